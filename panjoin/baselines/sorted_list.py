"""A ``sortedcontainers.SortedList`` per subwindow: what a Python programmer would write first.

Plugged into the engine as the index kind ``sortedlist`` (so it runs under
the same manager, batching, window filter and expiry as PanJoin's indexes,
and only the index differs). Each stored tuple is a Python tuple
``(key, seq, ts)`` in a SortedList; a probe of the closed key interval
``[lo, hi]`` is two bisections and a slice::

    insert (5, 0, 10), (2, 1, 11), (5, 2, 12)  ->  [(2, 1, 11), (5, 0, 10), (5, 2, 12)]
    probe [4, 5]: bisect_left((4,)) = 1, bisect_right((5, inf)) = 3  ->  seqs 0, 2

Every probe tuple and every stored tuple passes through the interpreter, so
per-tuple cost is microseconds where the Numba indexes take nanoseconds.
Memory is estimated from the Python objects (``nbytes``): a 3-tuple, three
ints and a list slot per stored tuple.
"""

from __future__ import annotations

import math
import sys

import numpy as np
from sortedcontainers import SortedList

from panjoin.subwindow.base import Residual, SubwindowIndex, WindowFilter

# a stored (key, seq, ts): the tuple, its three numbers, one list pointer
_BYTES_PER_TUPLE = sys.getsizeof((1, 2, 3)) + 3 * sys.getsizeof(2**40) + 8


class SortedListIndex(SubwindowIndex):
    kind = "sortedlist"

    def __init__(self, capacity, key_dtype=np.int64, partitions=1, threads=1, predecessor=None,
                 **_):
        super().__init__(capacity, key_dtype, max(1, partitions), threads)
        self.sl = SortedList()

    def insert(self, keys, ts, seq, key2=None):
        keys, ts, seq = self._check_insert(keys, ts, seq, key2)
        self.sl.update(zip(keys.tolist(), seq.tolist(), ts.tolist(), strict=True))

    def probe(self, lo, hi, flt: WindowFilter | None = None, res: Residual | None = None):
        lo, hi, flt = self._check_probe(lo, hi, flt)
        out_p: list[int] = []
        out_seq: list[int] = []
        out_ts: list[int] = []
        sl = self.sl
        for b in range(lo.shape[0]):
            for i, (a, z) in enumerate(zip(lo[b].tolist(), hi[b].tolist(), strict=True)):
                if a > z:
                    continue
                start = sl.bisect_left((a,))
                stop = sl.bisect_right((z, math.inf))
                for _key, sq, t in sl.islice(start, stop):
                    out_p.append(i)
                    out_seq.append(sq)
                    out_ts.append(t)
        p = np.array(out_p, dtype=np.int64)
        s = np.array(out_seq, dtype=np.int64)
        keep = flt.mask(p, s, np.array(out_ts, dtype=np.int64))
        return self._keep_residual(p[keep], s[keep], res, lo.shape[1])

    def __len__(self):
        return len(self.sl)

    @property
    def nbytes(self):
        return len(self.sl) * _BYTES_PER_TUPLE

    def check(self):
        self.sl._check()
        assert len(self.sl) <= self.capacity, f"sortedlist: {len(self.sl)} > {self.capacity}"
