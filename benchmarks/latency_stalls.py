"""Where an in-process latency run's stalls come from (issue 27).

One open-loop run of ``panjoin bench latency`` (count window 1M per stream, equi,
uniform keys, ``--max-latency``), with every engine batch timed and split into what it
did (subwindows created and expired, inserts, probes, collecting answers), the page
faults it took, and the garbage collector's full collections during the run. Prints the
run's line, then the batches over ``--slow`` ms and the full collections::

    python -m benchmarks.latency_stalls --rate 1M            # batches over 4 ms
    python -m benchmarks.latency_stalls --rate 500K --slow 10 --no-freeze

``--no-freeze`` leaves the startup heap in the collector's view (the engine freezes it
under a latency bound, :func:`panjoin.config.freeze_heap`).
"""

from __future__ import annotations

import argparse
import gc
import resource
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="1M", help="tuples/s (default: 1M)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--max-latency", type=float, default=5.0)
    ap.add_argument("--index", default="auto")
    ap.add_argument("--slow", type=float, default=4.0, help="list batches over this (ms)")
    ap.add_argument("--no-freeze", action="store_true")
    args = ap.parse_args(argv)

    import panjoin.config
    from panjoin.bench.latency import HEAD_S, TAIL_S, EngineTarget, run_open_loop
    from panjoin.generate import generate
    from panjoin.manager.engine import JoinEngine, warm_up
    from panjoin.semantics import parse_size

    if args.no_freeze:
        panjoin.config._HEAP_FROZEN = True  # as if done: nothing frozen
    rate = float(parse_size(args.rate))
    warm_up(args.index)
    fill = 2 << 20
    ev = generate(fill + int(rate * (HEAD_S + args.seconds + TAIL_S)), "uniform",
                  key_max=1_000_000, seed=1)
    eng = JoinEngine("count:1M,1M", "eq", index=args.index, max_latency_ms=args.max_latency)

    full: list[tuple[float, float]] = []  # (start, seconds) of each full collection
    started = [0.0]

    def on_gc(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        elif info["generation"] == 2:
            full.append((started[0], time.perf_counter() - started[0]))

    gc.callbacks.append(on_gc)
    parts = {"create": 0.0, "expire": 0.0, "insert": 0.0, "probe": 0.0}

    def timed(obj, name, key):
        f = getattr(obj, name)

        def g(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                parts[key] += time.perf_counter() - t
        setattr(obj, name, g)

    timed(eng.backend, "create", "create")
    timed(eng.backend, "expire", "expire")
    timed(eng.backend, "insert", "insert")
    timed(eng.backend, "probe_many", "probe")
    batches = []
    process = eng._process_batch

    def each_batch(x, since=None):
        n = eng.buffers[x].n
        for k in parts:
            parts[k] = 0.0
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = time.perf_counter()
        process(x, since)
        d = time.perf_counter() - t
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        batches.append((t, n, d, faults, dict(parts)))

    eng._process_batch = each_batch
    res = run_open_loop(ev, fill, rate, EngineTarget(eng))
    gc.callbacks.remove(on_gc)
    print(res.line())
    t0 = batches[0][0] if batches else 0.0
    for t, n, d, faults, p in batches:
        if d * 1000.0 > args.slow:
            split = " ".join(f"{k} {v * 1000:.2f}" for k, v in p.items())
            print(f"  t {t - t0:7.3f} s  batch of {n:6d}  {d * 1000:7.2f} ms  ({split}; "
                  f"{faults} page faults)")
    print("full collections (t s, ms):",
          [(round(t - t0, 3), round(d * 1000, 1)) for t, d in full])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
