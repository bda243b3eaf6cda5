"""Hash-table kernels: a chained, open-addressing table over a subwindow's arrival order.

Arrays in, arrays out; the orchestration lives in :mod:`panjoin.subwindow.hash_table`.

Rows stay in arrival order (``key``, ``ts``, ``seq`` columns plus ``nxt``). The table
has ``2^bits`` slots, each two int64 words in one array (``slots[2 s]`` = the key's
64 bits, ``slots[2 s + 1]`` = 1 + the newest row with that key, 0 empty: a table of
zeros is empty, so a new one costs no pass over its memory), so a lookup reads one
cache line; ``nxt[row]`` links a row to the previous row with the same key.
Collisions probe linearly. The load factor stays <= 1/2 (slots >= 2 x capacity), so a
miss ends after about 1.5 slots. Example, keys 7, 3, 7 inserted as rows 0, 1, 2::

    slot(7): key 7, head 2 + 1      nxt [-1, -1, 0]     lookup 7 -> rows 2, 0
    slot(3): key 3, head 1 + 1

A batch of lookups runs a few probe tuples ahead of itself: the slot of tuple
``i + AHEAD`` is prefetched while tuple ``i`` is resolved, and the head row of a hit
before its chain is walked, so the cache misses of a small batch over a large
subwindow overlap instead of queueing (the reason this index exists: a batch of 1K
tuples costs one or two misses a tuple, with no merge into a large sorted array).
Keys are compared as 64-bit patterns: int64 keys as they are, float64 keys with
``-0.0`` folded into ``0.0`` (the caller does it; NaN never reaches an index).
"""

import numpy as np
from numba import njit

from panjoin.config import NJIT
from panjoin.subwindow.kernels.primitives import prefetch_read, prefetch_write
from panjoin.subwindow.kernels.window import in_window

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
#: how many probe (or insert) tuples ahead of the current one a slot is prefetched
AHEAD = 16


@njit(inline="always", cache=True)
def slot_of(b, shift):
    """Fibonacci hashing: the top ``64 - shift`` bits of ``b * golden``."""
    return np.int64((np.uint64(b) * _GOLDEN) >> np.uint64(shift))


@njit(**NJIT)
def hash_insert(slots, shift, nxt, bits, n0, m):
    """Chain rows ``n0 .. n0+m-1`` (their key bits ``bits[0 .. m-1]``) into the table."""
    mask = (slots.shape[0] >> 1) - 1
    for j in range(m):
        if j + AHEAD < m:
            prefetch_write(slots, 2 * slot_of(bits[j + AHEAD], shift))
        b = bits[j]
        s = slot_of(b, shift)
        while slots[2 * s + 1] != 0 and slots[2 * s] != b:
            s = (s + 1) & mask
        row = n0 + j
        if slots[2 * s + 1] == 0:
            slots[2 * s] = b
        nxt[row] = slots[2 * s + 1] - 1
        slots[2 * s + 1] = row + 1


@njit(inline="always", cache=True)
def _head(slots, shift, mask, b):
    s = slot_of(b, shift)
    while True:
        h = slots[2 * s + 1]
        if h == 0 or slots[2 * s] == b:
            return h - 1
        s = (s + 1) & mask


@njit(inline="always", cache=True)
def _grow(a, need):
    if need <= a.shape[0]:
        return a
    b = np.empty(max(need, 2 * a.shape[0]), dtype=a.dtype)
    b[: a.shape[0]] = a
    return b


@njit(**NJIT)
def hash_lookup(slots, shift, nxt, ts, seq, pbits, pidx, mode, c0, c1, c2):
    """Pairs ``(probe index, stored seq)`` of the point lookups ``pbits[k]`` (key bits)
    made for probe tuple ``pidx[k]``, each stored row passed through the window filter
    of its probe tuple."""
    mask = (slots.shape[0] >> 1) - 1
    m = pbits.shape[0]
    heads = np.empty(AHEAD, dtype=np.int64)  # a ring of resolved heads, AHEAD behind
    out_p = np.empty(max(16, m), dtype=np.int64)
    out_s = np.empty(max(16, m), dtype=np.int64)
    k = 0
    for j in range(min(AHEAD, m)):
        prefetch_read(slots, 2 * slot_of(pbits[j], shift))
    for j in range(m + AHEAD):
        i = j - AHEAD
        if i >= 0:  # stage 2: walk tuple i's chain (its head row was prefetched)
            row = heads[i % AHEAD]
            p = pidx[i]
            while row >= 0:
                if in_window(mode, c0[p], c1[p], c2[p], seq[row], ts[row]):
                    if k == out_p.shape[0]:
                        out_p = _grow(out_p, k + 1)
                        out_s = _grow(out_s, k + 1)
                    out_p[k] = p
                    out_s[k] = seq[row]
                    k += 1
                row = nxt[row]
        if j < m:  # stage 1: tuple j's head row (its slot was prefetched); prefetch it
            if j + AHEAD < m:
                prefetch_read(slots, 2 * slot_of(pbits[j + AHEAD], shift))
            h = _head(slots, shift, mask, pbits[j])
            if h >= 0:  # the head row's columns, its chain link included
                prefetch_read(seq, h)
                prefetch_read(ts, h)
                prefetch_read(nxt, h)
            heads[j % AHEAD] = h  # the slot tuple i just freed
    return out_p[:k], out_s[:k]


@njit(**NJIT)
def enumerate_points(lo, hi, span):
    """The integer keys of every non-empty band ``[lo[b, i], hi[b, i]]`` as point lookups
    ``(key, probe index)``; ``span`` is the widest band (the caller checked it is small)."""
    nb, n = lo.shape
    total = 0
    for b in range(nb):
        for i in range(n):
            if lo[b, i] <= hi[b, i]:
                total += hi[b, i] - lo[b, i] + 1
    keys = np.empty(total, dtype=np.int64)
    pidx = np.empty(total, dtype=np.int64)
    k = 0
    for b in range(nb):
        for i in range(n):
            if lo[b, i] <= hi[b, i]:
                for d in range(hi[b, i] - lo[b, i] + 1):
                    keys[k] = lo[b, i] + d
                    pidx[k] = i
                    k += 1
    return keys, pidx


@njit(**NJIT)
def chain_check(slots, shift, nxt, bits, n):
    """Every row reachable exactly once, from the slot of its own key, newest first;
    returns an error code (0: fine) for :meth:`HashTable.check`."""
    mask = (slots.shape[0] >> 1) - 1
    seen = np.zeros(n, dtype=np.bool_)
    for s in range(mask + 1):
        row = slots[2 * s + 1] - 1
        if row >= n:
            return 1  # a head past the rows
        prev = n
        while row >= 0:
            if row >= prev:
                return 2  # chain not newest first
            if seen[row]:
                return 3  # a row on two chains
            if bits[row] != slots[2 * s]:
                return 4  # a row under another key's slot
            seen[row] = True
            prev = row
            row = nxt[row]
        if slots[2 * s + 1] > 0 and _head(slots, shift, mask, slots[2 * s]) != slots[2 * s + 1] - 1:
            return 5  # a key that a lookup would not find (broken linear probing)
    for r in range(n):
        if not seen[r]:
            return 6  # a row no lookup reaches
    return 0
