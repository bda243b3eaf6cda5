"""WiB+-Tree leaf splits: an overflowing leaf cut into pieces at key boundaries.

A leaf that a run would take past W tuples is gathered with the run (unsorted),
cut into pieces of at least a quarter each by :func:`cut_pieces` (a heavy key
becomes a *sealed* piece of its own), and the pieces become leaves: the first
keeps the old leaf's id, the others are new leaves whose lower bounds go into
the tree as separators (:func:`panjoin.subwindow.kernels.wib.tree.tree_insert`).
The old chain's LLAT entries are released first and taken back by the pieces
(:mod:`panjoin.subwindow.kernels.llat`). Array layout: :mod:`.layout`.
"""

import numpy as np

from panjoin.config import NJIT
from panjoin.jit import njit
from panjoin.subwindow.kernels.llat import llat_push_run, llat_release
from panjoin.subwindow.kernels.primitives import key_after
from panjoin.subwindow.kernels.search import gallop_left_range
from panjoin.subwindow.kernels.wib.layout import (
    K_HI,
    K_LO,
    L_FIRST,
    L_NEXT,
    L_SEAL,
    L_SIZE,
    NLEAVES,
    NO_ENTRY,
    NO_LEAF,
    NO_NODE,
    OK,
)
from panjoin.subwindow.kernels.wib.tree import tree_insert

#: stack for the piece cutter; every pending level leaves <= 2 items, ranges shrink by >= 1/4
CUT_STACK = 1024


@njit(**NJIT)
def _swap(ck, ct, cs, a, b):
    k = ck[a]
    ck[a] = ck[b]
    ck[b] = k
    t = ct[a]
    ct[a] = ct[b]
    ct[b] = t
    t = cs[a]
    cs[a] = cs[b]
    cs[b] = t


@njit(**NJIT)
def _random_row(rng, lo, hi):
    """A pseudo-random row in [lo, hi) (xorshift64)."""
    z = rng[0]
    z ^= z << np.uint64(13)
    z ^= z >> np.uint64(7)
    z ^= z << np.uint64(17)
    rng[0] = z
    return lo + np.int64(z % np.uint64(hi - lo))


@njit(**NJIT)
def cut_group(ck, ct, cs, a, b, rng):
    """Partition rows [a, b) around a key group fit to cut at; returns (lb, ub).

    Afterwards rows [lb, ub) hold exactly the keys equal to some key x, rows
    [a, lb) the smaller and [ub, b) the larger ones (each side unsorted). The
    group is either heavy (more than half of the rows: it is the median's) or
    leaves >= ceil((b - a) / 4) rows on the side of a cut at lb or ub. That is
    quickselect for the median (three-way partitions, so equal keys never make
    it quadratic; random median-of-3 pivots, so no key order does) that stops at
    the first pivot good enough; the median's group always is (see
    :func:`cut_pieces`). Expected O(b - a).
    """
    n = b - a
    need = (n + 3) // 4
    m = a + n // 2
    lo = a
    hi = b
    while True:
        x0 = ck[_random_row(rng, lo, hi)]
        x1 = ck[_random_row(rng, lo, hi)]
        x2 = ck[_random_row(rng, lo, hi)]
        x = max(min(x0, x1), min(max(x0, x1), x2))
        lt = lo
        i = lo
        gt = hi
        while i < gt:
            k = ck[i]
            if k < x:
                _swap(ck, ct, cs, lt, i)
                lt += 1
                i += 1
            elif k > x:
                gt -= 1
                _swap(ck, ct, cs, i, gt)
            else:
                i += 1
        if 2 * (gt - lt) > n:
            return lt, gt
        if lt > a and min(lt - a, b - lt) >= need:
            return lt, gt
        if gt < b and min(gt - a, b - gt) >= need:
            return lt, gt
        if m < lt:
            hi = lt
        elif m >= gt:
            lo = gt
        else:
            return lt, gt  # the median's group (cannot get here: it is always fit)


