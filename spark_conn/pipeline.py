"""The Spark job: Kafka R and S -> the PanJoin manager -> Kafka, exactly once.

    panjoin pipeline --bootstrap-servers 127.0.0.1:9092 \\
        --manager 127.0.0.1:50050 --window time:1000,1000 --predicate band:10 \\
        --checkpoint /tmp/ckpt            (or python -m spark_conn.cli, the same flags)

The job's parts, one module each: its settings (:mod:`spark_conn.config`), records
to tuples (:mod:`spark_conn.records`), reading ahead (:mod:`spark_conn.read_ahead`),
the join log (:mod:`spark_conn.join_log`), the window's records and ids
(:mod:`spark_conn.record_window`), the watermark (:mod:`spark_conn.watermark`), the
command line (:mod:`spark_conn.cli`); this module is the job itself, per micro-batch
(:class:`Pipeline`) and as a Spark query (:func:`run`).

Per micro-batch ``b`` (Spark's batch id), on the driver (``foreachBatch``)::

    Spark plans the offset ranges ──► records read in bulk (Fetch, Numba)
       (topic, partition,                   │
        start, end)                         ▼
                    parse by schema ──► bad: dead-letter topic (reason, record)
                    (id, key, ts by a Numba JSON pass: panjoin.kafka.json_fields)
                                            │ good ones, sorted by event time
                                            ▼
                    manager Join(batch_id = b + 1, flush): ids, keys, times
                                            │
      id pairs + the records ──► output topic: {"r_id", "s_id", "r": {R record}, "s": {S record}}
      late tuples ──► late topic: {"stream", "id", "ts", "record"}

Spark's source (``format("panjoin_kafka")`` with ``ranges``) hands the job only
each micro-batch's offset ranges; Spark still admits them (``maxOffsetsPerTrigger``)
and keeps them in its checkpoint. While batch ``b`` joins and writes, a background
thread reads and parses batch ``b + 1``, whose ranges follow from ``b``'s by the
source's own planner (:class:`~spark_conn.read_ahead.ReadAhead`). The records skip
Spark's Python worker, its JVM rows and ``toArrow`` (that trip cost more than the
join itself; see
benchmarks/RESULTS.md, issue 6). Records come and go as whole Kafka record batches,
decoded and encoded by Numba kernels (:mod:`panjoin.kafka.fetcher`,
:mod:`panjoin.kafka.writer`): nothing in the data path is per-record Python.
``--source python-records`` sends the records through Spark instead.

Every record written carries headers ``panjoin.batch = b`` and ``panjoin.seq = i``
(its position in that batch's output to that topic, in a deterministic order).

Exactly once. Spark's checkpoint fixes each batch's offsets before the batch runs
and replays the last batch after a crash with the same offsets. The manager
applies a batch id at most once, but its window lives in memory and goes away
with the connection, so the job keeps a *join log* (``<checkpoint>/panjoin/join.log``,
one fsynced JSON line per batch, written after the batch is joined and BEFORE any of
its output is written) naming each batch's offset ranges, where the output topics
ended before the batch wrote, the watermark it was joined under, its repeated ids,
and per stream the tuples it stored and their largest ts. A restarted job opens a
new join and replays the logged batches that the window still needs
(:func:`spark_conn.join_log.first_needed`: re-read from Kafka, same order, same watermarks,
same repeated ids, output discarded); older batches hold nothing that a later tuple
can pair with, so the log is compacted as they leave the window and a restart costs
what the window holds, not the job's age. The batch Spark replays is then recomputed
(identical output, since everything it can reach is identical) and only the records
whose ``(batch, seq)`` are not already in the output topics (read from the logged
ends) are written. The writer never retries on its own (a failed write fails the
batch, and the restart writes what is missing), so no record is written twice. So a
kill at any point gives the same output topics, no loss, no duplicate. Example:
killed while writing batch 7's output after seq 0..41 reached the broker, with a
window of three batches: on restart batches 4..6 are replayed into a new join
(nothing written), batch 7 yields the same 100 records, and seq 42..99 are written.
A manager that goes away is handled the same way, without a restart
(:meth:`Pipeline.apply_reconnecting`).

Watermark (:mod:`spark_conn.watermark`): a tuple is late iff ``ts < W - L``, W the
least over the input partitions of the largest ts read from each, taken at the start
of the micro-batch; the manager gets W with the batch and expires by it.

Joining ahead: when the next micro-batch's ranges are known in advance (an
"available now" run, :class:`~spark_conn.read_ahead.ReadAhead`), the job joins it
right after this one, in a background thread, while this batch's output is written and Spark commits
and plans the next trigger. Nothing of it is logged or written until Spark hands
that batch: with the ranges joined ahead, its output is written as is; with other
ranges (a wrong guess), the join is rebuilt from the log and the batch is joined
as usual. Example: batch 4 joins while batch 3's 70,000 records are written; when
Spark hands batch 4 with the guessed ranges, it is logged and written at once.

Records: the manager gets each tuple's id, key and ts, and answers pairs of ids.
The job keeps the window's records itself (:class:`RecordWindow`, one chunk per
micro-batch, dropped by the window's own rule) and joins them back onto the pairs,
so no record travels to the manager and back (a replay into a fresh join rebuilds
them too, so exactly-once is unchanged). It also keeps the window's ids
(:class:`IdWindow`) to reject a repeated id to the dead-letter topic.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from panjoin.client import Client, JoinSession
from panjoin.kafka import io
from panjoin.kafka.fetcher import Fetcher
from panjoin.kafka.io import BATCH_HEADER, SEQ_HEADER
from panjoin.kafka.protocol import ProtocolError
from panjoin.kafka.writer import BatchWriter
from panjoin.ops.timings import Timings
from panjoin.semantics import I64_MIN, parse_predicate, parse_window
from spark_conn.config import PipelineConfig
from spark_conn.join_log import JoinLog, first_needed
from spark_conn.native import NativeSourceError, check_connector, check_jar_paths
from spark_conn.read_ahead import ReadAhead, offset_log_ranges
from spark_conn.record_window import IdWindow, RecordWindow
from spark_conn.records import Parsed, Records, fetch_ranges, parse_batch, raw_record
from spark_conn.watermark import PartitionWatermarks

log = logging.getLogger("panjoin.pipeline")



# --------------------------------------------------------------------------- the job


def later_ts(p: Parsed, r: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Per pair (r[i], s[i]) joined in micro-batch ``p``, the event time of its later
    tuple. At least one of the two is ``p``'s own (a pair is made when its later tuple
    comes; a partner from an earlier batch came before it); when both are, the larger
    ts. Example: R 7 (ts 100) from an earlier batch, S 3 (ts 180) in ``p`` -> 180."""
    t = np.full(len(r), I64_MIN, np.int64)
    for st, ids in ((0, r), (1, s)):
        pos = np.flatnonzero(p.stream == st)
        if not len(pos):
            continue
        by = pos[np.argsort(p.id[pos], kind="stable")]
        k = np.minimum(np.searchsorted(p.id[by], ids), len(by) - 1)
        hit = p.id[by[k]] == ids  # ids of the window are unique per stream (IdWindow)
        np.maximum(t, np.where(hit, p.ts[by[k]], I64_MIN), out=t)
    return t


