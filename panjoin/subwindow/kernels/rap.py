"""RaP-Table kernels (PanJoin paper, sections III-B, III-E and III-F).

The partition table is an array ``spl`` of P splitters, non-decreasing, with
``spl[0]`` the lowest value of the key type (I64_MIN or -inf): partition i
holds the keys in ``[spl[i], spl[i+1])`` (the last one up to +inf), so the
partition of a key k is ``(first j with spl[j] > k) - 1``, which a rebounding
search finds from the previous key's answer. Insert and probe kernels see int64
only: float64 keys arrive as order-preserving codes (:func:`float_codes`), which
halves what Numba compiles; Algorithm 1 interpolates in key values, either type.
Equal splitters leave the partitions between them empty and never split one key
value over two partitions; the three histograms (count, min, max per partition)
feed the splitter adjustment of the next subwindow (Algorithm 1).

Kernels:

- :func:`adjust_splitters`: Algorithm 1, P new splitters from the histograms;
- :func:`quantile_splitters`: splitters from a sorted batch (the first insert of
  a subwindow that has neither a predecessor nor given splitters);
- :func:`rap_insert`: a sorted batch, one LLAT run per partition;
- :func:`rap_probe`: the multi-threaded probe (count pass, prefix sum, fill pass).

Algorithm 1 on the paper's Figure 3 shape (N = 16, P = 4, so bal_j = 4 j)::

    partition i   1      2      3       4          counts 3, 2, 5, 6
    [min, max]   [0,9] [10,19] [20,29] [30,39]     sums   3, 5, 10, 16
    bal_1 = 4 in (sum_1, sum_2] = (3, 5]   -> s_1 = 10 + (4-3)/2 * 9  = 14
    bal_2 = 8 in (sum_2, sum_3] = (5, 10]  -> s_2 = 20 + (8-5)/5 * 9  = 25
    bal_3 = 12 in (10, 16]                 -> s_3 = 30 + (12-10)/6 * 9 = 33
    new table: [-inf, 14, 25, 33]
"""

import numpy as np

from panjoin.config import NJIT, NJIT_PAR
from panjoin.jit import later, njit, prange
from panjoin.subwindow.kernels.llat import llat_push_run
from panjoin.subwindow.kernels.primitives import I64_MAX, I64_MIN, lowest, prefetch_read
from panjoin.subwindow.kernels.search import (
    chunk_bounds,
    gallop_left,
    gallop_left_range,
    gallop_right,
    gallop_right_range,
)
from panjoin.subwindow.kernels.window import in_window  # closed bounds: see window.py

# --------------------------------------------------------------------------- typed helpers
# Numba specialises a kernel per key dtype; this one picks the int64 or the float64
# variant of Algorithm 1's interpolation (it runs on key values of either type; the
# table's s_0 is :func:`~panjoin.subwindow.kernels.primitives.lowest`).


def interp_splitter(a, b, frac):
    """``a + frac * (b - a)`` clamped to [a, b], without int64 overflow."""
    raise NotImplementedError("interp_splitter runs inside Numba kernels only")


@later  # Numba's typing of it, registered when Numba loads (panjoin.jit)
def _interp_typed():
    from numba import types
    from numba.extending import overload

    @overload(interp_splitter)
    def _interp_ov(a, b, frac):
        if isinstance(a, types.Integer):

            def impl_int(a, b, frac):
                if a < 0 and b > I64_MAX + a:
                    # b - a does not fit in int64 (range above 2**63): interpolate in float,
                    # whose 2**-53 relative error is far below one partition's width here
                    v = float(a) + frac * (float(b) - float(a))
                    if v <= float(a):
                        return a
                    if v >= float(b):
                        return b
                    r = np.int64(v)  # safe: float(a) < v < float(b) <= 2**63
                    if r < a:
                        return a
                    if r > b:
                        return b
                    return r
                rng = b - a
                off = frac * float(rng)
                if off <= 0.0:
                    return a
                if off >= float(rng):
                    return b
                return a + np.int64(off)  # off < float(rng), so the offset stays within rng

            return impl_int

        def impl_float(a, b, frac):
            d = b - a
            if d == np.inf:  # both extremes of float64: the difference overflows
                v = a * (1.0 - frac) + b * frac
            else:
                v = a + frac * d
            if v != v:  # an infinite min or max: no point inside, take the nearer end
                return a if frac < 0.5 else b
            if v < a:
                return a
            if v > b:
                return b
            return v

        return impl_float


