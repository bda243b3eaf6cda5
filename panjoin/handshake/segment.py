"""One node's segment of one stream window, and the immediate scan against it.

A segment holds tuples of one stream in arrival order (oldest first), as
columns ``id, key, ts, seq, opp, key2``: ``seq`` is the tuple's arrival number in its
stream, ``opp`` the number of opposite-stream tuples that arrived before it
(count windows), ``ts`` its event time. Tuples leave only from the oldest end
(forwarded to the next node, or expired by the driver), and enter only at the
newest end, so the storage is one growable array with a moving head::

    append [s4 s5]        ->  head 0  [s4 s5]
    append [s6]           ->  head 0  [s4 s5 s6]
    pop_oldest(2)         ->  head 2  [.. .. s6]      (compacted when head > half)

:func:`scan` is the immediate scan strategy (handshake join, Figure 6): every
tuple entering a node is compared with every tuple of the opposite segment
(the nested loop, :mod:`.kernels`, single-threaded: each node is one core),
with the window condition of DESIGN section 2 checked per pair, so that pairs
the driver has not yet expired, but which are outside each other's window,
are not reported. Predicates come from :mod:`panjoin.semantics`
(``probe_bounds``), exactly as for every other operator. A residual condition on
``key2`` (``band:10&band2:10``, ``residual_bounds``) is evaluated in the same scan,
after the key condition, as the paper's nested loop evaluates its whole predicate
per pair; ``key2`` (float64) travels with each tuple, zeros where there is none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from panjoin.handshake.kernels import scan_segment
from panjoin.semantics import Predicate, Window, probe_bounds, residual_bounds, window_bounds
from panjoin.subwindow.kernels import window as W

COLUMNS = ("id", "key", "ts", "seq", "opp", "key2")


@dataclass
class Tuples:
    """A run of tuples of one stream, in arrival order (the unit that travels the chain)."""

    id: np.ndarray
    key: np.ndarray
    ts: np.ndarray
    seq: np.ndarray
    opp: np.ndarray
    key2: np.ndarray | None = None  # float64; None: no second attribute (zeros)

    def __post_init__(self):
        if self.key2 is None:
            self.key2 = np.zeros(self.id.shape[0], np.float64)

    def __len__(self) -> int:
        return int(self.id.shape[0])

    def take(self, sl) -> Tuples:
        return Tuples(*(getattr(self, c)[sl] for c in COLUMNS))

    @staticmethod
    def empty(key_dtype) -> Tuples:
        z = np.zeros(0, np.int64)
        return Tuples(z, np.zeros(0, key_dtype), z, z, z, np.zeros(0, np.float64))

    @staticmethod
    def concat(parts: list[Tuples]) -> Tuples:
        return Tuples(*(np.concatenate([getattr(p, c) for p in parts]) for c in COLUMNS))


#: how a node scans its segments: the paper's nested loop, or a sorted key index
SEGMENT_KINDS = ("nested", "sorted")


class Segment:
    """Tuples of one stream held by one node, oldest first; O(1) amortised append/pop.

    ``index="sorted"`` also keeps the keys sorted with their seqs (BI-Sort's main
    array without its insertion buffer): an append merges the new keys in and a pop
    drops the oldest seqs, O(segment) each, and a scan is a binary search per probe
    tuple and band instead of a pass over the whole segment.
    """

    def __init__(self, key_dtype=np.int64, capacity: int = 64, index: str = "nested"):
        if index not in SEGMENT_KINDS:
            raise ValueError(f"segment index {index!r}: choose one of {', '.join(SEGMENT_KINDS)}")
        self.index = index
        self.skey = np.zeros(0, key_dtype)  # sorted keys (index="sorted")
        self.sseq = np.zeros(0, np.int64)  # their seqs
        self.key_dtype = np.dtype(key_dtype)
        cap = max(1, capacity)
        dtypes = {"key": self.key_dtype, "key2": np.float64}
        self._cols = {c: np.empty(cap, dtypes.get(c, np.int64)) for c in COLUMNS}
        self.head = 0
        self.tail = 0

    def __len__(self) -> int:
        return self.tail - self.head

    def col(self, name: str) -> np.ndarray:
        return self._cols[name][self.head:self.tail]

    def view(self, start: int = 0, stop: int | None = None) -> Tuples:
        """Tuples ``start .. stop`` counted from the oldest (copies)."""
        stop = len(self) if stop is None else stop
        a, b = self.head + start, self.head + stop
        return Tuples(*(self._cols[c][a:b].copy() for c in COLUMNS))

    def append(self, t: Tuples) -> None:
        m = len(t)
        if m == 0:
            return
        cap = self._cols["id"].shape[0]
        if self.tail + m > cap:
            n = len(self)
            if n + m > cap // 2:  # grow; else just compact
                cap = max(2 * cap, 2 * (n + m))
            for c in COLUMNS:
                new = np.empty(cap, self._cols[c].dtype)
                new[:n] = self._cols[c][self.head:self.tail]
                self._cols[c] = new
            self.head, self.tail = 0, n
        for c in COLUMNS:
            self._cols[c][self.tail:self.tail + m] = getattr(t, c)
        self.tail += m
        if self.index == "sorted":
            order = np.argsort(t.key, kind="stable")
            k = t.key[order]
            at = np.searchsorted(self.skey, k, side="right")
            self.skey = np.insert(self.skey, at, k)
            self.sseq = np.insert(self.sseq, at, t.seq[order])

    def pop_oldest(self, n: int) -> Tuples:
        if n > len(self):
            raise ValueError(f"segment holds {len(self)} tuples, cannot remove {n}")
        out = self.view(0, n)
        self.head += n
        if self.head == self.tail:
            self.head = self.tail = 0
        if self.index == "sorted" and n:
            keep = self.sseq > out.seq[-1]  # seqs are consecutive: drop the n oldest
            self.skey, self.sseq = self.skey[keep], self.sseq[keep]
        return out

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._cols.values())


def window_filter(window: Window, probe_stream: str, probe: Tuples):
    """The per-pair window condition as the kernel's (mode, c0, c1, c2), probe tuple x of X
    against stored y of Y (see :mod:`panjoin.subwindow.kernels.window`).

    count: y arrived before x (``seq_y < opp_x``) and ``seq_y >= opp_x - W_Y``, or y arrived
    after x and ``opp_y <= seq_x + W_X``; the stored ``ts`` column must then hold ``opp``.
    time: ``x.ts - W_Y < y.ts < x.ts + W_X``. Bounds closed and saturated
    (:func:`panjoin.semantics.window_bounds`).
    """
    if window.kind == "count":
        return (W.COUNT, *window_bounds(window, probe_stream, probe.opp, probe.seq))
    return (W.TIME, *window_bounds(window, probe_stream, probe.ts, probe.seq))


def scan(probe: Tuples, probe_stream: str, stored: Segment, window: Window,
         pred: Predicate, earlier_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Immediate scan: ids ``(probe_ids, stored_ids)`` of every qualifying pair;
    ``earlier_only``: only with stored tuples that arrived before the probe tuple
    (``seq < opp``; fast forwarding, where a pair is found by its later tuple).

    Example, band:1, time:10,10, stored S keys [5, 9] at ts [0, 0]; probe r key 6 at ts 3:
    bounds [5, 7] -> s with key 5 matches, and 3 - 10 < 0 < 3 + 10 -> one pair.
    """
    z = np.zeros(0, np.int64)
    if len(probe) == 0 or len(stored) == 0:
        return z, z
    lo, hi = probe_bounds(pred, probe_stream, probe.key)
    res = residual_bounds(pred, probe_stream, probe.key2)
    mode, c0, c1, c2 = window_filter(window, probe_stream, probe)
    tscol = stored.col("opp") if window.kind == "count" else stored.col("ts")
    if stored.index == "sorted":
        pidx, pos = _scan_sorted(probe, stored, lo, hi, mode, c0, c1, c2, tscol, res)
        return _pairs(probe, stored, pidx, pos, earlier_only)
    lo2, hi2 = res if res is not None else (np.zeros((0, len(probe))), np.zeros((0, len(probe))))
    pidx, pos = scan_segment(stored.col("key"), tscol, stored.col("seq"), lo, hi, mode,
                             np.ascontiguousarray(c0), np.ascontiguousarray(c1),
                             np.ascontiguousarray(c2), stored.col("key2"), lo2, hi2,
                             res is not None)
    return _pairs(probe, stored, pidx, pos, earlier_only)