def records_per_stream(table: pa.Table | Records, s_topic: str) -> tuple[int, int]:
    """How many of a micro-batch's records came from the R topic and the S topic."""
    if isinstance(table, Records):
        n_s = int(table.stream.sum())
        return len(table.stream) - n_s, n_s
    import pyarrow.compute as pc

    n_s = int(pc.sum(pc.equal(table.column("topic"), s_topic)).as_py() or 0)
    return table.num_rows - n_s, n_s


@dataclass
class BatchOutput:
    joined: list  # bytes per record, deterministic order
    late: list
    dead: list
    n_in: int = 0
    # what the join log keeps of the batch (a replay repeats its decisions, and the
    # log is compacted by them): the watermark W it was joined under, the positions of
    # its repeated ids, per stream the tuples stored and their largest ts, and the
    # partitions' largest ts after it
    watermark: int | None = None
    dups: list = field(default_factory=list)
    stored: list = field(default_factory=lambda: [0, 0])
    ts_max: list = field(default_factory=lambda: [None, None])
    wm_after: list = field(default_factory=list)
    # per joined record, the event time (ms) of the later of its two tuples: its
    # event-to-result latency is measured from there once the record is written
    pair_ts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    def log_fields(self) -> dict:
        return {"watermark": self.watermark, "dups": self.dups, "stored": self.stored,
                "ts_max": self.ts_max, "wm_after": self.wm_after}


