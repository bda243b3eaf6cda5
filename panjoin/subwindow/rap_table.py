"""RaP-Table: range partitions, histograms and an LLAT (PanJoin paper, section III-B).

A partition table of P splitters cuts the key domain into P ranges; partition
i holds the keys in ``[s_i, s_{i+1})``, where ``s_0`` is the key type's lowest
value (so partition 0 also takes every key below s_1) and the last partition
runs to +inf. Equal splitters leave empty partitions between them, and a key
always has exactly one partition: ``(first j with s_j > key) - 1``. Per
partition, three histograms (count, min, max) are kept up to date on insert;
the tuples themselves live in an LLAT (2P entries of ``ceil(NSub/P * sigma)``
slots; a partition that outgrows its entry chains reserved ones)::

    splitters  s0 = -inf    s1 = 12      s2 = 22      s3 = 41
    partition  |     0      |     1      |     2      |     3      ... +inf
    count            3            6            3            4
    [min, max]     [3, 8]     [12, 21]     [22, 34]     [41, 50]

    LLAT (5 slots an entry)  0: 3 7 8
                             1: 12 15 21 13 14  ──►  4: 16   (reserved, chained)
                             2: 22 30 34
                             3: 41 45 50 44                   PtrG = 5

float64 keys are stored, partitioned and probed as order-preserving int64
codes (``encode``: -2.0 < -1.0 < 0.0 < 1.0 map to increasing int64s, -0.0 to
the code of 0.0), so every kernel is compiled for int64 once; the splitters a
user gives or reads, and Algorithm 1's interpolation, stay in key values.

Where the splitters come from: a successor subwindow gets them from its
predecessor's histograms by Algorithm 1 (:meth:`RaPTable.successor_splitters`,
kernel :func:`~panjoin.subwindow.kernels.rap.adjust_splitters`); a first
subwindow from ``splitters=`` if given, else from the quantiles of its first
(sorted) insert batch.

Worked trace (NSub = 16, P = 4, sigma = 1.25, so an entry holds 5 tuples):

1. insert ``[3 7 8 12 15 21 22 30 34 41 45 50]``: no table yet, so quantiles
   ``s = [-inf, 12, 22, 41]`` (batch positions 3, 6, 9). The rebounding
   search walks the table once: runs ``[3 7 8] [12 15 21] [22 30 34] [41 45 50]``
   are copied to entries 0..3.
2. insert ``[13 14 16 44]``: runs ``[13 14 16]`` -> partition 1 (entry 1 fills
   at 5 tuples, 16 goes to reserved entry 4, PtrG 4 -> 5) and ``[44]`` -> 3.
3. probe band:3 from R with keys ``[14 25 30]`` -> bands ``[11,17] [22,28]
   [27,33]``. Key 14: lo 11 is in partition 0, hi 17 in 1: both scanned with key
   tests -> 12 15 13 14 16. Keys 25 and 30 have both bounds in partition 2 and
   form one group for it: a group this small scans the (by then cached)
   partition once per tuple; a large one runs the paper's nested loop, outer
   ``[22 30 34]``, inner the group -> (25, 22), (30, 30). This is the count
   pass; the fill pass repeats only the scans that found something, stopping at
   the last match, and writes at per-thread offsets.
4. probe band:20 with key 25 -> ``[5, 45]``: partitions 0 and 3 are scanned
   (7 8 | 41 45 44), partitions 1 and 2 lie strictly inside and are copied
   without a key test.
5. successor splitters (Algorithm 1, N = 16, bal = 4, 8, 12; sums 3, 9, 12, 16):
   ``s_1 = 12 + (4-3)/6 * 9 = 13``, ``s_2 = 12 + (8-3)/6 * 9 = 19``,
   ``s_3 = 22 + (12-9)/3 * 12 = 34`` -> ``[-inf, 13, 19, 34]``.
6. expire: the manager drops the whole subwindow (RaP-Table has no delete).

Costs: insert O(m + r log(P/r)) for m tuples in r runs; probe per band
O(log jump) to locate each bound plus the boundary partitions' sizes plus the
matches; memory ``2P * ceil(NSub/P * sigma)`` slots of key, ts, seq plus 4P
for the table and histograms (see ``nbytes``).
"""

from __future__ import annotations

import numpy as np

from panjoin.config import LLAT_SIGMA
from panjoin.subwindow.base import Residual, SubwindowIndex, WindowFilter, no_pairs
from panjoin.subwindow.kernels.primitives import I64_MAX, I64_MIN
from panjoin.subwindow.kernels.rap import (
    adjust_splitters,
    first_unsorted,
    float_codes,
    quantile_splitters,
    rap_insert,
    rap_probe,
)
from panjoin.subwindow.llat import LLAT


