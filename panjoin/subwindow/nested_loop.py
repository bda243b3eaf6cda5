"""Nested-loop subwindow: unsorted columns, every probe scans everything.

The baseline the paper compares against (handshake join, SplitJoin and
ScaleJoin all scan their subwindows). Insert is an append::

    insert keys [4, 9] then [1]  ->  key column [4, 9, 1]
    probe  band [3, 5] from key 4 -> stored 4 matches (one comparison per stored tuple)
"""

from __future__ import annotations

import numpy as np

from panjoin.subwindow.base import Residual, SubwindowIndex, WindowFilter, no_pairs
from panjoin.subwindow.kernels.nested import nested_probe


class NestedLoop(SubwindowIndex):
    kind = "nested"

    def __init__(self, capacity, key_dtype=np.int64, partitions=1, threads=1, **_):
        super().__init__(capacity, key_dtype, max(1, partitions), threads)
        self.keys = np.empty(self.capacity, dtype=self.key_dtype)
        self.ts = np.empty(self.capacity, dtype=np.int64)
        self.seq = np.empty(self.capacity, dtype=np.int64)
        self.n = 0

    def insert(self, keys, ts, seq, key2=None):
        keys, ts, seq = self._check_insert(keys, ts, seq, key2)
        m = keys.shape[0]
        self.keys[self.n : self.n + m] = keys
        self.ts[self.n : self.n + m] = ts
        self.seq[self.n : self.n + m] = seq
        self.n += m

    def probe(self, lo, hi, flt: WindowFilter | None = None, res: Residual | None = None):
        lo, hi, flt = self._check_probe(lo, hi, flt)
        if lo.shape[1] == 0 or self.n == 0:
            return no_pairs()
        c0, c1, c2 = flt.arrays(lo.shape[1])
        p, q = nested_probe(self.keys, self.ts, self.seq, self.n, lo, hi, flt.mode, c0, c1, c2)
        return self._keep_residual(p, q, res, lo.shape[1])

    def __len__(self):
        return self.n

    @property
    def nbytes(self):
        return self.keys.nbytes + self.ts.nbytes + self.seq.nbytes

    def check(self):
        assert 0 <= self.n <= self.capacity, f"nested: size {self.n} outside [0, {self.capacity}]"

