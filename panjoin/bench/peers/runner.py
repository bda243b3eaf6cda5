"""Running and timing the peers on every workload, and checking that they agree.

:func:`run_peers` warms every kernel up, then :class:`PeerRunner` runs each workload:
it plans each peer (full, bounded, extrapolated or skipped), runs the timed peers in
``repeat`` interleaved rounds keeping each one's best, and flags a peer whose pairs
change between rounds. :func:`_stream` drives a streaming peer's adapter chunk by
chunk, times the fill and the steady part apart and folds the pairs into a
:class:`~panjoin.bench.peers.digest.PairDigest` (its folding time taken off).
Across peers, :func:`~panjoin.bench.peers.results.check_results` compares the pairs.

The offline engines (DuckDB, Polars, DataFusion) run in a child process of their own
(:func:`offline_pool`), unless ``PeerConfig.isolate`` is off: DuckDB hands the glibc
heap back to the kernel after a query (``malloc_trim``), and a PanJoin round after it
in the same process faults its arrays in again (at W = 256K, 16M tuples/s against 23M
after a ``malloc_trim(0)`` alone, and rounds of 6M). Each peer times itself where it
runs; the file is sent to the child untimed.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from panjoin.bench.peers.adapters import (
    BAND_AS,
    DEFAULT_THREADS_PEERS,
    OFFLINE_PEERS,
    _EngineOp,
    _SHJOp,
    _spark_peer,
    engine_op,
)
from panjoin.bench.peers.config import PeerConfig
from panjoin.bench.peers.digest import PairDigest
from panjoin.bench.peers.report import plot, save_records
from panjoin.bench.peers.results import PeerResult
from panjoin.bench.peers.workloads import Data, Workload, calibrate, events_for

_OFFLINE_POOL: ProcessPoolExecutor | None = None


def offline_pool() -> ProcessPoolExecutor:
    """The one child process that runs the offline engines, for the whole run (started
    on first use, with this process's environment, so POLARS_MAX_THREADS holds there
    too): its heap is theirs, and the warm-up's queries warm it for the timed ones."""
    global _OFFLINE_POOL
    if _OFFLINE_POOL is None:
        import multiprocessing

        _OFFLINE_POOL = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        atexit.register(_OFFLINE_POOL.shutdown)
    return _OFFLINE_POOL


_DEFAULT_THREADS_POOL: ProcessPoolExecutor | None = None


def _unpin_threads() -> None:
    """In the default-threads child, before polars is imported there: no pinned pool size."""
    os.environ.pop("POLARS_MAX_THREADS", None)


def default_threads_pool() -> ProcessPoolExecutor:
    """The child process of the offline peers that run at their engine's default threads
    (:data:`DEFAULT_THREADS_PEERS`): Polars sizes its pool once per process, so these
    cannot share a process with the one-thread peers, isolated or not."""
    global _DEFAULT_THREADS_POOL
    if _DEFAULT_THREADS_POOL is None:
        import multiprocessing

        _DEFAULT_THREADS_POOL = ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn"), initializer=_unpin_threads)
        atexit.register(_DEFAULT_THREADS_POOL.shutdown)
    return _DEFAULT_THREADS_POOL


def _default_threads(package: str) -> int:
    """The threads an engine runs with when not told: Polars' pool size; DataFusion's
    target partitions default to the CPUs this process may use (Rust's num_cpus: the
    affinity mask and the cgroup quota, as :func:`panjoin.cpus.available_cpus`)."""
    if package == "polars":
        import polars as pl

        return pl.thread_pool_size()
    from panjoin.cpus import available_cpus

    return available_cpus()


def _offline_run(peer: str, wl: Workload, data: Data,
                 threads: int) -> tuple[int, str, float, int]:
    """One offline peer's join of the whole file: ``(pairs, digest, seconds, threads)``;
    a :data:`DEFAULT_THREADS_PEERS` peer ignores ``threads`` and says what it ran with."""
    run, plan, package = OFFLINE_PEERS[peer]
    if peer in DEFAULT_THREADS_PEERS:
        threads = None
    digest, secs = run(wl, data, threads, plan)
    used = _default_threads(package) if threads is None else threads
    return digest.count, digest.hex(), secs, used


