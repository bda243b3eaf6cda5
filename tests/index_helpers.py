"""The harness the per-index test files share: key distributions, batch sizes, filling
indexes alike, random window filters, the probe grid, and the comparison of an index
against a reference (the nested loop, or a brute force over the stored tuples).

Used by test_rap_table, test_wib_tree, test_bi_sort, test_opencl_bisort, test_baselines
and test_residual. A typical test::

    ix, ref = WiBTree(n), NestedLoop(n)
    fill([ix, ref], rng, keys, batch_sizes(rng, n, 1, 20))       # check() after each insert
    for case in probe_cases(rng, PREDICATES, MODES, m, lambda r: probe_keys(r, keys, "uniform", m)):
        total += assert_same(ix, ref, *case)                    # the same pairs, or fail
"""

import numpy as np

from panjoin.semantics import I64_MAX, I64_MIN, parse_predicate, probe_bounds
from panjoin.subwindow import WindowFilter
from panjoin.subwindow.kernels import window as W

F64_MAX = np.finfo(np.float64).max

#: eq, a band, two disjoint bands and ne (two bands around the key): every probe shape
PREDICATES = ["eq", "band:3", "bands:-5,-2;4,9", "ne"]
#: every window filter mode
MODES = (W.NONE, W.TIME, W.COUNT)


# --------------------------------------------------------------------------- data


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


def probe_keys(rng, keys, dist, m, draw=draw_keys):
    """``m`` sorted probe keys: half drawn from ``dist`` (by ``draw``), half copies of
    stored keys, so that equal keys and near misses both occur."""
    drawn = draw(rng, dist, m, keys.dtype)
    if keys.shape[0]:
        hit = keys[rng.integers(0, keys.shape[0], m)]
        drawn = np.where(rng.random(m) < 0.5, hit, drawn)
    return np.sort(drawn, kind="stable")


def batch_sizes(rng, n, low, high):
    """Batch sizes summing to n, each drawn from [low, high] (the last one cut to fit)."""
    sizes = []
    while sum(sizes) < n:
        sizes.append(min(int(rng.integers(low, high + 1)), n - sum(sizes)))
    return sizes


def buffer_sizes(rng, n, pattern, buffer):
    """Batch sizes summing to n for an index with an insertion buffer of ``buffer``
    tuples: small (<= buffer), large (> buffer), mixed, or one huge batch."""
    if pattern == "huge":
        return [n]
    low, high = {"small": (1, buffer), "large": (buffer + 1, 3 * buffer + 1),
                 "mixed": (1, 3 * buffer + 1)}[pattern]
    return batch_sizes(rng, n, low, high)


# --------------------------------------------------------------------------- filling


def fill(indexes, rng, keys, sizes, *, presorted=False, after=None):
    """Insert the same sorted batches into every index; check() after each insert, then
    ``after()`` (if given) once all indexes hold the batch. ``keys`` in arrival order;
    each batch is sorted (stable) unless ``presorted``. Returns the ``ts, seq`` columns
    (ts in [0, 1000), seq unique and not positions)."""
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
        if after is not None:
            after()
        pos += s
    return ts, seq


def random_filter(rng, mode, m, ts_max=1000, seq_max=1200):
    """A window filter of the given mode with random bounds for m probe tuples, for
    stored ts in [0, ts_max) and seq in [0, seq_max) (``fill``'s by default): some pairs
    pass, some do not."""
    if mode == W.NONE:
        return WindowFilter.none(m)
    if mode == W.TIME:
        c0 = rng.integers(-10, ts_max * 3 // 5, m)
        c1 = c0 + rng.integers(0, ts_max * 7 // 10, m)
        return WindowFilter(W.TIME, c0, c1, np.zeros(m, np.int64))
    c1 = rng.integers(0, seq_max, m)
    c0 = c1 - rng.integers(0, seq_max * 2 // 3, m)
    c2 = rng.integers(0, ts_max, m)
    return WindowFilter(W.COUNT, c0, c1, c2)


# --------------------------------------------------------------------------- comparing


def canon(p, s):
    """A probe result ``(probe_idx, seq)`` as one canonical array (pairs sorted), so that
    two results compare as multisets."""
    p, s = np.asarray(p), np.asarray(s)
    assert p.dtype == np.int64 and s.dtype == np.int64, (p.dtype, s.dtype)
    assert p.shape == s.shape and p.ndim == 1, (p.shape, s.shape)
    order = np.lexsort((s, p))
    return np.stack([p[order], s[order]])


def pairs(result) -> list[tuple[int, int]]:
    """A probe result as the sorted list of its ``(probe_idx, seq)`` pairs (``canon``, in
    a form to write expected results with)."""
    return [tuple(x) for x in canon(*result).T.tolist()]


def assert_same(ix, ref, lo, hi, flt=None, what=""):
    """``ix`` and ``ref`` return the same pairs for one probe; returns their number."""
    want = canon(*ref.probe(lo, hi, flt))
    np.testing.assert_array_equal(canon(*ix.probe(lo, hi, flt)), want, err_msg=what)
    return want.shape[1]


def probe_cases(rng, preds, modes, m, make_keys):
    """``(lo, hi, flt, what)`` for every predicate x probe side x filter mode: probe keys
    ``make_keys(rng)`` (m of them, sorted) per predicate and side, a random filter per
    mode; ``what`` names the case for failure messages."""
    for pred in preds:
        p = parse_predicate(pred)
        for side in "RS":
            pk = make_keys(rng)
            with np.errstate(over="ignore"):  # bounds next to the largest double
                lo, hi = probe_bounds(p, side, pk)
            for mode in modes:
                yield lo, hi, random_filter(rng, mode, m), f"{pred} from {side}, filter {mode}"


def band_property_cases(ix, batches, probe, band, sides="R"):
    """Insert ``batches`` (lists of int keys) into ``ix``, check() after each; per probe
    side, the bounds of ``probe`` for bands:a,a+w and the brute-force expected result
    (a ``canon`` array): the pairs with s.key - r.key in [a, a + w]."""
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
    sk, ss = np.array(stored_k, np.int64), np.array(stored_s, np.int64)
    out = []
    for side in sides:
        lo, hi = probe_bounds(pred, side, pk)
        # brute force, straight from the predicate: s.key - r.key in [a, a + w]
        d = sk[None, :] - pk[:, None] if side == "R" else pk[:, None] - sk[None, :]
        want_p, want_j = np.nonzero((d >= a) & (d <= a + w))
        out.append((lo, hi, canon(want_p.astype(np.int64), ss[want_j])))
    return out
