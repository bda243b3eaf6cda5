"""What the pipeline job keeps of the window: its tuples' ids and their records.

The manager joins ids, keys and times only; the job keeps, per stream,

* :class:`IdWindow`, the ids still in the window, to reject a tuple whose id repeats
  one of them (the join names tuples by id);
* :class:`RecordWindow`, each window tuple's record as it came, to build the output
  records of the manager's id pairs (:mod:`spark_conn.joined`) without any record
  travelling to the manager and back.

Both hold one chunk per micro-batch and stream and drop chunks by the window's own
rule (DESIGN section 2: time windows keep a tuple while ``ts > max ts - L - T``,
count windows the last ``W`` tuples and one batch more), so each micro-batch costs
time in proportion to itself, not to the window.

Example (time window T = 100, L = 10): batches 3 and 4 of R hold ids 30..39 (ts up
to 350) and 40..49 (ts up to 480); once a batch reaches ts 470, batch 3's tuples
(ts <= 470 - 10 - 100 = 360) can pair with no future tuple: its chunks go, and id 35
may come back without being a repeat.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from panjoin.kafka.fetcher import value_buffers, values_array
from panjoin.semantics import Window
from panjoin.wire import PAYLOAD_TYPE
from spark_conn.joined import copy_spans, frame


class IdWindow:
    """The ids of the window's tuples per stream (numpy, no per-tuple Python): chunks of
    ``[ids, ts, bounds]`` in arrival order, ``bounds`` their (min id, max id, min ts,
    max ts), so that a micro-batch reads only the chunks its ids or the window's edge
    reach. Ids leave once no future tuple can pair with them (time windows: ``ts + T
    <= max ts - L``; count windows: beyond the last W + one batch)."""

    def __init__(self, window: Window, batch: int):
        self.window = window
        self.batch = batch
        self.chunks: list = [[], []]  # per stream: [ids, ts, bounds] per batch, in arrival order
        self.max_ts = None

    @staticmethod
    def _chunk(ids: np.ndarray, ts: np.ndarray) -> list:
        return [ids, ts, (ids.min(), ids.max(), ts.min(), ts.max()) if len(ids) else None]

    @property
    def ids(self) -> list[np.ndarray]:
        """Per stream, every id kept, in arrival order."""
        return [np.concatenate([c[0] for c in cs]) if cs else np.empty(0, np.int64)
                for cs in self.chunks]

    def _overlapping(self, s: int, ids: np.ndarray) -> list:
        """The chunks of stream ``s`` whose id range meets that of ``ids`` (ids that grow
        with arrival, the usual case, meet none of the older chunks)."""
        lo, hi = ids.min(), ids.max()
        return [c for c in self.chunks[s] if c[2] is not None and lo <= c[2][1]
                and c[2][0] <= hi]

    def add(self, p, dups: np.ndarray | None = None) -> np.ndarray:
        """Store a batch's tuples; returns the positions whose id repeats a stored one
        (or an earlier one of the batch), which are not stored. ``dups`` (positions)
        gives that answer instead of computing it: a replay repeats the first run's."""
        dup = np.zeros(len(p.id), bool)
        if dups is not None:
            dup[dups] = True
        for s in (0, 1):
            pos = np.flatnonzero(p.stream == s)
            ids = p.id[pos]
            if not len(ids):
                continue
            if dups is not None:
                bad = dup[pos]
            else:
                first = np.zeros(len(ids), bool)
                first[np.unique(ids, return_index=True)[1]] = True
                bad = ~first
                for c in self._overlapping(s, ids):
                    bad |= np.isin(ids, c[0])
                dup[pos[bad]] = True
            if (~bad).any():
                self.chunks[s].append(self._chunk(ids[~bad], p.ts[pos[~bad]]))
        return np.flatnonzero(dup)

    def drop(self, s: int, ids: np.ndarray) -> None:
        if not len(ids):
            return
        for c in self._overlapping(s, ids):
            keep = ~np.isin(c[0], ids)
            c[:] = self._chunk(c[0][keep], c[1][keep])

    def prune(self, batch_max_ts: int | None) -> None:
        w = self.window
        if batch_max_ts is not None:
            self.max_ts = batch_max_ts if self.max_ts is None else max(self.max_ts, batch_max_ts)
        for s in (0, 1):
            chunks = self.chunks[s]
            if w.kind == "count":
                keep = w.size("RS"[s]) + self.batch
                n = sum(len(c[0]) for c in chunks)
                while chunks and n - len(chunks[0][0]) >= keep:
                    n -= len(chunks.pop(0)[0])
                if chunks and n > keep:
                    cut = n - keep
                    chunks[0] = self._chunk(chunks[0][0][cut:], chunks[0][1][cut:])
            elif self.max_ts is not None:
                dead = self.max_ts - w.lateness - w.size("RS"[s])
                kept = []
                for c in chunks:
                    if c[2] is None or c[2][3] <= dead:
                        continue  # every tuple of the chunk left the window
                    if c[2][2] <= dead:
                        live = c[1] > dead
                        c = self._chunk(c[0][live], c[1][live])
                    kept.append(c)
                self.chunks[s] = kept


