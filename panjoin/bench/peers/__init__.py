"""The peer benchmark (issue 7): PanJoin against the joins people use today, on the same data.

Every workload is one generated event file of ``N = 2W + M`` tuples (count
windows of W per stream; the first 2W tuples fill both windows) and every peer
joins that same file in the same run:

=================  ==========================================================
panjoin-<index>    the in-process engine with each PanJoin index (rap, wib, bisort)
panjoin-cluster    the same engine over a local cluster of worker processes (bisort)
nested-loop        the engine with index ``nested`` (handshake join / SplitJoin /
                   ScaleJoin scan their subwindows): in full up to ``nested_max``,
                   bounded beyond it (below)
sorted-list        the engine with index ``sortedlist`` (a SortedList per subwindow),
                   in full up to ``sorted_max``, bounded beyond
shj                symmetric hash join with build-side pruning; for band joins it
                   is filter-only (a scan of the pruned buffer), so it is limited
                   and bounded like the nested loop
duckdb             the whole file joined offline in DuckDB (one SQL query, every
                   result pair fetched as Arrow batches, like the streaming peers
                   materialise theirs); band joins rewritten by hand into a bucket
                   equi-join (the fast plan)
duckdb-range       the same with the band as two range conditions, as first written:
                   DuckDB plans a piecewise merge join, O(N^2); in full up to
                   ``nested_max``, beyond it EXTRAPOLATED as rate(W0) * W0 / W (a
                   scan costs W per probe tuple), and flagged so
polars             the whole file joined offline in Polars (expressions: arrival
                   numbers by cumulative sums, a hash join on the key or, for bands,
                   DuckDB's bucket rewrite; ``polars-iejoin``, not run by default:
                   the band by ``join_where``), its pairs fetched as Arrow batches
datafusion         the whole file joined offline in DataFusion, by DuckDB's SQL (the
                   bucket rewrite for bands), its pairs streamed as Arrow batches
polars-mt,         ``polars`` and ``datafusion`` at their engine's *default* threads
datafusion-mt      (Polars' pool as it sizes itself, DataFusion's default target
                   partitions: the CPUs it may use), in a child process of their own,
                   next to the one-thread rows: what a user who tries them gets
spark              Spark Structured Streaming's stream-stream join (issue 6): run
                   when pyspark and ``spark_conn.peer`` exist, else skipped with the
                   reason printed
=================  ==========================================================

Workloads: band joins with selectivity S in {1, 64, 1K} on uniform keys, S = 64
on Zipf and increasing keys (the band half-width E is *calibrated* on the file
so that a probe tuple matches about S tuples of a full window: the uniform
formula would make a Zipf band cover nearly every key), the equi join on
uniform and Zipf keys, S = 64 over *time* windows (T ms holding about W tuples
per stream), and the handshake join paper's 2-D band join (its section 5.2:
``r.x BETWEEN s.a-10 AND s.a+10 AND r.y BETWEEN s.b-10 AND s.b+10``, values
uniform in 1..10000). The 2-D join runs on the x band as the key; the y band is
a *residual* condition: SHJ and DuckDB take it in their filter / SQL, the
engine-based peers (PanJoin's indexes, the sorted list, the nested loop, the cluster)
take it as the engine's residual predicate on key2 (:func:`two_d_engine_op`). The y
values are multiples of 1/1024 (floats, like the paper's) handled as exact
int64 ``y * 1024`` by every peer.

Peers too slow for a large window (``_limit``) are run *bounded* there: both
windows are filled without joining (insert and expire only), then
``bounded_probes`` tuples are joined against the full windows and timed; those
rows say "bounded" and their pairs are checked against each other (only the
pairs found by the bounded probe tuples). ``duckdb-range`` is offline
and cannot be bounded: beyond its limit it is EXTRAPOLATED (rate(W0) * W0 / W),
and flagged so.

Every peer gets ``threads`` threads (default 1: on the shared 2-core machine,
loaded by other jobs, two Numba threads meeting at OpenMP barriers ran PanJoin
2.5x slower than one, and DuckDB ran alike with 1 or 2; Polars' pool is sized
once, at import, so :func:`run_peers` sets ``POLARS_MAX_THREADS`` first and the
polars peer fails rather than run another count; DataFusion gets ``threads``
target partitions; the ``-mt`` peers excepted), and every peer materialises the
(r_id, s_id) pairs it finds, chunk by chunk. An offline peer whose package is
missing is skipped, the reason printed.

Streaming peers report the *steady* rate (the M tuples after the fill, windows
full, expiry running) and the *whole-file* rate (N / total time); the offline
peers (DuckDB, Polars, DataFusion) only have the whole-file rate, so their ratio
is taken against PanJoin's whole-file rate. Every peer that ran the whole file must
report the same result pairs (the same count and pair digest, :class:`PairDigest`;
Spark's hook gives a count only, so Spark is checked by its count), else the run
fails (after printing the table).

Modules, each importing only those above it:

=============  ==============================================================
workloads.py   :class:`Workload`, the generated file (:func:`events_for`,
               :class:`Data`) and the calibrated band (:func:`calibrate`)
config.py      :class:`PeerConfig`: windows, peers, limits, budget, threads
digest.py      :class:`PairDigest`: the fingerprint of a result's pair set
results.py     :class:`PeerResult`, and the check that the peers agree
               (:func:`check_results`)
report.py      the Markdown :func:`table`, the JSON (:func:`save_records`,
               :func:`load_records`) and the :func:`plot`
adapters.py    one adapter per peer: how it joins and hands back its pairs
runner.py      :class:`PeerRunner` and :func:`run_peers`: running, timing,
               checking rounds; :func:`_stream` drives a streaming peer
=============  ==============================================================
"""

from panjoin.bench.peers.adapters import (
    OFFLINE_PEERS,
    _EngineOp,
    _SHJOp,
    _spark_peer,
    _TwoDimEngineOp,
    datafusion_peer,
    duckdb_peer,
    engine_op,
    polars_peer,
    two_d_engine_op,
)
from panjoin.bench.peers.config import PeerConfig
from panjoin.bench.peers.digest import PairDigest, pair_digest
from panjoin.bench.peers.report import load_records, plot, ratios, save_records, table
from panjoin.bench.peers.results import PeerResult, check_results
from panjoin.bench.peers.runner import PeerRunner, _stream, run_peers, warm_up
from panjoin.bench.peers.workloads import (
    HS_BAND,
    HS_MAX,
    KEY_MAX,
    PANJOIN_INDEXES,
    RATE,
    RESIDUAL_2D,
    Y_SCALE,
    Data,
    Workload,
    calibrate,
    events_for,
)

__all__ = [
    "HS_BAND", "HS_MAX", "KEY_MAX", "OFFLINE_PEERS", "PANJOIN_INDEXES", "RATE",
    "RESIDUAL_2D", "Y_SCALE",
    "Data", "PairDigest", "PeerConfig", "PeerResult", "PeerRunner", "Workload",
    "_EngineOp", "_SHJOp", "_TwoDimEngineOp", "_spark_peer", "_stream",
    "calibrate", "check_results", "datafusion_peer", "duckdb_peer", "engine_op",
    "events_for", "load_records", "pair_digest", "plot", "polars_peer", "ratios",
    "run_peers", "save_records", "table", "two_d_engine_op", "warm_up",
]