class Pipeline:
    """The per-micro-batch logic and the join log; ``process`` is the foreachBatch."""

    def __init__(self, cfg: PipelineConfig, ending: dict | None = None):
        self.cfg = cfg
        self.window = parse_window(cfg.window, cfg.allowed_lateness)
        if parse_predicate(cfg.predicate).residual is not None:  # fail before Spark starts
            raise ValueError(f"predicate {cfg.predicate!r}: the Kafka records carry no key2, "
                             "so a residual condition ('&band2:...') cannot be used here")
        self.log = JoinLog(os.path.join(cfg.checkpoint, "panjoin"))
        self.session: JoinSession | None = None
        self._stale = False  # the window must be rebuilt from the log before the next batch
        self.wm: PartitionWatermarks | None = None
        self.ids = IdWindow(self.window, cfg.batch_size)
        self.records = RecordWindow(self.window, cfg.batch_size)
        self._fetcher = None
        self.read_ahead = ReadAhead(cfg, ending)
        self._ahead = None  # (batch, future of (ranges, Records, Parsed, BatchOutput))
        self._ahead_pool = None
        self._ends = None  # future of the output topics' ends, measured after a write
        self._probe = None
        self._probe_lock = threading.Lock()
        self.writer: BatchWriter | None = None
        self.entries: dict | None = None
        self.done_to: dict = {}  # {topic: {partition: end of the last range processed}}
        self.read_to: dict = {}  # {topic: {partition: end of the last range joined}}
        self.stats = {"batches": 0, "tuples": 0, "tuples_r": 0, "tuples_s": 0, "joined": 0,
                      "late": 0, "dead": 0, "replayed_batches": 0, "skipped_records": 0,
                      "joined_ahead": 0, "joined_ahead_wrong": 0}
        # histograms for the metrics (panjoin.ops.metrics.PipelineCollector): each
        # micro-batch's time in foreachBatch, each written pair's event-to-result latency
        self.batch_s = Timings()
        self.latency_s = Timings()
        self.metrics_port: int | None = None  # where run() serves them, if it does

    # -- join log

    # -- one batch through the manager

    def watermarks(self) -> PartitionWatermarks:
        """The job's per-partition watermark (:mod:`spark_conn.watermark`), over every
        partition of both input topics (from the ending offsets, else the broker)."""
        if self.wm is None:
            c = self.cfg
            ends = self.read_ahead.ending
            if ends is None:
                with self._probe_lock:
                    if self._probe is None:
                        self._probe = Fetcher(c.bootstrap, options=c.kafka_options)
                    ends = {t: io.end_offsets(c.bootstrap, t, probe=self._probe,
                                              options=c.kafka_options)
                            for t in (c.r_topic, c.s_topic)}
            self.wm = PartitionWatermarks(
                [(int(t == c.s_topic), int(q)) for t in (c.r_topic, c.s_topic)
                 for q in ends.get(t, {})], c.idle_timeout)
        return self.wm

    def apply(self, batch: int, p: Parsed, logged: dict | None = None) -> BatchOutput:
        """Join one micro-batch. ``logged`` (its join-log entry, on a replay) gives the
        watermark and repeated ids it was first joined with, so a replay repeats its
        decisions whatever the clock or the ids of batches no longer replayed."""
        wm = self.watermarks()
        if self.window.kind == "time":
            w = logged["watermark"] if logged and "watermark" in logged else wm.current()
        else:
            w = None
        dup = self.ids.add(p, None if not logged or "dups" not in logged
                           else np.asarray(logged["dups"], np.int64))
        if p.partition is not None:  # every well-formed tuple read moves its partition
            wm.observe(p.stream, p.partition, p.ts)
        dead = [{"topic": t, "partition": q, "offset": o, "reason": r, **raw_record(v)}
                for t, q, o, r, v in p.bad]
        if len(dup):  # an id seen before in its stream: the join names tuples by id
            keep = np.ones(len(p.id), bool)
            keep[dup] = False
            for i in dup.tolist():
                dead.append({"topic": self.cfg.r_topic if p.stream[i] == 0 else self.cfg.s_topic,
                             "reason": f"id {int(p.id[i])} repeats an id of its stream that "
                                       f"is still in the window; ids must be unique",
                             **raw_record(p.records[int(p.row[i])].as_py())})
            p = p.take(keep)
        out = BatchOutput([], [], [json.dumps(d).encode() for d in dead], len(p.id),
                          watermark=w, dups=dup.tolist(), wm_after=wm.snapshot())
        if len(p.id) == 0:
            return out
        if self.session is None:
            self.session = self._open_join()
        self.records.add(p)
        t0 = time.perf_counter()
        # on a time window the job's watermark goes with every batch, from the first on
        # (None: none yet), so the manager's own lateness rule stays off
        ans = self.session.send(batch + 1, p, watermark=(I64_MIN if w is None else w)
                                if self.window.kind == "time" else None)
        if ans.duplicate:
            raise RuntimeError(f"manager took batch {batch + 1} as a replay on a fresh join")
        r, s, ls, li = ans.r_id, ans.s_id, ans.late_stream, ans.late_id
        self._time("manager", t0)  # a part of "join": the round trip to the cluster
        order = np.lexsort((s, r))
        if len(order):
            r, s = r[order], s[order]
            out.joined = self.records.joined(r, s)
            out.pair_ts = later_ts(p, r, s)
        # late tuples are this batch's own: find their records by (stream, id)
        lorder = np.lexsort((li, ls))
        ls, li = ls[lorder], li[lorder]
        stored = np.ones(len(p.id), bool)
        tags = (b"R", b"S")
        for st in (0, 1) if len(li) else ():
            pos = np.flatnonzero(p.stream == st)
            by_id = pos[np.argsort(p.id[pos], kind="stable")]
            at = by_id[np.searchsorted(p.id[by_id], li[ls == st])]
            stored[at] = False
            for rid, i in zip(li[ls == st].tolist(), at.tolist(), strict=True):
                out.late.append(b'{"stream":"%s","id":%d,"ts":%d,"record":%s}'
                                % (tags[st], rid, int(p.ts[i]),
                                   p.records[int(p.row[i])].as_py()))
            self.ids.drop(st, li[ls == st])
        for st in (0, 1):
            m = stored & (p.stream == st)
            out.stored[st] = int(m.sum())
            out.ts_max[st] = int(p.ts[m].max()) if m.any() else None
        # ids and records leave once no tuple at or above W - L can pair with them
        edge = int(p.ts.max()) if self.window.kind == "count" else w
        if edge is not None:
            self.ids.prune(edge)
            self.records.prune(edge)
        return out

    # -- Kafka

    def _writer(self) -> BatchWriter:
        if self.writer is None:
            self.writer = BatchWriter(self.cfg.bootstrap, options=self.cfg.kafka_options)
        return self.writer

    def out_topics(self):
        c = self.cfg
        return [c.out_topic, c.late_topic, c.dead_letter_topic]

    def out_ends(self) -> dict:
        with self._probe_lock:  # a Fetcher is one thread's; this runs in the background too
            if self._probe is None:
                self._probe = Fetcher(self.cfg.bootstrap, options=self.cfg.kafka_options)
            return {t: {str(p): v[1] for p, v in io.end_offsets(
                self.cfg.bootstrap, t, probe=self._probe).items()} for t in self.out_topics()}

    def out_start(self) -> dict:
        """Where the output topics end before this batch writes. Measured in the
        background right after the last batch's write was flushed: nothing of this
        job writes in between, so that is this batch's start (or, should another
        producer write too, a point before it: :meth:`written` then reads more)."""
        fut, self._ends = self._ends, None
        return fut.result() if fut is not None else self.out_ends()

    def written(self, batch: int, since: dict) -> dict[str, set]:
        """The seqs of ``batch`` already in each output topic (read from ``since``)."""
        c = io.consumer(self.cfg.bootstrap, self.cfg.kafka_options,
                        **{"enable.partition.eof": True})
        try:
            seen = {}
            for t in self.out_topics():
                seen[t] = set()
                for p, (_, end) in io.end_offsets(self.cfg.bootstrap, t,
                                                  options=self.cfg.kafka_options).items():
                    for m in io.read_range(c, t, p, since[t].get(str(p), 0), end):
                        h = dict(m.headers() or ())
                        if int(h.get(BATCH_HEADER, b"-1")) == batch:
                            seen[t].add(int(h[SEQ_HEADER]))
            return seen
        finally:
            c.close()

    def write(self, batch: int, out: BatchOutput, skip: dict | None) -> None:
        """The batch's output records, each with its batch id and position as headers;
        the positions in ``skip`` (already in the topic, see :meth:`written`) are not
        written again."""
        w = self._writer()
        for topic, recs in zip(self.out_topics(), (out.joined, out.late, out.dead),
                               strict=True):
            done = skip.get(topic, ()) if skip else ()
            vals = recs if isinstance(recs, pa.Array) else pa.array(recs, pa.large_binary())
            try:
                n = w.write(topic, vals, batch, done)
            except ProtocolError as e:
                if topic != self.cfg.dead_letter_topic:
                    raise
                n = self._write_dead_letters(batch, vals, e)
            self.stats["skipped_records"] += len(vals) - n

    def _write_dead_letters(self, batch: int, vals: pa.Array, e: ProtocolError) -> int:
        """The broker refused some of the batch's dead letters (too large for it, say,
        though :func:`raw_record` caps them): write them one at a time, after those the
        refused write left in the topic, and log each one refused again and go on. A
        record the broker will not take must not stop the job: every restart from the
        checkpoint would fail on it again."""
        topic = self.cfg.dead_letter_topic
        log.warning("batch %d: the dead-letter topic %r refused a write (%s); writing its "
                    "records one at a time", batch, topic, e)
        n, w = len(vals), self._writer()
        entry = (self.entries or {}).get(batch) or self.log.read().get(batch)
        there = self.written(batch, entry["out_start"])[topic] if entry else set()
        written = 0
        for i in range(n):
            if i in there:
                continue
            try:
                written += w.write(topic, vals, batch, set(range(n)) - {i})
            except ProtocolError as e1:
                self.stats["dead_dropped"] = self.stats.get("dead_dropped", 0) + 1
                log.error("batch %d: dead letter %d of %d is dropped, the topic %r refused "
                          "it (%s): %s", batch, i, n, topic, e1, vals[i].as_py()[:400])
        return written

    # -- replay after a restart

    def rebuild(self, upto: int, entries: dict) -> None:
        """Replay the logged batches ``< upto`` that the window still needs
        (:func:`spark_conn.join_log.first_needed`) into a fresh join, writing nothing."""
        self._stale = True  # until the replay is done: a failure leaves a window to redo
        first = first_needed(entries, upto, self.window, self.cfg.batch_size)
        missing = [b for b in range(first, upto) if b not in entries]
        if missing:
            raise RuntimeError(f"join log {self.log.path} lacks batches {missing[:5]}: the "
                               f"window cannot be rebuilt; start over with a new --checkpoint")
        prev = [b for b in entries if b < upto]
        if prev and "wm_after" in entries[max(prev)]:  # partitions' maxima before upto
            last = entries[max(prev)]
            self.watermarks().restore(last["wm_after"], last.get("watermark"))
        replay = list(range(first, upto))
        if replay:  # the reader is needed here: no read-ahead may hold it
            self.read_ahead.take(self.reader(), None)
        t0 = time.perf_counter()
        for b in replay:
            self.apply(b, parse_batch(self.fetch(entries[b]["ranges"]), self.cfg), entries[b])
            self.stats["replayed_batches"] += 1
        self.stats["s_rebuild"] = self.stats.get("s_rebuild", 0.0) + time.perf_counter() - t0
        self._stale = False
        log.info("rebuilt the join from %d logged batches (%d..%d) in %.2f s; %d older ones "
                 "are out of the window", len(replay), first, upto - 1,
                 time.perf_counter() - t0, first - min(entries, default=first))

    def _compact_log(self, batch: int) -> None:
        """Drop the log entries that a rebuild for ``batch`` no longer needs, rewriting
        the log once they are at least as many as the ones kept."""
        first = first_needed(self.entries, batch, self.window, self.cfg.batch_size)
        gone = [b for b in self.entries if b < first]
        if len(gone) < max(16, len(self.entries) - len(gone)):
            return
        for b in gone:
            del self.entries[b]
        self.log.rewrite(self.entries)
        self.stats["log_compactions"] = self.stats.get("log_compactions", 0) + 1
        log.info("join log compacted: %d batches out of the window dropped, %d kept",
                 len(gone), len(self.entries))

    # -- foreachBatch

    def reader(self) -> Fetcher:
        if self._fetcher is None:
            self._fetcher = Fetcher(self.cfg.bootstrap, options=self.cfg.kafka_options)
        return self._fetcher

    def fetch(self, ranges: dict) -> Records:
        """A micro-batch's records, read from Kafka by the offsets Spark planned."""
        return fetch_ranges(self.reader(), ranges, self.cfg)

    def process(self, df, batch_id: int) -> None:
        """foreachBatch. With the ``ranges`` source (the default) ``df`` is one row per
        partition range that Spark planned for this batch, and the records are read
        here in bulk (the next batch's are read ahead meanwhile: :class:`ReadAhead`);
        otherwise ``df`` holds the records themselves."""
        t0 = started = time.perf_counter()
        parsed = None
        if "value" in df.columns:
            table = df.select("topic", "partition", "offset", "value").toArrow()
        else:
            ranges = offset_log_ranges(os.path.join(self.cfg.checkpoint, "spark"), batch_id)
            if ranges is None:  # the first batch: Spark's plan is only in the frame
                ranges = {}
                for t, p, lo, hi in df.select("topic", "partition", "start", "end").collect():
                    ranges.setdefault(t, {})[str(p)] = [lo, hi]
            else:
                self.stats["ranges_from_log"] = self.stats.get("ranges_from_log", 0) + 1
            t0 = self._time("ranges", t0)
            if self.entries is None:  # a restart replays logged batches first
                self.entries = self.log.read()
                self._stale = True  # rebuilt by apply_reconnecting, before this batch
            done = self._joined_ahead(batch_id, ranges)
            if done is not None:
                self._time("read", t0)
                self.process_table(done[0], batch_id, done[1], done[2], started=started)
                return
            if self._stale:  # before the read-ahead starts: a rebuild takes the reader
                self.apply_reconnecting(batch_id, None)
            ahead = self.read_ahead.take(self.reader(), ranges)
            table, parsed = ahead if ahead is not None else (self.fetch(ranges), None)
            self.read_ahead.start(self.reader(), ranges)
        self._time("read", t0)
        self.process_table(table, batch_id, parsed, started=started)

    # -- joining ahead

    def join_first_ahead(self, begin: dict) -> None:
        """A fresh job (nothing logged) whose query starts at ``begin`` (``{topic:
        {partition: offset}}``): read and join batch 0 as the source will plan it, in
        the background, while Spark starts its query (about 1.5 s); when Spark hands
        batch 0 with other ranges it is joined again from scratch (:meth:`_joined_ahead`)."""
        if self.log.read():
            raise RuntimeError(f"{self.log.path} holds batches: this job is not fresh")
        self.entries = {}
        self.read_ahead.prime(self.reader(), begin)
        self._join_ahead(0)

    def _join_ahead(self, batch: int) -> None:
        """Join the batch that the read-ahead guessed next, in the background."""
        nxt = self.read_ahead.guessed()
        if nxt is None or batch in self.entries:
            return
        if self._ahead_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._ahead_pool = ThreadPoolExecutor(1, thread_name_prefix="panjoin-join-ahead")

        def job():
            got = self.read_ahead.take(self.reader(), nxt)  # None if the read failed
            rec, parsed = got if got is not None else (self.fetch(nxt), None)
            parsed = parsed if parsed is not None else parse_batch(rec, self.cfg)
            self.read_ahead.start(self.reader(), nxt)
            t0 = time.perf_counter()
            out = self.apply(batch, parsed)
            self._time("join", t0)
            return nxt, rec, parsed, out

        self._ahead = (batch, self._ahead_pool.submit(job))

    def _joined_ahead(self, batch: int, ranges: dict):
        """``(Records, Parsed, BatchOutput)`` of ``batch`` if it was joined ahead with
        these ranges. A batch joined ahead with other ranges is undone: the join is
        rebuilt from the log, and the batch is then joined as usual (None)."""
        if self._ahead is None:
            return None
        (b, fut), self._ahead = self._ahead, None
        try:
            nxt, rec, parsed, out = fut.result()
        except Exception as e:  # e.g. the manager went away: join it again, as usual
            log.warning("batch %d failed while joined ahead (%s); rebuilding the join from "
                        "the log", b, e)
            nxt = None
        if b == batch and nxt == ranges:
            self.stats["joined_ahead"] += 1
            return rec, parsed, out
        log.warning("batch %d was joined ahead as %s but Spark planned %s; rebuilding the "
                    "join from the log", b, nxt, ranges)
        self.stats["joined_ahead_wrong"] += 1
        self.read_ahead.take(self.reader(), None)  # gives back what it read past the guess
        self._reset_join()
        self._stale = True  # apply_reconnecting rebuilds, waiting for the manager if need be
        return None

    def _open_join(self) -> JoinSession:
        """A new join on the manager, and the Join stream the batches go on."""
        client = Client(self.cfg.manager, self.cfg.security)
        try:
            join_id = client.open(self.cfg.window, self.cfg.predicate, self.cfg.index,
                                  **self.cfg.open_settings())
        except BaseException:
            client.close()
            raise
        return client.session(join_id)

    def _close_join(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session.client.close()
            self.session = None

    def _reset_join(self) -> None:
        self._close_join()
        self.ids = IdWindow(self.window, self.cfg.batch_size)
        self.records = RecordWindow(self.window, self.cfg.batch_size)
        self.wm = None  # a rebuild restores it from the log

    def apply_reconnecting(self, batch: int, p: Parsed | None, logged: dict | None = None):
        """:meth:`apply`, surviving a manager that goes away (killed, restarted, its
        host rebooted): the join is opened again once the manager answers (for up to
        ``manager_timeout`` seconds), rebuilt from the join log, and the batch joined
        again. Nothing of the batch was logged or written, so nothing is lost or
        doubled; past the timeout the batch fails, and a restart rebuilds the same way."""
        import grpc

        deadline = time.monotonic() + self.cfg.manager_timeout
        while True:
            try:
                if self._stale:  # a restart, a wrong guess, or the manager's loss
                    self._reset_join()
                    self.rebuild(batch, self.entries or {})
                return self.apply(batch, p, logged) if p is not None else None
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else None
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                                grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNKNOWN,
                                grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the manager at {self.cfg.manager} has not answered for "
                        f"{self.cfg.manager_timeout:.0f} s ({code}); start it and run the "
                        "job again: it rebuilds its window from the join log") from e
                log.warning("batch %d: lost the manager at %s (%s); reconnecting and "
                            "rebuilding the join from the log", batch, self.cfg.manager,
                            code.name if code else e)
                self.stats["manager_reconnects"] = self.stats.get("manager_reconnects", 0) + 1
                self._stale = True
                time.sleep(0.5)

    def _time(self, what: str, t0: float) -> float:
        now = time.perf_counter()
        key = f"s_{what}"
        self.stats[key] = self.stats.get(key, 0.0) + now - t0
        return now

    def process_table(self, table: pa.Table | Records, batch: int,
                      parsed: Parsed | None = None, out: BatchOutput | None = None,
                      started: float | None = None) -> None:
        """One micro-batch: log it, join it (unless ``out`` is its output, joined
        ahead), join the next one ahead, and write this one's output. ``started``
        (``perf_counter``): when foreachBatch began, for the batch-time histogram."""
        if self.entries is None:  # the first batch of this run: rebuild what came before
            self.entries = self.log.read()
            self._stale = True  # apply_reconnecting rebuilds, waiting for the manager
        t0 = time.perf_counter()
        started = t0 if started is None else started
        p = parsed if parsed is not None else parse_batch(table, self.cfg)
        t0 = self._time("parse", t0)
        for t, ps in p.ranges.items():
            for q, (_, e) in ps.items():
                self.read_to.setdefault(t, {})[q] = max(e, self.read_to.get(t, {}).get(q, 0))
        skip = None
        logged = self.entries.get(batch)
        if logged is not None:  # Spark replays a batch this job began before it stopped
            if logged["ranges"] != p.ranges:
                raise RuntimeError(f"batch {batch}: Spark replays offsets {p.ranges} but the "
                                   f"join log has {logged['ranges']}; checkpoint and join "
                                   f"log disagree (were they mixed up?)")
            skip = self.written(batch, logged["out_start"])
            out = self.apply_reconnecting(batch, p, logged)
            t0 = self._time("join", t0)
        else:
            if out is None:
                out = self.apply_reconnecting(batch, p)
                t0 = self._time("join", t0)
            # logged before anything is written: where the output topics ended, and the
            # decisions a replay must repeat
            entry = {"batch": batch, "ranges": p.ranges, "out_start": self.out_start(),
                     **out.log_fields()}
            self.log.append(entry)
            self.entries[batch] = entry
            self._compact_log(batch)
            t0 = self._time("log", t0)
        self._join_ahead(batch + 1)
        self.write(batch, out, skip)
        for t, ps in p.ranges.items():
            for q, (_, e) in ps.items():
                self.done_to.setdefault(t, {})[q] = max(e, self.done_to.get(t, {}).get(q, 0))
        self._ends = self.read_ahead.pool.submit(self.out_ends)
        t0 = self._time("write", t0)
        if len(out.pair_ts):  # written now: the pairs' results exist from here on
            self.latency_s.observe_many(time.time() - out.pair_ts / 1000.0)
        self.batch_s.observe(t0 - started)
        st = self.stats
        st["batches"] += 1
        n_r, n_s = records_per_stream(table, self.cfg.s_topic)
        n_in = n_r + n_s
        st["tuples"] += n_in
        st["tuples_r"] += n_r
        st["tuples_s"] += n_s
        st["joined"] += len(out.joined)
        st["late"] += len(out.late)
        st["dead"] += len(out.dead)
        log.info("batch %d: %d records, %d joined, %d late, %d dead-letter", batch,
                 n_in, len(out.joined), len(out.late), len(out.dead))

    # -- what the metrics read (panjoin.ops.metrics.PipelineCollector)

    @property
    def offsets_read(self) -> dict:
        """``{(topic, partition): next offset}`` of the records taken into the join."""
        return {(t, q): e for t, ps in list(self.read_to.items()) for q, e in list(ps.items())}

    @property
    def offsets_committed(self) -> dict:
        """``{(topic, partition): next offset}`` whose output is written (Spark commits
        the batch once this returns)."""
        return {(t, q): e for t, ps in list(self.done_to.items()) for q, e in list(ps.items())}

    def metrics_watermark(self) -> int | None:
        """The watermark W (ms) as last decided, None before any (-inf)."""
        return self.wm.w if self.wm is not None else None

    def close(self) -> None:
        if self._ahead is not None:  # joined ahead, never handed by Spark: not logged
            try:
                self._ahead[1].result()
            except Exception:
                pass
            self._ahead = None
        if self._ahead_pool is not None:
            self._ahead_pool.shutdown(wait=True)
            self._ahead_pool = None
        self.read_ahead.close()  # before the reader it uses closes
        self._ends = None
        self._close_join()
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        for c in (self._fetcher, self._probe):
            if c is not None:
                c.close()
        self._fetcher = self._probe = None


