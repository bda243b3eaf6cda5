"""WiB+-Tree probes (PanJoin paper, sections III-E and III-F).

Array layout: :mod:`.layout`; traversal: :mod:`.tree`.
"""

import numpy as np

from panjoin.config import NJIT, NJIT_PAR
from panjoin.jit import njit, prange
from panjoin.subwindow.kernels.primitives import prefetch_read
from panjoin.subwindow.kernels.search import chunk_bounds
from panjoin.subwindow.kernels.wib.layout import (
    K_HI,
    K_LO,
    L_FIRST,
    L_NEXT,
    L_SEAL,
    L_SIZE,
    PROBE_AHEAD,
    RING,
)
from panjoin.subwindow.kernels.wib.tree import find_leaf, new_path
from panjoin.subwindow.kernels.window import NONE, in_window  # closed bounds: see window.py


@njit(**NJIT)
def _segment(keys, ts, seq, p0, p1, xl, xh, whole, g, mode, c0, c1, c2,
             out_p, out_s, pos, limit, cnt):
    """Pairs of probe tuple g with slots [p0, p1) whose key lies in [xl, xh].

    ``whole``: every key is inside, no comparison needed. ``limit`` = 0 counts
    only (branch-free compares that vectorise when there is no window filter);
    otherwise pairs are written at out_*[pos + cnt] while cnt < limit, and counted on.
    """
    if limit == 0:
        if mode == NONE:
            if whole:
                return cnt + (p1 - p0)
            c = 0
            for p in range(p0, p1):
                k = keys[p]
                c += (k >= xl) & (k <= xh)
            return cnt + c
        for p in range(p0, p1):
            k = keys[p]
            if (whole or (k >= xl and k <= xh)) and in_window(mode, c0[g], c1[g], c2[g],
                                                             seq[p], ts[p]):
                cnt += 1
        return cnt
    if mode == NONE and not whole:
        # few keys match: count them branch-free first, then stop after the last one
        c = 0
        for p in range(p0, p1):
            k = keys[p]
            c += (k >= xl) & (k <= xh)
        p = p0
        while c > 0:
            k = keys[p]
            if k >= xl and k <= xh:
                if cnt < limit:
                    out_p[pos + cnt] = g
                    out_s[pos + cnt] = seq[p]
                cnt += 1
                c -= 1
            p += 1
        return cnt
    for p in range(p0, p1):
        k = keys[p]
        if (whole or (k >= xl and k <= xh)) and in_window(mode, c0[g], c1[g], c2[g],
                                                         seq[p], ts[p]):
            if cnt < limit:
                out_p[pos + cnt] = g
                out_s[pos + cnt] = seq[p]
            cnt += 1
    return cnt


@njit(**NJIT)
def _probe_leaf(leaf, store, W, l, boundary, b, i, j, lo, hi, mode, c0, c1, c2,
                out_p, out_s, pos, limit, cnt):
    """Leaf l against probe group [i, j).

    A boundary leaf compares keys (a sealed one holds a single key, so it matches
    a probe tuple whole or not at all); a leaf strictly between the boundary
    leaves is copied whole. The leaf stays in cache across the group, so the loop
    runs probe tuple by probe tuple. An unsealed leaf is one LLAT entry, read as
    one slice (its size is the leaf's, Tail is always 0: whole-subwindow expiry
    never moves it); only sealed leaves walk a chain.
    """
    linfo, lkey = leaf
    keys, ts, seq, head, tail, nxt, last, ptr, free = store
    sealed = linfo[l, L_SEAL] == 1
    x = lkey[l, K_LO]
    e0 = linfo[l, L_FIRST]
    size = linfo[l, L_SIZE]
    for g in range(i, j):
        xl = lo[b, g]
        xh = hi[b, g]
        if xl > xh:
            continue
        whole = not boundary
        if sealed:
            if not (whole or (xl <= x and x <= xh)):
                continue
            whole = True
        e = e0
        while e >= 0:
            p0 = e * W
            if sealed:
                p1 = p0 + head[e]
                e = nxt[e]
            else:
                p1 = p0 + size
                e = -1
            cnt = _segment(keys, ts, seq, p0, p1, xl, xh, whole, g, mode, c0, c1, c2,
                           out_p, out_s, pos, limit, cnt)
    return cnt


