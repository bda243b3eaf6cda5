"""The hash table's lookup kernel before and after its rows became one record (issue 27).

The kernels of two trees (``--base``: a checkout of the commit before, whose rows are
three columns ``seq``, ``ts``, ``nxt``; this tree's: one ``(seq, ts, nxt)`` record a
row) look up the same keys in the same three 512K-row tables, alternated in one process
(the machine's load hits both alike); prints the median ns a lookup and the median of
the pairwise ratios, for windowless (NONE) and count-filtered (COUNT) probes::

    git worktree add --detach /tmp/base 84d819f
    python -m benchmarks.hash_kernel_ab --base /tmp/base
"""

import argparse
import importlib.util
import time

import numpy as np

from panjoin.subwindow.kernels import hash as new
from panjoin.subwindow.kernels.window import COUNT, NONE

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--base", required=True, help="checkout whose kernels/hash.py is the 'before'")
ap.add_argument("--rounds", type=int, default=7)
args = ap.parse_args()
spec = importlib.util.spec_from_file_location(
    "oldhash", f"{args.base}/panjoin/subwindow/kernels/hash.py")
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
rng = np.random.default_rng(1)
NS, T = 1 << 19, 3  # three tables of 512K rows: far more than the caches hold
tabs = []
for t in range(T):
    nslots = 1 << max(4, int(2 * NS - 1).bit_length())
    shift = 64 - (nslots.bit_length() - 1)
    keys = rng.integers(0, 1 << 20, NS)
    seq = np.arange(t * NS, (t + 1) * NS, dtype=np.int64)
    ts = seq.copy()
    so, sn = np.zeros(2 * nslots, np.int64), np.zeros(2 * nslots, np.int64)
    nxt = np.empty(NS, np.int64)
    rows = np.empty((NS, 3), np.int64)
    stored = np.empty(NS, np.int64)
    rows[:, 0], rows[:, 1] = seq, ts
    for a in range(0, NS, 4096):
        old.hash_insert(so, shift, nxt, keys[a:a + 4096], a, 4096)
        new.hash_insert(sn, shift, rows, stored, keys[a:a + 4096],
                        keys[a:a + 4096], ts[a:a + 4096], seq[a:a + 4096], a)
    assert (rows[:, 2] == nxt).all()
    tabs.append((shift, so, sn, nxt, ts, seq, rows))


def run(which, m, mode, reps):
    """ns a lookup of ``reps`` calls of m sorted uniform keys over every table."""
    t0 = time.perf_counter()
    for _ in range(reps):
        pb, pi = np.sort(rng.integers(0, 1 << 20, m)), np.arange(m)
        # COUNT: the oldest half of the first table is out of every probe's window
        c0, c1, c2 = np.full(m, NS // 2), np.full(m, 10 * NS), np.full(m, 10 * NS)
        for shift, so, sn, nxt, ts, seq, rows in tabs:
            if which == "old":
                old.hash_lookup(so, shift, nxt, ts, seq, pb, pi, mode, c0, c1, c2)
            else:
                new.hash_lookup(sn, shift, rows, pb, pi, mode, c0, c1, c2)
    return (time.perf_counter() - t0) / (reps * m * T) * 1e9


for w in ("old", "new"):  # load both kernels
    run(w, 1024, NONE, 2)
    run(w, 1024, COUNT, 2)
res = {}
for r in range(args.rounds):
    for m in (1024, 4096):
        for mode, mn in ((NONE, "none"), (COUNT, "count")):
            for w in (("old", "new") if r % 2 == 0 else ("new", "old")):
                res.setdefault((m, mn, w), []).append(run(w, m, mode, max(1, 300_000 // m)))
for m in (1024, 4096):
    for mn in ("none", "count"):
        o, n = res[(m, mn, "old")], res[(m, mn, "new")]
        ratios = [b / a for a, b in zip(o, n, strict=True)]
        print(f"m {m} {mn:5s}: before {np.median(o):.0f}, after {np.median(n):.0f} ns a lookup; "
              f"after / before {np.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})")