@njit(inline="always", **NJIT)
def _prefetch_partition(keys, head, tail, cap, p):
    """Ask for the keys of partition p's first entry, one request per 64-byte line."""
    base = p * cap
    for s in range(base + tail[p], base + head[p], 8):
        prefetch_read(keys, s)


# --------------------------------------------------------------------------- splitters


@njit(**NJIT)
def adjust_splitters(count, mn, mx, n_total, P):
    """Algorithm 1 (splitter adjustment): P splitters for a successor subwindow.

    ``count, mn, mx`` are the predecessor's histograms (any number of partitions),
    ``n_total`` its tuple count N. Balancing indicator ``bal_j = N/P * j``; for each
    partition i with ``bal_j in (sum_{i-1}, sum_i]`` the new splitter is
    ``min_i + (bal_j - sum_{i-1}) / count_i * (max_i - min_i)``, i.e. tuples are
    assumed uniform inside a partition (the PDF's text extraction lost the
    ``min_i +``; without it the splitter would be a width, not a key).
    ``spl[0]`` is the type's lowest value.
    One pass over partitions and splitters, O(P_old + P). Splitters are clamped to
    their partition's [min, max] and kept non-decreasing against float rounding.
    """
    out = np.empty(P, dtype=mn.dtype)
    out[0] = lowest(mn)
    step = n_total / P
    j = 1
    prev_sum = 0  # sum_{i-1}
    last_val = out[0]
    for i in range(count.shape[0]):
        c = count[i]
        if c <= 0:
            continue  # (sum_{i-1}, sum_i] is empty: no bal_j falls here
        cur_sum = prev_sum + c
        while j < P:
            bal = step * j
            if bal > cur_sum:
                break
            v = interp_splitter(mn[i], mx[i], (bal - prev_sum) / c)
            if v < last_val:
                v = last_val
            out[j] = v
            last_val = v
            j += 1
        prev_sum = cur_sum
    # float rounding of bal_j near N may leave the last splitters unset: they go to the top
    while j < P:
        out[j] = last_val
        j += 1
    return out


