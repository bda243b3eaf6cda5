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
rows say "bounded" and their counts are checked against each other (they count
only the pairs found by the bounded probe tuples). ``duckdb-range`` is offline
and cannot be bounded: beyond its limit it is EXTRAPOLATED (rate(W0) * W0 / W),
and flagged so.

Every peer gets ``threads`` threads (default 1: on the shared 2-core machine,
loaded by other jobs, two Numba threads meeting at OpenMP barriers ran PanJoin
2.5x slower than one, and DuckDB ran alike with 1 or 2), and every peer
materialises the (r_id, s_id) pairs it finds, chunk by chunk.

Streaming peers report the *steady* rate (the M tuples after the fill, windows
full, expiry running) and the *whole-file* rate (N / total time); DuckDB only
has the whole-file rate, so its ratio is taken against PanJoin's whole-file
rate. Every peer that ran the whole file must report the same result count,
else the run fails (after printing the table).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from panjoin.generate import band_for_selectivity, generate

KEY_MAX = 1 << 40
RATE = 1_000_000  # generated tuples per second of event time (both streams)
PANJOIN_INDEXES = ("rap", "wib", "bisort")
# the handshake join paper's section 5.2: values uniform in 1..10000, bands of +-10
HS_MAX = 10_000
HS_BAND = 10
Y_SCALE = 1024  # y = k / 1024: floats every peer compares exactly as the int64 k
RESIDUAL_2D = {"y": (-HS_BAND * Y_SCALE, HS_BAND * Y_SCALE)}  # s.y - r.y in [A, B]


@dataclass(frozen=True)
class Workload:
    pred: str  # "band", "eq" or "band2d" (the handshake paper's 2-D band join)
    selectivity: float  # band: S; eq: about 1 match per tuple (uniform) or what zipf gives
    dist: str
    window: int
    kind: str = "count"  # count | time (T ms that hold about W tuples per stream)
    band: int | None = None  # E calibrated on the file (non-uniform keys), see calibrate()

    @property
    def name(self) -> str:
        if self.pred == "band2d":
            return "band2d handshake"
        p = f"band S={self.selectivity:g}" if self.pred == "band" else "eq"
        return f"{p} {self.dist}" + (" time" if self.kind == "time" else "")

    def window_spec(self) -> str:
        if self.kind == "time":
            t = max(1, round(self.window * 2 * 1000 / RATE))  # both streams arrive at RATE/2
            return f"time:{t},{t}"
        return f"count:{self.window},{self.window}"

    def predicate(self) -> str:
        if self.pred == "eq":
            return "eq"
        if self.pred == "band2d":
            return f"band:{HS_BAND}"
        if self.band is not None:
            return f"band:{self.band}"
        return f"band:{int(band_for_selectivity(self.selectivity, self.window, 0, KEY_MAX))}"

    def key_range(self) -> tuple[int, int]:
        if self.pred == "band2d":
            return 1, HS_MAX
        # eq on uniform keys: W distinct values give about one match per probe tuple
        return 0, (self.window if (self.pred == "eq" and self.dist == "uniform") else KEY_MAX)

    @property
    def residual(self) -> dict | None:
        return RESIDUAL_2D if self.pred == "band2d" else None


@dataclass
class PeerResult:
    workload: str
    window: int
    peer: str
    status: str = "ok"  # ok | extrapolated | skipped | failed
    note: str = ""
    results: int | None = None
    steady_tps: float | None = None
    whole_tps: float | None = None
    seconds: float | None = None
    memory_bytes: int | None = None


