"""The router of a join sharded over K managers (``panjoin/sharding.py``), per tuple.

In one process, alternated round by round on the same chunks: ``Router.route`` (its
kernel passes, :mod:`panjoin.sharding_kernels`) against the rule written out in numpy
(``late_mask``, ``shard_of`` for R, ``s_targets`` for S, a ``nonzero`` per shard: what
``route`` ran before), both producing the same rows (checked). Uniform int keys, one
tuple a millisecond, an equi join and ``band:10`` on a time window, K = 2 and 4, chunks
of 256K rows (what ``panjoin replay --cluster A,B`` routes). The figure is ns a tuple,
one thread; the client's routing is this plus gathering each shard's columns. Example::

    python -m benchmarks.routing --quick          # 1M tuples, one round
    python -m benchmarks.routing --tuples 4M --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from panjoin.cli.options import size
from panjoin.generate import generate
from panjoin.semantics import STREAMS, late_mask, parse_predicate, parse_window
from panjoin.sharding import Router, boundaries, s_targets, shard_of

CHUNK = 1 << 18
WINDOW = "time:2000,2000"


def numpy_route(state: dict, bounds, pred, lateness, stream, keys, ts):
    """The rule in numpy, as ``Router.route`` ran it before its kernel."""
    late, state["maxts"] = late_mask(ts, state.get("maxts"), lateness)
    is_r = stream == 0
    owner = shard_of(bounds, keys)
    s_rows = np.flatnonzero(~is_r & ~late)
    to = np.zeros((bounds.size + 1, stream.size), dtype=bool)
    to[:, s_rows] = s_targets(bounds, pred, keys[s_rows])
    rows = [np.flatnonzero(to[j] | (is_r & ~late & (owner == j))) for j in range(bounds.size + 1)]
    return rows, {name: np.flatnonzero(late & (stream == x)) for x, name in enumerate(STREAMS)}


def one(events, k: int, spec: str) -> tuple[float, float]:
    """(kernel s, numpy s) over all chunks, the same rows from both."""
    pred = parse_predicate(spec)
    window = parse_window(WINDOW)
    bounds = boundaries(events.key, k)
    router, state = Router(bounds, window, pred), {}
    t_kernel = t_numpy = 0.0
    for a in range(0, len(events), CHUNK):
        s, kk, ts = (c[a:a + CHUNK] for c in (events.stream, events.key, events.ts))
        t0 = time.perf_counter()
        got = router.route(s, kk, ts)
        t1 = time.perf_counter()
        want, late = numpy_route(state, bounds, pred, window.lateness, s, kk, ts)
        t2 = time.perf_counter()
        t_kernel += t1 - t0
        t_numpy += t2 - t1
        assert all(np.array_equal(x, y) for x, y in zip(got.rows, want, strict=True))
        assert all(np.array_equal(got.late[n], late[n]) for n in STREAMS)
    return t_kernel, t_numpy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tuples", type=size, default=4 << 20, help="tuples (default: 4M)")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds (default: 3)")
    ap.add_argument("--quick", action="store_true", help="1M tuples, one round")
    args = ap.parse_args()
    n, rounds = (1 << 20, 1) if args.quick else (args.tuples, args.rounds)
    events = generate(n, "uniform", key_max=n // 2, rate=1000, seed=1)
    one(events.slice(0, CHUNK), 2, "eq")  # the kernels loaded (or compiled) first
    print(f"| predicate | K | kernel ns/tuple | numpy ns/tuple | numpy / kernel |  ({n:,} tuples, "
          f"chunks of {CHUNK:,}, medians of {rounds})")
    print("|---|---|---|---|---|")
    for spec in ("eq", "band:10"):
        for k in (2, 4):
            runs = [one(events, k, spec) for _ in range(rounds)]
            kern = statistics.median(r[0] for r in runs) / n * 1e9
            nump = statistics.median(r[1] for r in runs) / n * 1e9
            print(f"| {spec} | {k} | {kern:.1f} | {nump:.1f} | {nump / kern:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
