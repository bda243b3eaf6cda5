"""The job's join log: one fsynced JSON line per micro-batch, in ``<checkpoint>/panjoin/join.log``.

Written after a batch is joined and before any of its output is written, each line
names the batch's offset ranges, where the output topics ended before it wrote, the
watermark it was joined under, its repeated ids and, per stream, the tuples it stored
and their largest ts (see :mod:`spark_conn.pipeline` for how a restart uses them). A
torn last line (a crash mid-write) is a batch that was never sent, and is ignored.
:func:`first_needed` says which logged batches a rebuilt join still needs, so the log
is compacted as batches leave the window::

    >>> import tempfile
    >>> log = JoinLog(tempfile.mkdtemp())
    >>> log.append({"batch": 1, "ranges": {}}); log.append({"batch": 2, "ranges": {}})
    >>> sorted(log.read())
    [1, 2]
"""

from __future__ import annotations

import json
import os

from panjoin.semantics import Window


class JoinLog:
    """The log file in ``directory`` (created if missing)."""

    def __init__(self, directory: str):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, "join.log")

    def read(self) -> dict[int, dict]:
        """``{batch: entry}`` of every whole line."""
        entries = {}
        if os.path.exists(self.path):
            with open(self.path) as f:
                for line in f:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        e = json.loads(line)
                    except ValueError:
                        break  # a torn last line: the batch was never sent
                    entries[e["batch"]] = e
        return entries

    def append(self, entry: dict) -> None:
        """One more line, on disk when this returns."""
        with open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def rewrite(self, entries: dict) -> None:
        """Replace the log by ``entries`` (atomically: a crash leaves the old or the new)."""
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            for b in sorted(entries):
                f.write(json.dumps(entries[b]) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself survives a crash
        finally:
            os.close(fd)


def first_needed(entries: dict, upto: int, window: Window, batch_size: int) -> int:
    """The oldest logged batch a join rebuilt for batch ``upto`` must replay: older
    ones hold no tuple that a tuple of ``upto`` or later can pair with, nor an id
    that can still repeat (bounded recovery: restart time follows the window, not
    the job's age; the join log is compacted to this point).

    Time windows: batch j is needed while one of its stored tuples of stream X has
    ``ts + T_X > W - L``, W the newest logged watermark (no later tuple is below
    ``W - L``). Count windows: the newest batches holding the last ``W_X + NBat``
    stored tuples of each stream (the ids kept by :class:`IdWindow`). Entries of an
    older log, without these counts, are all needed."""
    older = sorted(b for b in entries if b < upto)
    if not older:
        return upto
    if any("stored" not in entries[b] for b in older):
        return older[0]
    w = window
    if w.kind == "time":
        marks = [e.get("watermark") for e in entries.values()]
        marks = [m for m in marks if m is not None]
        if not marks:
            return older[0]
        edge = max(marks) - w.lateness
        need = [b for b in older if any(
            t is not None and t + w.size("RS"[x]) > edge
            for x, t in enumerate(entries[b]["ts_max"]))]
        return need[0] if need else upto
    want = [w.size("RS"[x]) + batch_size for x in (0, 1)]
    have = [0, 0]
    for b in reversed(older):
        have = [h + n for h, n in zip(have, entries[b]["stored"], strict=True)]
        if all(h >= n for h, n in zip(have, want, strict=True)):
            return b
    return older[0]