@njit(**NJIT)
def quantile_splitters(keys, P):
    """Splitters at the j/P quantiles of a sorted batch: ``spl[j] = keys[j * m // P]``."""
    m = keys.shape[0]
    out = np.empty(P, dtype=keys.dtype)
    out[0] = lowest(keys)
    for j in range(1, P):
        out[j] = keys[(j * m) // P]
    return out


@njit(**NJIT)
def first_unsorted(keys):
    """Index of the first key that is not >= its predecessor (or is NaN); -1 if sorted.

    Blocks of 4096 are tested without an early exit (a branch-free count the
    compiler vectorises, so the check runs at memory speed); only a failing
    block is searched for the exact position. The block loop reads two slice
    views at offsets from 0: indexing ``keys[i - 1]`` directly kept Numba's
    negative-index wraparound in the loop, which stopped it vectorising (14 ms
    against 2.2 ms for 8M int64 keys).
    """
    m = keys.shape[0]
    if m > 0 and not (keys[0] == keys[0]):
        return 0
    B = 4096
    for s in range(1, m, B):
        e = min(m, s + B)
        prev = keys[s - 1:e - 1]
        cur = keys[s:e]
        bad = 0
        for i in range(e - s):
            bad += (prev[i] > cur[i]) | (cur[i] != cur[i])
        if bad:
            for i in range(s, e):
                if not (keys[i - 1] <= keys[i]):
                    return i
    return -1


@njit(**NJIT)
def float_codes(x, out):
    """Order-preserving int64 codes of finite or infinite float64 values.

    Non-negative floats keep their bit pattern; negative ones get every bit but
    the sign flipped, so larger magnitudes come out smaller; -0.0 becomes the
    code of +0.0 (they compare equal). ``a < b`` iff ``code(a) < code(b)``, so
    every kernel below runs on float keys as int64 ones (compiled once).
    Example: -2.0 -> -4611686018427387905, -1.0 -> -4607182418800017409, 0.0 -> 0,
    1.0 -> 4607182418800017408.
    """
    bits = x.view(np.int64)
    for i in range(x.shape[0]):
        b = bits[i]
        if b == I64_MIN:  # -0.0
            b = 0
        elif b < 0:
            b ^= I64_MAX
        out[i] = b


# --------------------------------------------------------------------------- insert


@njit(**NJIT)
def rap_insert(spl, count, mn, mx, keys, ts, seq, head, tail, nxt, last, ptr, free, cap, bk, bt,
               bs):
    """Insert a sorted batch; False if the LLAT ran out of entries (cannot happen, see LLAT).

    Per run of batch tuples with one target partition p: the rebounding search on
    the partition table finds p from the previous run's partition, a second one on
    the batch finds where the run ends (the first key >= spl[p+1]), LLAT appends the
    run entry-sized copies at a time, and the histograms take the run's count and
    its first/last keys as min/max candidates (the batch is sorted).

    A run that fits in its chain's last entry, the common case, is copied here
    through slice views indexed from 0, which Numba vectorises (three columns in
    one loop); ``llat_push_run``'s copy indexes ``keys[p + j]`` with a run-time p,
    keeps the negative-index wraparound and does not (8M tuples into P 64K: 16 ms
    against 41 ms). Runs that need a new entry go to ``llat_push_run``, the one
    allocator.
    """
    m = bk.shape[0]
    P = spl.shape[0]
    i = 0
    start = 1  # spl[0] is the lowest value: the first splitter above a key is at >= 1
    while i < m:
        j = gallop_right(spl, bk[i], start)
        p = j - 1
        if j < P:
            end = gallop_left(bk, spl[j], i + 1)
        else:
            end = m
        n = end - i
        e = last[p]
        h = head[e]
        if n <= cap - h:
            q = e * cap + h
            dk = keys[q:q + n]
            dt = ts[q:q + n]
            ds = seq[q:q + n]
            sk = bk[i:end]
            st = bt[i:end]
            ss = bs[i:end]
            for r in range(n):
                dk[r] = sk[r]
                dt[r] = st[r]
                ds[r] = ss[r]
            head[e] = h + n
        elif llat_push_run(keys, ts, seq, head, tail, nxt, last, ptr, free, cap, p, bk, bt, bs, i,
                           end) < 0:
            return False
        count[p] += end - i
        if bk[i] < mn[p]:
            mn[p] = bk[i]
        if bk[end - 1] > mx[p]:
            mx[p] = bk[end - 1]
        i = end
        start = j + 1  # the next key is >= spl[j]
    return True


# --------------------------------------------------------------------------- probe
# Per chunk of probe tuples and per band, three sweeps (section III-F):
#   (1) groups of consecutive tuples whose lo falls in one partition scan it, testing
#       lo <= key <= hi;
#   (2) groups whose hi falls in a later partition than their lo scan that one,
#       testing key <= hi only (its keys are all above those lo);
#   (3) partitions strictly between the two are copied whole (window filter only).
# Count pass, then fill pass; the count pass leaves per-scan match counts (``found``)
# so that the fill pass skips scans without matches and stops a scan early. Sweep (1)
# without a window filter, the common case, has its own loops (_sweep_low_count,
# _sweep_low_fill): one function serving every case compiles the tight loops worse.

#: groups up to this size scan their partition once per probe tuple (it is in L1 by
#: then); larger ones scan it once, finding each key's matches by binary search
SMALL_GROUP = 4
#: probe tuples between the one being scanned and the one whose partition is prefetched
PREFETCH_AHEAD = 8


@njit(**NJIT)
def _locate(spl, lo, hi, b, a, e, plo, phi):
    """Partitions of lo[b, i] and hi[b, i] for i in [a, e) by rebounding search; -1 if empty.

    Both rows are sorted over their non-empty entries, so each search starts at the
    previous answer; empty bands (lo > hi) leave the cursors where they are.
    """
    s_lo = 1
    s_hi = 1
    for i in range(a, e):
        lv = lo[b, i]
        hv = hi[b, i]
        if lv > hv:
            plo[b, i] = -1
            phi[b, i] = -1
            continue
        j = gallop_right(spl, lv, s_lo)
        s_lo = j
        if s_hi < j:
            s_hi = j
        jh = gallop_right(spl, hv, s_hi)
        s_hi = jh
        plo[b, i] = j - 1
        phi[b, i] = jh - 1


@njit(inline="always", **NJIT)
def _prefetch_ahead(keys, head, tail, cap, pl_row, pf_i, pf_last, g, e):
    """Prefetch the partitions of lo for tuples up to PREFETCH_AHEAD past g, each once."""
    stop = min(e, g + PREFETCH_AHEAD)
    if pf_i < g:
        pf_i = g
    while pf_i < stop:
        q = pl_row[pf_i]
        if q > pf_last:
            _prefetch_partition(keys, head, tail, cap, q)
            pf_last = q
        pf_i += 1
    return pf_i, pf_last


@njit(inline="always", **NJIT)
def _count_nf(keys, head, tail, nxt, cap, p, lv, hv):
    """Keys of partition p in [lv, hv]: branch-free, so the compiler vectorises it."""
    n = 0
    e = p
    while e >= 0:
        base = e * cap
        for s in range(base + tail[e], base + head[e]):
            n += (keys[s] >= lv) & (keys[s] <= hv)
        e = nxt[e]
    return n


@njit(inline="always", **NJIT)
def _fill_nf(keys, seq, head, tail, nxt, cap, p, t, lv, hv, want, out_pi, out_seq, pos):
    """Write the ``want`` matches of probe tuple t in partition p from ``pos``; stop at the last.

    A plain branch beats a branch-free selection here: with few matches the branch
    is predicted well, and the scan ends at the last match instead of the entry's end.
    """
    n = 0
    e = p
    while e >= 0:
        base = e * cap
        for s in range(base + tail[e], base + head[e]):
            k = keys[s]
            if k >= lv and k <= hv:
                out_pi[pos + n] = t
                out_seq[pos + n] = seq[s]
                n += 1
                if n == want:
                    return n
        e = nxt[e]
    return n


@njit(**NJIT)
def _scan_flt(keys, ts, seq, head, tail, nxt, cap, p, t, lv, hv, mode, c0, c1, c2,
              want, out_pi, out_seq, pos):
    """Probe tuple t against partition p with the window filter; counts if ``want < 0``,
    else writes from ``pos`` and stops at ``want`` matches."""
    n = 0
    e = p
    while e >= 0:
        base = e * cap
        for s in range(base + tail[e], base + head[e]):
            k = keys[s]
            if k >= lv and k <= hv and in_window(mode, c0[t], c1[t], c2[t], seq[s], ts[s]):
                if want >= 0:
                    out_pi[pos + n] = t
                    out_seq[pos + n] = seq[s]
                n += 1
                if n == want:
                    return n
        e = nxt[e]
    return n


@njit(**NJIT)
def _scan_large(keys, ts, seq, head, tail, nxt, cap, lo_row, hi_row, p, g0, g1,
                mode, c0, c1, c2, write, out_pi, out_seq, pos):
    """Partition p against a large group [g0, g1): the paper's nested loop.

    Outer: the partition's tuples (each read once); inner: the related probe
    tuples. Both bound rows are sorted over the group, so the tuples matching a
    key k form one range ``[first hi >= k, first lo > k)``, found by two
    rebounding searches instead of a walk over the group.
    """
    n = 0
    e = p
    while e >= 0:
        base = e * cap
        for s in range(base + tail[e], base + head[e]):
            k = keys[s]
            t0 = gallop_left_range(hi_row, k, g0, g1)
            t1 = gallop_right_range(lo_row, k, t0, g1)
            if mode == 0:
                if write:
                    for t in range(t0, t1):
                        out_pi[pos + n] = t
                        out_seq[pos + n] = seq[s]
                        n += 1
                else:
                    n += t1 - t0
            else:
                for t in range(t0, t1):
                    if in_window(mode, c0[t], c1[t], c2[t], seq[s], ts[s]):
                        if write:
                            out_pi[pos + n] = t
                            out_seq[pos + n] = seq[s]
                        n += 1
        e = nxt[e]
    return n


# The sweep functions below take ``mode`` and ``write`` as run-time values, even where
# they are known (Numba compiles a callee once per distinct literal argument, which
# doubled the compile time of every function below a literal ``True``/``False``).


@njit(**NJIT)
def _sweep_low_count(keys, ts, seq, head, tail, nxt, cap, lo_row, hi_row, pl_row, found,
                     a, e, mode, c0, c1, c2, write, out_pi, out_seq, pos):
    """Sweep (1), count pass, no window filter. Returns the matches; fills ``found``."""
    n = 0
    i = a
    pf_i = a
    pf_last = -1
    while i < e:
        p = pl_row[i]
        if p < 0:
            i += 1
            continue
        g = i + 1
        while g < e and pl_row[g] == p:  # an empty band ends the group
            g += 1
        pf_i, pf_last = _prefetch_ahead(keys, head, tail, cap, pl_row, pf_i, pf_last, g, e)
        if g - i <= SMALL_GROUP:
            for t in range(i, g):
                got = _count_nf(keys, head, tail, nxt, cap, p, lo_row[t], hi_row[t])
                found[t] = got
                n += got
        else:
            got = _scan_large(keys, ts, seq, head, tail, nxt, cap, lo_row, hi_row, p, i, g,
                              mode, c0, c1, c2, write, out_pi, out_seq, pos)
            found[i] = got
            n += got
        i = g
    return n


@njit(**NJIT)
def _sweep_low_fill(keys, ts, seq, head, tail, nxt, cap, lo_row, hi_row, pl_row, found,
                    a, e, mode, c0, c1, c2, write, out_pi, out_seq, pos):
    """Sweep (1), fill pass, no window filter: the scans the count pass found matches in."""
    n = 0
    i = a
    pf_i = a
    pf_last = -1
    while i < e:
        p = pl_row[i]
        if p < 0:
            i += 1
            continue
        g = i + 1
        while g < e and pl_row[g] == p:
            g += 1
        pf_i, pf_last = _prefetch_ahead(keys, head, tail, cap, pl_row, pf_i, pf_last, g, e)
        if g - i <= SMALL_GROUP:
            for t in range(i, g):
                if found[t] > 0:
                    n += _fill_nf(keys, seq, head, tail, nxt, cap, p, t, lo_row[t], hi_row[t],
                                  found[t], out_pi, out_seq, pos + n)
        elif found[i] > 0:
            n += _scan_large(keys, ts, seq, head, tail, nxt, cap, lo_row, hi_row, p, i, g,
                             mode, c0, c1, c2, write, out_pi, out_seq, pos + n)
        i = g
    return n


@njit(**NJIT)
def _sweep_any(keys, ts, seq, head, tail, nxt, cap, lo_row, hi_row, pl_row, ph_row,
               found_lo, found_hi, a, e, lower, mode, c0, c1, c2, write, out_pi, out_seq, pos):
    """Sweep (1) with a window filter (if ``lower``), then sweep (2) in any mode.

    Sweep (2) groups tuples by the partition of hi, among those whose lo lies in an
    earlier partition; such tuples with one hi partition are consecutive, because
    both partition rows are non-decreasing.
    """
    n = 0
    for side in range(2):
        upper = side == 1
        if not upper and not lower:
            continue
        pt_row = ph_row if upper else pl_row
        found = found_hi if upper else found_lo
        i = a
        while i < e:
            p = pt_row[i]
            if p < 0 or (upper and p == pl_row[i]):
                i += 1
                continue
            g = i + 1
            while g < e and pt_row[g] == p and (not upper or pl_row[g] < p):
                g += 1
            if g - i <= SMALL_GROUP:
                for t in range(i, g):
                    want = found[t] if write else -1
                    if want == 0:
                        continue
                    got = _scan_flt(keys, ts, seq, head, tail, nxt, cap, p, t, lo_row[t],
                                    hi_row[t], mode, c0, c1, c2, want, out_pi, out_seq, pos + n)
                    if not write:
                        found[t] = got
                    n += got
            elif not write or found[i] > 0:
                got = _scan_large(keys, ts, seq, head, tail, nxt, cap, lo_row, hi_row, p, i, g,
                                  mode, c0, c1, c2, write, out_pi, out_seq, pos + n)
                if not write:
                    found[i] = got
                n += got
            i = g
    return n


@njit(**NJIT)
def _copy_range(ts, seq, head, tail, nxt, cap, p0, p1, t, mode, c0, c1, c2,
                write, out_pi, out_seq, pos):
    """Partitions p0..p1-1 wholly inside probe tuple t's band: no key test, window filter only."""
    n = 0
    for p in range(p0, p1):
        e = p
        while e >= 0:
            base = e * cap
            for s in range(base + tail[e], base + head[e]):
                if in_window(mode, c0[t], c1[t], c2[t], seq[s], ts[s]):
                    if write:
                        out_pi[pos + n] = t
                        out_seq[pos + n] = seq[s]
                    n += 1
            e = nxt[e]
    return n


@njit(**NJIT)
def _probe_chunk(cum, keys, ts, seq, head, tail, nxt, cap, lo, hi, plo, phi, found_lo, found_hi,
                 mode, c0, c1, c2, a, e, out_pi, out_seq, pos):
    """Matches of probe tuples [a, e) over all bands; written from ``pos`` into non-empty
    ``out_pi, out_seq`` (the fill pass), else only counted (the count pass).

    Runs the three sweeps per band. Without a window filter the count pass takes
    sweep (3) from the histogram prefix sums ``cum`` instead of walking it.
    """
    write = out_pi.shape[0] > 0
    n = 0
    for b in range(lo.shape[0]):
        lo_row = lo[b]
        hi_row = hi[b]
        pl_row = plo[b]
        ph_row = phi[b]
        # (1) lower boundary partitions, without a window filter
        if mode == 0 and not write:
            n += _sweep_low_count(keys, ts, seq, head, tail, nxt, cap, lo_row, hi_row, pl_row,
                                  found_lo[b], a, e, mode, c0, c1, c2, write, out_pi, out_seq,
                                  pos)
        elif mode == 0:
            n += _sweep_low_fill(keys, ts, seq, head, tail, nxt, cap, lo_row, hi_row, pl_row,
                                 found_lo[b], a, e, mode, c0, c1, c2, write, out_pi, out_seq,
                                 pos + n)
        # (1) with a window filter, and (2) upper boundary partitions
        n += _sweep_any(keys, ts, seq, head, tail, nxt, cap, lo_row, hi_row, pl_row, ph_row,
                        found_lo[b], found_hi[b], a, e, mode != 0, mode, c0, c1, c2, write,
                        out_pi, out_seq, pos + n)
        # (3) partitions strictly inside a band
        for t in range(a, e):
            pl = pl_row[t]
            ph = ph_row[t]
            if ph - pl < 2:
                continue  # also skips empty bands (-1, -1)
            if not write and mode == 0:
                n += cum[ph] - cum[pl + 1]
            else:
                n += _copy_range(ts, seq, head, tail, nxt, cap, pl + 1, ph, t,
                                 mode, c0, c1, c2, write, out_pi, out_seq, pos + n)
    return n


@njit(**NJIT)
def _count_chunk(spl, cum, keys, ts, seq, head, tail, nxt, cap, lo, hi, plo, phi,
                 found_lo, found_hi, mode, c0, c1, c2, a, e):
    """Pass 1 for chunk [a, e): locate every bound, count the matches."""
    for b in range(lo.shape[0]):
        _locate(spl, lo, hi, b, a, e, plo, phi)
    empty = np.empty(0, dtype=np.int64)
    return _probe_chunk(cum, keys, ts, seq, head, tail, nxt, cap, lo, hi, plo, phi,
                        found_lo, found_hi, mode, c0, c1, c2, a, e, empty, empty, a)


@njit(**NJIT_PAR)
def rap_probe(spl, cum, keys, ts, seq, head, tail, nxt, cap, lo, hi, mode, c0, c1, c2, parts):
    """Probe a sorted batch (bands ``lo <= key <= hi``); ``(probe_idx, seq)`` of every match.

    The batch is cut into ``parts`` contiguous chunks, one per thread. Pass 1
    locates each tuple's boundary partitions and counts its chunk's matches; a
    prefix sum over the chunk counts gives each chunk its own output slice; pass 2
    repeats the scans that found matches and writes there, so no two threads share
    a slot. ``cum[p]`` = tuples in partitions < p.
    """
    nb = lo.shape[0]
    m = lo.shape[1]
    bounds = chunk_bounds(m, parts)
    plo = np.empty((nb, m), dtype=np.int64)
    phi = np.empty((nb, m), dtype=np.int64)
    found_lo = np.empty((nb, m), dtype=np.int64)  # matches per scan, count pass -> fill pass
    found_hi = np.empty((nb, m), dtype=np.int64)
    counts = np.zeros(parts + 1, dtype=np.int64)
    for c in prange(parts):
        counts[c + 1] = _count_chunk(spl, cum, keys, ts, seq, head, tail, nxt, cap, lo, hi, plo,
                                     phi, found_lo, found_hi, mode, c0, c1, c2, bounds[c],
                                     bounds[c + 1])
    offs = np.cumsum(counts)
    out_pi = np.empty(offs[parts], dtype=np.int64)
    out_seq = np.empty(offs[parts], dtype=np.int64)
    if offs[parts] == 0:
        return out_pi, out_seq
    for c in prange(parts):
        _probe_chunk(cum, keys, ts, seq, head, tail, nxt, cap, lo, hi, plo, phi,
                     found_lo, found_hi, mode, c0, c1, c2, bounds[c], bounds[c + 1],
                     out_pi, out_seq, offs[c])
    return out_pi, out_seq