@dataclass
class PeerConfig:
    windows: list[int] = field(default_factory=lambda: [1 << 16, 1 << 18, 1 << 20, 1 << 23])
    measure: int | None = None  # M; default W
    selectivities: tuple = (1, 64, 1024)
    nested_max: int = 1 << 14  # nested loop, SHJ and duckdb-range on band joins, in full
    sorted_max: int = 1 << 16
    bounded_probes: int = 1 << 13  # beyond a peer's limit: this many probe tuples, full windows
    bounded_max: int = 1 << 23  # no bounded run above this W (the fill alone is 2W inserts)
    band2d_max: int = 1 << 18  # 2-D: every x-band candidate becomes a pair (21 W / 10^4 each)
    budget_s: float = 120.0  # a peer slower than this at one window skips the larger ones
    repeat: int = 2  # interleaved rounds per workload; each peer's best round counts
    # one thread per peer: on the shared 2-core box (load 4-6) two Numba threads meet at
    # OpenMP barriers and ran PanJoin 2.5x slower than one; DuckDB ran alike with 1 or 2
    threads: int = 1
    workers: int = 2
    chunk: int = 1 << 16
    seed: int = 0
    only: tuple = ()  # keep only the workloads with these names (e.g. "band S=64 uniform")
    peers: tuple = ("panjoin-rap", "panjoin-wib", "panjoin-bisort", "panjoin-cluster",
                    "nested-loop", "sorted-list", "shj", "duckdb", "duckdb-range", "spark")

    @classmethod
    def quick(cls) -> PeerConfig:
        """Every peer on every workload kind once, W = 8K (a bounded run of the scans
        included, at 16K for band S=64 uniform): about 2-3 minutes on 2 cores."""
        return cls(windows=[1 << 13], extra_windows=((1 << 14, "band S=64 uniform"),),
                   nested_max=1 << 13, sorted_max=1 << 13, bounded_probes=1 << 11,
                   budget_s=30.0, chunk=1 << 12, repeat=1)

    extra_windows: tuple = ()  # (W, workload name) pairs run besides the windows

    def workloads(self) -> list[Workload]:
        out = []
        for w in self.windows:
            out += [Workload("band", s, "uniform", w) for s in self.selectivities]
            out += [Workload("eq", 1, "uniform", w), Workload("eq", 1, "zipf", w),
                    Workload("band", 64, "zipf", w), Workload("band", 64, "increasing", w),
                    Workload("band", 64, "uniform", w, "time")]
            if w <= self.band2d_max:
                out.append(Workload("band2d", 0, "uniform", w))
        for w, name in self.extra_windows:
            out += [wl for wl in _all_workloads(w) if wl.name == name]
        if self.only:
            known = sorted({wl.name for wl in out})
            bad = [o for o in self.only if o not in known]
            if bad:
                raise ValueError(f"unknown workload(s) {bad}; choose from {known}")
            out = [wl for wl in out if wl.name in self.only]
        return out


def _all_workloads(w: int) -> list[Workload]:
    """Every workload kind at one W."""
    return PeerConfig(windows=[w], band2d_max=w).workloads()


@dataclass
class Data:
    """One workload's event file, and the y column of the 2-D join (None otherwise)."""

    events: object  # EventTable
    y: np.ndarray | None = None  # int64 y * Y_SCALE per event, arrival order

    def __len__(self) -> int:
        return len(self.events)

    def slice(self, a: int, b: int) -> Data:
        return Data(self.events.slice(a, b), None if self.y is None else self.y[a:b])


def events_for(wl: Workload, measure: int, seed: int) -> Data:
    lo, hi = wl.key_range()
    ev = generate(2 * wl.window + measure, wl.dist, key_min=lo, key_max=hi, seed=seed,
                  rate=RATE)
    if wl.pred != "band2d":
        return Data(ev)
    y = np.random.default_rng([seed, 2]).integers(Y_SCALE, HS_MAX * Y_SCALE, len(ev),
                                                 endpoint=True)
    return Data(ev, y.astype(np.int64))


