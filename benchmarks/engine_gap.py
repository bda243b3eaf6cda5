"""Why the engine alone on ``cli_vs_polars``' file runs below ``bench peers``' "eq
uniform" figure at the same W (issue 31, item 4): the two setups differ one step at
a time, each step timed in the same process, warm, alternated round by round.

``bench peers`` joins a file of 3W tuples (2W fill both windows, then W measured),
keys uniform in [0, W], with one thread, NSub = NBat = W, chunks of 64K, and reports
the whole file's rate; ``cli_vs_polars`` joins n tuples (n / 2 per stream, keys in
[0, n / 8]: at 2M the same [0, 256K]) with replay's knobs (NSub W, NBat W / 2), the
default threads and chunks of 1M. Example::

    python -m benchmarks.engine_gap u2097152.parquet --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def _run(ev, w: int, threads: int, nbat: int, chunk: int, skip: int = 0) -> tuple[float, int]:
    """Tuples/s over the file after its first ``skip`` tuples (joined, untimed)."""
    from panjoin.manager.engine import JoinEngine

    eng = JoinEngine(f"count:{w},{w}", "eq", index="bisort", subwindow_size=w,
                     batch_size=nbat, threads=threads)
    n = 0
    t0 = None
    for a in range(0, len(ev), chunk):
        if a >= skip and t0 is None:
            t0 = time.perf_counter()
        eng.push(ev.slice(a, min(len(ev), a + chunk)))
        n += sum(int(p[0].size) for p in eng.take_result_pieces(wait=False))
    eng.flush()
    n += sum(int(p[0].size) for p in eng.take_result_pieces())
    return (len(ev) - skip) / (time.perf_counter() - t0), n


def main(argv=None) -> int:
    from panjoin.events import read_events
    from panjoin.generate import generate
    from panjoin.manager.engine import warm_up

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("events", help="cli_vs_polars' file (e.g. u2097152.parquet)")
    ap.add_argument("--window", type=int, default=1 << 18, help="W per stream (256K)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    w = args.window
    mine = read_events(args.events)
    peers = generate(3 * w, "uniform", key_min=0, key_max=w, seed=0, rate=1_000_000)
    warm_up()
    cases = {  # name: (file, threads, NBat, chunk, tuples skipped)
        "file, replay's: 2 threads, NBat W/2, chunk 1M": (mine, 2, w // 2, 1 << 20, 0),
        "file, 1 thread, NBat W/2, chunk 1M": (mine, 1, w // 2, 1 << 20, 0),
        "file, 1 thread, NBat W, chunk 64K (peers' knobs)": (mine, 1, w, 1 << 16, 0),
        "file, peers' knobs, after the first 2W": (mine, 1, w, 1 << 16, 2 * w),
        "peers' 3W file, peers' knobs (its whole-file rate)": (peers, 1, w, 1 << 16, 0),
        "peers' 3W file, peers' knobs, after the 2W fill": (peers, 1, w, 1 << 16, 2 * w),
        "peers' 3W file, 2 threads, NBat W/2, chunk 1M": (peers, 2, w // 2, 1 << 20, 0),
    }
    rates = {k: [] for k in cases}
    pairs = {}
    for _ in range(args.rounds):
        for name, c in cases.items():
            r, n = _run(c[0], w, *c[1:])
            rates[name].append(r)
            pairs[name] = n
    print(f"{len(mine):,} tuples in the file, W = {w:,}; median of {args.rounds} rounds")
    print("| setup | M tuples/s (median) | min-max | pairs |")
    print("|---|---:|---:|---:|")
    for name, r in rates.items():
        print(f"| {name} | {statistics.median(r) / 1e6:.2f} | {min(r) / 1e6:.2f}-"
              f"{max(r) / 1e6:.2f} | {pairs[name]:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
