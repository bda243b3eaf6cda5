"""Reading ahead: the next micro-batch read and parsed in the background.

:class:`ReadAhead` guesses the next micro-batch's offset ranges the way Spark's
source will plan them and reads them while this batch joins and writes;
:func:`offset_log_ranges` reads a batch's ranges from Spark's own offset log.
"""

from __future__ import annotations

import json
import logging
import os

from panjoin.kafka.fetcher import Fetcher
from spark_conn.config import PipelineConfig
from spark_conn.records import parse_batch, records_of

log = logging.getLogger("panjoin.pipeline")


class ReadAhead:
    """The next micro-batch read from Kafka and parsed in a background thread while
    this one joins and writes.

    The source plans every micro-batch with :func:`spark_conn.kafka_source.plan_batch`
    from where the last one ended, the end offsets and the trigger limit. In an
    "available now" run the end offsets are fixed (``endingOffsets``), so the next
    plan is known as soon as this one is: its records are read and parsed ahead.
    When Spark hands other ranges (a restart, a partition that was not seen yet) the
    records go back to the reader (:meth:`Fetcher.unread`) and the batch is read
    as usual, so a wrong guess costs time, never a record.

    Example: batch 3 is R[0] 400..600; with R[0] ending at 900 and 200 records per
    trigger, batch 4 is guessed as R[0] 600..800 and read while batch 3 joins.
    """

    def __init__(self, cfg: PipelineConfig, ending: dict | None):
        from concurrent.futures import ThreadPoolExecutor

        self.cfg, self.ending = cfg, ending
        self.pos: dict = {}  # {topic: {partition: where the last batch ended}}
        # two threads: the read ahead, and the output topics' ends (Pipeline.out_start)
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="panjoin-read-ahead")
        self._job = None  # (the guessed ranges, future of (got, Records, Parsed))
        self.hits = self.misses = 0

    def guess(self, ranges: dict) -> dict | None:
        """The ranges of the batch after ``ranges``, or None when there is none to guess."""
        from spark_conn.kafka_source import plan_batch

        for t, ps in ranges.items():
            for p, (_, e) in ps.items():
                self.pos.setdefault(t, {})[p] = e
        if self.ending is None:
            return None
        begin = {t: {p: self.pos.get(t, {}).get(p, e) for p, e in ps.items()}
                 for t, ps in self.ending.items()}
        end = {t: {p: max(e, begin[t][p]) for p, e in ps.items()}
               for t, ps in self.ending.items()}
        nxt = plan_batch(begin, end, self.cfg.max_offsets_per_trigger)
        out = {t: {p: [begin[t][p], e] for p, e in ps.items() if e > begin[t][p]}
               for t, ps in nxt.items()}
        return {t: ps for t, ps in out.items() if ps} or None

    def prime(self, reader: Fetcher, begin: dict) -> None:
        """Before the first batch: read the one the source will plan from ``begin``
        (``{topic: {partition: offset}}``, where a fresh query starts)."""
        self.pos = {t: dict(ps) for t, ps in begin.items()}
        self.start(reader, {})

    def start(self, reader: Fetcher, ranges: dict) -> None:
        """After a batch of ``ranges`` is planned: read the next one in the background."""
        nxt = self.guess(ranges)
        if nxt is not None and self._job is None:
            self._job = (nxt, self.pool.submit(self._read, reader, nxt))

    def guessed(self) -> dict | None:
        """The ranges being read ahead, if any."""
        return self._job[0] if self._job is not None else None

    def _read(self, reader: Fetcher, ranges: dict):
        want = [(t, int(p), lo, hi) for t in sorted(ranges)
                for p, (lo, hi) in sorted(ranges[t].items(), key=lambda x: int(x[0]))]
        got = reader.read(want)
        rec = records_of(got, want, ranges, self.cfg)
        return got, rec, parse_batch(rec, self.cfg)

    def take(self, reader: Fetcher, ranges: dict | None):
        """``(Records, Parsed)`` of ``ranges`` if they were read ahead, else None. Waits
        for the read in flight: the reader is never used by two threads. ``None``
        gives back whatever was read ahead."""
        if self._job is None:
            return None
        guessed, fut = self._job
        self._job = None
        try:
            got, rec, parsed = fut.result()
        except Exception as e:  # the batch is read again, from its first offset
            log.warning("read-ahead of %s failed (%s); reading the batch again", guessed, e)
            self.misses += 1
            return None
        if guessed == ranges:
            self.hits += 1
            return rec, parsed
        reader.unread(got)
        self.misses += 1
        return None

    def close(self) -> None:
        if self._job is not None:
            self._job[1].cancel()
            try:
                self._job[1].result()
            except Exception:
                pass
            self._job = None
        self.pool.shutdown(wait=True)


def offset_log_ranges(spark_checkpoint: str, batch: int) -> dict | None:
    """Micro-batch ``batch``'s offset ranges ``{topic: {partition: [start, end]}}`` from
    Spark's offset log, or None when it cannot say (batch 0, whose start only the
    source knows, or a log this cannot read).

    Spark writes ``offsets/<b>`` (a version line, the batch's metadata, then each
    source's end offsets as JSON) before batch b runs, and b starts where b - 1
    ended. Reading two small files costs far less than a Spark job that collects
    the planned ranges from the batch's frame (about 0.13 s a batch)."""
    def end_of(b: int) -> dict:
        with open(os.path.join(spark_checkpoint, "offsets", str(b))) as f:
            lines = f.read().splitlines()
        if len(lines) != 3 or lines[0] != "v1":  # one source, the log format Spark 4 writes
            raise ValueError(f"offset log {b}: {len(lines)} lines")
        return json.loads(lines[2])

    if batch < 1:
        return None
    try:
        start, end = end_of(batch - 1), end_of(batch)
        out = {t: {str(p): [int(start.get(t, {}).get(p, 0)), int(e)] for p, e in ps.items()}
               for t, ps in end.items()}
    except (OSError, ValueError, TypeError, AttributeError) as e:
        log.debug("batch %d: no ranges from Spark's offset log (%s)", batch, e)
        return None
    return {t: {p: r for p, r in ps.items() if r[1] > r[0]} for t, ps in out.items()
            if any(r[1] > r[0] for r in ps.values())}
