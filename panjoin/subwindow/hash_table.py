"""Hash table subwindow: rows in arrival order, chained by key in an open-addressing table.

Not one of the paper's three indexes: the one for equi joins at small batches, where
the sorted indexes pay a random search per probe tuple and subwindow plus merges into
a large sorted array, and a hash lookup pays one cache line. Insert appends the batch
and links each row to the previous row with its key (O(1) a tuple, nothing moves, no
merge stalls); a probe looks each probe key up and walks its chain through the window
filter (:mod:`panjoin.subwindow.kernels.hash`)::

    insert keys [4, 9] then [4]  ->  rows [4, 9, 4], chain of 4: row 2 -> row 0
    probe eq from key 4          ->  stored rows 2 and 0 (two lookups' worth: one slot)

Band predicates over int64 keys whose bands are at most ``SPAN`` keys wide are probed
as one lookup per key of the band (band:1 -> 3 lookups); anything wider, and every
float band, falls back to the nested loop's scan: exact, but O(subwindow) a probe
tuple, so ``--index hash`` is for equality joins (the engine warns in its log
otherwise). Memory: 32 bytes a row plus 32 a slot at a load factor <= 1/2 (about
64-96 bytes a tuple against BI-Sort's 25-35).
"""

from __future__ import annotations

import logging

import numpy as np

from panjoin.subwindow.base import Residual, SubwindowIndex, WindowFilter, no_pairs
from panjoin.subwindow.kernels.hash import (
    NXT,
    SEQ,
    TS,
    chain_check,
    enumerate_points,
    hash_insert,
    hash_lookup,
)
from panjoin.subwindow.kernels.nested import nested_probe
from panjoin.subwindow.spares import SPARES

log = logging.getLogger("panjoin.subwindow.hash")

#: the widest int64 band (in keys) probed by lookups rather than by a scan
SPAN = 16


def key_bits(keys: np.ndarray) -> np.ndarray:
    """Keys as the 64-bit patterns the table compares (-0.0 folded into 0.0)."""
    if keys.dtype == np.float64:
        return np.where(keys == 0.0, 0.0, keys).view(np.int64)
    return np.ascontiguousarray(keys, dtype=np.int64)


def predicate_fits(pred, key_dtype=None) -> bool:
    """Whether a predicate's bands are points (any keys) or, over int64 keys (or keys not
    known yet), narrow enough to enumerate."""
    if pred.negated:
        return False
    if key_dtype is not None and np.dtype(key_dtype) == np.float64:
        return all(a == b for a, b in pred.bands)
    return all(b - a + 1 <= SPAN for a, b in pred.bands)


