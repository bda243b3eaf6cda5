"""The subwindow ring of one stream: chronologically chained subwindows and their life cycle.

The subwindows of a stream form a chain, oldest first, allocated round-robin
over the workers (PanJoin paper, section III-A). New tuples go only into the
newest subwindow; only the oldest expires, and always whole. The manager keeps,
per subwindow, only what it needs to decide without asking the workers: the seq
and ts ranges (for expiry, for whether probe results need window filtering, and
the seq limit of each probe). The ids of the tuples live with the subwindow on
its worker (:mod:`panjoin.subwindow.store`); payloads, when a client hands them
to the manager at all, are kept here by seq.

Life cycle of a subwindow (one :class:`SubState` per subwindow)::

    CREATED --first insert--> FILLING --count == capacity--> FULL
       |                         |                             |
       +------ expire (every tuple out of every future window) +--> EXPIRED

- CREATED: the create command was sent (RaP-Table splitters from the predecessor);
- FILLING: it is the newest subwindow and receives every insert;
- FULL: a successor was created; it is only probed from now on;
- EXPIRED: the expire command was sent (and its payloads dropped); it is gone
  from the ring.

Example, NSub = 4, count window of 6 tuples: inserts of 3, 3, 3 tuples give
subwindows #0 [seq 0-3] FULL, #1 [seq 4-7] FULL, #2 [seq 8] FILLING; when the
oldest future probe only reaches back to seq 4, #0 expires.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

import numpy as np


class SubState(enum.Enum):
    CREATED = "created"
    FILLING = "filling"
    FULL = "full"
    EXPIRED = "expired"


@dataclass
class Subwindow:
    """The manager's record of one subwindow (the index itself lives on a worker)."""

    sub_id: int
    stream: str
    worker: int
    capacity: int
    index: str = ""  # its index kind (``--index auto`` picks one per subwindow)
    state: SubState = SubState.CREATED
    count: int = 0
    seq_start: int = -1  # seqs of a subwindow are contiguous: [seq_start, seq_start + count)
    ts_min: int = np.iinfo(np.int64).max  # of the stored ts column (opp counts for count windows)
    ts_max: int = np.iinfo(np.int64).min
    _pay_offs: np.ndarray | None = None  # payload i is _pay_data[offs[i]:offs[i+1]]
    _pay_data: np.ndarray | None = None  # payload bytes in seq order; grows by doubling
    _pay_null: np.ndarray | None = None  # per slot, once a null payload came
    payload_bytes: int = 0

    @property
    def seq_end(self) -> int:
        return self.seq_start + self.count

    @property
    def room(self) -> int:
        return self.capacity - self.count

    def add(self, seq: np.ndarray, ts_col: np.ndarray, payloads=None,
            ts_sorted: bool = False) -> None:
        """Record an insert: ``seq``, in arrival order, must continue this subwindow's
        contiguous range; ``payloads`` (a pyarrow array in seq order) is kept to join
        back onto results;
        ``ts_sorted``: ``ts_col`` is non-decreasing (count windows' opposite arrivals)."""
        if seq.size == 0:
            return
        first = int(seq[0])
        if self.count == 0:
            self.seq_start = first
        elif first != self.seq_end:
            raise AssertionError(
                f"subwindow {self.sub_id}: seq {first} does not follow {self.seq_end}")
        self.count += int(seq.size)
        if ts_sorted:
            lo, hi = int(ts_col[0]), int(ts_col[-1])
        else:
            lo, hi = int(ts_col.min()), int(ts_col.max())
        self.ts_min = min(self.ts_min, lo)
        self.ts_max = max(self.ts_max, hi)
        if payloads is not None:
            self._add_payloads(payloads)
        self.state = SubState.FULL if self.count >= self.capacity else SubState.FILLING

    def _add_payloads(self, p) -> None:
        """Append a large_binary array's values after the last count - len(p) slots.

        The bytes go into one buffer that grows by doubling, so that :meth:`payloads`
        is a view, not a concatenation of every insert so far (that was O(NSub) per
        probe). A view taken for a probe in flight stays valid: later inserts write
        past its end, and a grown buffer is a new one."""
        n = len(p)
        k = self.count - n
        _, offs, data = p.buffers()
        o = np.frombuffer(offs, np.int64)[p.offset:p.offset + n + 1]
        d = np.frombuffer(data, np.uint8) if data is not None else np.empty(0, np.uint8)
        lo, hi = int(o[0]), int(o[-1])
        if self._pay_offs is None:  # untouched pages cost nothing: size for a full one
            self._pay_offs = np.zeros(self.capacity + 1, np.int64)
            self._pay_data = np.empty(max(1 << 12, (hi - lo) * self.capacity // max(n, 1)
                                          + (hi - lo)), np.uint8)
        base = int(self._pay_offs[k])
        if base + hi - lo > len(self._pay_data):
            grown = np.empty(max(base + hi - lo, 2 * len(self._pay_data)), np.uint8)
            grown[:base] = self._pay_data[:base]
            self._pay_data = grown
        self._pay_data[base:base + hi - lo] = d[lo:hi]
        self._pay_offs[k + 1:k + n + 1] = o[1:] - lo + base
        if p.null_count:
            if self._pay_null is None:
                self._pay_null = np.zeros(self.capacity, bool)
            self._pay_null[k:k + n] = np.asarray(p.is_null())
        self.payload_bytes += hi - lo + 8 * n

    def payloads(self):
        """The payloads in seq order as one large_binary array (a view), or None when
        the join has none."""
        if self._pay_offs is None:
            return None
        import pyarrow as pa

        n = self.count
        valid = None
        if self._pay_null is not None and self._pay_null[:n].any():
            valid = pa.py_buffer(np.packbits(~self._pay_null[:n], bitorder="little"))
        return pa.Array.from_buffers(pa.large_binary(), n, [
            valid, pa.py_buffer(self._pay_offs[:n + 1]), pa.py_buffer(self._pay_data)])


class SubwindowRing:
    """The chain of one stream's subwindows, oldest at the left."""

    def __init__(self, stream: str, capacity: int, n_workers: int, first_worker: int = 0):
        self.stream = stream
        self.capacity = capacity
        self.n_workers = max(1, n_workers)
        self._next_worker = first_worker % self.n_workers
        self.subs: deque[Subwindow] = deque()
        self.created = 0
        self.expired = 0

    def __iter__(self):
        return iter(self.subs)

    def __len__(self) -> int:
        return len(self.subs)

    @property
    def newest(self) -> Subwindow | None:
        return self.subs[-1] if self.subs else None

    @property
    def oldest(self) -> Subwindow | None:
        return self.subs[0] if self.subs else None

    def tuples(self) -> int:
        return sum(s.count for s in self.subs)

    def new_subwindow(self, sub_id: int) -> Subwindow:
        """Chain a new subwindow on the next worker in round-robin order."""
        if self.subs and self.subs[-1].state == SubState.FILLING:
            self.subs[-1].state = SubState.FULL
        sub = Subwindow(sub_id, self.stream, self._next_worker, self.capacity)
        self._next_worker = (self._next_worker + 1) % self.n_workers
        self.subs.append(sub)
        self.created += 1
        return sub

    def pop_oldest(self) -> Subwindow:
        sub = self.subs.popleft()
        sub.state = SubState.EXPIRED
        sub._pay_offs = sub._pay_data = sub._pay_null = None
        self.expired += 1
        return sub
