"""WiB+-Tree batch insert (PanJoin paper, section III-E batch mode).

Array layout: :mod:`.layout`; traversal: :mod:`.tree`; splits: :mod:`.split`.
"""

import numpy as np

from panjoin.config import NJIT
from panjoin.jit import njit
from panjoin.subwindow.kernels.llat import llat_push_run
from panjoin.subwindow.kernels.primitives import prefetch_read, prefetch_write
from panjoin.subwindow.kernels.search import gallop_left
from panjoin.subwindow.kernels.wib.layout import (
    HEIGHT,
    INSERT_AHEAD,
    L_FIRST,
    L_SEAL,
    L_SIZE,
    NO_ENTRY,
    OK,
    RING,
    ROOT,
    SIZE,
)
from panjoin.subwindow.kernels.wib.split import new_scratch, split_leaf
from panjoin.subwindow.kernels.wib.tree import find_leaf, new_path


@njit(**NJIT)
def wib_insert(tree, leaf, store, meta, W, F, q, bk, bt, bs):
    """Insert a batch sorted by key (paper III-E batch mode). Returns a status code.

    Consecutive tuples bound for one leaf form a run (found by a rebounding
    search for the leaf's upper bound in the batch) and go in together: appended
    when they fit or the leaf is sealed, else the leaf splits around them.

    Leaves and LLAT entries are numbered in creation order, not key order, so a
    sorted batch still hits them at random; the traversal therefore runs
    INSERT_AHEAD runs ahead of the inserts, prefetching each run's leaf row and,
    half as far ahead, the slot the run goes to, so that several memory accesses
    are in flight at once. A split changes the tree: the lookahead restarts
    behind it from the root.
    """
    ikeys, ichild, icnt = tree
    linfo, lkey = leaf
    keys, ts, seq, head, tail, nxt, last, ptr, free = store
    m = bk.shape[0]
    pn, pi, pu, pinf, cur = new_path(bk)
    scratch = new_scratch(bk, W, q, m)
    # queue of looked-ahead runs: counters qh (the run being inserted), qt (runs found),
    # qb (runs whose slots were prefetched); slot c of the ring is counter c & (RING - 1)
    q_start = np.empty(RING, dtype=np.int64)
    q_end = np.empty(RING, dtype=np.int64)
    q_leaf = np.empty(RING, dtype=np.int64)
    info_flat = linfo.reshape(linfo.size)
    key_flat = lkey.reshape(lkey.size)
    half = INSERT_AHEAD // 2
    qh = np.int64(0)
    qt = np.int64(0)
    qb = np.int64(0)
    la = np.int64(0)  # the first tuple not yet in a looked-ahead run
    while qh < qt or la < m:
        while la < m and qt - qh <= INSERT_AHEAD:
            h = meta[HEIGHT]
            l2 = find_leaf(bk[la], ikeys, ichild, icnt, meta[ROOT], h, pn, pi, pu, pinf, cur)
            end2 = m if pinf[h] == 1 else gallop_left(bk, pu[h], la + 1)
            c = qt & (RING - 1)
            q_start[c] = la
            q_end[c] = end2
            q_leaf[c] = l2
            prefetch_read(info_flat, l2 * 4)
            prefetch_read(key_flat, l2 * 2)
            qt += 1
            la = end2
        while qb < qt and qb <= qh + half:
            l2 = q_leaf[qb & (RING - 1)]
            e = linfo[l2, L_FIRST]
            p = e * W + linfo[l2, L_SIZE]
            prefetch_write(keys, p)
            prefetch_write(ts, p)
            prefetch_write(seq, p)
            prefetch_write(head, e)
            qb += 1
        c = qh & (RING - 1)
        qh += 1
        i = q_start[c]
        j = q_end[c]
        l = q_leaf[c]
        r = j - i
        sz = linfo[l, L_SIZE]
        if linfo[l, L_SEAL] == 0 and sz + r <= W:
            # an unsealed leaf is one entry: append in place, no chain to follow
            e = linfo[l, L_FIRST]
            p = e * W + sz
            for t in range(r):
                keys[p + t] = bk[i + t]
                ts[p + t] = bt[i + t]
                seq[p + t] = bs[i + t]
            linfo[l, L_SIZE] = sz + r
            head[e] = sz + r
        elif linfo[l, L_SEAL] == 1:
            if llat_push_run(keys, ts, seq, head, tail, nxt, last, ptr, free, W,
                             linfo[l, L_FIRST], bk, bt, bs, i, j) < 0:
                return NO_ENTRY
            linfo[l, L_SIZE] = sz + r
        else:
            st = split_leaf(tree, leaf, store, meta, W, F, q, l, bk, bt, bs, i, j, scratch,
                            pn, pi)
            if st != OK:
                return st
            # the tree changed: looked-ahead runs may be stale, restart from the root
            cur[0] = -1
            la = j
            qh = qt = qb = 0
        meta[SIZE] += r
    return OK