def encode(keys: np.ndarray) -> np.ndarray:
    """int64 keys as they are; float64 keys as order-preserving int64 codes (any shape)."""
    if keys.dtype == np.int64:
        return keys
    keys = np.ascontiguousarray(keys)
    out = np.empty(keys.shape, dtype=np.int64)
    float_codes(keys.reshape(-1), out.reshape(-1))
    return out


def decode(codes: np.ndarray, key_dtype) -> np.ndarray:
    """Inverse of :func:`encode` (the lowest code, a table's s_0, becomes -inf)."""
    if np.dtype(key_dtype) == np.int64:
        return codes
    bits = np.where(codes < 0, codes ^ I64_MAX, codes)
    out = bits.view(np.float64).copy()
    out[codes == I64_MIN] = -np.inf
    return out


class RaPTable(SubwindowIndex):
    """Range Partition Table over one subwindow.

    ``predecessor``: the previous RaP-Table of the same stream; the partition
    table is computed from its histograms by Algorithm 1. Options:
    ``splitters`` (P values, or the P-1 inner ones; non-decreasing; the first of
    P is replaced by the key type's lowest value) fixes the table and wins over
    a predecessor; ``sigma`` is the LLAT slack (default ``config.LLAT_SIGMA``).
    Other options are ignored (``make_index`` passes one set to every kind).
    Without either, the table comes from the quantiles of the first insert.

    float64 keys are stored, partitioned and probed as their order-preserving
    int64 codes (:func:`encode`), so the kernels are compiled for int64 only;
    ``splitters`` and :meth:`successor_splitters` are in key values, while the
    LLAT, ``mn`` and ``mx`` hold codes.
    """

    kind = "rap"

    def __init__(self, capacity, key_dtype=np.int64, partitions=1024, threads=1,
                 predecessor=None, **opts):
        super().__init__(capacity, key_dtype, partitions, threads)
        sigma = float(opts.get("sigma", LLAT_SIGMA))
        P = self.partitions
        # numpy advises transparent huge pages for large arrays, so the first touches of
        # a fresh LLAT cost one fault per 2 MiB rather than per 4 KiB
        self.llat = LLAT(self.capacity, P, np.int64, sigma=sigma)
        self.count = np.zeros(P, dtype=np.int64)
        self.mn = np.full(P, I64_MAX, dtype=np.int64)  # empty partition: min above max
        self.mx = np.full(P, I64_MIN, dtype=np.int64)
        self.n = 0
        self._cum: np.ndarray | None = None
        self._spl: np.ndarray | None = None  # the partition table, in codes
        given = opts.get("splitters")
        if given is not None:
            self._spl = self._table_from(given)
        elif predecessor is not None:
            if not isinstance(predecessor, RaPTable):
                raise TypeError(
                    f"rap: the predecessor of a RaP-Table must be a RaP-Table, "
                    f"got {type(predecessor).__name__}")
            if predecessor.key_dtype != self.key_dtype:
                raise TypeError(f"rap: predecessor holds {predecessor.key_dtype} keys, "
                                f"this subwindow {self.key_dtype}")
            spl = predecessor.successor_splitters(P)
            if spl is not None:
                self._spl = self._table_from(spl)

    def _table_from(self, given) -> np.ndarray:
        """Validate user splitters (key values) and return the table in codes."""
        arr = np.asarray(given)
        P = self.partitions
        if arr.ndim != 1 or arr.shape[0] not in (P, P - 1):
            raise ValueError(f"rap: expected {P} splitters (or the {P - 1} inner ones), "
                             f"got shape {arr.shape}")
        if not np.can_cast(arr.dtype, self.key_dtype, "same_kind"):
            raise TypeError(f"rap: splitters of dtype {arr.dtype} for {self.key_dtype} keys")
        arr = arr.astype(self.key_dtype)
        if arr.shape[0] == P:
            arr = arr[1:]
        if arr.dtype.kind == "f" and np.isnan(arr).any():
            raise ValueError("rap: a splitter is NaN")
        if arr.shape[0] and np.any(arr[1:] < arr[:-1]):
            raise ValueError("rap: splitters must be non-decreasing")
        out = np.empty(P, dtype=np.int64)
        out[0] = I64_MIN  # partition 0 takes every key below s_1
        out[1:] = encode(arr)
        return out

    @property
    def splitters(self) -> np.ndarray | None:
        """The partition table s_0..s_{P-1} in key values (s_0 = I64_MIN or -inf)."""
        if self._spl is None:
            return None
        return decode(self._spl, self.key_dtype)

    # ------------------------------------------------------------------ commands

    def successor_splitters(self, partitions: int | None = None) -> np.ndarray | None:
        """Splitters (key values) for the next subwindow from this one's histograms, by
        Algorithm 1; an empty table passes on its own (None if it never had any). O(P)."""
        P = self.partitions if partitions is None else int(partitions)
        if self.n == 0:
            if self._spl is None or P != self.partitions:
                return None
            return self.splitters.copy()
        # interpolate in key values: codes of floats are monotone but not linear
        mn = decode(self.mn, self.key_dtype)
        mx = decode(self.mx, self.key_dtype)
        return adjust_splitters(self.count, mn, mx, self.n, P)

    def insert(self, keys, ts, seq, key2=None):
        """Insert a batch sorted by key. O(m + runs * log(P / runs)) for m tuples."""
        keys, ts, seq = self._check_insert(keys, ts, seq, key2)
        m = keys.shape[0]
        if m == 0:
            return
        if keys.dtype == np.float64 and np.isnan(keys).any():
            raise ValueError("rap: insert batch is not sorted by key (it holds NaN)")
        codes = encode(keys)
        bad = first_unsorted(codes)
        if bad >= 0:
            raise ValueError(f"rap: insert batch is not sorted by key (position {bad})")
        if self._spl is None:
            self._spl = quantile_splitters(codes, self.partitions)
        L = self.llat
        ok = rap_insert(self._spl, self.count, self.mn, self.mx, L.keys, L.ts, L.seq,
                        L.head, L.tail, L.nxt, L.last, L.ptr, L.free, L.cap, codes, ts, seq)
        if not ok:  # 2P entries always suffice (see llat.py): this is a bug, not bad input
            raise RuntimeError("rap: LLAT ran out of entries")
        self.n += m
        self._cum = None

    def probe(self, lo, hi, flt: WindowFilter | None = None, res: Residual | None = None):
        """Every (probe index, stored seq) with lo <= key <= hi for a sorted probe batch."""
        lo, hi, flt = self._check_probe(lo, hi, flt)
        m = lo.shape[1]
        if m == 0 or self.n == 0:
            return no_pairs()
        if self._cum is None:
            cum = np.zeros(self.partitions + 1, dtype=np.int64)
            np.cumsum(self.count, out=cum[1:])
            self._cum = cum
        c0, c1, c2 = flt.arrays(m)
        L = self.llat
        p, q = rap_probe(self._spl, self._cum, L.keys, L.ts, L.seq, L.head, L.tail, L.nxt,
                         L.cap, encode(lo), encode(hi), flt.mode, c0, c1, c2, self.threads)
        return self._keep_residual(p, q, res, m)

    def __len__(self):
        return self.n

    @property
    def nbytes(self):
        extra = 0 if self._spl is None else self._spl.nbytes
        extra += 0 if self._cum is None else self._cum.nbytes
        return self.llat.nbytes + self.count.nbytes + self.mn.nbytes + self.mx.nbytes + extra

    def check(self):
        P = self.partitions
        L = self.llat
        state = f"(n={self.n}, P={P}, table={self._spl}, count={self.count})"
        assert 0 <= self.n <= self.capacity, f"rap: size {self.n} outside [0, {self.capacity}] "
        total = L.check(range(P))
        # LLAT.check: chains disjoint, full before chained, PtrG bound, last[] right
        assert total == self.n, f"rap: LLAT holds {total} tuples, table says {self.n} {state}"
        assert int(self.count.sum()) == self.n, f"rap: histogram counts sum != size {state}"
        if self._spl is None:
            assert self.n == 0, f"rap: tuples stored without a partition table {state}"
            return
        spl = self._spl  # codes: the same order as the keys
        assert spl.shape == (P,) and spl.dtype == np.int64, f"rap: table shape {state}"
        # partition 0 takes every key below s_1
        assert spl[0] == I64_MIN, f"rap: s_0 is not the lowest value {state}"
        assert np.all(spl[1:] >= spl[:-1]), f"rap: splitters decrease {state}"
        for p in range(P):
            keys = L.chain_keys(p)
            c = int(self.count[p])
            assert keys.shape[0] == c, (
                f"rap: partition {p} holds {keys.shape[0]} tuples, histogram says {c} {state}")
            if c == 0:
                assert self.mn[p] == I64_MAX and self.mx[p] == I64_MIN, (
                    f"rap: empty partition {p} has min/max {self.mn[p]}/{self.mx[p]}")
                continue
            assert keys.min() == self.mn[p], f"rap: min of partition {p}: {keys} vs {self.mn[p]}"
            assert keys.max() == self.mx[p], f"rap: max of partition {p}: {keys} vs {self.mx[p]}"
            # partition p holds [s_p, s_{p+1})
            assert keys.min() >= spl[p], f"rap: partition {p} holds {keys.min()} < {spl[p]}"
            if p + 1 < P:
                assert keys.max() < spl[p + 1], (
                    f"rap: partition {p} holds {keys.max()} >= {spl[p + 1]}")
        if self._cum is not None:
            assert np.array_equal(self._cum[1:], np.cumsum(self.count)), "rap: stale prefix sums"