# --------------------------------------------------------------------------- Spark


def source_frame(spark, cfg: PipelineConfig, ending: dict | None):
    """The streaming DataFrame of both topics: topic, partition, offset, timestamp
    (ms), key, value; with ``source="python"`` (the default) only the offset ranges
    of each micro-batch (topic, partition, start, end): the job reads the records."""
    topics = f"{cfg.r_topic},{cfg.s_topic}"
    if cfg.source == "native":
        r = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", cfg.bootstrap)
             .option("subscribe", topics).option("startingOffsets", cfg.starting_offsets))
        if cfg.max_offsets_per_trigger:
            r = r.option("maxOffsetsPerTrigger", cfg.max_offsets_per_trigger)
        for k, v in cfg.kafka_options.items():  # Spark's Kafka client takes kafka.*
            r = r.option("kafka." + k, v)
        try:
            df = r.load()
        except Exception as e:  # AnalysisException: no data source named kafka
            raise NativeSourceError(
                "--source native needs Spark's Kafka connector (spark-sql-kafka-0-10 and its "
                "dependencies) on the classpath: give them with --spark-jars; without it use "
                f"--source python (the default). Spark said: {str(e).strip().splitlines()[0]}"
            ) from None
        return df.selectExpr("topic", "partition", "offset",
                             "CAST(unix_millis(timestamp) AS LONG) AS timestamp", "key",
                             "value")
    r = (spark.readStream.format("panjoin_kafka").option("kafka.bootstrap.servers", cfg.bootstrap)
         .option("subscribe", topics).option("startingOffsets", cfg.starting_offsets)
         .option("ranges", str(cfg.source == "python").lower()))
    if cfg.max_offsets_per_trigger:
        r = r.option("maxOffsetsPerTrigger", cfg.max_offsets_per_trigger)
    if ending is not None:
        r = r.option("endingOffsets", json.dumps(ending))
    for k, v in cfg.kafka_options.items():  # the source's clients take kafka.*
        r = r.option("kafka." + k, v)
    return r.load()