def calibrate(wl: Workload, data: Data, probes: int = 256) -> Workload:
    """The band half-width E that makes a probe tuple match about S tuples of a full
    window on this file (non-uniform keys; uniform keys keep the closed formula):
    the smallest E whose mean match count reaches S for the first ``probes`` R tuples
    after the fill, each against its own window (the last W S-tuples before it;
    increasing keys move a whole band's width in a few hundred arrivals).

    The windows of consecutive probes overlap: one sorted array U holds the S keys
    of all of them, and each probe subtracts, by brute force, the few keys of U
    outside its own window."""
    if wl.pred != "band" or wl.dist == "uniform" or wl.band is not None:
        return wl
    ev = data.events
    fill, w = 2 * wl.window, wl.window
    is_s = ev.stream == 1
    s_before = np.cumsum(is_s) - is_s  # S arrivals before each position
    pos = fill + np.flatnonzero(~is_s[fill:])[:probes]
    if pos.size == 0:
        return wl
    s_keys = ev.key[is_s]
    j = s_before[pos]  # probe i's window: S tuples [j_i - W, j_i)
    lo_j, hi_j = max(0, int(j[0]) - w), int(j[-1])
    union = np.sort(s_keys[lo_j:hi_j])
    keys = ev.key[pos]
    outside = [np.concatenate([s_keys[lo_j:max(lo_j, int(ji) - w)], s_keys[int(ji):hi_j]])
               for ji in j]

    def mean(e: int) -> float:
        n = np.searchsorted(union, keys + e, "right") - np.searchsorted(union, keys - e, "left")
        n -= np.array([np.count_nonzero((o >= k - e) & (o <= k + e))
                       for o, k in zip(outside, keys, strict=True)])
        return float(n.mean())

    lo, hi = 0, KEY_MAX
    while lo < hi:
        mid = (lo + hi) // 2
        if mean(mid) >= wl.selectivity:
            hi = mid
        else:
            lo = mid + 1
    from dataclasses import replace

    return replace(wl, band=lo)


# --------------------------------------------------------------------------- streaming peers


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

    def push(self, data: Data) -> int:
        self.eng.push(self.events(data))
        return len(self.eng.take_results()[0])

    def fill(self, data: Data) -> None:
        """Insert and expire without probing: the windows fill, nothing is joined."""
        self.eng._probe = lambda *a, **k: None  # the instance attribute shadows the method
        try:
            self.eng.push(self.events(data))
            self.eng.flush()
        finally:
            del self.eng._probe

    def finish(self) -> int:
        self.eng.flush()
        return len(self.eng.take_results()[0])

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

    def push(self, data: Data) -> int:
        self.j.push(data.events, self._extra(data))
        return len(self.j.take_results()[0])

    def fill(self, data: Data) -> None:
        self.j._probe = lambda *a, **k: None  # buffer and prune only
        try:
            for a in range(0, len(data), 1 << 16):
                part = data.slice(a, a + (1 << 16))
                self.j.push(part.events, self._extra(part))
        finally:
            del self.j._probe

    def finish(self) -> int:
        return 0

    def memory(self) -> int:
        return self.j.peak_bytes


def _stream(op, data: Data, fill: int, chunk: int, bar=None, bounded: bool = False) -> dict:
    """Push the whole file in chunks; time the fill and the measured part apart.
    ``bounded``: the fill only inserts (nothing joined, untimed); the rest is timed."""
    n = len(data)
    count, mem = 0, 0
    t0 = time.perf_counter()
    t_fill = None
    start = 0
    if bounded:
        op.fill(data.slice(0, fill))
        mem = op.memory()
        start = fill
        if bar is not None:
            bar.update(fill)
    for a in range(start, n, chunk):
        if a >= fill and t_fill is None:
            t_fill = time.perf_counter()
        b = min(n, a + chunk)
        count += op.push(data.slice(a, b))
        mem = max(mem, op.memory())
        if bar is not None:
            bar.update(b - a)
    count += op.finish()
    mem = max(mem, op.memory())
    t1 = time.perf_counter()
    t_fill = t1 if t_fill is None else t_fill
    if bounded:
        return dict(results=count, steady_tps=(n - fill) / max(t1 - t_fill, 1e-9),
                    seconds=t1 - t_fill, memory_bytes=int(mem))
    return dict(results=count, steady_tps=(n - fill) / max(t1 - t_fill, 1e-9),
                whole_tps=n / (t1 - t0), seconds=t1 - t0, memory_bytes=int(mem))


def _spark_peer():
    """The issue-6 hook: ``spark_conn.peer.spark_stream_join(events, window, predicate)
    -> (result count, seconds)``; None and the reason when it is not there."""
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


# --------------------------------------------------------------------------- one workload


