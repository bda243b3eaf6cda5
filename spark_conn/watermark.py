"""The pipeline's event-time watermark, per input partition (as Flink and Spark do it).

Kafka keeps order only within a partition, and Spark cuts each micro-batch out of
every partition independently, so "the largest ts so far" (the rule of ``panjoin
replay``, which reads one ordered file) would call a tuple late merely because another
partition ran ahead in the same micro-batch. The pipeline uses the watermark instead:

    W = min over every input partition (both topics) of the largest ts read from it

taken at the start of each micro-batch, from the batches before it (Spark's rule:
the watermark moves between micro-batches). A tuple is late iff ``ts < W - L``
(L = ``--allowed-lateness``); the manager gets W with the batch
(``JoinInput.watermark``) and expires subwindows by it. A partition whose tuples are
in order within L is never late, whatever the trigger size: every tuple is at least
its partition's earlier maximum minus L, and W is at most that maximum.

A partition that has given nothing yet holds W at -inf (nothing late, nothing
expires). One from which nothing was read for ``idle_timeout`` seconds (wall clock,
as Flink's ``withIdleness``) stops holding W back until it gives data again; so W
depends on timing, which is why the job logs each batch's W and a replay uses the
logged one. W never moves back.

Example: partitions R/0, R/1, S/0 have given ts up to 900, 400 and 650: W = 400, and
with L = 100 a tuple below 300 is late. R/1 then idles past the timeout: W = 650.
"""

from __future__ import annotations

import time

NO_WATERMARK = None  # W = -inf: no partition has been heard from everywhere yet


class PartitionWatermarks:
    """Largest ts read per (stream, partition) and the watermark over them.

    ``stream`` is 0 for the R topic, 1 for the S topic. :meth:`snapshot` and
    :meth:`restore` carry the maxima through the join log (a restart reads idle
    clocks afresh)."""

    def __init__(self, partitions=(), idle_timeout: float | None = None, clock=time.monotonic):
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError(f"idle timeout must be positive seconds, got {idle_timeout}")
        self.idle_timeout = idle_timeout
        self.clock = clock
        now = clock()
        self.top: dict[tuple[int, int], int | None] = {}
        self.heard: dict[tuple[int, int], float] = {}
        for sp in partitions:
            self.add_partition(*sp, now=now)
        self.w: int | None = NO_WATERMARK

    def add_partition(self, stream: int, partition: int, now: float | None = None) -> None:
        key = (int(stream), int(partition))
        if key not in self.top:
            self.top[key] = None
            self.heard[key] = self.clock() if now is None else now

    def observe(self, stream, partition, ts) -> None:
        """Tuples read (numpy arrays of one length): their partitions' maxima move."""
        import numpy as np

        if not len(ts):
            return
        now = self.clock()
        # one pass, no sort: a max per (stream, partition) slot (partitions are few)
        width = int(partition.max()) + 1
        slot = stream.astype(np.int64) * width + partition
        tops = np.full(2 * width, np.iinfo(np.int64).min, np.int64)
        np.maximum.at(tops, slot, ts)
        seen = np.zeros(2 * width, bool)
        seen[slot] = True
        for k in np.flatnonzero(seen).tolist():
            sp, t = (k // width, k % width), int(tops[k])
            self.add_partition(*sp, now=now)
            old = self.top[sp]
            self.top[sp] = t if old is None else max(old, t)
            self.heard[sp] = now

    def current(self) -> int | None:
        """W now: the least maximum over partitions that are not idle (None = -inf)."""
        now = self.clock()
        live = [t for sp, t in self.top.items() if self.idle_timeout is None
                or now - self.heard[sp] < self.idle_timeout]
        if live and all(t is not None for t in live):
            w = min(live)
            self.w = w if self.w is None else max(self.w, w)
        return self.w

    def snapshot(self) -> list:
        """``[[stream, partition, largest ts or None], ...]`` and W, for the join log."""
        return [[s, p, t] for (s, p), t in sorted(self.top.items())]

    def restore(self, snap: list, w: int | None) -> None:
        now = self.clock()
        for s, p, t in snap:
            self.add_partition(s, p, now=now)
            old = self.top[(s, p)]
            self.top[(s, p)] = t if old is None else (old if t is None else max(old, t))
        if w is not None:
            self.w = w if self.w is None else max(self.w, w)
