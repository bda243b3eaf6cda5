"""Residual-condition kernels: a second attribute ``key2`` checked where the pairs are produced.

A predicate such as ``band:10&band2:10`` (the handshake paper's 2-D band join) is
looked up by its key condition; each candidate the index finds must then also
have ``lo2[b, i] <= stored.key2 <= hi2[b, i]`` for some residual band ``b`` of its
probe tuple ``i`` (:func:`panjoin.semantics.residual_bounds`). Done here, a
candidate that fails is never written to an output array, let alone sent.

Two ways to hold ``key2`` beside an index:

- by arrival position: ``k2pos[seq - base]`` (every index, where a subwindow's
  seqs are a contiguous run starting at ``base``). ``residual_keep`` filters the
  pairs an index emitted (the generic post-filter);
- permuted with BI-Sort's sorted main array (``mk2[p]`` beside ``mk[p]``), so the
  fused probe ``bisort_probe_residual`` reads key2 sequentially over a candidate
  range; ``permuted=False`` gathers ``k2pos[ms[p] - base]`` instead (the benchmark
  compares both).

Example, band:10&band2:1 probing from R: r with key 50 and key2 2.5 gives
``[lo, hi] = [40, 60]`` and ``[lo2, hi2] = [1.5, 3.5]``. Main keys
``[41 45 59 70]`` with key2 ``[9.0 2.0 3.5 2.0]``: the key range is rows [0, 3);
row 0 fails key2 (9.0), rows 1 and 2 pass: two pairs written, one candidate
dropped in the kernel.
"""

import numpy as np

from panjoin.config import NJIT, NJIT_PAR
from panjoin.jit import njit, prange
from panjoin.subwindow.kernels.bisort import locate, locate_dense
from panjoin.subwindow.kernels.scan import BLOCK, res_ok
from panjoin.subwindow.kernels.search import chunk_bounds
from panjoin.subwindow.kernels.window import NONE, TIME, in_window


@njit(**NJIT)
def residual_keep(pidx, seq, k2pos, base, lo2, hi2):
    """The pairs ``(pidx, seq)`` whose stored key2 ``k2pos[seq - base]`` passes, compacted."""
    n = pidx.shape[0]
    op = np.empty(n, dtype=np.int64)
    os_ = np.empty(n, dtype=np.int64)
    k = 0
    for j in range(n):
        i = pidx[j]
        if res_ok(lo2, hi2, i, k2pos[seq[j] - base]):
            op[k] = i
            os_[k] = seq[j]
            k += 1
    return op[:k], os_[:k]


@njit(inline="always", **NJIT)
def _k2_at(mk2, ms, k2pos, base, p, permuted):
    if permuted:
        return mk2[p]
    return k2pos[ms[p] - base]


@njit(inline="always", **NJIT)
def _range_count(mk2, mt, ms, k2pos, base, permuted, s, e, l2, h2, mode, c0, c1, c2):
    """Main rows [s, e) with key2 in [l2, h2] and inside the window: a branch-free
    (vectorised) count when the window is off and key2 is permuted."""
    c = 0
    if permuted:  # branch-free per mode, so that the loops vectorise
        if mode == NONE:
            for p in range(s, e):
                x = mk2[p]
                c += (x >= l2) & (x <= h2)
        elif mode == TIME:
            for p in range(s, e):
                x = mk2[p]
                t = mt[p]
                c += (x >= l2) & (x <= h2) & (c0 <= t) & (t <= c1)
        else:  # COUNT: seq < c1 ? seq >= c0 : ts <= c2
            for p in range(s, e):
                x = mk2[p]
                q = ms[p]
                c += (x >= l2) & (x <= h2) & (((q < c1) & (q >= c0)) | ((q >= c1) & (mt[p] <= c2)))
        return c
    for p in range(s, e):
        x = _k2_at(mk2, ms, k2pos, base, p, permuted)
        if x >= l2 and x <= h2 and in_window(mode, c0, c1, c2, ms[p], mt[p]):
            c += 1
    return c


