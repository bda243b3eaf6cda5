"""The engine alone, closed loop: ns a tuple at a fixed batch size (issue 27).

One process pushes N uniform tuples (keys in [0, 1M], streams at random) into a
``JoinEngine`` in chunks of 1M and takes the results as it goes, after a warm-up join
of 64K tuples that loads the kernels; prints ns a tuple (the window's fill included)
and ms a batch. ``--profile`` prints cProfile's top functions instead of nothing::

    python -m benchmarks.closed_loop --window 1M --batch-size 2K --subwindow-size 512K
    python -m benchmarks.closed_loop --window 1M --batch-size 2K --profile tottime
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np

from panjoin.manager.engine import JoinEngine
from panjoin.semantics import Window, parse_size


def run(w: int, nbat: int, index: str, nsub: int, n: int, data) -> tuple[float, JoinEngine]:
    stream, ids, keys, ts = data
    eng = JoinEngine(Window("count", w, w), "eq", index=index, subwindow_size=nsub,
                     batch_size=nbat, threads=1)
    t = time.perf_counter()
    for a in range(0, n, 1 << 20):
        b = min(n, a + (1 << 20))
        eng.push_arrays(stream[a:b], ids[a:b], keys[a:b], ts[a:b])
        eng.take_results(wait=False)
    eng.flush()
    eng.collect()
    eng.take_results()
    return time.perf_counter() - t, eng


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=parse_size, default=1 << 20, help="count window W")
    ap.add_argument("--batch-size", type=parse_size, default=2048)
    ap.add_argument("--index", default="hash")
    ap.add_argument("--subwindow-size", type=parse_size, default=None,
                    help="NSub (default W/2)")
    ap.add_argument("--n", type=parse_size, default=4 << 20, help="tuples pushed")
    ap.add_argument("--profile", metavar="SORT", help="cProfile, sorted by SORT")
    a = ap.parse_args(argv)
    nsub = a.subwindow_size or max(a.window // 2, 1024)
    rng = np.random.default_rng(1)
    data = (rng.integers(0, 2, a.n).astype(np.uint8), np.arange(a.n, dtype=np.int64),
            rng.integers(0, 1 << 20, a.n).astype(np.int64), np.arange(a.n, dtype=np.int64))
    run(a.window, a.batch_size, a.index, nsub, 1 << 16, data)  # load the kernels
    if a.profile:
        pr = cProfile.Profile()
        pr.enable()
        dt, eng = run(a.window, a.batch_size, a.index, nsub, a.n, data)
        pr.disable()
        pstats.Stats(pr).sort_stats(a.profile).print_stats(40)
    else:
        dt, eng = run(a.window, a.batch_size, a.index, nsub, a.n, data)
    print(f"W {a.window} NSub {nsub} NBat {a.batch_size} {a.index}: {dt / a.n * 1e9:.0f} ns a "
          f"tuple, {dt / (a.n / a.batch_size) * 1e3:.3f} ms a batch, {eng.stats.results} pairs")


if __name__ == "__main__":
    main()
