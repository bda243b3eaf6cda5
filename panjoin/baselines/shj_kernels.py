"""Numba kernels of the symmetric hash join baseline: the pruning hash table and the probes.

Rows of one side's buffer live in arrival order at positions ``head .. n-1``
(rows before ``head`` were pruned). The hash table is open addressing on the
key's 64 bits (float keys normalised so that -0.0 == 0.0), each slot holding
the NEWEST row with that key; ``nxt[row]`` links to the previous row with the
same key. A probe walks a chain from newest to oldest and stops at the first
row below ``head``: pruning a prefix costs nothing in the table (DataFusion's
``PruningJoinHashMap`` does the same with its ``prune_hash_values``). Example,
keys 7, 3, 7 inserted as rows 0, 1, 2: slot(7) -> 2, nxt[2] = 0, nxt[0] = -1;
after pruning row 0 (head = 1) a probe for 7 sees row 2 only.

The join filter is lowered to rows ``coefB . build_cols + pconst >= 0``
(``pconst`` already holds the probe tuple's part), checked exactly per pair.
"""

import numpy as np

from panjoin.jit import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, inline="always")
def _slot(k, mask):
    return np.int64((np.uint64(k) * _GOLDEN) >> np.uint64(20)) & mask


@njit(cache=True)
def ht_insert(tkey, thead, nxt, bits, start, stop):
    """Insert rows ``start .. stop-1`` (key bits ``bits[row]``); load factor kept < 1/2 by
    the caller."""
    mask = tkey.shape[0] - 1
    for row in range(start, stop):
        k = bits[row]
        s = _slot(k, mask)
        while thead[s] >= 0 and tkey[s] != k:
            s = (s + 1) & mask
        if thead[s] < 0:
            tkey[s] = k
            nxt[row] = -1
        else:
            nxt[row] = thead[s]
        thead[s] = row


@njit(cache=True, inline="always")
def _passes(bcols, coef, pconst, i, j):
    for c in range(coef.shape[0]):
        v = pconst[c, i]
        for b in range(coef.shape[1]):
            v += coef[c, b] * bcols[b, j]
        if v < 0:
            return False
    return True


@njit(cache=True, inline="always")
def _push(out_p, out_b, m, i, j):
    if m == out_p.shape[0]:
        np_ = np.empty(2 * m, np.int64)
        nb = np.empty(2 * m, np.int64)
        np_[:m] = out_p
        nb[:m] = out_b
        out_p, out_b = np_, nb
    out_p[m] = i
    out_b[m] = j
    return out_p, out_b


@njit(cache=True)
def ht_probe(tkey, thead, nxt, head, probe_bits, bcols, coef, pconst):
    """Equi probe: per probe tuple i, every live build row with the same key that passes
    the filter. Returns (probe index, build row) and the number of rows visited."""
    mask = tkey.shape[0] - 1
    out_p = np.empty(1024, np.int64)
    out_b = np.empty(1024, np.int64)
    m = 0
    visited = 0
    for i in range(probe_bits.shape[0]):
        k = probe_bits[i]
        s = _slot(k, mask)
        while thead[s] >= 0 and tkey[s] != k:
            s = (s + 1) & mask
        j = thead[s]
        while j >= head:
            visited += 1
            if _passes(bcols, coef, pconst, i, j):
                out_p, out_b = _push(out_p, out_b, m, i, j)
                m += 1
            j = nxt[j]
    return out_p[:m], out_b[:m], visited


@njit(cache=True)
def scan_probe(bkeys, head, n, lo, hi, bcols, coef, pconst):
    """Filter-only probe (no equi key, e.g. a band join): every live build row is a
    candidate; the key bands ``lo[b, i] <= key <= hi[b, i]`` and the filter rows decide."""
    out_p = np.empty(1024, np.int64)
    out_b = np.empty(1024, np.int64)
    m = 0
    for i in range(lo.shape[1]):
        for j in range(head, n):
            k = bkeys[j]
            hit = False
            for b in range(lo.shape[0]):
                if lo[b, i] <= k and k <= hi[b, i]:
                    hit = True
                    break
            if hit and _passes(bcols, coef, pconst, i, j):
                out_p, out_b = _push(out_p, out_b, m, i, j)
                m += 1
    return out_p[:m], out_b[:m]


@njit(cache=True)
def prune_prefix(bcols, head, n, lows):
    """Advance ``head`` past rows whose sorted columns lie below their pruning bounds:
    such a row can never match a future probe tuple. Stops at the first row that may
    still match (with out-of-order input later rows may be prunable too; the exact
    filter keeps them out of results, and they go once the prefix reaches them)."""
    while head < n:
        dead = False
        for c in range(lows.shape[0]):
            if bcols[c, head] < lows[c]:
                dead = True
                break
        if not dead:
            break
        head += 1
    return head
