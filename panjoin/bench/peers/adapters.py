"""One adapter per peer: how each peer runs the join and hands back its result pairs.

A streaming peer is an *op* that the runner drives chunk by chunk
(:func:`panjoin.bench.peers.runner._stream`)::

    op.push(data) -> (r_ids, s_ids)   join a chunk of arrivals; the pairs it produced
    op.fill(data)                     insert and expire only (a bounded run's fill)
    op.finish() -> (r_ids, s_ids)     flush; the pairs still held back
    op.memory() -> bytes

- ``_EngineOp``: PanJoin's engine with one index (the PanJoin indexes, ``nested``
  for the nested loop, ``sortedlist``, and the cluster through a gRPC backend);
  ``_TwoDimEngineOp`` is the same for the 2-D band join (:func:`engine_op` picks);
- ``_SHJOp``: the symmetric hash join;
- :func:`duckdb_peer`, :func:`polars_peer`, :func:`datafusion_peer`: the offline
  joins of the whole file (DuckDB, Polars, DataFusion), run alike by
  :func:`_offline_peer`: their pairs folded into a
  :class:`~panjoin.bench.peers.digest.PairDigest` batch by batch; ``OFFLINE_PEERS``
  names them (with their plan);
- :func:`_spark_peer`: the hook to Spark's stream-stream join (it lives in
  ``spark_conn.peer``), which hands each micro-batch's pairs to a callback.
"""

from __future__ import annotations

import numpy as np

from panjoin.bench.peers.digest import PairDigest
from panjoin.bench.peers.workloads import Data, Workload, engine_input


