"""Linked List Adaptive Table: skew-tolerant storage for RaP-Table and WiB+-Tree partitions.

2P entries of C = ceil((NSub / P) * sigma) slots: entries 0..P-1 are the normal
entries (one per partition), P..2P-1 the reserved ones that a full entry chains
to. 2P entries always suffice when sigma > 1: needing more would mean P full
entries, i.e. more than NSub tuples. Diagram for P = 4, partition 1 skewed::

    entry:   0      1      2      3   | 4      5  6  7      PtrG = 5
    data:  [a b] [c d e] [f]   []    | [g h]  .  .  .
    next:   -1     4     -1    -1    |  -1
                   └──────────────────►┘

The kernels (``kernels/llat.py``: the entry allocator, appends, chain sizes) operate on
the arrays held here; ``ptr = [PtrG, free-stack top]``. WiB+-Tree makes its LLAT with
``reuse=True`` (a free stack of ``entries`` slots, for the chains a leaf split
releases) and ``huge_pages=True`` (the worst-case sized columns on transparent huge
pages, see :func:`huge_empty`).
"""

from __future__ import annotations

import math
import mmap

import numpy as np

from panjoin.config import LLAT_SIGMA
from panjoin.subwindow.kernels.llat import llat_chain_size

#: arrays at least this large are backed by transparent huge pages where the OS allows
HUGE_MIN_BYTES = 4 << 20


def huge_empty(n: int, dtype) -> np.ndarray:
    """An uninitialised array on an anonymous mapping advised for transparent huge pages.

    An LLAT sized for the worst case is filled front to back (PtrG), so only its
    used prefix is ever touched; 2 MiB pages make those first touches 512 times
    fewer page faults. Falls back to ``np.empty`` for small arrays.
    """
    dtype = np.dtype(dtype)
    nb = n * dtype.itemsize
    if nb < HUGE_MIN_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.empty(n, dtype=dtype)
    mm = mmap.mmap(-1, nb, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mm.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        pass  # THP disabled: ordinary pages, still correct
    return np.frombuffer(mm, dtype=dtype, count=n)


class LLAT:
    def __init__(self, capacity: int, partitions: int, key_dtype=np.int64,
                 sigma: float = LLAT_SIGMA, entries: int | None = None,
                 normal_entries: int | None = None, reuse: bool = False,
                 huge_pages: bool = False):
        """``entries`` defaults to 2P; ``normal_entries`` (PtrG's start) defaults to P;
        ``reuse``: a free stack for released entries; ``huge_pages``: the key, ts and seq
        columns on transparent huge pages."""
        if sigma <= 1.0:
            raise ValueError(f"LLAT sigma must be > 1 (paper: 1.10-1.25), got {sigma}")
        self.partitions = int(partitions)
        self.cap = max(1, math.ceil(capacity / partitions * sigma))
        n_entries = 2 * self.partitions if entries is None else int(entries)
        column = huge_empty if huge_pages else np.empty
        self.keys = column(n_entries * self.cap, key_dtype)
        self.ts = column(n_entries * self.cap, np.int64)
        self.seq = column(n_entries * self.cap, np.int64)
        self.head = np.zeros(n_entries, dtype=np.int64)
        self.tail = np.zeros(n_entries, dtype=np.int64)
        self.nxt = np.full(n_entries, -1, dtype=np.int64)
        self.last = np.arange(n_entries, dtype=np.int64)
        start = self.partitions if normal_entries is None else int(normal_entries)
        self.ptr = np.array([start, 0], dtype=np.int64)
        self.free = np.empty(n_entries if reuse else 0, dtype=np.int64)

    @property
    def n_entries(self) -> int:
        return self.head.shape[0]

    @property
    def n_free(self) -> int:
        """Entries on the free stack."""
        return int(self.ptr[1])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.keys, self.ts, self.seq, self.head, self.tail,
                                      self.nxt, self.last, self.ptr, self.free))

    def chain(self, first: int) -> list[int]:
        """Entries of the chain that starts at ``first``."""
        out = []
        e = first
        while e >= 0:
            out.append(e)
            e = int(self.nxt[e])
        return out

    def chain_size(self, first: int) -> int:
        return int(llat_chain_size(self.head, self.tail, self.nxt, first))

    def chain_keys(self, first: int) -> np.ndarray:
        """All live keys of a chain, in storage order (for tests and check())."""
        parts = [self.keys[e * self.cap + self.tail[e]: e * self.cap + self.head[e]]
                 for e in self.chain(first)]
        return np.concatenate(parts) if parts else np.zeros(0, self.keys.dtype)

    def check(self, firsts) -> int:
        """Invariants over the chains starting at ``firsts`` (all chains there are) and the
        free stack; returns the live tuple count."""
        ptr = int(self.ptr[0])
        top = self.n_free
        assert 0 <= ptr <= self.n_entries, f"LLAT: PtrG {ptr} outside [0, {self.n_entries}]"
        assert 0 <= top <= self.free.shape[0], f"LLAT: free stack top {top} outside bounds"
        assert np.all(self.head >= self.tail), "LLAT: an entry has Tail beyond Head"
        assert np.all(self.head <= self.cap), "LLAT: an entry holds more than its capacity"
        seen = set()
        total = 0
        for f in firsts:
            chain = self.chain(int(f))
            for e in chain:
                assert e not in seen, f"LLAT: entry {e} belongs to two chains (state {chain})"
                seen.add(e)
            for e in chain[:-1]:
                assert self.head[e] == self.cap, f"LLAT: entry {e} is chained but not full"
                assert e < ptr or e == f, f"LLAT: chained entry {e} is beyond PtrG {ptr}"
            assert self.last[f] == chain[-1], f"LLAT: last[{f}] = {self.last[f]}, chain {chain}"
            total += sum(int(self.head[e] - self.tail[e]) for e in chain)
        # every entry below PtrG is in exactly one chain or on the free stack
        free = self.free[:top].tolist()
        assert len(set(free)) == top and not (seen & set(free)), (
            f"LLAT: free stack {free} repeats an entry or holds one in use")
        assert all(0 <= e < ptr for e in free), f"LLAT: free entry beyond PtrG {ptr}: {free}"
        assert len(seen) + top == ptr, (
            f"LLAT: {ptr} entries below PtrG, {len(seen)} in chains + {top} free")
        return total