def run(cfg: PipelineConfig, spark=None, on_batch=None) -> dict:
    """Run the job until the input available at start is processed (``available-now``)
    or until interrupted (a processing-time trigger: SIGINT stops the query and the
    counters are returned). Returns counters."""
    from spark_conn.session import spark_session

    # Spark and, for the native source, its Kafka connector first: a job that cannot
    # read must not leave topics behind
    check_jar_paths(cfg.spark_jars)
    conf = {"spark.jars": ",".join(os.path.abspath(p) for p in cfg.spark_jars)} \
        if cfg.spark_jars else None
    spark = spark or spark_session("panjoin-pipeline", conf=conf,
                                   planning_only=cfg.source == "python")
    if cfg.source == "native":
        check_connector(spark)
    io.create_topics(cfg.bootstrap, [cfg.r_topic, cfg.s_topic] + [
        cfg.out_topic, cfg.late_topic, cfg.dead_letter_topic], options=cfg.kafka_options)
    available_now = cfg.trigger in ("available-now", "availableNow", "once")
    ending = None
    if available_now:
        offs = {t: {str(p): v for p, v in
                    io.end_offsets(cfg.bootstrap, t, options=cfg.kafka_options).items()}
                for t in (cfg.r_topic, cfg.s_topic)}
        ending = {t: {p: v[1] for p, v in ps.items()} for t, ps in offs.items()}
    pipe = Pipeline(cfg, ending if cfg.source == "python" else None)
    httpd = None
    if cfg.metrics_port is not None:
        from panjoin.ops.metrics import PipelineCollector, serve_metrics

        httpd, port = serve_metrics(PipelineCollector(pipe), cfg.metrics_port)
        pipe.metrics_port = port
        print(f"pipeline: metrics on http://127.0.0.1:{port}/metrics", flush=True)
    if (ending is not None and cfg.source == "python" and cfg.starting_offsets == "earliest"
            and not pipe.log.read()):  # a fresh query starts at the earliest offsets
        pipe.join_first_ahead({t: {p: v[0] for p, v in ps.items()} for t, ps in offs.items()})

    reached = threading.Event()  # the batch that reaches the ending offsets is done

    def each(df, batch_id):
        if "s_start" not in pipe.stats:  # Spark's query start and first plan
            pipe.stats["s_start"] = time.perf_counter() - t0
        pipe.process(df, batch_id)
        if on_batch is not None:
            on_batch(batch_id, pipe)
        if ending is not None and _covers(pipe.done_to, ending):
            reached.set()

    t0 = time.perf_counter()
    w = (source_frame(spark, cfg, ending).writeStream.foreachBatch(each)
         .option("checkpointLocation", os.path.join(cfg.checkpoint, "spark")))
    if available_now and cfg.source == "native":
        w = w.trigger(availableNow=True)
    elif available_now:
        w = w.trigger(processingTime="0 seconds")
    else:
        w = w.trigger(processingTime=cfg.trigger)
    q = w.start()
    try:
        if available_now and cfg.source != "native":
            _await_end(q, ending, reached)
        elif available_now:
            q.awaitTermination()
        else:  # runs until stopped: Ctrl-C (SIGINT) is the end of a run, counters and all
            try:
                q.awaitTermination()
            except KeyboardInterrupt:
                log.info("interrupted: stopping the query")
        t1 = time.perf_counter()
    finally:
        if q.isActive:
            q.stop()
        pipe.close()
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
    if q.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {q.exception()}")
    pipe.stats["seconds"] = time.perf_counter() - t0
    pipe.stats["s_stop"] = time.perf_counter() - t1  # the query's stop, the join's close
    pipe.stats["spark_ms"] = trigger_ms(q)
    pipe.stats["spark_triggers"] = len(q.recentProgress)  # what spark_ms sums over
    pipe.stats["read_ahead_hits"] = pipe.read_ahead.hits
    pipe.stats["read_ahead_misses"] = pipe.read_ahead.misses
    return pipe.stats


