"""A subwindow as its holder keeps it: the index, plus the user ids of its tuples.

The index (RaP-Table, WiB+-Tree, BI-Sort, ...) stores ``(key, ts, seq)`` and
answers a probe with ``(probe_index, stored_seq)`` pairs. The store beside it
keeps the user ids in seq order (a subwindow's seqs are one contiguous run), so
that whoever holds the subwindow (a worker, or the in-process engine) answers
with the stored tuples' ids and the manager needs no per-tuple state at all.

Two things make a probe exact whenever it runs:

- ``seq_limit``: the probe sees only stored tuples with ``seq < seq_limit``
  (the subwindow's size when the probe was issued). A probe replayed on a
  replica after a failure, which may already hold later inserts, so answers
  exactly as the first time.
- a *backup* store keeps only a log of the inserts (no index, a few memcpys
  per batch); :meth:`promote` builds the index from the log when the primary
  is lost (the paper's subwindows are rebuilt, not copied back).

A *piece* (``piece=True``, the manager's key placement) holds one key range of a
subwindow whose other ranges live on other workers: its seqs are the subwindow's with
gaps, each insert's after the previous ones', and its ids are kept by rank
(:class:`panjoin.subwindow.piece_ids.PieceIds`), not at their offsets in the span.

Example:

    >>> import numpy as np
    >>> from panjoin.subwindow import WindowFilter
    >>> st = SubwindowStore("bisort", 8, "int64", 2)
    >>> st.insert(np.array([1, 5]), np.zeros(2, np.int64), np.array([0, 1]),
    ...           np.array([70, 71]))
    >>> pidx, ids, seq = st.probe(np.array([[4]]), np.array([[6]]), WindowFilter.none(1))
    >>> pidx.tolist(), ids.tolist()
    ([0], [71])
"""

from __future__ import annotations

import numpy as np

from panjoin.subwindow import Residual, SubwindowIndex, WindowFilter, make_index
from panjoin.subwindow.hash_table import AHEAD_SPARES
from panjoin.subwindow.piece_ids import PieceIds
from panjoin.subwindow.spares import SPARES


