"""The system benchmark: end-to-end input tuples/s of a local cluster against the in-process engine.

A band join with about S matches per tuple over count windows of W tuples per
stream. Each run first fills both windows (untimed), then times the next
``measure`` tuples pushed in chunks, so the figure is the sustained rate with
full windows, subwindows expiring as they would in production. The same data
goes through the in-process engine in the same run, and the ratio of the two
rates is the cluster's overhead.

With null workers (``panjoin worker --null``: they hold nothing and answer every
probe empty) the same run measures the manager alone: its tuples/s ceiling and
its CPU-seconds per million tuples, everything it does for a real cluster
(batching, sorting, probe bounds, encoding, gRPC) but the join itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from panjoin.generate import band_for_selectivity, generate
from panjoin.manager.engine import JoinEngine

KEY_MAX = 1 << 40


@dataclass
class SystemPoint:
    workers: int = 2
    window: int = 1 << 20
    batch: int = 32768
    index: str = "bisort"
    selectivity: float = 1.0
    measure: int = 1 << 21
    threads: int = 1
    seed: int = 0
    result_format: str = "pairs"  # BI-Sort on the cluster: "ranges" uses the manager's mirror
    replicas: int = 2  # copies of each subwindow on the cluster
    null_workers: bool = False  # workers that hold nothing: the manager's own ceiling


def _index_seconds(backend) -> float:
    """Seconds spent in the index commands so far: the in-process index's time (one
    thread, so CPU), or the CPU the workers reported for this join's commands."""
    if hasattr(backend, "sessions"):
        return sum(s.busy_s for s in backend.sessions)
    return backend.stats.insert_s + backend.stats.probe_s


def _run(point: SystemPoint, events, backend, n_workers: int, progress=None,
         costs: dict | None = None) -> float:
    e = int(band_for_selectivity(point.selectivity, point.window, 0, KEY_MAX))
    eng = JoinEngine(f"count:{point.window},{point.window}", f"band:{e}", index=point.index,
                     batch_size=point.batch, backend=backend, n_workers=n_workers,
                     threads=point.threads)
    fill = 2 * point.window
    step = 1 << 18
    for a in range(0, fill, step):
        eng.push(events.slice(a, min(fill, a + step)))
        eng.take_results()
    if hasattr(eng.backend, "sync"):
        eng.backend.sync()
    t0, c0, i0 = time.perf_counter(), time.process_time(), _index_seconds(eng.backend)
    for a in range(fill, len(events), step):
        eng.push(events.slice(a, min(len(events), a + step)))
        eng.take_results()
        if progress is not None:
            progress.update(min(step, len(events) - a))
    eng.flush()
    eng.take_results()
    if hasattr(eng.backend, "sync"):
        eng.backend.sync()
    if costs is not None:  # this process's CPU-seconds: the manager's, on a cluster
        costs["process_cpu_s"] = time.process_time() - c0
        costs["index_s"] = _index_seconds(eng.backend) - i0
    return (len(events) - fill) / (time.perf_counter() - t0)


def system_events(point: SystemPoint):
    """The point's data: both windows' fill plus the timed tuples."""
    return generate(2 * point.window + point.measure, "uniform", key_min=0, key_max=KEY_MAX,
                    seed=point.seed)


def run_system(point: SystemPoint, progress: bool = False, events=None,
               addresses: list[str] | None = None, costs: dict | None = None
               ) -> tuple[float, float]:
    """(cluster tuples/s, in-process tuples/s) on the same generated data. ``addresses``
    reuses running workers (a sweep); otherwise the point starts and stops its own.
    ``costs`` gets, for the timed part, ``local`` and ``cluster``: this process's
    CPU-seconds (in-process: everything; cluster: the manager's) and ``index_s``
    (in-process: time in the index commands; cluster: the workers' CPU for them)."""
    from contextlib import nullcontext

    from tqdm import tqdm

    from panjoin.launch import start_cluster
    from panjoin.manager.grpc_backend import GrpcBackend

    events = system_events(point) if events is None else events
    with tqdm(total=2 * point.measure, disable=not progress, unit="tuples",
              unit_scale=True, desc="system") as bar:
        local_costs: dict = {}
        local = _run(point, events, None, 1, bar, local_costs)
        extra = [["--null"] if point.null_workers else [] for _ in range(point.workers)]
        cluster_costs: dict = {}
        with (start_cluster(point.workers, point.threads, manager=False, worker_args=extra)
              if addresses is None else nullcontext()) as started:
            with GrpcBackend(addresses or started.addresses, result_format=point.result_format,
                             replicas=point.replicas) as backend:
                cluster = _run(point, events, backend, point.workers, bar, cluster_costs)
    if costs is not None:
        costs.update(local=local_costs, cluster=cluster_costs)
    return cluster, local
