"""Cost of one probe tuple per subwindow at small batches, per index (issue 27).

Six subwindows of NSub uniform keys in [0, 2 NSub) each (more than the caches hold), then
calls of m random sorted probe keys (an equi join's bounds) over all six; prints ns a
probe tuple per subwindow, the Python of each call included (as the engine pays it).

    python -m benchmarks.probe_cost                  # hash and bisort, NSub 512K
    python -m benchmarks.probe_cost --index rap --nsub 256K
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from panjoin.semantics import parse_size
from panjoin.subwindow import make_index


def probe_cost(index: str, nsub: int, sizes=(512, 4096, 65536), tables: int = 6,
               seed: int = 1) -> dict[int, float]:
    rng = np.random.default_rng(seed)
    subs = []
    for _ in range(tables):
        ix = make_index(index, nsub)
        for b in range(0, nsub, 1024):
            k = np.sort(rng.integers(0, 2 * nsub, 1024))
            s = np.arange(b, b + 1024, dtype=np.int64)
            ix.insert(k, s, s)
        subs.append(ix)
    z = np.zeros((1, 4), np.int64)
    subs[0].probe(z, z)  # load the kernels
    out = {}
    for m in sizes:
        reps = max(1, 200_000 // m)
        t0 = time.perf_counter()
        for _ in range(reps):
            lo = np.sort(rng.integers(0, 2 * nsub, m))[None, :]
            for ix in subs:
                ix.probe(lo, lo)
        out[m] = (time.perf_counter() - t0) / (reps * m * tables) * 1e9
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", action="append", help="index kind (repeatable; default: "
                    "hash and bisort)")
    ap.add_argument("--nsub", type=parse_size, default=512 * 1024)
    a = ap.parse_args(argv)
    for index in a.index or ["hash", "bisort"]:
        for m, ns in probe_cost(index, a.nsub).items():
            print(f"{index:>8}  NSub {a.nsub:,}  m {m:>6,}: {ns:6.0f} ns a probe tuple per "
                  "subwindow", flush=True)


if __name__ == "__main__":
    main()