def engine_config(wl: Workload, index: str, backend=None) -> tuple[int | None, int]:
    """``(NSub, NBat)`` of an engine-based peer (NSub None: the engine's default).

    In-process BI-Sort: one subwindow per window (NSub = W) and NBat = W, at most
    512K. With one thread nothing is gained by spreading a window over subwindows, and
    every subwindow costs each batch a probe pass; BI-Sort's merge, O(NSub) per batch,
    is the price. Larger batches make the probes denser and the merges fewer (issue
    20's sweeps, benchmarks/RESULTS.md: at W = 1M, equi join, 6.5M tuples/s at NSub W/2
    and NBat 32K, 10.5M at NSub W and NBat 128K, 13.4M at 256K, 16.3M at 512K, 15.2M
    at 1M; at W = 256K, 20.2M at NBat 128K, 24.4M at 256K). Every other
    peer keeps the paper's NBat of 32K, at most W/8 so that small windows still see
    many batches, and the engine's NSub (W/4 for count windows): the cluster spreads
    subwindows over its workers."""
    if index == "bisort" and backend is None:
        return wl.window, min(1 << 19, max(256, wl.window))
    return None, min(1 << 15, max(256, wl.window // 8))


class _EngineOp:
    def __init__(self, wl: Workload, index: str, threads: int, backend=None, n_workers=1,
                 predicate: str | None = None):
        from panjoin.manager.engine import JoinEngine

        nsub, nbat = engine_config(wl, index, backend)
        self.eng = JoinEngine(wl.window_spec(), predicate or wl.predicate(), index=index,
                              threads=threads, backend=backend, n_workers=n_workers,
                              subwindow_size=nsub, batch_size=nbat)
        self.note = f"NSub {nsub}, NBat {nbat}" if nsub else ""

    def events(self, data: Data):
        return data.events

    def push(self, data: Data) -> tuple[np.ndarray, np.ndarray]:
        self.eng.push(self.events(data))
        return self.eng.take_results()

    def fill(self, data: Data) -> None:
        """Insert and expire without probing: the windows fill, nothing is joined."""
        self.eng._probe = lambda *a, **k: None  # the instance attribute shadows the method
        try:
            self.eng.push(self.events(data))
            self.eng.flush()
        finally:
            del self.eng._probe

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        self.eng.flush()
        return self.eng.take_results()

    def memory(self) -> int:
        return self.eng.memory_bytes()


class _TwoDimEngineOp(_EngineOp):
    """The 2-D band join on an engine: the x band is the key, the y band the engine's
    residual condition on key2 (``band:10&bands2:A,B``), checked inside the probe where
    the x-band candidates are found, so only pairs passing both are produced."""

    def __init__(self, wl: Workload, data: Data, *args, **kw):
        self.wl = wl
        super().__init__(wl, *args, predicate=engine_input(wl, data)[1], **kw)

    def events(self, data: Data):
        return engine_input(self.wl, data)[0]


def two_d_engine_op(wl: Workload, data: Data, index: str, threads: int, backend=None,
                    n_workers: int = 1) -> _EngineOp:
    """THE one place where an engine-based peer gets the 2-D band join: the x band as
    the key, the y band as the engine's residual predicate on key2 = y."""
    return _TwoDimEngineOp(wl, data, index, threads, backend, n_workers)


def engine_op(wl: Workload, data: Data, index: str, threads: int, backend=None,
              n_workers: int = 1) -> _EngineOp:
    if wl.pred == "band2d":
        return two_d_engine_op(wl, data, index, threads, backend, n_workers)
    return _EngineOp(wl, index, threads, backend, n_workers)


class _SHJOp:
    def __init__(self, wl: Workload):
        from panjoin.baselines.symmetric_hash_join import SymmetricHashJoin

        self.j = SymmetricHashJoin(wl.window_spec(), wl.predicate(), residual=wl.residual)
        self.cols = list(wl.residual or ())

    def _extra(self, data: Data) -> dict:
        return {c: data.y for c in self.cols}

    def push(self, data: Data) -> tuple[np.ndarray, np.ndarray]:
        self.j.push(data.events, self._extra(data))
        return self.j.take_results()

    def fill(self, data: Data) -> None:
        self.j._probe = lambda *a, **k: None  # buffer and prune only
        try:
            for a in range(0, len(data), 1 << 16):
                part = data.slice(a, a + (1 << 16))
                self.j.push(part.events, self._extra(part))
        finally:
            del self.j._probe

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)

    def memory(self) -> int:
        return self.j.peak_bytes


def _offline_peer(join, wl: Workload, data: Data, threads: int,
                  plan: str) -> tuple[PairDigest, float]:
    """THE one way an offline peer runs: ``join`` (``duckdb_join``, ``polars_join``,
    ``datafusion_join``) joins the whole file with ``plan``, the y band of the 2-D join
    as its residual, and hands every batch of (r_id, s_id) pairs it fetches to a
    :class:`PairDigest`: the digest, and the join's seconds less the time spent
    folding the pairs."""
    digest = PairDigest()
    res = join(data.events, wl.window_spec(), wl.predicate(), threads=threads, plan=plan,
               residual=wl.residual, extra={c: data.y for c in (wl.residual or ())},
               on_pairs=digest.add)
    if digest.count != res.count:
        raise RuntimeError(f"{join.__name__} handed {digest.count} of its {res.count} pairs")
    return digest, res.seconds - digest.seconds


def duckdb_peer(wl: Workload, data: Data, threads: int, plan: str) -> tuple[PairDigest, float]:
    """DuckDB's offline join of the whole file (``plan``: "bucket" or "range", see
    :func:`panjoin.baselines.duckdb_join.join_sql`), every pair fetched in Arrow batches."""
    from panjoin.baselines.duckdb_join import duckdb_join

    return _offline_peer(duckdb_join, wl, data, threads, plan)


def polars_peer(wl: Workload, data: Data, threads: int, plan: str) -> tuple[PairDigest, float]:
    """Polars' offline join of the whole file (``plan``: "bucket" or "iejoin", see
    :mod:`panjoin.baselines.polars_join`); raises unless Polars' pool has ``threads``."""
    from panjoin.baselines.polars_join import polars_join

    return _offline_peer(polars_join, wl, data, threads, plan)


def datafusion_peer(wl: Workload, data: Data, threads: int,
                    plan: str) -> tuple[PairDigest, float]:
    """DataFusion's offline join of the whole file (DuckDB's SQL; ``plan``: "bucket" or
    "range"), ``threads`` target partitions, the pairs streamed as Arrow batches."""
    from panjoin.baselines.datafusion_join import datafusion_join

    return _offline_peer(datafusion_join, wl, data, threads, plan)


# peer -> (adapter, plan, the package it needs); each runs the whole file offline
OFFLINE_PEERS = {
    "duckdb": (duckdb_peer, "bucket", "duckdb"),
    "duckdb-range": (duckdb_peer, "range", "duckdb"),
    "polars": (polars_peer, "bucket", "polars"),
    "polars-iejoin": (polars_peer, "iejoin", "polars"),
    "datafusion": (datafusion_peer, "bucket", "datafusion"),
    "polars-mt": (polars_peer, "bucket", "polars"),
    "datafusion-mt": (datafusion_peer, "bucket", "datafusion"),
}
#: offline peers run with their engine's *default* threads (Polars' pool as it sizes
#: itself, DataFusion's default target partitions), not the run's ``threads``: what a
#: user who tries them gets (issue 31)
DEFAULT_THREADS_PEERS = frozenset({"polars-mt", "datafusion-mt"})
BAND_AS = {"bucket": "bucket equi-join", "range": "range conditions",
           "iejoin": "IEJoin (join_where)"}


def _spark_peer():
    """The issue-6 hook: ``spark_conn.peer.spark_stream_join(events, window, predicate,
    on_pairs=...) -> (result count, seconds)``; None and the reason when it is not there."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return None, ("pyspark is not installed (Spark Structured Streaming's stream-stream "
                      "join is issue 6, branch spark)")
    try:
        from spark_conn.peer import spark_stream_join
    except ImportError as e:
        return None, f"spark_conn.peer.spark_stream_join is not available ({e})"
    return spark_stream_join, ""