class PeerRunner:
    """Runs every peer on every workload; keeps the cluster's workers for the whole run."""

    def __init__(self, cfg: PeerConfig, progress: bool = True, log=print):
        self.cfg = cfg
        self.progress = progress
        self.log = log
        self.records: list[PeerResult] = []
        self.workers = []
        self.slow: set[tuple[str, str]] = set()  # (peer, workload name) over budget
        self.spark, self.spark_reason = _spark_peer()
        self.said: set[str] = set()

    def _say_once(self, msg: str) -> None:
        if msg not in self.said:
            self.said.add(msg)
            self.log(msg)

    def close(self) -> None:
        for w in self.workers:
            w.stop()
        self.workers = []

    def _addresses(self) -> list[str]:
        if not self.workers:
            from panjoin.launch import start_workers
            from panjoin.manager.grpc_backend import GrpcBackend

            for attempt in range(2):
                self.workers = start_workers(self.cfg.workers, threads=1)
                # a tiny join first: each worker loads (or compiles) its kernels untimed,
                # which on a loaded machine can outlast the manager's command timeout
                backend = GrpcBackend([w.address for w in self.workers])
                try:
                    wl = Workload("band", 64, "uniform", 1024)
                    _stream(_EngineOp(wl, "bisort", 1, backend, self.cfg.workers),
                            events_for(wl, 1024, 0), 2048, 512)
                    break
                except Exception as e:
                    self.log(f"cluster warm-up failed ({e}); restarting the workers")
                    self.close()
                    if attempt:
                        raise
                finally:
                    backend.close()
        return [w.address for w in self.workers]

    def _limit(self, peer: str, wl: Workload) -> int | None:
        """Largest window the peer runs in full at for this workload (None: no limit)."""
        if peer == "nested-loop" or (peer in ("shj", "duckdb-range") and wl.pred != "eq"):
            return self.cfg.nested_max
        if peer == "sorted-list":
            return self.cfg.sorted_max
        return None

    def run_peer(self, peer: str, wl: Workload, data: Data, fill: int, bar=None,
                 bounded: bool = False) -> PeerResult:
        rec = PeerResult(wl.name, wl.window, peer, "bounded" if bounded else "ok")
        if bounded:
            rec.note = (f"BOUNDED: windows filled without joining, then {len(data) - fill} "
                        "probe tuples timed")
        chunk = min(self.cfg.chunk, max(1, wl.window // 4))  # the fill ends on a chunk edge
        events = data.events
        if peer.startswith("panjoin-") and peer != "panjoin-cluster":
            op = engine_op(wl, data, peer.split("-", 1)[1], self.cfg.threads)
        elif peer == "panjoin-cluster":
            from panjoin.manager.grpc_backend import GrpcBackend

            backend = GrpcBackend(self._addresses())
            try:
                op = engine_op(wl, data, "bisort", self.cfg.threads, backend, self.cfg.workers)
                out = _stream(op, data, fill, chunk, bar, bounded)
            finally:
                backend.close()
            rec.note = f"{self.cfg.workers} workers, bisort"
            return _fill(rec, out)
        elif peer == "nested-loop":
            op = engine_op(wl, data, "nested", self.cfg.threads)
        elif peer == "sorted-list":
            op = engine_op(wl, data, "sortedlist", self.cfg.threads)
        elif peer == "shj":
            op = _SHJOp(wl)
            rec.note = ("hash on key" if wl.pred == "eq" else "filter-only (no equi key)") + \
                (", y band in the filter" if wl.residual else "") + \
                (f"; {rec.note}" if bounded else "")  # keeps the BOUNDED note
        elif peer in ("duckdb", "duckdb-range"):
            from panjoin.baselines.duckdb_join import duckdb_join

            plan = "range" if peer == "duckdb-range" else "bucket"
            res = duckdb_join(events, wl.window_spec(), wl.predicate(),
                              threads=self.cfg.threads, plan=plan, residual=wl.residual,
                              extra={c: data.y for c in (wl.residual or ())},
                              stream_pairs=True)
            if bar is not None:
                bar.update(len(events))
            rec.results, rec.seconds = res.count, res.seconds
            rec.whole_tps = len(events) / res.seconds
            rec.note = f"offline, pairs fetched, {self.cfg.threads} threads" + (
                ", band as bucket equi-join" if plan == "bucket" and wl.pred != "eq" else
                ", band as range conditions" if wl.pred != "eq" else "") + (
                ", y band in SQL" if wl.residual else "")
            return rec
        elif peer == "spark":
            count, secs = self.spark(events, wl.window_spec(), wl.predicate())
            rec.results, rec.seconds, rec.whole_tps = count, secs, len(events) / secs
            return rec
        else:
            raise ValueError(f"unknown peer {peer!r}; choose from {', '.join(self.cfg.peers)}")
        return _fill(rec, _stream(op, data, fill, chunk, bar, bounded))

    def _plan(self, peer: str, wl: Workload) -> PeerResult | str:
        """What to do with a peer on a workload: "full", "bounded", or a finished record."""
        if peer == "spark":
            if self.spark is None:
                self._say_once(f"spark: skipped: {self.spark_reason}")
                return PeerResult(wl.name, wl.window, peer, "skipped", self.spark_reason)
            if wl.residual:
                return PeerResult(wl.name, wl.window, peer, "skipped",
                                  "the Spark hook takes one key column; the 2-D band join "
                                  "needs a second")
        limit = self._limit(peer, wl)
        if limit is not None and wl.window > limit:
            if peer == "duckdb-range" or wl.window > self.cfg.bounded_max \
                    or not self.cfg.bounded_probes:
                return self._extrapolate(peer, wl, limit)
            return "bounded"
        if (peer, wl.name) in self.slow:
            return PeerResult(wl.name, wl.window, peer, "skipped",
                              f"over the {self.cfg.budget_s:g} s budget at a smaller W")
        return "full"

    def run_workload(self, wl: Workload) -> list[PeerResult]:
        """Every peer on one workload, ``repeat`` interleaved rounds (all peers, then all
        again), keeping each peer's best round: the machine's load varies during a run,
        and interleaving exposes every peer to the same spells of it."""
        from tqdm import tqdm

        measure = self.cfg.measure or wl.window
        data = events_for(wl, measure, self.cfg.seed)
        wl = calibrate(wl, data)
        fill = 2 * wl.window
        # a scan costs W per probe tuple: above 1M, fewer probes keep it to ~8G steps
        nb = min(measure, self.cfg.bounded_probes, max(256, (1 << 33) // wl.window))
        bdata = data.slice(0, fill + nb)
        best: dict[str, PeerResult] = {}
        timed: list[tuple[str, bool]] = []
        for peer in self.cfg.peers:
            plan = self._plan(peer, wl)
            if isinstance(plan, PeerResult):
                best[peer] = plan
            else:
                timed.append((peer, plan == "bounded"))
        for rnd in range(max(1, self.cfg.repeat)):
            for peer, bounded in timed:
                if rnd and (best[peer].status not in ("ok", "bounded") or
                            (best[peer].seconds or 0) > self.cfg.budget_s / 2):
                    continue  # one round is all a failing or slow peer gets
                d = bdata if bounded else data
                with tqdm(total=len(d), unit="tuples", unit_scale=True, leave=False,
                          disable=not self.progress,
                          desc=f"{peer} {wl.name} W={wl.window} #{rnd + 1}") as bar:
                    try:
                        rec = self.run_peer(peer, wl, d, fill, bar, bounded)
                    except NotImplementedError as e:  # e.g. a predicate Spark cannot express
                        rec = PeerResult(wl.name, wl.window, peer, "skipped", str(e))
                    except Exception as e:  # a failing peer is reported, the others run
                        # SparkCannotJoin: Spark has no stream-stream band join
                        cannot = type(e).__name__ == "SparkCannotJoin"
                        rec = PeerResult(wl.name, wl.window, peer,
                                         "skipped" if cannot else "failed",
                                         f"{type(e).__name__}: {e}")
                if rec.seconds is not None and rec.seconds > self.cfg.budget_s:
                    self.slow.add((peer, wl.name))
                old = best.get(peer)
                if old is None or _rate(rec) > _rate(old):
                    if old is not None and rec.results != old.results:
                        rec.status, rec.note = "failed", (
                            f"result count changed between rounds: {old.results} then "
                            f"{rec.results}")
                    best[peer] = rec
        if wl.band is not None:
            for r in best.values():
                r.note = f"E={wl.band} (calibrated)" + (f"; {r.note}" if r.note else "")
        out = [best[p] for p in self.cfg.peers]
        self.records += out
        return out

    def _extrapolate(self, peer: str, wl: Workload, limit: int) -> PeerResult:
        base = [r for r in self.records if r.peer == peer and r.workload == wl.name
                and r.status == "ok" and r.window <= limit]
        if not base:
            return PeerResult(wl.name, wl.window, peer, "skipped", f"only run at W <= {limit}")
        b = max(base, key=lambda r: r.window)
        f = b.window / wl.window  # a scan costs W per probe tuple
        return PeerResult(wl.name, wl.window, peer, "extrapolated",
                          f"EXTRAPOLATED from W={b.window} x {f:.3g} (cost linear in W), "
                          "not measured",
                          steady_tps=None if b.steady_tps is None else b.steady_tps * f,
                          whole_tps=b.whole_tps * f,
                          memory_bytes=None if b.memory_bytes is None
                          else int(b.memory_bytes * wl.window / b.window))


def _rate(r: PeerResult) -> float:
    return r.steady_tps or r.whole_tps or 0.0


def _fill(rec: PeerResult, out: dict) -> PeerResult:
    for k, v in out.items():
        setattr(rec, k, v)
    return rec


# --------------------------------------------------------------------------- checks and report


def check_counts(records: list[PeerResult]) -> list[str]:
    """Every peer that ran the whole file of a workload reports the same result count;
    so does every peer that ran it bounded (the same probe tuples)."""
    problems = []
    groups: dict[tuple, dict[str, int]] = {}
    for r in records:
        if r.status in ("ok", "bounded") and r.results is not None:
            groups.setdefault((r.workload, r.window, r.status), {})[r.peer] = r.results
    for (wl, w, st), counts in groups.items():
        if len(set(counts.values())) > 1:
            what = " (bounded runs)" if st == "bounded" else ""
            problems.append(f"{wl} W={w}: result counts differ{what}: {counts}")
    return problems


def ratios(records: list[PeerResult]) -> dict[tuple, dict]:
    """PanJoin's best in-process index per workload, steady and whole-file."""
    best: dict[tuple, dict] = {}
    for r in records:
        if r.peer.startswith("panjoin-") and r.peer != "panjoin-cluster" and r.status == "ok":
            b = best.setdefault((r.workload, r.window), {"steady": 0.0, "whole": 0.0, "peer": ""})
            if r.steady_tps > b["steady"]:
                b["steady"], b["peer"] = r.steady_tps, r.peer
            b["whole"] = max(b["whole"], r.whole_tps)
    return best


def _g(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def table(records: list[PeerResult]) -> str:
    """Markdown table: rates, memory, and PanJoin-best / peer (steady; whole-file for DuckDB)."""
    best = ratios(records)
    lines = ["| workload | W | peer | steady tuples/s | whole-file tuples/s | memory MB | "
             "PanJoin best / peer | results | note |",
             "|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in records:
        b = best.get((r.workload, r.window))
        ratio = None
        if b and r.steady_tps:
            ratio = b["steady"] / r.steady_tps
        elif b and r.whole_tps:
            ratio = b["whole"] / r.whole_tps
        mem = None if r.memory_bytes is None else r.memory_bytes / 2**20
        note = r.note if r.status in ("ok", "bounded") else f"{r.status}: {r.note}"
        lines.append(f"| {r.workload} | {r.window} | {r.peer} | {_g(r.steady_tps)} | "
                     f"{_g(r.whole_tps)} | {_g(mem)} | {_g(ratio)} | "
                     f"{'' if r.results is None else r.results} | {note} |")
    return "\n".join(lines)



def _save(plt, fig, ax, path, paths: list) -> None:
    """Write a plot to ``path`` (appended to ``paths``) unless it has no line: a run
    without band S = 64 on uniform keys has nothing to draw."""
    if ax.lines:
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
        paths.append(path)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    plt.close(fig)

def plot(records: list[PeerResult], out_dir: Path, tag: str) -> list[Path]:
    """Throughput vs window size (band S=64 uniform) and vs selectivity (largest W), log scale."""
    import matplotlib

    out_dir.mkdir(parents=True, exist_ok=True)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def rate(r):
        return r.steady_tps or r.whole_tps

    paths = []
    peers = sorted({r.peer for r in records if rate(r)})
    whole = {r.peer for r in records if r.whole_tps and not r.steady_tps}

    def label(p):
        return f"{p} (whole file)" if p in whole else p

    def style(pts):
        st = {s for *_, s in pts}
        return "--" if "extrapolated" in st else ":" if "bounded" in st else "-"

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in peers:
        pts = sorted((r.window, rate(r), r.status) for r in records
                     if r.peer == p and r.workload == "band S=64 uniform" and rate(r))
        if pts:
            ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], marker="o", label=label(p),
                    linestyle=style(pts))
    ax.set(xscale="log", yscale="log", xlabel="window size W per stream (tuples)",
           ylabel="input tuples/s",
           title="Band join, S = 64, uniform keys\n(dotted: bounded probe runs at large W; "
                 "dashed: extrapolated)")
    _save(plt, fig, ax, out_dir / f"peers_window{tag}.png", paths)

    def sel_ws(w):
        return {r.workload for r in records if r.window == w and r.workload.startswith("band S=")
                and r.workload.endswith(" uniform")}

    # the largest W that has the most selectivities
    wmax = max({r.window for r in records}, key=lambda w: (len(sel_ws(w)), w))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in peers:
        pts = []
        for r in records:
            if r.peer == p and r.window == wmax and r.workload.startswith("band S=") \
                    and r.workload.endswith(" uniform") and rate(r):
                s = float(r.workload.split("=")[1].split()[0])
                pts.append((s, rate(r), r.status))
        pts.sort()
        if pts:
            ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], marker="o", label=label(p),
                    linestyle=style(pts))
    ax.set(xscale="log", yscale="log", xlabel="selectivity S (matches per probe tuple)",
           ylabel="input tuples/s", title=f"Band join, W = {wmax} per stream, uniform keys")
    _save(plt, fig, ax, out_dir / f"peers_selectivity{tag}.png", paths)
    return paths


def warm_up(cfg: PeerConfig, log=print) -> None:
    """Compile every Numba kernel once (small windows, untimed), so no run pays for JIT."""
    small = PeerConfig(windows=[1024], measure=1024, threads=cfg.threads, chunk=512, repeat=1,
                       peers=tuple(p for p in cfg.peers
                                   if p not in ("panjoin-cluster", "spark", "duckdb-range")))
    r = PeerRunner(small, progress=False, log=lambda *_: None)
    for wl in small.workloads():
        r.run_workload(wl)
    del log


def run_peers(cfg: PeerConfig, progress: bool = True, out_json: Path | None = None,
              plot_dir: Path | None = None, tag: str = "", log=print) -> list[PeerResult]:
    from tqdm import tqdm

    log("warming up (JIT compile of every kernel, untimed)")
    warm_up(cfg, log)
    runner = PeerRunner(cfg, progress, log)
    try:
        wls = cfg.workloads()
        for wl in tqdm(wls, desc="workloads", disable=not progress):
            runner.run_workload(wl)
    finally:
        runner.close()
    recs = runner.records
    if out_json is not None:
        out_json.parent.mkdir(parents=True, exist_ok=True)
        meta = {"config": {k: (list(v) if isinstance(v, tuple) else v)
                           for k, v in asdict(cfg).items()},
                "count_check": check_counts(recs) or "all peers that ran agree"}
        out_json.write_text(json.dumps({"meta": meta, "records": [asdict(r) for r in recs]},
                                       indent=1, default=_jsonable))
    if plot_dir is not None:
        plot_dir.mkdir(parents=True, exist_ok=True)
        plot(recs, plot_dir, tag)
    return recs


def load_records(paths) -> list[PeerResult]:
    """Records of several runs' JSON files (e.g. to plot them together); where two files
    hold the same (workload, W, peer), the later file's record counts."""
    out: dict[tuple, PeerResult] = {}
    for p in paths:
        for r in json.loads(Path(p).read_text())["records"]:
            rec = PeerResult(**r)
            out[(rec.workload, rec.window, rec.peer)] = rec
    return list(out.values())


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(type(x))
