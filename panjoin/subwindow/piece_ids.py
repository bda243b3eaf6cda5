"""The ids of a key piece: a subwindow's seqs with gaps, mapped to ids by rank.

A whole subwindow keeps its ids at ``seq - seq_start`` (its seqs are one run). A
piece (key placement) holds one key range of the subwindow, about a worker's share
of its seqs, spread over the subwindow's whole span: ids kept at their offsets would
touch every page of a span-sized array on every worker. Instead a bitmap marks the
offsets held, a prefix count per 64-bit word gives each offset's *rank* (set bits
before it; :mod:`panjoin.subwindow.kernels.piece_ids`), and the ids sit compactly at
their ranks: a quarter of a byte a slot of the span (a bit, and a count per 64) plus
8 bytes a held tuple. Inserts come in seq order (each insert's offsets after the last
one's), so only the words an insert touches are recounted.

    >>> import numpy as np
    >>> p = PieceIds(200)
    >>> p.insert(np.array([70, 3, 130]), np.array([700, 30, 1300]))
    >>> p.insert(np.array([150, 140]), np.array([1500, 1400]))
    >>> p.ids_of(np.array([130, 3, 150])).tolist()
    [1300, 30, 1500]
"""

from __future__ import annotations

import numpy as np

from panjoin.subwindow.kernels.piece_ids import ranks, set_bits


class PieceIds:
    """Ids of offsets in ``[0, span)``, inserted in increasing runs."""

    def __init__(self, span: int):
        words = (int(span) + 63) >> 6
        self.bits = np.zeros(words, np.uint64)
        self.before = np.zeros(words, np.int64)  # set bits in the words before each
        self.ids = np.empty(int(span), np.int64)  # by rank: only the first count touched
        self.count = 0
        self.last_word = -1  # the highest word counted so far

    def _rank(self, off: np.ndarray) -> np.ndarray:
        out = np.empty(off.shape[0], np.int64)
        ranks(self.bits, self.before, off, out)
        return out

    def insert(self, off: np.ndarray, ids: np.ndarray) -> None:
        """Offsets (distinct, any order, all past the ones held) and their ids."""
        if off.size == 0:
            return
        off = off.astype(np.int64, copy=False)
        set_bits(self.bits, off)
        w0, w1 = int(off.min()) >> 6, int(off.max()) >> 6
        # the words before w0 hold every earlier bit, or w0 is the last one counted
        base = int(self.before[w0]) if w0 == self.last_word else self.count
        counts = np.bitwise_count(self.bits[w0:w1 + 1]).astype(np.int64)
        np.cumsum(counts, out=self.before[w0:w1 + 1])
        self.before[w0:w1 + 1] += base - counts
        self.last_word = w1
        self.ids[self._rank(off)] = ids
        self.count += int(off.size)

    def ids_of(self, off: np.ndarray) -> np.ndarray:
        # take: a fifth faster than indexing with the ranks (numpy's fancy get)
        return self.ids.take(self._rank(off.astype(np.int64, copy=False)))