class SubwindowStore:
    """One subwindow: its index (absent on a backup until promoted) and its ids."""

    def __init__(self, kind: str, capacity: int, key_dtype: str, partitions: int,
                 threads: int = 1, opts: dict | None = None,
                 predecessor: SubwindowIndex | None = None, backup: bool = False,
                 piece: bool = False):
        self.kind = kind
        self.piece = piece
        self.capacity = int(capacity)
        self.key_dtype = np.dtype(key_dtype)
        self.partitions = int(partitions)
        self.threads = threads
        self.opts = dict(opts or {})
        self.index: SubwindowIndex | None = None
        self.log: list[tuple] | None = [] if backup else None  # a backup's inserts, in order
        self._log_bytes = 0  # kept as they come: nbytes is asked after every command
        if not backup:
            self.index = make_index(kind, capacity, key_dtype=key_dtype, partitions=partitions,
                                    threads=threads, predecessor=predecessor, **self.opts)
        # a hash subwindow (the small-batch index) takes an expired one's ids array
        # (panjoin.subwindow.spares): pages mapped already; the others allocate as before
        self._spares = kind == "hash" and not piece
        self.pieces = PieceIds(self.capacity) if piece else None
        self.ids = (np.empty(0, np.int64) if piece else
                    SPARES.empty(self.capacity, np.int64, AHEAD_SPARES) if self._spares
                    else np.empty(self.capacity, np.int64))
        self.count = 0
        self.end = 0  # offset past the last seq held (count, unless a piece)
        self.seq_start = -1

    @property
    def backup(self) -> bool:
        return self.index is None

    def __len__(self) -> int:
        return self.count

    @property
    def full(self) -> bool:
        return self.count >= self.capacity

    @property
    def nbytes(self) -> int:
        if self.index is not None:
            return int(self.index.nbytes) + 8 * self.count + (
                self.pieces.bits.nbytes * 2 if self.pieces is not None else 0)
        return self._log_bytes

    def insert(self, keys: np.ndarray, ts: np.ndarray, seq: np.ndarray, ids: np.ndarray,
               key2: np.ndarray | None = None, *, seq_first: int | None = None,
               seq_end: int | None = None) -> None:
        """A batch sorted by key; its seqs continue this subwindow's run (any order).
        ``seq_first``, ``seq_end``: the caller knows the seqs are exactly that range (the
        engine in this process does; a worker's client is checked)."""
        n = int(keys.size)
        if n == 0:
            return
        if not (ts.shape == seq.shape == ids.shape == keys.shape):
            raise ValueError("keys, ts, seq and ids differ in length")
        if self.count + n > self.capacity:
            raise ValueError(f"insert of {n} tuples overflows a subwindow holding "
                             f"{self.count} of {self.capacity}")
        first = (int(seq.min()) if seq_first is None else seq_first) if self.count == 0 \
            else self.seq_start
        off = seq - first
        if seq_first is not None and seq_end is not None and seq_end - seq_first == n:
            low, high = seq_first - first, seq_end - 1 - first
        else:
            low, high = int(off.min()), int(off.max())
        if self.piece:  # one key range: gaps, but after what it holds and within its span
            if low < self.end or high >= self.capacity:
                raise ValueError(f"a piece's insert needs seqs in [{first + self.end}, "
                                 f"{first + self.capacity}) (after the ones it holds)")
        elif low < self.count or high >= self.count + n:
            raise ValueError(f"insert's seqs must continue the subwindow's run at "
                             f"{first + self.count}")
        if self.index is not None:
            self.index.insert(keys, ts, seq, key2)
        else:  # a backup: keep the command, build nothing
            self.log.append((keys, ts, seq, key2))
            self._log_bytes += keys.nbytes + ts.nbytes + seq.nbytes + (
                key2.nbytes if key2 is not None else 0)
        if self.pieces is not None:
            self.pieces.insert(off, ids)
        else:
            self.ids[off] = ids
        self.seq_start = first
        self.count += n
        self.end = high + 1 if self.piece else self.count

    def seal(self) -> None:
        """No insert follows (a key piece's subwindow is complete): an index with an
        insertion buffer merges it, as a whole subwindow does once full."""
        flush = getattr(self.index, "flush", None)
        if flush is not None:
            flush()

    def promote(self) -> None:
        """A backup becomes the primary: its index is built from the logged inserts,
        in their order (the same batches give the same structure)."""
        if self.index is not None:
            return
        ix = make_index(self.kind, self.capacity, key_dtype=self.key_dtype,
                        partitions=self.partitions, threads=self.threads, **self.opts)
        for keys, ts, seq, key2 in self.log:
            ix.insert(keys, ts, seq, key2)
        self.index, self.log, self._log_bytes = ix, None, 0

    def _primary(self) -> SubwindowIndex:
        if self.index is None:
            raise ValueError("this subwindow is a backup: promote it before probing")
        return self.index

    def probe(self, lo: np.ndarray, hi: np.ndarray, flt: WindowFilter,
              res: Residual | None = None, seq_limit: int | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(probe_index, stored_id, stored_seq)`` of every matching pair whose stored
        tuple has ``seq < seq_limit`` (None: all)."""
        pidx, seq = self._primary().probe(lo, hi, flt, res)
        return self._answer(pidx, seq, seq_limit)

    def _answer(self, pidx, seq, seq_limit):
        if seq_limit is not None and seq_limit < self.seq_start + self.end and seq.size:
            keep = seq < seq_limit
            pidx, seq = pidx[keep], seq[keep]
        return pidx, self.ids_of(seq), seq

    def probe_ranges(self, lo, hi, flt: WindowFilter):
        """BI-Sort's range answer (:class:`panjoin.subwindow.bi_sort.RangeResult`)."""
        ix = self._primary()
        if not hasattr(ix, "probe_ranges"):
            raise ValueError("range results need BI-Sort subwindows")
        return ix.probe_ranges(lo, hi, flt)

    def ids_of(self, seq: np.ndarray) -> np.ndarray:
        if self.pieces is not None:
            return self.pieces.ids_of(seq - self.seq_start)
        return self.ids.take(seq - self.seq_start)  # a third faster than ids[...]

    def release(self) -> None:
        """The subwindow expired: it and its index hand back what the next one can reuse
        (this store is empty afterwards)."""
        if self.index is not None:
            self.index.release()
        arrays = [self.ids]
        self.ids = np.empty(0, np.int64)
        self.pieces = None
        self.count = self.end = 0
        if self.log is not None:
            self.log, self._log_bytes = [], 0
        if self._spares:  # a large BI-Sort store's ids are not kept for 10 s
            SPARES.give_all(arrays)

    def successor_splitters(self):
        """RaP-Table, once full: its successor's partition table (Algorithm 1)."""
        f = getattr(self.index, "successor_splitters", None)
        return f() if f is not None and self.full else None

    def check(self) -> None:
        """The index's invariants, and ids for exactly the run of seqs it holds."""
        if self.index is not None:
            self.index.check()
            assert len(self.index) == self.count, (len(self.index), self.count)
        else:
            assert sum(int(b[0].size) for b in self.log) == self.count
        if self.piece:
            assert self.count <= self.end <= self.capacity
            assert self.pieces is None or self.pieces.count == self.count
        else:
            assert self.count == self.end <= self.capacity
