"""Hash-table kernels: a chained, open-addressing table over a subwindow's arrival order.

Arrays in, arrays out; the orchestration lives in :mod:`panjoin.subwindow.hash_table`.

Rows stay in insertion order. What a lookup reads of a row is one 24-byte record,
``rows[row] = (seq, ts, nxt)`` (one cache line, at most two), not three columns (three
lines: a chain's row cost three misses); ``nxt`` links a row to the previous row with
the same key. The table has ``2^bits`` slots, each two int64 words in one array
(``slots[2 s]`` = the key's 64 bits, ``slots[2 s + 1]`` = 1 + the newest row with
that key, 0 empty: a table of zeros is empty, so a new one costs no pass over its
memory), so a lookup reads one cache line. Collisions probe linearly. The load factor
stays <= 1/2 (slots >= 2 x capacity), so a miss ends after about 1.5 slots. Example,
keys 7, 3, 7 inserted as rows 0, 1, 2::

    slot(7): key 7, head 2 + 1      rows[:, NXT] [-1, -1, 0]     lookup 7 -> rows 2, 0
    slot(3): key 3, head 1 + 1

Inserts prefetch the slot of tuple ``i + AHEAD`` while tuple ``i`` is chained. A batch
of lookups goes in passes over a frontier (one entry a chain not yet ended): the first
pass reads every lookup's slot, each later one the next row of every chain, and each
pass prefetches the entry ``AHEAD`` places on. The cache misses of a small batch over a
large subwindow overlap instead of queueing, chains included (the reason this index
exists: a batch of 1K tuples costs one or two misses a tuple, with no merge into a large
sorted array); a pass is a plain loop, so the core keeps as many misses in flight as it
can (measured at 1K lookups over a 1M-row table: 17 ns a lookup, against 27 ns for
sixteen lookups visited in turn, each chain walked by its own lane).
Keys are compared as 64-bit patterns: int64 keys as they are, float64 keys with
``-0.0`` folded into ``0.0`` (the caller does it; NaN never reaches an index).
"""

import numpy as np

from panjoin.config import NJIT
from panjoin.jit import njit
from panjoin.subwindow.kernels.primitives import prefetch_read, prefetch_write
from panjoin.subwindow.kernels.window import in_window

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
#: how many insert tuples, or frontier entries of a lookup pass, ahead of the current
#: one a slot or row is prefetched (16 -> 32: 13.4 -> 10 ns an insert, 22 -> 17 ns a
#: lookup over a 1M-row table)
AHEAD = 32
#: the columns of a row record
SEQ, TS, NXT = 0, 1, 2


@njit(inline="always", cache=True)
def slot_of(b, shift):
    """Fibonacci hashing: the top ``64 - shift`` bits of ``b * golden``."""
    return np.int64((np.uint64(b) * _GOLDEN) >> np.uint64(shift))


@njit(**NJIT)
def hash_insert(slots, shift, rows, stored_keys, keys, bits, ts, seq, n0):
    """Store a batch as rows ``n0 ..`` (``stored_keys`` and the row records take its
    keys, ts and seqs) and chain each row into the table by its key bits ``bits``."""
    mask = (slots.shape[0] >> 1) - 1
    m = bits.shape[0]
    for j in range(m):
        if j + AHEAD < m:
            prefetch_write(slots, 2 * slot_of(bits[j + AHEAD], shift))
        b = bits[j]
        s = slot_of(b, shift)
        while slots[2 * s + 1] != 0 and slots[2 * s] != b:
            s = (s + 1) & mask
        row = n0 + j
        stored_keys[row] = keys[j]
        rows[row, SEQ] = seq[j]
        rows[row, TS] = ts[j]
        if slots[2 * s + 1] == 0:
            slots[2 * s] = b
        rows[row, NXT] = slots[2 * s + 1] - 1
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
def hash_lookup(slots, shift, rows, pbits, pidx, mode, c0, c1, c2):
    """Pairs ``(probe index, stored seq)`` of the point lookups ``pbits[k]`` (key bits)
    made for probe tuple ``pidx[k]``, each stored row passed through the window filter
    of its probe tuple; pairs come out in no particular order.

    In passes over a frontier ``(probe index, row)``: the heads of every lookup's chain
    first, then each pass takes one row of every chain still going (its filter, its
    pair) and keeps the chain's next row for the next pass. Each pass prefetches the
    slot or row ``AHEAD`` entries on, so its misses overlap."""
    mask = (slots.shape[0] >> 1) - 1
    flat = rows.reshape(-1)  # prefetch_read takes a 1-d array
    m = pbits.shape[0]
    front_p = np.empty(m, dtype=np.int64)
    front_row = np.empty(m, dtype=np.int64)
    live = 0
    for k in range(m):
        if k + AHEAD < m:
            prefetch_read(slots, 2 * slot_of(pbits[k + AHEAD], shift))
        row = _head(slots, shift, mask, pbits[k])
        if row >= 0:
            front_p[live] = pidx[k]
            front_row[live] = row
            live += 1
    out_p = np.empty(max(16, m), dtype=np.int64)
    out_s = np.empty(max(16, m), dtype=np.int64)
    n = 0
    while live > 0:
        going = 0  # the chains that go on, compacted in place (written at or before i)
        for i in range(live):
            if i + AHEAD < live:
                # the record's first and last word: one line, or the two it straddles
                ahead = 3 * front_row[i + AHEAD]
                prefetch_read(flat, ahead)
                prefetch_read(flat, ahead + 2)
            row = front_row[i]
            p = front_p[i]
            sq = rows[row, SEQ]
            if in_window(mode, c0[p], c1[p], c2[p], sq, rows[row, TS]):
                if n == out_p.shape[0]:
                    out_p = _grow(out_p, n + 1)
                    out_s = _grow(out_s, n + 1)
                out_p[n] = p
                out_s[n] = sq
                n += 1
            row = rows[row, NXT]
            if row >= 0:
                front_p[going] = p
                front_row[going] = row
                going += 1
        live = going
    return out_p[:n], out_s[:n]


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
def chain_check(slots, shift, rows, bits, n):
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
            row = rows[row, NXT]
        if slots[2 * s + 1] > 0 and _head(slots, shift, mask, slots[2 * s]) != slots[2 * s + 1] - 1:
            return 5  # a key that a lookup would not find (broken linear probing)
    for r in range(n):
        if not seen[r]:
            return 6  # a row no lookup reaches
    return 0
