"""The one interface every subwindow index implements, and the window filter it is probed with.

A subwindow holds up to ``capacity`` (NSub) tuples of one stream, as three
columns: ``key`` (int64 or float64, the join field), ``ts`` (int64) and
``seq`` (int64, the tuple's arrival number within its stream, which the
manager maps back to the user's id and payload). Commands, as in the paper:

- ``insert(keys, ts, seq)``: a batch sorted by key (ties in any order);
- ``probe(lo, hi, flt)``: a batch sorted by key, given as the closed intervals
  ``lo[b, i] <= stored.key <= hi[b, i]`` of each band ``b`` and probe tuple ``i``
  (``lo > hi`` means empty; see :func:`panjoin.semantics.probe_bounds`), and a
  :class:`WindowFilter`; returns matching ``(probe_index, stored_seq)`` pairs,
  each exactly once, in no particular order;
- residual (optional): ``insert(..., key2=...)`` stores each tuple's float64
  ``key2``, and ``probe(..., res=Residual(lo2, hi2))`` returns only the pairs
  whose stored key2 lies in one of the probe tuple's residual intervals
  (:mod:`panjoin.subwindow.kernels.residual`). Every index keeps key2 by arrival
  position (a subwindow's seqs are one contiguous run) and filters the pairs it
  emits in a Numba pass; BI-Sort fuses the check into its probe kernel. An index
  that cannot do it raises :class:`ResidualError` rather than ignore it;
- expire: the manager drops the whole (oldest) subwindow object;
- ``check()``: asserts every invariant of the structure (tests call it after
  every operation);
- ``nbytes``: memory held, for the memory-per-tuple figures.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from panjoin.subwindow.kernels import window as W
from panjoin.subwindow.kernels.residual import residual_keep


def no_pairs() -> tuple[np.ndarray, np.ndarray]:
    """The empty probe result: no ``(probe_index, stored_seq)`` pairs."""
    return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)


class ResidualError(ValueError):
    """A residual condition (key2) that this index or call cannot apply; says what to do."""


@dataclass
class Residual:
    """Per-probe-tuple closed intervals on stored ``key2``, shape ``(n_bands2, n)``
    (float64; ``lo > hi`` empty), from :func:`panjoin.semantics.residual_bounds`."""

    lo: np.ndarray
    hi: np.ndarray

    def __post_init__(self):
        lo = np.ascontiguousarray(self.lo, dtype=np.float64)
        hi = np.ascontiguousarray(self.hi, dtype=np.float64)
        if lo.ndim == 1:
            lo, hi = lo[None, :], hi[None, :]
        if lo.shape != hi.shape or lo.ndim != 2:
            raise ResidualError(f"residual bounds lo {lo.shape} and hi {hi.shape} must be "
                                "(n_bands2, n) arrays of one shape")
        self.lo, self.hi = lo, hi

    def take(self, idx: np.ndarray) -> Residual:
        return Residual(self.lo[:, idx], self.hi[:, idx])

    def mask(self, probe_idx: np.ndarray, k2: np.ndarray) -> np.ndarray:
        """Vectorised check over candidate pairs (probe index, stored key2)."""
        ok = np.zeros(probe_idx.shape, dtype=bool)
        for b in range(self.lo.shape[0]):
            ok |= (self.lo[b, probe_idx] <= k2) & (k2 <= self.hi[b, probe_idx])
        return ok


@dataclass
class WindowFilter:
    """Per-probe-tuple window bounds (see :mod:`panjoin.subwindow.kernels.window`)."""

    mode: int
    c0: np.ndarray
    c1: np.ndarray
    c2: np.ndarray

    @classmethod
    def none(cls, n: int = 0) -> WindowFilter:
        z = np.zeros(n, dtype=np.int64)
        return cls(W.NONE, z, z, z)

    def take(self, idx: np.ndarray) -> WindowFilter:
        if self.mode == W.NONE:
            return self
        return WindowFilter(self.mode, self.c0[idx], self.c1[idx], self.c2[idx])

    def arrays(self, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``c0, c1, c2`` of length m for a kernel (zeros when the filter is off)."""
        if self.c0.shape[0] == m:
            return self.c0, self.c1, self.c2
        z = np.zeros(m, dtype=np.int64)
        return z, z, z

    def mask(self, probe_idx: np.ndarray, seq: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Vectorised filter over candidate pairs (used after expanding BI-Sort ranges)."""
        if self.mode == W.NONE:
            return np.ones(probe_idx.shape, dtype=bool)
        c0, c1 = self.c0[probe_idx], self.c1[probe_idx]
        if self.mode == W.TIME:
            return (c0 <= ts) & (ts <= c1)
        c2 = self.c2[probe_idx]
        return np.where(seq < c1, seq >= c0, ts <= c2)


class SubwindowIndex(ABC):
    """Base class of RaP-Table, WiB+-Tree, BI-Sort and the nested loop."""

    kind: ClassVar[str]

    def __init__(self, capacity: int, key_dtype=np.int64, partitions: int = 1024, threads: int = 1):
        if capacity <= 0:
            raise ValueError(f"subwindow capacity must be positive, got {capacity}")
        if partitions <= 0:
            raise ValueError(f"partition count must be positive, got {partitions}")
        self.capacity = int(capacity)
        self.key_dtype = np.dtype(key_dtype)
        if self.key_dtype not in (np.dtype(np.int64), np.dtype(np.float64)):
            raise TypeError(f"keys must be int64 or float64, got {self.key_dtype}")
        self.partitions = int(partitions)
        self.threads = max(1, int(threads))

    #: key2 by arrival position (``seq - _k2base``), allocated by the first insert with key2
    _k2: np.ndarray | None = None
    _k2base: int = 0

    @abstractmethod
    def insert(self, keys: np.ndarray, ts: np.ndarray, seq: np.ndarray,
               key2: np.ndarray | None = None) -> None:
        """Insert a batch sorted by key; ``len(self) + len(keys) <= capacity``; ``key2``
        (float64, optional, all inserts or none) for residual conditions."""

    @abstractmethod
    def probe(
        self, lo: np.ndarray, hi: np.ndarray, flt: WindowFilter | None = None,
        res: Residual | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Matching ``(probe_index, stored_seq)`` int64 arrays for a sorted probe batch;
        with ``res``, only the pairs whose stored key2 passes the residual."""

    @abstractmethod
    def __len__(self) -> int: ...

    @property
    @abstractmethod
    def nbytes(self) -> int: ...

    @abstractmethod
    def check(self) -> None:
        """Assert every invariant; raise AssertionError with the state on failure."""

    @property
    def full(self) -> bool:
        return len(self) >= self.capacity

    def release(self) -> None:
        """The subwindow expired: hand back what can serve the next one (the hash table
        gives its arrays to :mod:`panjoin.subwindow.spares`); nothing by default."""
        return None

    def _check_insert(self, keys, ts, seq, key2=None):
        keys = np.ascontiguousarray(keys)
        if keys.dtype != self.key_dtype:
            raise TypeError(f"{self.kind}: keys are {keys.dtype}, subwindow holds {self.key_dtype}")
        ts = np.ascontiguousarray(ts, dtype=np.int64)
        seq = np.ascontiguousarray(seq, dtype=np.int64)
        if not (keys.shape == ts.shape == seq.shape) or keys.ndim != 1:
            raise ValueError(f"{self.kind}: key, ts and seq must be 1-d arrays of one length")
        if len(self) + keys.shape[0] > self.capacity:
            raise ValueError(
                f"{self.kind}: inserting {keys.shape[0]} tuples into a subwindow holding "
                f"{len(self)} of {self.capacity}"
            )
        self._store_key2(seq, key2, keys.shape[0])
        return keys, ts, seq

    def _store_key2(self, seq: np.ndarray, key2, n: int) -> None:
        """Keep key2 by arrival position: ``_k2[seq - base]``, base = the first seq stored."""
        if key2 is None:
            if len(self) == 0:
                self._k2 = None
            if self._k2 is not None and n:
                raise ResidualError(f"{self.kind}: this subwindow stores key2; insert every "
                                    "batch with key2")
            return
        key2 = np.ascontiguousarray(key2, dtype=np.float64)
        if key2.shape != seq.shape:
            raise ValueError(f"{self.kind}: key2 must have one value per tuple")
        if n == 0:
            return
        if len(self) == 0:  # nothing stored yet (a failed insert may have left a base)
            self._k2 = None
        if self._k2 is None:
            if len(self):
                raise ResidualError(f"{self.kind}: this subwindow holds tuples without key2; "
                                    "insert every batch with key2 or none")
            self._k2 = np.zeros(self.capacity, dtype=np.float64)
            self._k2base = int(seq.min())
        pos = seq - self._k2base
        if int(pos.min()) < 0 or int(pos.max()) >= self.capacity:
            raise ResidualError(
                f"{self.kind}: key2 is kept by arrival position, so a subwindow's seqs must "
                f"lie in [{self._k2base}, {self._k2base + self.capacity}) (its first seq + "
                f"capacity); got {int(seq.min())}..{int(seq.max())}")
        self._k2[pos] = key2

    def _check_residual(self, res: Residual | None, n: int) -> Residual | None:
        if res is None:
            return None
        if not isinstance(res, Residual):
            res = Residual(*res)
        if res.lo.shape[1] != n:
            raise ResidualError(f"{self.kind}: residual bounds are for {res.lo.shape[1]} "
                                f"probe tuples, the batch has {n}")
        if self._k2 is None and len(self):
            raise ResidualError(f"{self.kind}: a residual needs key2, but this subwindow was "
                                "filled without it; insert with key2")
        return res

    def _keep_residual(self, pidx, seq, res: Residual | None, n: int):
        """The generic post-filter: drop emitted pairs whose stored key2 fails ``res``
        (``n``: probe tuples in the batch)."""
        res = self._check_residual(res, n)
        if res is None or pidx.shape[0] == 0:
            return pidx, seq
        return residual_keep(np.ascontiguousarray(pidx, dtype=np.int64),
                             np.ascontiguousarray(seq, dtype=np.int64), self._k2,
                             self._k2base, res.lo, res.hi)

    def _check_probe(self, lo, hi, flt):
        lo = np.ascontiguousarray(lo, dtype=self.key_dtype)
        hi = np.ascontiguousarray(hi, dtype=self.key_dtype)
        if lo.ndim == 1:
            lo, hi = lo[None, :], hi[None, :]
        if lo.shape != hi.shape:
            raise ValueError(f"{self.kind}: lo and hi bounds differ in shape")
        if flt is None:
            flt = WindowFilter.none(lo.shape[1])
        elif flt.mode != W.NONE and flt.c0.shape[0] != lo.shape[1]:
            raise ValueError(f"{self.kind}: window filter has the wrong length")
        return lo, hi, flt