@njit(**NJIT)
def cut_pieces(ck, ct, cs, start, n, W, pst, pen, psl, k, sa, sb, sk, rng):
    """Cut rows [start, n) into leaf pieces; appended to pst/pen/psl from k on.

    A range of at most W tuples is one piece. A longer one (n rows) is split at
    a key boundary that leaves >= ceil(n/4) rows on each side, unless the
    median's key fills more than half of the range: then that key's tuples
    become a *sealed* piece and the two sides are cut on their own (no duplicate
    separators: equal keys never straddle a cut). Such a boundary exists: next to
    the median's group (g <= n/2 rows, lb..ub), the side of the boundary away
    from the median holds >= (n - g)/2 >= n/4 rows on one of the two choices and
    the other side >= n/2. The rows need not be sorted: :func:`cut_group`
    partitions each range around a fit group, so cutting costs O(n log(n / W))
    and a plain split O(W).
    Pieces come out in key order (every key of a piece is below every key of the
    next); empty ranges yield no piece. Returns the new piece count. ``sa, sb,
    sk``: scratch stack of CUT_STACK ranges.
    """
    top = 1
    sa[0] = start
    sb[0] = n
    sk[0] = 0
    while top > 0:
        top -= 1
        a = sa[top]
        b = sb[top]
        if a >= b:
            continue
        if sk[top] == 1 or b - a <= W:
            pst[k] = a
            pen[k] = b
            psl[k] = sk[top]
            k += 1
            continue
        lb, ub = cut_group(ck, ct, cs, a, b, rng)
        if 2 * (ub - lb) > b - a:
            # pushed right to left so that pieces come out in key order
            sa[top] = ub
            sb[top] = b
            sk[top] = 0
            sa[top + 1] = lb
            sb[top + 1] = ub
            sk[top + 1] = 1
            sa[top + 2] = a
            sb[top + 2] = lb
            sk[top + 2] = 0
            top += 3
        else:
            bal_lb = min(lb - a, b - lb) if lb > a else -1
            bal_ub = min(ub - a, b - ub) if ub < b else -1
            c = lb if bal_lb >= bal_ub else ub
            sa[top] = c
            sb[top] = b
            sk[top] = 0
            sa[top + 1] = a
            sb[top + 1] = c
            sk[top + 1] = 0
            top += 2
    return k


