"""Helpers shared by the per-index test files: filling indexes alike, random window filters."""

import numpy as np

from panjoin.semantics import I64_MAX, I64_MIN, parse_predicate, probe_bounds
from panjoin.subwindow import WindowFilter
from panjoin.subwindow.kernels import window as W

F64_MAX = np.finfo(np.float64).max


def draw_keys(rng, dist, n, dtype=np.int64, float_extremes=False):
    """``n`` keys of a test distribution: uniform, zipf, increasing, equal, extreme
    (int64 ends), negative, float (with 0.1 + 0.2, and with ``float_extremes`` also
    -0.0 and +-the largest double)."""
    if dist == "uniform":
        k = rng.integers(-50, 50, n)
    elif dist == "zipf":
        k = np.minimum(rng.zipf(1.5, n), 40) - 5
    elif dist == "increasing":
        k = np.arange(n) // 2 + rng.integers(0, 3, n)
    elif dist == "equal":
        k = np.full(n, 7)
    elif dist == "extreme":
        pool = np.array([I64_MIN, I64_MIN + 1, I64_MIN + 3, -1, 0, 1,
                         I64_MAX - 4, I64_MAX - 1, I64_MAX], dtype=np.int64)
        k = pool[rng.integers(0, pool.shape[0], n)]
    elif dist == "negative":
        k = rng.integers(-(2**62), -(2**62) + 40, n)
    elif dist == "float":
        k = np.round(rng.normal(0.0, 6.0, n), 1)
        k[rng.random(n) < 0.1] = 0.1 + 0.2  # a value whose band edges need exact rounding
        if float_extremes:
            k[rng.random(n) < 0.05] = -0.0
            k[rng.random(n) < 0.05] = F64_MAX  # the largest double: no key above it
            k[rng.random(n) < 0.05] = -F64_MAX
    else:
        raise ValueError(dist)
    return np.asarray(k, dtype=np.float64 if dist == "float" else dtype)


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


def band_property_case(ix, batches, probe, band):
    """Insert ``batches`` (lists of int keys) into ``ix``, check() after each, and return the
    probe bounds of ``probe`` for bands:a,a+w plus the brute-force expected (probe, seq)."""
    stored_k, stored_s = [], []
    seq = 0
    for b in batches:
        k = np.sort(np.array(b, dtype=np.int64))
        s = np.arange(seq, seq + k.shape[0], dtype=np.int64)
        seq += k.shape[0]
        ix.insert(k, s * 7, s)
        ix.check()
        stored_k += k.tolist()
        stored_s += s.tolist()
    a, w = band
    pred = parse_predicate(f"bands:{a},{a + w}")
    pk = np.sort(np.array(probe, dtype=np.int64))
    lo, hi = probe_bounds(pred, "R", pk)
    sk, ss = np.array(stored_k, np.int64), np.array(stored_s, np.int64)
    # brute force: s.key - r.key in [a, a + w]
    d = sk[None, :] - pk[:, None]
    want_p, want_j = np.nonzero((d >= a) & (d <= a + w))
    return lo, hi, want_p.astype(np.int64), ss[want_j]