def trigger_ms(q) -> dict:
    """Spark's own time per trigger phase (``durationMs`` of each progress), summed over
    the query's recent progress reports: where the per-trigger overhead goes."""
    tot: dict = {}
    for prog in q.recentProgress:
        for k, v in (prog.get("durationMs") or {}).items():
            tot[k] = tot.get(k, 0) + int(v)
    return tot


def _await_end(q, ending: dict, reached: threading.Event | None = None,
               poll: float = 0.2) -> None:
    """Until Spark's progress says the source reached ``ending`` (nothing in flight).
    Once ``reached`` is set (the last batch's foreachBatch returned), Spark only has
    to commit it: the progress is then polled often, so the end is seen at once."""
    want = {t: {p: int(o) for p, o in ps.items()} for t, ps in ending.items()}
    while q.isActive:
        if reached is not None and reached.is_set():
            poll = 0.01
        if q.exception() is not None:
            return
        prog = q.lastProgress
        if prog and prog.get("sources"):
            end = prog["sources"][0].get("endOffset")
            if isinstance(end, str):
                end = json.loads(end)
            if end is not None and _covers(end, want) and not q.status["isTriggerActive"]:
                return
        st = q.status
        if (st["message"] == "Waiting for data to arrive" and not st["isDataAvailable"]
                and not st["isTriggerActive"]):
            return  # e.g. a restart whose checkpoint already covers everything
        if reached is not None and not reached.is_set():
            reached.wait(poll)  # wakes when the last batch is done
        else:
            time.sleep(poll)


def _covers(end: dict, want: dict) -> bool:
    return all(int(end.get(t, {}).get(p, -1)) >= o for t, ps in want.items()
               for p, o in ps.items())
