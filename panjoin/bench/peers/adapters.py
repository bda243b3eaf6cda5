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
- :func:`duckdb_peer`: DuckDB's offline join of the whole file, its pairs folded into
  a :class:`~panjoin.bench.peers.digest.PairDigest` batch by batch;
- :func:`_spark_peer`: the hook to Spark's stream-stream join (it lives in
  ``spark_conn.peer``), which hands each micro-batch's pairs to a callback.
"""

from __future__ import annotations

import numpy as np

from panjoin.bench.peers.digest import PairDigest
from panjoin.bench.peers.workloads import Data, Workload


class _EngineOp:
    def __init__(self, wl: Workload, index: str, threads: int, backend=None, n_workers=1,
                 predicate: str | None = None):
        from panjoin.manager.engine import JoinEngine

        # NBat: the paper's 32K, but at most W/8 so that small windows still see many batches
        self.eng = JoinEngine(wl.window_spec(), predicate or wl.predicate(), index=index,
                              threads=threads, backend=backend, n_workers=n_workers,
                              batch_size=min(1 << 15, max(256, wl.window // 8)))

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
        ((_, (a, b)),) = wl.residual.items()
        super().__init__(wl, *args, predicate=f"{wl.predicate()}&bands2:{a},{b}", **kw)

    def events(self, data: Data):
        from dataclasses import replace

        # y is int64 y * 1024 below 2**53: exact as float64
        return replace(data.events, key2=data.y.astype(np.float64))


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


class _PairTap:
    """The DuckDB connection :func:`duckdb_peer` hands to ``duckdb_join``: every Arrow
    batch of (r_id, s_id) pairs that ``duckdb_join(stream_pairs=True)`` fetches (and
    drops after counting) passes through ``digest`` on its way, so DuckDB runs the
    same query, fetch and timing as before and its pairs are checked too."""

    def __init__(self, con, digest: PairDigest):
        self._con, self._digest = con, digest

    def __getattr__(self, name):
        return getattr(self._con, name)

    def sql(self, query: str) -> _TappedRelation:
        return _TappedRelation(self._con.sql(query), self._digest)


class _TappedRelation:
    def __init__(self, rel, digest: PairDigest):
        self._rel, self._digest = rel, digest

    def to_arrow_reader(self, batch_size: int):
        for b in self._rel.to_arrow_reader(batch_size):
            self._digest.add(b.column("r_id").to_numpy(), b.column("s_id").to_numpy())
            yield b


def duckdb_peer(wl: Workload, data: Data, threads: int, plan: str) -> tuple[PairDigest, float]:
    """DuckDB's offline join of the whole file (``plan``: "bucket" or "range", see
    :func:`panjoin.baselines.duckdb_join.join_sql`), every pair fetched in Arrow batches:
    the digest of its pairs, and the query's seconds less the time spent folding them."""
    import duckdb

    from panjoin.baselines.duckdb_join import duckdb_join

    digest = PairDigest()
    con = duckdb.connect()
    try:
        res = duckdb_join(data.events, wl.window_spec(), wl.predicate(), threads=threads,
                          plan=plan, residual=wl.residual,
                          extra={c: data.y for c in (wl.residual or ())}, stream_pairs=True,
                          con=_PairTap(con, digest))
    finally:
        con.close()
    if digest.count != res.count:  # duckdb_join no longer fetches through to_arrow_reader
        raise RuntimeError(f"the DuckDB peer saw {digest.count} of its {res.count} pairs")
    return digest, res.seconds - digest.seconds


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
