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
            return (c0 < ts) & (ts < c1)
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

    @abstractmethod
    def insert(self, keys: np.ndarray, ts: np.ndarray, seq: np.ndarray) -> None:
        """Insert a batch sorted by key; ``len(self) + len(keys) <= capacity``."""

    @abstractmethod
    def probe(
        self, lo: np.ndarray, hi: np.ndarray, flt: WindowFilter | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Matching ``(probe_index, stored_seq)`` int64 arrays for a sorted probe batch."""

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

    def _check_insert(self, keys, ts, seq):
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
        return keys, ts, seq

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