class RecordWindow:
    """Each window tuple's record (its raw JSON), to build the output records of the
    manager's pairs.

    One chunk per micro-batch and stream: the ids sorted, with their rows in the
    micro-batch's records (whose buffers both streams' chunks share: nothing is
    copied). A chunk goes once none of its tuples can pair with a future one, by the
    rule of :class:`IdWindow`. Lookups search the newest chunk first (an id may come
    back once its first tuple left the window), and only for ids within a chunk's
    range (ids that grow with arrival fall in one chunk each).

    Example: chunks of batches 3 and 4 for R; ``lookup(0, [17, 4])`` finds id 17 in
    batch 4's sorted ids and 4 in batch 3's, and returns their records in that order.
    """

    def __init__(self, window: Window, batch: int):
        self.window, self.batch = window, batch
        # per stream: [((data, offsets) of the batch's records, sorted ids, rows, max ts)]
        self.chunks: list = [[], []]
        self.max_ts = None

    def add(self, p) -> None:
        """Keep a parsed micro-batch's records (``p.records``, tuple i's at ``p.row[i]``)."""
        buf = value_buffers(p.records)
        for s in (0, 1):
            pos = np.flatnonzero(p.stream == s)
            if len(pos):
                perm = np.argsort(p.id[pos], kind="stable")
                self.chunks[s].append((buf, p.id[pos[perm]], p.row[pos[perm]],
                                       int(p.ts[pos].max())))

    def locate(self, s: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(chunk, row)`` of each of ``ids`` of stream ``s``: its record is that
        chunk's record number ``row``."""
        where = np.full(len(ids), -1, np.int64)  # chunk number
        at = np.zeros(len(ids), np.int64)  # row in the chunk's records
        todo = np.arange(len(ids))
        for c in range(len(self.chunks[s]) - 1, -1, -1):
            if not len(todo):
                break
            _, srt, rows, _ = self.chunks[s][c]
            q = ids[todo]
            inside = np.flatnonzero((q >= srt[0]) & (q <= srt[-1]))
            k = np.searchsorted(srt, q[inside])
            hit = srt[k] == q[inside]
            found = todo[inside[hit]]
            where[found], at[found] = c, rows[k[hit]]
            miss = np.ones(len(todo), bool)
            miss[inside[hit]] = False
            todo = todo[miss]
        if len(todo):
            raise RuntimeError(f"the manager paired {'RS'[s]} ids {ids[todo[:5]].tolist()} "
                               f"whose records left the job's window; this is a bug")
        return where, at

    def _spans(self, s: int, where: np.ndarray, at: np.ndarray):
        """Where the located records lie in their chunks' buffers: (start, length)."""
        start = np.empty(len(at), np.int64)
        length = np.empty(len(at), np.int64)
        for c in np.unique(where).tolist():
            m = where == c
            offs = self.chunks[s][c][0][1]
            start[m] = offs[at[m]]
            length[m] = offs[at[m] + 1] - start[m]
        return start, length

    def _copy(self, s, out, dst, where, start, length) -> None:
        for c in np.unique(where).tolist():
            m = where == c
            copy_spans(out, dst[m], self.chunks[s][c][0][0], start[m], length[m])

    def lookup(self, s: int, ids: np.ndarray) -> pa.Array:
        """The records of ``ids`` of stream ``s``, in that order."""
        where, at = self.locate(s, ids)
        start, length = self._spans(s, where, at)
        offs = np.zeros(len(ids) + 1, np.int64)
        np.cumsum(length, out=offs[1:])
        out = np.empty(offs[-1], np.uint8)
        self._copy(s, out, offs[:-1], where, start, length)
        return values_array(out, offs).cast(PAYLOAD_TYPE)

    def joined(self, r: np.ndarray, s: np.ndarray) -> pa.Array:
        """The output record of each pair (r[i], s[i]) (:mod:`spark_conn.joined`):
        ``{"r_id":..,"s_id":..,"r":{R record},"s":{S record}}``, large_binary."""
        rw, ra = self.locate(0, r)
        sw, sa = self.locate(1, s)
        rstart, rlen = self._spans(0, rw, ra)
        sstart, slen = self._spans(1, sw, sa)
        out, offs, dr, ds = frame(r, s, rlen, slen)
        self._copy(0, out, dr, rw, rstart, rlen)
        self._copy(1, out, ds, sw, sstart, slen)
        return values_array(out, offs)

    def prune(self, batch_max_ts: int) -> None:
        w = self.window
        self.max_ts = batch_max_ts if self.max_ts is None else max(self.max_ts, batch_max_ts)
        for s in (0, 1):
            chunks = self.chunks[s]
            if w.kind == "count":
                keep, n = w.size("RS"[s]) + self.batch, sum(len(c[1]) for c in chunks)
                while chunks and n - len(chunks[0][1]) >= keep:
                    n -= len(chunks.pop(0)[1])
            else:
                dead = self.max_ts - w.lateness - w.size("RS"[s])
                while chunks and chunks[0][3] <= dead:
                    chunks.pop(0)