def _pairs(probe, stored, pidx, pos, earlier_only):
    """(probe ids, stored ids) of the pairs (probe index, stored position)."""
    if earlier_only and pidx.size:
        keep = stored.col("seq")[pos] < probe.opp[pidx]
        pidx, pos = pidx[keep], pos[keep]
    return probe.id[pidx], stored.col("id")[pos]


def _scan_sorted(probe, stored, lo, hi, mode, c0, c1, c2, tscol, res=None):
    """The scan over the sorted key index: candidate ranges by binary search, then the
    window condition on each candidate (as :meth:`WindowFilter.mask` does); returns
    (probe index, stored position) pairs."""
    pis, poss = [], []
    first = int(stored.col("seq")[0])
    for b in range(lo.shape[0]):
        a = np.searchsorted(stored.skey, lo[b], side="left")
        e = np.searchsorted(stored.skey, hi[b], side="right")
        cnt = np.maximum(e - a, 0)
        tot = int(cnt.sum())
        if tot == 0:
            continue
        pi = np.repeat(np.arange(lo.shape[1]), cnt)
        starts = np.repeat(a - np.cumsum(cnt) + cnt, cnt)  # a[i] - (offset of i's first)
        j = starts + np.arange(tot)
        pis.append(pi)
        poss.append(stored.sseq[j] - first)
    if not pis:
        z = np.zeros(0, np.int64)
        return z, z.copy()
    pi, pos = np.concatenate(pis), np.concatenate(poss)
    seq, ts = stored.col("seq")[pos], tscol[pos]
    if mode == W.TIME:
        ok = (c0[pi] <= ts) & (ts <= c1[pi])
    elif mode == W.COUNT:
        ok = np.where(seq < c1[pi], seq >= c0[pi], ts <= c2[pi])
    else:
        ok = np.ones(pi.shape, bool)
    if res is not None:  # the residual on key2, for the candidates the key index found
        k2 = stored.col("key2")[pos]
        inside = np.zeros(pi.shape, bool)
        for b in range(res[0].shape[0]):
            inside |= (res[0][b, pi] <= k2) & (k2 <= res[1][b, pi])
        ok &= inside
    return pi[ok], pos[ok]