@njit(**NJIT)
def split_leaf(tree, leaf, store, meta, W, F, q, l, bk, bt, bs, i, j, scratch, pn, pi):
    """Insert batch rows [i, j) into leaf l, which then holds more than W tuples.

    Gather the leaf (unsorted, <= W tuples) and the run, cut them into pieces
    (:func:`cut_pieces`: the paper sorts the leaf here; partitioning it around
    its median is all a split needs, since the pieces are unsorted leaves again),
    give the first piece back to l and each other piece a new leaf, rewrite the
    chains (freed entries first), then add one separator per new leaf to the
    tree. Returns a status code.
    """
    linfo, lkey = leaf
    keys, ts, seq, head, tail, nxt, last, ptr, free = store
    ck, ct, cs, pst, pen, psl, fst, fen, fsl, flb, sa, sb, sk, rng = scratch
    # gather the leaf (one entry: unsealed leaves never overflow) and the run behind it
    s = linfo[l, L_SIZE]
    base = linfo[l, L_FIRST] * W
    old_max = ck[0]
    for t in range(s):
        ck[t] = keys[base + t]
        ct[t] = ts[base + t]
        cs[t] = seq[base + t]
        if t == 0 or ck[t] > old_max:
            old_max = ck[t]
    r = j - i
    n = s + r
    for t in range(r):
        ck[s + t] = bk[i + t]
        ct[s + t] = bt[i + t]
        cs[s + t] = bs[i + t]
    # pieces
    k = np.int64(0)  # np.int64: a literal 0 would compile callees twice
    old_next = linfo[l, L_NEXT]
    old_hi = lkey[l, K_HI]
    start = np.int64(0)
    if old_next < 0 and s >= q and old_max < bk[i]:
        # rightmost leaf and the run lies above all it holds (increasing keys): nothing will
        # land left of the run again, so cut full leaves (at key boundaries, >= q tuples)
        # instead of halves, and leave only the tail to the median cutter. Row start + W
        # lies in the sorted run and every row before the run is smaller, so "key >= its
        # key" is monotone over the rows and a rebounding search finds the boundary.
        while n - start > W:
            c = gallop_left_range(ck, ck[start + W], start, start + W)
            if c - start < q:
                break
            pst[k] = start
            pen[k] = c
            psl[k] = 0
            k += 1
            start = c
    k = cut_pieces(ck, ct, cs, start, n, W, pst, pen, psl, k, sa, sb, sk, rng)
    # final pieces with their lower bounds; an empty piece fills a key gap that a sealed
    # piece leaves (before it, between two sealed ones, or after the last)
    f = np.int64(0)
    prev_sealed = False
    prev_key = ck[0]
    for t in range(k):
        x = ck[pst[t]]
        if f == 0:
            if psl[t] == 1 and lkey[l, K_LO] < x:
                fst[f] = pst[t]
                fen[f] = pst[t]
                fsl[f] = 0
                flb[f] = lkey[l, K_LO]
                f += 1
                lbx = x
            else:
                lbx = lkey[l, K_LO]
        elif psl[t] == 1:
            if prev_sealed:
                ok, y = key_after(prev_key)
                if y < x:
                    fst[f] = pst[t]
                    fen[f] = pst[t]
                    fsl[f] = 0
                    flb[f] = y
                    f += 1
            lbx = x
        elif prev_sealed:
            ok, y = key_after(prev_key)
            lbx = y
        else:
            lbx = x  # the piece's smallest key: pieces are partitioned, not sorted
            for p in range(pst[t] + 1, pen[t]):
                if ck[p] < lbx:
                    lbx = ck[p]
        fst[f] = pst[t]
        fen[f] = pen[t]
        fsl[f] = psl[t]
        flb[f] = lbx
        f += 1
        prev_sealed = psl[t] == 1
        prev_key = x
    if prev_sealed:
        ok, y = key_after(prev_key)
        if ok and (old_next < 0 or y < old_hi):
            fst[f] = n
            fen[f] = n
            fsl[f] = 0
            flb[f] = y
            f += 1
    # release the old chain; the pieces take these entries back first
    llat_release(nxt, ptr, free, linfo[l, L_FIRST])
    first_new = meta[NLEAVES]
    if first_new + f - 1 > linfo.shape[0]:
        return NO_LEAF
    prev = -1
    for t in range(f):
        if t == 0:
            lf = l
        else:
            lf = meta[NLEAVES]
            meta[NLEAVES] = lf + 1
            lkey[lf, K_LO] = flb[t]
            linfo[prev, L_NEXT] = lf
            lkey[prev, K_HI] = flb[t]
        e = llat_push_run(keys, ts, seq, head, tail, nxt, last, ptr, free, W, -1, ck, ct, cs,
                          fst[t], fen[t])
        if e < 0:
            return NO_ENTRY
        linfo[lf, L_FIRST] = e
        linfo[lf, L_SIZE] = fen[t] - fst[t]
        linfo[lf, L_SEAL] = fsl[t]
        prev = lf
    linfo[prev, L_NEXT] = old_next
    lkey[prev, K_HI] = old_hi
    # one separator per new leaf, left to right: each lands just right of its predecessor
    for t in range(1, f):
        if not tree_insert(tree, meta, F, flb[t], first_new + t - 1, pn, pi):
            return NO_NODE
    return OK


@njit(**NJIT)
def new_scratch(bk, W, q, m):
    """Work arrays of one insert call, big enough for any split in it.

    A split handles n <= W + m tuples (the leaf, unsealed so <= W, plus a run).
    Pieces: those of >= q tuples, sealed ones of >= h = (W+1)//2 + 1, at most one
    smaller piece per side of a sealed one, and one more (the last, small, run
    piece); the final list adds at most one empty gap leaf per sealed piece.
    """
    n = W + m
    h = (W + 1) // 2 + 1
    cap = n // q + 3 * (n // h) + 4
    return (np.empty(n, dtype=bk.dtype), np.empty(n, dtype=np.int64),
            np.empty(n, dtype=np.int64),
            np.empty(cap, dtype=np.int64), np.empty(cap, dtype=np.int64),
            np.zeros(cap, dtype=np.uint8), np.empty(2 * cap + 2, dtype=np.int64),
            np.empty(2 * cap + 2, dtype=np.int64), np.zeros(2 * cap + 2, dtype=np.uint8),
            np.empty(2 * cap + 2, dtype=bk.dtype), np.empty(CUT_STACK, dtype=np.int64),
            np.empty(CUT_STACK, dtype=np.int64), np.empty(CUT_STACK, dtype=np.uint8),
            np.full(1, 0x2545F4914F6CDD1D + n, dtype=np.uint64))