@njit(inline="always", **NJIT)
def _range_fill(mk2, mt, ms, k2pos, base, permuted, s, e, l2, h2, mode, c0, c1, c2,
                out_seq, pos, stop):
    """Write the seqs of those rows from out_seq[pos]; returns the new end. Full blocks
    of BLOCK rows without a key2 candidate are skipped after a branch-free pass, and
    the scan ends once ``stop`` (the count from pass 1) is reached."""
    p = s
    while p < e and pos < stop:
        if permuted and p + BLOCK <= e:
            cand = 0
            for j in range(BLOCK):  # fixed trip count: vectorised
                x = mk2[p + j]
                cand += (x >= l2) & (x <= h2)
            if cand == 0:
                p += BLOCK
                continue
        z = min(e, p + BLOCK)
        for q in range(p, z):
            x = _k2_at(mk2, ms, k2pos, base, q, permuted)
            if x >= l2 and x <= h2 and in_window(mode, c0, c1, c2, ms[q], mt[q]):
                out_seq[pos] = ms[q]
                pos += 1
        p = z
    return pos


@njit(**NJIT_PAR)
def bisort_probe_residual(mk, mt, ms, mk2, m, idx, nidx, step, up, lvoff, nlev, bk, bt, bs,
                          nbuf, k2pos, base, lo, hi, mode, c0, c1, c2, lo2, hi2, parts,
                          permuted):
    """BI-Sort's probe (``probe_kernel`` with pairs) with the residual fused in.

    Pass 1 locates every band's main-array range and counts the candidates passing
    both the residual and the window condition; a prefix sum gives each probe tuple
    its output slots; pass 2 writes them. Residual bands are disjoint, so a stored
    tuple passes at most one: counting per residual band is exact, and each per-band
    count over a range is branch-free. The insertion buffer is sorted (BI-Sort keeps
    it so): its ranges are located as the main array's are, without an index, and
    walked the same way over its key2, gathered once per call into buffer order. (A
    scan of the whole buffer per probe tuple made a batch no larger than the buffer
    cost O(n B): the join 5x slower at 8K-row batches over 128K-row subwindows.)
    Returns ``(probe_idx, seq)``.
    """
    nb, n = lo.shape
    nb2 = lo2.shape[0]
    st = np.empty((nb, n), dtype=np.int64)
    en = np.empty((nb, n), dtype=np.int64)
    counts = np.zeros(n + 1, dtype=np.int64)
    cb = chunk_bounds(n, parts)
    bk2 = np.empty(nbuf, dtype=np.float64)  # key2 of the buffer rows, in buffer order
    for p in range(nbuf):
        bk2[p] = k2pos[bs[p] - base]
    nbn = n if nbuf > 0 else 0
    bst = np.empty((nb, nbn), dtype=np.int64)
    ben = np.empty((nb, nbn), dtype=np.int64)
    locate_dense(bk, nbuf, idx, 0, 1, lo, hi, 0, nbn, bst, ben)
    for t in prange(parts):
        i0 = cb[t]
        i1 = cb[t + 1]
        locate(mk, ms, mt, m, idx, nidx, step, up, lvoff, nlev, lo, hi, i0, i1, st, en, False)
        for i in range(i0, i1):
            c = 0
            for b in range(nb):
                l = lo[b, i]
                h = hi[b, i]
                if l > h:
                    continue
                for b2 in range(nb2):
                    l2 = lo2[b2, i]
                    h2 = hi2[b2, i]
                    if l2 > h2:
                        continue
                    c += _range_count(mk2, mt, ms, k2pos, base, permuted, st[b, i], en[b, i],
                                      l2, h2, mode, c0[i], c1[i], c2[i])
                    if nbn:
                        c += _range_count(bk2, bt, bs, k2pos, base, True, bst[b, i],
                                          ben[b, i], l2, h2, mode, c0[i], c1[i], c2[i])
            counts[i + 1] = c
    offs = np.cumsum(counts)
    out_probe = np.empty(offs[n], dtype=np.int64)
    out_seq = np.empty(offs[n], dtype=np.int64)
    for t in prange(parts):
        for i in range(cb[t], cb[t + 1]):
            pos = offs[i]
            if offs[i + 1] == pos:
                continue
            for b in range(nb):
                l = lo[b, i]
                h = hi[b, i]
                if l > h:
                    continue
                for b2 in range(nb2):
                    l2 = lo2[b2, i]
                    h2 = hi2[b2, i]
                    if l2 > h2:
                        continue
                    pos = _range_fill(mk2, mt, ms, k2pos, base, permuted, st[b, i], en[b, i],
                                      l2, h2, mode, c0[i], c1[i], c2[i], out_seq, pos,
                                      offs[i + 1])
                    if nbn:
                        pos = _range_fill(bk2, bt, bs, k2pos, base, True, bst[b, i],
                                          ben[b, i], l2, h2, mode, c0[i], c1[i], c2[i],
                                          out_seq, pos, offs[i + 1])
            for x in range(offs[i], pos):
                out_probe[x] = i
    return out_probe, out_seq