@njit(**NJIT)
def probe_chunk(tree, leaf, store, root, height, W, lo, hi, mode, c0, c1, c2,
                start, end, out_p, out_s, pos, limit):
    """Matches of probe tuples [start, end), written from out_*[pos] on (see _segment).

    Per band row (sorted), consecutive probe tuples whose lower bound falls in
    the same leaf and whose upper bound falls in the same leaf form a group
    (paper III-E: a partition is scanned for all its related batch tuples at
    once). The two boundary leaves are scanned comparing keys, leaves strictly
    between are copied whole; the window filter applies to every pair. The
    traversal runs PROBE_AHEAD leaves ahead of the scans and prefetches each
    leaf's row, then (half as far ahead) its keys, so that the scans, which
    meet the leaves in random memory order, find them in cache.
    """
    ikeys, ichild, icnt = tree
    linfo, lkey = leaf
    keys = store[0]
    info_flat = linfo.reshape(linfo.size)
    key_flat = lkey.reshape(lkey.size)
    cnt = np.int64(0)  # np.int64: a literal 0 would compile callees twice
    pn, pi, pu, pinf, cur = new_path(lo)
    # queue of looked-ahead lo leaves: q_start[c] is the first probe tuple whose lo lies
    # in leaf q_leaf[c]; counters qh (current), qt (found), qb (keys prefetched)
    q_start = np.empty(RING, dtype=np.int64)
    q_leaf = np.empty(RING, dtype=np.int64)
    half = PROBE_AHEAD // 2
    for b in range(lo.shape[0]):
        cur[0] = -1
        qh = np.int64(0)
        qt = np.int64(0)
        qb = np.int64(0)
        la = start  # the first probe tuple the lookahead has not placed
        i = start
        while i < end:
            x = lo[b, i]
            y = hi[b, i]
            if x > y:
                i += 1  # empty band: no cursor moves
                continue
            while la < end and qt - qh <= PROBE_AHEAD:
                if lo[b, la] > hi[b, la]:
                    la += 1
                    continue
                l3 = find_leaf(lo[b, la], ikeys, ichild, icnt, root, height, pn, pi, pu, pinf,
                               cur)
                c = qt & (RING - 1)
                q_start[c] = la
                q_leaf[c] = l3
                prefetch_read(info_flat, l3 * 4)
                prefetch_read(key_flat, l3 * 2)
                qt += 1
                # the following probe tuples whose lo lies in the same leaf
                la += 1
                if pinf[height] == 1:
                    la = end
                else:
                    u = pu[height]
                    while la < end and (lo[b, la] > hi[b, la] or lo[b, la] < u):
                        la += 1
            while qb < qt and qb <= qh + half:
                l3 = q_leaf[qb & (RING - 1)]
                base = linfo[l3, L_FIRST] * W
                stop = base + min(linfo[l3, L_SIZE], W)
                for p in range(base, stop, 8):
                    prefetch_read(keys, p)
                qb += 1
            while qh + 1 < qt and q_start[(qh + 1) & (RING - 1)] <= i:
                qh += 1
            l1 = q_leaf[qh & (RING - 1)]
            n1 = linfo[l1, L_NEXT]
            u1 = lkey[l1, K_HI]
            l2 = l1
            while True:
                n2 = linfo[l2, L_NEXT]
                if n2 < 0 or lkey[l2, K_HI] > y:
                    break
                l2 = n2
            u2 = lkey[l2, K_HI]
            j = i + 1
            while j < end:
                xj = lo[b, j]
                yj = hi[b, j]
                if xj <= yj and ((n1 >= 0 and xj >= u1) or (n2 >= 0 and yj >= u2)):
                    break
                j += 1
            l = l1
            while True:
                cnt = _probe_leaf(leaf, store, W, l, l == l1 or l == l2, b, i, j, lo, hi, mode,
                                  c0, c1, c2, out_p, out_s, pos, limit, cnt)
                if l == l2:
                    break
                l = linfo[l, L_NEXT]
            i = j
    return cnt


@njit(**NJIT_PAR)
def wib_probe(tree, leaf, store, root, height, W, lo, hi, mode, c0, c1, c2, parts, slab):
    """Probe driver: ``parts`` chunks of the batch in parallel, two passes.

    Pass 1 counts each chunk's matches and, speculatively, writes them into the
    chunk's own slab of ``slab`` slots (slab = 0: count only). Pass 2 fills the
    output at the prefix-sum offsets: a chunk whose matches fit its slab is
    copied, any other is probed again straight into place. With a slab sized
    from the expected selectivity the leaves are read from memory once, not twice.
    """
    m = lo.shape[1]
    bounds = chunk_bounds(m, parts)
    counts = np.zeros(parts + 1, dtype=np.int64)
    sp = np.empty(parts * slab, dtype=np.int64)
    ss = np.empty(parts * slab, dtype=np.int64)
    for t in prange(parts):
        counts[t + 1] = probe_chunk(tree, leaf, store, root, height, W, lo, hi, mode, c0, c1,
                                    c2, bounds[t], bounds[t + 1], sp, ss, t * slab, slab)
    offs = np.cumsum(counts)
    total = offs[parts]
    out_p = np.empty(total, dtype=np.int64)
    out_s = np.empty(total, dtype=np.int64)
    for t in prange(parts):
        c = counts[t + 1]
        if c == 0:
            continue
        o = offs[t]
        if c <= slab:
            base = t * slab
            out_p[o:o + c] = sp[base:base + c]
            out_s[o:o + c] = ss[base:base + c]
        else:
            probe_chunk(tree, leaf, store, root, height, W, lo, hi, mode, c0, c1, c2,
                        bounds[t], bounds[t + 1], out_p, out_s, o, c)
    return out_p, out_s