def warn_predicate(pred, key_dtype=None) -> None:
    """Say so in the log when the hash table will answer a join by scanning (exact, but
    O(subwindow) a probe tuple), and what to use instead."""
    if not predicate_fits(pred, key_dtype):
        log.warning("index hash answers eq, and bands of at most %d integer keys (band:%d at "
                    "most), by lookups; %s scans every subwindow for every probe tuple: use "
                    "--index bisort for it", SPAN, (SPAN - 1) // 2, pred)


_IOTA = np.arange(1 << 12, dtype=np.int64)


def _iota(m: int) -> np.ndarray:
    """0 .. m-1 as a view of one shared array (an equi probe's lookup index, read by
    the kernel only: not a fresh arange per probe and subwindow)."""
    global _IOTA
    if m > _IOTA.shape[0]:
        _IOTA = np.arange(max(m, 2 * _IOTA.shape[0]), dtype=np.int64)
    return _IOTA[:m]


def _points(lo, hi):
    """(key bits, probe index) of the lookups that answer these bands, or None."""
    if lo.shape[0] == 1 and not (lo[0] != hi[0]).any():  # an equi join's probe
        return key_bits(lo[0]), _iota(lo.shape[1])
    full = lo <= hi
    if lo.dtype == np.float64:
        if not np.array_equal(lo[full], hi[full]):
            return None
        b, i = np.nonzero(full)
        return key_bits(lo[b, i]), i.astype(np.int64)
    if full.any():
        # width - 1 as unsigned: no overflow for bands across the whole int64 range
        width = (hi[full].view(np.uint64) - lo[full].view(np.uint64)).max()
        if width >= SPAN:
            return None
    return enumerate_points(lo, hi, SPAN)


_LAST = (None, None, None)  # (lo, hi, points) of the last probe


def _points_of(given, lo, hi):
    """:func:`_points` of ``lo, hi``, once per batch: a batch probes several subwindows
    with the same bound arrays ``given`` (made once, never changed), so the last answer
    is kept, by their identity. One tuple, read and replaced whole: threads probing
    other batches at the same time see a miss, never another batch's points."""
    global _LAST
    last = _LAST
    if last[0] is given[0] and last[1] is given[1]:
        return last[2]
    pts = _points(lo, hi)
    _LAST = (given[0], given[1], pts)
    return pts


#: spares of each array's shape prepared ahead (panjoin.subwindow.spares): a hash table
#: serves small batches under a latency bound, where a create's clearing and page
#: faults are the stalls; one subwindow of each stream may be created at once
AHEAD_SPARES = 2


class HashTable(SubwindowIndex):
    kind = "hash"
    _points = staticmethod(_points)

    def __init__(self, capacity, key_dtype=np.int64, partitions=1, threads=1, **_):
        super().__init__(capacity, key_dtype, max(1, partitions), threads)
        # from the spares an expired table gave back, cleared in the background: a new
        # table costs the batch that creates it no clearing and no page faults
        self.keys = SPARES.empty(self.capacity, self.key_dtype, AHEAD_SPARES)
        # what a lookup reads of a row, in one record (kernels/hash.py); the columns are
        # views for the scan and the checks
        self._flat = SPARES.empty(3 * self.capacity, np.int64, AHEAD_SPARES)
        self._views()
        nslots = 1 << max(4, int(2 * self.capacity - 1).bit_length())  # >= 2 x capacity
        self.shift = 64 - (nslots.bit_length() - 1)
        self.slots = SPARES.zeros(2 * nslots, np.int64, AHEAD_SPARES)  # zeros: empty
        self.n = 0

    def _views(self):
        self.rows = self._flat.reshape(-1, 3)
        self.seq, self.ts, self.nxt = self.rows[:, SEQ], self.rows[:, TS], self.rows[:, NXT]

    def release(self):
        """The subwindow expired: its arrays go back to the spares for the next table
        (each one only if nothing else refers to it), and this one is empty from now on."""
        arrays = [self.keys, self._flat, self.slots]
        self.n = 0
        self.keys = np.empty(0, self.key_dtype)
        self._flat = np.empty(0, np.int64)
        self._views()
        self.slots = np.zeros(2, np.int64)
        SPARES.give_all(arrays)

    def insert(self, keys, ts, seq, key2=None):
        keys, ts, seq = self._check_insert(keys, ts, seq, key2)
        m = keys.shape[0]
        if m == 0:
            return
        hash_insert(self.slots, self.shift, self.rows, self.keys, keys, key_bits(keys), ts,
                    seq, self.n)
        self.n += m

    def probe(self, lo, hi, flt: WindowFilter | None = None, res: Residual | None = None):
        given = (lo, hi)  # what the memo of _points_of knows a batch's bounds by
        lo, hi, flt = self._check_probe(lo, hi, flt)
        m = lo.shape[1]
        if m == 0 or self.n == 0:
            return no_pairs()
        c0, c1, c2 = flt.arrays(m)
        points = _points_of(given, lo, hi)
        if points is None:  # wide or float bands: scan (exact, O(n) a probe tuple)
            p, q = nested_probe(self.keys, self.ts, self.seq, self.n, lo, hi, flt.mode,
                                c0, c1, c2)
        else:
            p, q = hash_lookup(self.slots, self.shift, self.rows, points[0], points[1],
                               flt.mode, c0, c1, c2)
        return self._keep_residual(p, q, res, m)

    def __len__(self):
        return self.n

    @property
    def nbytes(self):
        return self.keys.nbytes + self.rows.nbytes + self.slots.nbytes

    def check(self):
        assert 0 <= self.n <= self.capacity, f"hash: size {self.n} outside [0, {self.capacity}]"
        assert self.slots.shape[0] >= 4 * self.capacity, "hash: load factor above 1/2"
        code = chain_check(self.slots, self.shift, self.rows, key_bits(self.keys[: self.n]),
                           self.n)
        assert code == 0, f"hash: broken table (chain_check code {code}, see kernels/hash.py)"