def _stream(op, data: Data, fill: int, chunk: int, bar=None, bounded: bool = False) -> dict:
    """Push the whole file in chunks; time the fill and the measured part apart.
    ``bounded``: the fill only inserts (nothing joined, untimed); the rest is timed.
    Every chunk's pairs are folded into a :class:`PairDigest` and dropped (the result
    is ``results``, the pair count, and ``pair_digest``); the folding's time is taken
    off both timed spans."""
    n = len(data)
    digest, mem = PairDigest(), 0
    folded = 0.0  # digest.seconds when the steady part begins
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
            t_fill, folded = time.perf_counter(), digest.seconds
        b = min(n, a + chunk)
        digest.add(*op.push(data.slice(a, b)))
        mem = max(mem, op.memory())
        if bar is not None:
            bar.update(b - a)
    digest.add(*op.finish())
    mem = max(mem, op.memory())
    t1 = time.perf_counter()
    if t_fill is None:
        t_fill, folded = t1, digest.seconds
    steady = t1 - t_fill - (digest.seconds - folded)
    whole = t1 - t0 - digest.seconds
    res = dict(results=digest.count, pair_digest=digest.hex())
    if bounded:
        return dict(res, steady_tps=(n - fill) / max(steady, 1e-9), seconds=steady,
                    memory_bytes=int(mem))
    return dict(res, steady_tps=(n - fill) / max(steady, 1e-9), whole_tps=n / whole,
                seconds=whole, memory_bytes=int(mem))


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
        elif peer in OFFLINE_PEERS:
            args = (peer, wl, data, self.cfg.threads)
            own = peer in DEFAULT_THREADS_PEERS
            rec.results, rec.pair_digest, rec.seconds, n = (
                default_threads_pool().submit(_offline_run, *args).result() if own
                else offline_pool().submit(_offline_run, *args).result() if self.cfg.isolate
                else _offline_run(*args))
            if bar is not None:
                bar.update(len(events))
            rec.whole_tps = len(events) / rec.seconds
            rec.note = f"offline, pairs fetched, {n} thread{'s' if n != 1 else ''}" + (
                " (the engine's default)" if own else "") + (
                f", band as {BAND_AS[OFFLINE_PEERS[peer][1]]}" if wl.pred != "eq" else "") + (
                ", y band in the filter" if wl.residual else "") + (
                "" if self.cfg.isolate or own else ", in PanJoin's process")
            return rec
        elif peer == "spark":
            digest = PairDigest()
            count, secs = self.spark(events, wl.window_spec(), wl.predicate(),
                                     on_pairs=digest.add)
            secs -= digest.seconds  # the check's folding, not Spark's join
            if count != digest.count:
                raise RuntimeError(f"spark counted {count} pairs but handed {digest.count}")
            rec.results, rec.pair_digest, rec.seconds = count, digest.hex(), secs
            rec.whole_tps = len(events) / secs
            rec.note = "pairs fetched to the driver as Arrow"
            return rec
        else:
            raise ValueError(f"unknown peer {peer!r}; choose from {', '.join(self.cfg.peers)}")
        if getattr(op, "note", ""):
            rec.note = f"{op.note}; {rec.note}" if rec.note else op.note
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
        if peer in OFFLINE_PEERS:
            package = OFFLINE_PEERS[peer][2]
            if importlib.util.find_spec(package) is None:
                why = f"{package} is not installed (pip install -e '.[peers]')"
                self._say_once(f"{peer}: skipped: {why}")
                return PeerResult(wl.name, wl.window, peer, "skipped", why)
        limit = self._limit(peer, wl)
        if limit is not None and wl.window > limit:
            if peer in OFFLINE_PEERS or wl.window > self.cfg.bounded_max \
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
                # every round that ran must find the pairs of the first, faster or not
                if old is not None and rec.results is not None and \
                        (rec.results, rec.pair_digest) != (old.results, old.pair_digest):
                    rec.status, rec.note = "failed", (
                        f"result pairs changed between rounds: {old.results} "
                        f"({old.pair_digest}) then {rec.results} ({rec.pair_digest})")
                    best[peer] = rec
                elif old is None or _rate(rec) > _rate(old):
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

    # Polars sizes its thread pool once, at import, from POLARS_MAX_THREADS: give it the
    # peers' threads (unless the variable says otherwise, which the polars peer then
    # reports as a failure rather than run with another count)
    os.environ.setdefault("POLARS_MAX_THREADS", str(cfg.threads))
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
        save_records(out_json, cfg, recs)
    if plot_dir is not None:
        plot_dir.mkdir(parents=True, exist_ok=True)
        plot(recs, plot_dir, tag)
    return recs
