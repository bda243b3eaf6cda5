"""The hash table's kernels of two checkouts, side by side (issue 27).

The kernels of ``--base`` (a checkout with the same kernel signatures, e.g. 46b2f93:
each lookup walked by one of sixteen lanes visited in turn) and this tree's (lookups
in passes over a frontier, twelfth session) build the same three 512K-row tables and
look up the same keys, alternated in one process (the machine's load hits both
alike); prints the median ns an insert and a lookup, and the median of the pairwise
ratios, for windowless (NONE) and count-filtered (COUNT) probes. (Until the twelfth
session this script compared the three-column rows with one record a row, at 84d819f;
its figures are in benchmarks/RESULTS.md with that commit.)::

    git worktree add --detach /tmp/base 46b2f93
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
KERNELS = {"old": old, "new": new}
rng = np.random.default_rng(1)
NS, T = 1 << 19, 3  # three tables of 512K rows: far more than the caches hold
NSLOTS = 1 << max(4, int(2 * NS - 1).bit_length())
SHIFT = 64 - (NSLOTS.bit_length() - 1)
KEYS = [rng.integers(0, 1 << 20, NS) for _ in range(T)]


def build(which):
    """The three tables built by ``which``'s insert, and its ns an insert (4K batches)."""
    k = KERNELS[which]
    tabs, t = [], 0.0
    for i, keys in enumerate(KEYS):
        seq = np.arange(i * NS, (i + 1) * NS, dtype=np.int64)
        slots, rows = np.zeros(2 * NSLOTS, np.int64), np.zeros((NS, 3), np.int64)
        stored = np.empty(NS, np.int64)
        t0 = time.perf_counter()
        for a in range(0, NS, 4096):
            b = a + 4096
            k.hash_insert(slots, SHIFT, rows, stored, keys[a:b], keys[a:b], seq[a:b],
                          seq[a:b], a)
        t += time.perf_counter() - t0
        tabs.append((slots, rows))
    return tabs, t / (T * NS) * 1e9


def run(which, tabs, m, mode, reps):
    """ns a lookup of ``reps`` calls of m sorted uniform keys over every table."""
    k = KERNELS[which]
    t0 = time.perf_counter()
    for _ in range(reps):
        pb, pi = np.sort(rng.integers(0, 1 << 20, m)), np.arange(m)
        # COUNT: the oldest half of the first table is out of every probe's window
        c0, c1, c2 = np.full(m, NS // 2), np.full(m, 10 * NS), np.full(m, 10 * NS)
        for slots, rows in tabs:
            k.hash_lookup(slots, SHIFT, rows, pb, pi, mode, c0, c1, c2)
    return (time.perf_counter() - t0) / (reps * m * T) * 1e9


built = {w: build(w) for w in ("old", "new")}  # (loads both kernels)
a, b = built["old"][0][0], built["new"][0][0]
assert (a[0] == b[0]).all() and (a[1] == b[1]).all(), "the two inserts build different tables"
for w in ("old", "new"):
    run(w, built[w][0], 1024, NONE, 2)
    run(w, built[w][0], 1024, COUNT, 2)
res = {}
for r in range(args.rounds):
    for w in (("old", "new") if r % 2 == 0 else ("new", "old")):
        res.setdefault(("insert", w), []).append(build(w)[1])
    for m in (1024, 4096):
        for mode, mn in ((NONE, "none"), (COUNT, "count")):
            for w in (("old", "new") if r % 2 == 0 else ("new", "old")):
                res.setdefault((m, mn, w), []).append(
                    run(w, built[w][0], m, mode, max(1, 300_000 // m)))


def show(label, key):
    o, n = res[key + ("old",)], res[key + ("new",)]
    ratios = [y / x for x, y in zip(o, n, strict=True)]
    print(f"{label}: before {np.median(o):.1f}, after {np.median(n):.1f} ns; after / before "
          f"{np.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})")


show("insert, 4K batches", ("insert",))
for m in (1024, 4096):
    for mn in ("none", "count"):
        show(f"lookup, m {m} {mn:5s}", (m, mn))
