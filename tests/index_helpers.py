"""Helpers shared by the per-index test files: filling indexes alike, random window filters."""

import numpy as np

from panjoin.subwindow import WindowFilter
from panjoin.subwindow.kernels import window as W


def fill(indexes, rng, keys, sizes, *, presorted=False):
    """Insert the same sorted batches into every index; check() after each insert."""
    n = keys.shape[0]
    seq = rng.permutation(n).astype(np.int64) * 3 + 11  # unique, not positions
    ts = rng.integers(0, 1000, n).astype(np.int64)
    pos = 0
    for s in sizes:
        order = np.arange(s) if presorted else np.argsort(keys[pos:pos + s], kind="stable")
        for ix in indexes:
            ix.insert(keys[pos:pos + s][order], ts[pos:pos + s][order],
                      seq[pos:pos + s][order])
            ix.check()
        pos += s
    return ts, seq


def random_filter(rng, mode, m):
    """A window filter of the given mode with random bounds for m probe tuples."""
    if mode == W.NONE:
        return WindowFilter.none(m)
    if mode == W.TIME:
        c0 = rng.integers(-10, 600, m)
        c1 = c0 + rng.integers(0, 700, m)
        return WindowFilter(W.TIME, c0, c1, np.zeros(m, np.int64))
    c1 = rng.integers(0, 3 * 400, m)
    c0 = c1 - rng.integers(0, 800, m)
    c2 = rng.integers(0, 1000, m)
    return WindowFilter(W.COUNT, c0, c1, c2)
