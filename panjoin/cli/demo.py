"""``panjoin demo``: the join alone through a local cluster (no Kafka or Spark):
generate a stream, band-join it with about one match per tuple, print the rate.
``make demo`` runs the Kafka path (:mod:`spark_conn.demo`).
"""

from __future__ import annotations

import time

from panjoin.cli.options import add_common, progress, size
from panjoin.config import DEFAULT_INDEX, INDEX_CHOICES
from panjoin.memory import fmt_bytes


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="the join alone through a local cluster, no Kafka or "
                                    "Spark (`make demo` runs the Kafka path)")
    p.add_argument("--n", type=size, default=3 << 20, help="tuples in all (default: 3M)")
    p.add_argument("--index", default=DEFAULT_INDEX, choices=INDEX_CHOICES)
    p.add_argument("--window", type=size, default=1 << 20, help="count window per stream")
    p.add_argument("--workers", type=int, default=2,
                   help="worker processes of the local cluster; 0 runs in-process (default: 2)")
    add_common(p)
    p.set_defaults(run=run)


def run(args) -> int:
    """Generate a stream, band-join it with selectivity about 1, print throughput."""
    from panjoin.generate import band_for_selectivity, generate
    from panjoin.manager.grpc_backend import GrpcBackend

    key_max = 1 << 40
    print(f"PanJoin demo: {args.n:,} tuples (uniform keys, half R, half S), "
          f"count window {args.window:,} per stream, index {args.index}")
    events = generate(args.n, "uniform", key_min=0, key_max=key_max, seed=42)
    e = band_for_selectivity(1.0, args.window, 0, key_max)
    pred = f"band:{int(e)}"
    warming = "warming up: compiling the kernels once (cached on disk for later runs)"
    if args.workers <= 0:
        from panjoin.manager.engine import warm_up

        print(warming)
        warm_up(args.index)
        return _demo_run(args, events, pred, None, 1)
    from panjoin.launch import start_cluster

    with start_cluster(args.workers, manager=False) as cluster:
        print(f"local cluster: {len(cluster.workers)} worker processes at "
              f"{', '.join(cluster.addresses)}")
        print(warming)
        cluster.warm_up(args.index)
        with GrpcBackend(cluster.addresses) as backend:
            return _demo_run(args, events, pred, backend, args.workers)


def _demo_run(args, events, pred, backend, n_workers) -> int:
    from panjoin.manager.engine import JoinEngine

    engine = JoinEngine(f"count:{args.window},{args.window}", pred, index=args.index,
                        batch_size=32768, backend=backend, n_workers=n_workers)
    print(f"predicate {pred} (about 1 match per tuple), NSub {engine.nsub:,}, "
          f"P {engine.partitions:,}, NBat {engine.batch_size:,}")
    n_results = 0
    step = 1 << 18
    t0 = time.perf_counter()
    with progress(len(events), "join", args.no_progress) as bar:
        for start in range(0, len(events), step):
            chunk = events.slice(start, min(len(events), start + step))
            engine.push(chunk)
            n_results += len(engine.take_results()[0])
            bar.update(len(chunk))
        engine.flush()
        n_results += len(engine.take_results()[0])
    elapsed = time.perf_counter() - t0
    print(f"results: {n_results:,} pairs ({n_results / len(events):.2f} per input tuple)")
    print(f"throughput: {len(events) / elapsed:,.0f} input tuples/s ({elapsed:.2f} s)")
    print(f"window memory: {fmt_bytes(engine.memory_bytes())}")
    return 0
