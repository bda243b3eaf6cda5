"""The Spark job: Kafka R and S -> the PanJoin manager -> Kafka, exactly once.

    python -m spark_conn.pipeline --bootstrap-servers 127.0.0.1:9092 \\
        --manager 127.0.0.1:50050 --window time:1000,1000 --predicate band:10 \\
        --checkpoint /tmp/ckpt            (same flags as `panjoin pipeline`)

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
source's own planner (:class:`ReadAhead`). The records skip Spark's Python worker, its JVM
rows and ``toArrow`` (that trip cost more than the join itself; see
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
(:meth:`Pipeline.first_needed`: re-read from Kafka, same order, same watermarks,
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
"available now" run, :class:`ReadAhead`), the job joins it right after this one,
in a background thread, while this batch's output is written and Spark commits
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
import queue
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from panjoin.kafka import fetcher, io, json_fields
from panjoin.kafka.fetcher import Fetcher
from panjoin.kafka.io import BATCH_HEADER, SEQ_HEADER
from panjoin.kafka.writer import BatchWriter
from panjoin.semantics import parse_predicate, parse_window
from panjoin.wire import from_array, to_array
from spark_conn.record_window import IdWindow, RecordWindow
from spark_conn.watermark import PartitionWatermarks

log = logging.getLogger("panjoin.pipeline")

_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass
class PipelineConfig:
    bootstrap: str
    manager: str
    checkpoint: str
    window: str
    predicate: str
    r_topic: str = "R"
    s_topic: str = "S"
    out_topic: str = "joined"
    late_topic: str = "late"
    dead_letter_topic: str = "dead-letter"
    key_field: str = "key"
    ts_field: str = "ts"
    id_field: str = "id"
    key_type: str = "int64"
    index: str = "bisort"
    allowed_lateness: int = 0
    subwindow_size: int | None = None
    partitions: int | None = None
    batch_size: int = 32768
    max_offsets_per_trigger: int | None = None
    starting_offsets: str = "earliest"
    trigger: str = "available-now"
    source: str = "python"
    idle_timeout: float | None = None  # s without records before a partition stops holding W
    manager_timeout: float = 60.0  # s to wait for a lost manager to come back
    extra_open: dict = field(default_factory=dict)
    #: librdkafka client properties for every Kafka client the job opens (TLS, SASL;
    #: see panjoin.kafka.options), and for Spark's source as kafka.* options
    kafka_options: dict = field(default_factory=dict)

    def open_settings(self) -> dict:
        s = {"allowed_lateness": self.allowed_lateness, "batch_size": self.batch_size,
             "key_dtype": self.key_type}
        if self.subwindow_size:
            s["subwindow_size"] = self.subwindow_size
        if self.partitions:
            s["partitions"] = self.partitions
        s.update(self.extra_open)
        return s


# --------------------------------------------------------------------------- parsing


@dataclass
class Parsed:
    """A micro-batch's good tuples in the order they go to the manager, and its rejects."""

    stream: np.ndarray  # uint8
    id: np.ndarray
    key: np.ndarray
    ts: np.ndarray
    records: pa.Array  # the micro-batch's records as they came (binary, raw JSON)
    row: np.ndarray  # tuple i's record is records[row[i]]
    bad: list  # (topic, partition, offset, reason, raw value) in offset order
    ranges: dict  # {topic: {partition: [first offset, last offset + 1]}}
    partition: np.ndarray | None = None  # int64: each tuple's Kafka partition

    def take(self, keep: np.ndarray) -> Parsed:
        """The tuples where ``keep`` is true (records, rejects and ranges unchanged)."""
        return Parsed(self.stream[keep], self.id[keep], self.key[keep], self.ts[keep],
                      self.records, self.row[keep], self.bad, self.ranges,
                      None if self.partition is None else self.partition[keep])


def _int_field(obj, name):
    v = obj.get(name)
    if isinstance(v, bool) or v is None:
        return None, f"field {name!r} is {'missing' if v is None else 'a boolean'}"
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int):
        return None, f"field {name!r} is {v!r}, not an integer"
    if not _I64_MIN <= v <= _I64_MAX:
        return None, f"field {name!r} = {v} is outside int64"
    return v, None


def _parse_record(v: bytes | None, cfg: PipelineConfig):
    """One record by Python's json (the rules of DESIGN section 6): ``(reason, id, key,
    ts)`` with ``reason`` None when it is good."""
    try:
        obj = json.loads(v) if v is not None else None
    except (ValueError, UnicodeDecodeError) as e:
        return f"not JSON ({e})", None, None, None
    except RecursionError:
        return "not JSON (nested too deeply)", None, None, None
    if not isinstance(obj, dict):
        return ("not a JSON object" if v is not None else "empty record (null value)",
                None, None, None)
    rid, reason = _int_field(obj, cfg.id_field)
    if reason is not None:
        return reason, None, None, None
    ts, reason = _int_field(obj, cfg.ts_field)
    if reason is not None:
        return reason, None, None, None
    k = obj.get(cfg.key_field)
    if isinstance(k, bool) or not isinstance(k, (int, float)):
        return f"field {cfg.key_field!r} is {k!r}, not a number", None, None, None
    if cfg.key_type == "float64":
        k = float(k)
        if not np.isfinite(k):
            return f"field {cfg.key_field!r} = {k} is not finite", None, None, None
        return None, rid, k, ts
    if isinstance(k, float):
        if not k.is_integer():
            return (f"field {cfg.key_field!r} = {k} is not an integer (run with "
                    f"--key-type float64 for float keys)", None, None, None)
        k = int(k)
    if not _I64_MIN <= k <= _I64_MAX:
        return f"field {cfg.key_field!r} = {k} is outside int64", None, None, None
    return None, rid, k, ts


@dataclass
class Records:
    """A micro-batch's records as they came: one entry per record (columns)."""

    stream: np.ndarray  # uint8: 0 = the R topic, 1 = the S topic
    partition: np.ndarray  # int64
    offset: np.ndarray  # int64
    value: pa.Array  # large_binary; null for a record without a value
    ranges: dict  # {topic: {partition: [start, end]}}

    @classmethod
    def from_table(cls, table: pa.Table, cfg: PipelineConfig) -> Records:
        """From the source's rows (topic, partition, offset, value); ranges are the
        offsets seen, ``[min, max + 1]`` per partition."""
        import pyarrow.compute as pc

        ranges: dict = {}
        g = table.group_by(["topic", "partition"]).aggregate([("offset", "min"),
                                                             ("offset", "max")])
        for t, p, lo, hi in zip(*(g.column(c).to_pylist() for c in (
                "topic", "partition", "offset_min", "offset_max")), strict=True):
            ranges.setdefault(t, {})[str(p)] = [lo, hi + 1]
        stream = pc.equal(table.column("topic"), cfg.s_topic).to_numpy(
            zero_copy_only=False).astype(np.uint8)
        return cls(stream, table.column("partition").to_numpy().astype(np.int64),
                   table.column("offset").to_numpy().astype(np.int64),
                   table.column("value").combine_chunks().cast(pa.large_binary()), ranges)


def fetch_ranges(reader: Fetcher, ranges: dict, cfg: PipelineConfig) -> Records:
    """The records of ``{topic: {partition: [start, end]}}`` read in bulk: the
    Spark-planned offsets of a micro-batch (or a logged one on replay)."""
    want = [(t, int(p), lo, hi) for t in sorted(ranges)
            for p, (lo, hi) in sorted(ranges[t].items(), key=lambda x: int(x[0]))]
    return records_of(reader.read(want), want, ranges, cfg)


def records_of(got: dict, want: list, ranges: dict, cfg: PipelineConfig) -> Records:
    """:class:`Records` from :meth:`Fetcher.read`'s answer, ranges in ``want`` order."""
    tables = [got[(t, p)] for t, p, _, _ in want]
    sizes = [x.num_rows for x in tables]
    part = np.repeat([p for _, p, _, _ in want], sizes).astype(np.int64)
    stream = np.repeat([int(t == cfg.s_topic) for t, _, _, _ in want], sizes).astype(np.uint8)
    if not tables:
        tables = [fetcher.SCHEMA.empty_table()]
    both = pa.concat_tables(tables)
    return Records(stream, part, both.column("offset").to_numpy(),
                   both.column("value").combine_chunks(), ranges)


def parse_batch(table: pa.Table | Records, cfg: PipelineConfig) -> Parsed:
    """Records (a table of the source's rows, or :class:`Records`) to tuples by the
    configured fields; anything that is not a JSON object with an integer id and ts
    and a finite key of the configured type is a reject with the reason. Good tuples
    are sorted by event time (ties: stream, partition, offset).

    The fields are read by a Numba pass over the records' bytes
    (:func:`panjoin.kafka.json_fields.read_fields`); the records it does not vouch
    for (malformed ones, ``1.0`` for an integer, ...) are parsed by Python's json,
    whose rules decide."""
    rec = table if isinstance(table, Records) else Records.from_table(table, cfg)
    vals = rec.value
    float_keys = cfg.key_type == "float64"
    ints, floats, ok = json_fields.read_fields(
        *fetcher.value_buffers(vals),
        [f.encode() for f in (cfg.id_field, cfg.key_field, cfg.ts_field)],
        [json_fields.INT, json_fields.FLOAT if float_keys else json_fields.INT, json_fields.INT])
    ids, ts_a = ints[:, 0].copy(), ints[:, 2].copy()
    keys = floats[:, 1].copy() if float_keys else ints[:, 1].copy()
    bad = []
    marked = np.flatnonzero(~ok)
    if len(marked):  # nulls and empty values are among them: they are no JSON object
        topics = (cfg.r_topic, cfg.s_topic)
        for i, v in zip(marked.tolist(), vals.take(marked).to_pylist(), strict=True):
            reason, rid, k, t = _parse_record(v, cfg)
            if reason is None:
                ids[i], keys[i], ts_a[i], ok[i] = rid, k, t, True
            else:
                bad.append((topics[rec.stream[i]], int(rec.partition[i]), int(rec.offset[i]),
                            reason, v))
        bad.sort(key=lambda b: (b[0], b[1], b[2]))
    pos = np.flatnonzero(ok) if len(marked) else np.arange(len(ok))
    # event-time order; ties by stream, then the records' own (partition, offset)
    perm = pos[np.lexsort((rec.offset[pos], rec.partition[pos], rec.stream[pos], ts_a[pos]))]
    return Parsed(rec.stream[perm], ids[perm], keys[perm], ts_a[perm], vals, perm, bad,
                  rec.ranges, rec.partition[perm])


def _raw(v: bytes | None) -> dict:
    """A rejected record as it came: text, or base64 when it is not UTF-8."""
    if v is None:
        return {"record": None}
    try:
        return {"record": v.decode("utf-8")}
    except UnicodeDecodeError:
        import base64

        return {"record_base64": base64.b64encode(v).decode()}


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


# --------------------------------------------------------------------------- the manager


class JoinSession:
    """One open join on the manager and one long-lived Join stream: each micro-batch
    goes out as one JoinInput (with each tuple's record as its payload) and comes back
    as one JoinOutput (the pairs with both records)."""

    def __init__(self, cfg: PipelineConfig):
        from panjoin.client import Client

        self.client = Client(cfg.manager)
        self.join_id = self.client.open(cfg.window, cfg.predicate, cfg.index,
                                        **cfg.open_settings())
        self.time_window = parse_window(cfg.window).kind == "time"
        self._q: queue.Queue = queue.Queue()
        self._out = self.client.stub.Join(iter(self._q.get, None))

    def send(self, batch_id: int, p: Parsed, watermark: int | None = None):
        """One micro-batch; on a time window with the job's watermark (None: none yet)."""
        from panjoin.proto.panjoin.v1 import manager_pb2

        msg = manager_pb2.JoinInput(
            join_id=self.join_id, batch_id=batch_id, stream=to_array(p.stream),
            id=to_array(p.id), key=to_array(p.key), ts=to_array(p.ts), flush=True)
        if self.time_window:  # from the first batch on: the manager's own rule stays off
            msg.watermark = _I64_MIN if watermark is None else watermark
        self._q.put(msg)
        out = next(self._out)
        if out.batch_id != batch_id:
            raise RuntimeError(f"manager answered batch {out.batch_id} to batch {batch_id}")
        if out.duplicate:
            raise RuntimeError(f"manager took batch {batch_id} as a replay on a fresh join")
        r, s = from_array(out.r_id, "<i8"), from_array(out.s_id, "<i8")
        return r, s, from_array(out.late_stream, "|u1"), from_array(out.late_id, "<i8")

    def close(self) -> None:
        from panjoin.proto.panjoin.v1 import manager_pb2

        self._q.put(None)
        try:
            self.client.stub.Close(manager_pb2.JoinRef(join_id=self.join_id), timeout=30)
        except Exception:  # the stream's end may have closed it already
            pass
        self.client.close()


# --------------------------------------------------------------------------- the job


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
        self.dir = os.path.join(cfg.checkpoint, "panjoin")
        os.makedirs(self.dir, exist_ok=True)
        self.log_path = os.path.join(self.dir, "join.log")
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
        self.stats = {"batches": 0, "tuples": 0, "joined": 0, "late": 0, "dead": 0,
                      "replayed_batches": 0, "skipped_records": 0, "joined_ahead": 0,
                      "joined_ahead_wrong": 0}

    # -- join log

    def read_log(self) -> dict[int, dict]:
        entries = {}
        if os.path.exists(self.log_path):
            with open(self.log_path) as f:
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

    def append_log(self, entry: dict) -> None:
        with open(self.log_path, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())

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
        dead = [{"topic": t, "partition": q, "offset": o, "reason": r, **_raw(v)}
                for t, q, o, r, v in p.bad]
        if len(dup):  # an id seen before in its stream: the join names tuples by id
            keep = np.ones(len(p.id), bool)
            keep[dup] = False
            for i in dup.tolist():
                dead.append({"topic": self.cfg.r_topic if p.stream[i] == 0 else self.cfg.s_topic,
                             "reason": f"id {int(p.id[i])} repeats an id of its stream that "
                                       f"is still in the window; ids must be unique",
                             "record": p.records[int(p.row[i])].as_py().decode("utf-8",
                                                                               "replace")})
            p = p.take(keep)
        out = BatchOutput([], [], [json.dumps(d).encode() for d in dead], len(p.id),
                          watermark=w, dups=dup.tolist(), wm_after=wm.snapshot())
        if len(p.id) == 0:
            return out
        if self.session is None:
            self.session = JoinSession(self.cfg)
        self.records.add(p)
        t0 = time.perf_counter()
        r, s, ls, li = self.session.send(batch + 1, p, w)
        self._time("manager", t0)  # a part of "join": the round trip to the cluster
        order = np.lexsort((s, r))
        if len(order):
            r, s = r[order], s[order]
            out.joined = self.records.joined(r, s)
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
            n = w.write(topic, vals, batch, done)
            self.stats["skipped_records"] += len(vals) - n

    # -- replay after a restart

    def first_needed(self, entries: dict, upto: int) -> int:
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
        w = self.window
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
        want = [w.size("RS"[x]) + self.cfg.batch_size for x in (0, 1)]
        have = [0, 0]
        for b in reversed(older):
            have = [h + n for h, n in zip(have, entries[b]["stored"], strict=True)]
            if all(h >= n for h, n in zip(have, want, strict=True)):
                return b
        return older[0]

    def rebuild(self, upto: int, entries: dict) -> None:
        """Replay the logged batches ``< upto`` that the window still needs
        (:meth:`first_needed`) into a fresh join, writing nothing."""
        self._stale = True  # until the replay is done: a failure leaves a window to redo
        first = self.first_needed(entries, upto)
        missing = [b for b in range(first, upto) if b not in entries]
        if missing:
            raise RuntimeError(f"join log {self.log_path} lacks batches {missing[:5]}: the "
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

    def compact_log(self, batch: int) -> None:
        """Drop the log entries that a rebuild for ``batch`` no longer needs, rewriting the
        log (atomically) once they are at least as many as the ones kept."""
        first = self.first_needed(self.entries, batch)
        gone = [b for b in self.entries if b < first]
        if len(gone) < max(16, len(self.entries) - len(gone)):
            return
        for b in gone:
            del self.entries[b]
        tmp = self.log_path + ".tmp"
        with open(tmp, "w") as f:
            for b in sorted(self.entries):
                f.write(json.dumps(self.entries[b]) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.log_path)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself survives a crash
        finally:
            os.close(fd)
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
        t0 = time.perf_counter()
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
                self.entries = self.read_log()
                self._stale = True  # rebuilt by apply_reconnecting, before this batch
            done = self._joined_ahead(batch_id, ranges)
            if done is not None:
                self._time("read", t0)
                self.process_table(done[0], batch_id, done[1], done[2])
                return
            if self._stale:  # before the read-ahead starts: a rebuild takes the reader
                self.apply_reconnecting(batch_id, None)
            ahead = self.read_ahead.take(self.reader(), ranges)
            table, parsed = ahead if ahead is not None else (self.fetch(ranges), None)
            self.read_ahead.start(self.reader(), ranges)
        self._time("read", t0)
        self.process_table(table, batch_id, parsed)

    # -- joining ahead

    def join_first_ahead(self, begin: dict) -> None:
        """A fresh job (nothing logged) whose query starts at ``begin`` (``{topic:
        {partition: offset}}``): read and join batch 0 as the source will plan it, in
        the background, while Spark starts its query (about 1.5 s); when Spark hands
        batch 0 with other ranges it is joined again from scratch (:meth:`_joined_ahead`)."""
        if self.read_log():
            raise RuntimeError(f"{self.log_path} holds batches: this job is not fresh")
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

    def _reset_join(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
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
                      parsed: Parsed | None = None, out: BatchOutput | None = None) -> None:
        """One micro-batch: log it, join it (unless ``out`` is its output, joined
        ahead), join the next one ahead, and write this one's output."""
        if self.entries is None:  # the first batch of this run: rebuild what came before
            self.entries = self.read_log()
            self._stale = True  # apply_reconnecting rebuilds, waiting for the manager
        t0 = time.perf_counter()
        p = parsed if parsed is not None else parse_batch(table, self.cfg)
        t0 = self._time("parse", t0)
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
            self.append_log(entry)
            self.entries[batch] = entry
            self.compact_log(batch)
            t0 = self._time("log", t0)
        self._join_ahead(batch + 1)
        self.write(batch, out, skip)
        for t, ps in p.ranges.items():
            for q, (_, e) in ps.items():
                self.done_to.setdefault(t, {})[q] = max(e, self.done_to.get(t, {}).get(q, 0))
        self._ends = self.read_ahead.pool.submit(self.out_ends)
        self._time("write", t0)
        st = self.stats
        st["batches"] += 1
        n_in = len(table.offset) if isinstance(table, Records) else table.num_rows
        st["tuples"] += n_in
        st["joined"] += len(out.joined)
        st["late"] += len(out.late)
        st["dead"] += len(out.dead)
        log.info("batch %d: %d records, %d joined, %d late, %d dead-letter", batch,
                 n_in, len(out.joined), len(out.late), len(out.dead))

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
        if self.session is not None:
            self.session.close()
            self.session = None
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
            raise RuntimeError(
                "--source native needs Spark's Kafka connector (spark-sql-kafka-0-10 and its "
                "dependencies) on the classpath, e.g. through spark.jars; without it use "
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
    or until interrupted (a processing-time trigger). Returns counters."""
    from spark_conn.session import spark_session

    io.create_topics(cfg.bootstrap, [cfg.r_topic, cfg.s_topic] + [
        cfg.out_topic, cfg.late_topic, cfg.dead_letter_topic], options=cfg.kafka_options)
    spark = spark or spark_session("panjoin-pipeline", planning_only=cfg.source == "python")
    available_now = cfg.trigger in ("available-now", "availableNow", "once")
    ending = None
    if available_now:
        offs = {t: {str(p): v for p, v in
                    io.end_offsets(cfg.bootstrap, t, options=cfg.kafka_options).items()}
                for t in (cfg.r_topic, cfg.s_topic)}
        ending = {t: {p: v[1] for p, v in ps.items()} for t, ps in offs.items()}
    pipe = Pipeline(cfg, ending if cfg.source == "python" else None)
    if (ending is not None and cfg.source == "python" and cfg.starting_offsets == "earliest"
            and not pipe.read_log()):  # a fresh query starts at the earliest offsets
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
        else:
            q.awaitTermination()
        t1 = time.perf_counter()
    finally:
        if q.isActive:
            q.stop()
        pipe.close()
    if q.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {q.exception()}")
    pipe.stats["seconds"] = time.perf_counter() - t0
    pipe.stats["s_stop"] = time.perf_counter() - t1  # the query's stop, the join's close
    pipe.stats["spark_ms"] = trigger_ms(q)
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


def config_from_args(args) -> PipelineConfig:
    """The job's config; the Kafka options are checked here, before Spark starts."""
    from panjoin.kafka.cli import kafka_options

    return PipelineConfig(
        bootstrap=args.bootstrap_servers, manager=args.manager, checkpoint=args.checkpoint,
        window=args.window, predicate=args.predicate, r_topic=args.r_topic,
        s_topic=args.s_topic, out_topic=args.out_topic, late_topic=args.late_topic,
        dead_letter_topic=args.dead_letter_topic, key_field=args.key_field,
        ts_field=args.ts_field, id_field=args.id_field, key_type=args.key_type,
        index=args.index, allowed_lateness=args.allowed_lateness,
        subwindow_size=args.subwindow_size, partitions=args.partitions,
        batch_size=args.batch_size, max_offsets_per_trigger=args.max_offsets_per_trigger,
        starting_offsets=args.starting_offsets, trigger=args.trigger, source=args.source,
        idle_timeout=args.idle_timeout, manager_timeout=args.manager_timeout,
        kafka_options=kafka_options(args))


def run_from_args(args) -> int:
    cfg = config_from_args(args)
    st = run(cfg)
    print(f"pipeline: {st['batches']} micro-batches, {st['tuples']:,} records in "
          f"{st['seconds']:.1f} s ({st['tuples'] / max(st['seconds'], 1e-9):,.0f} records/s); "
          f"{st['joined']:,} joined -> {cfg.out_topic}, {st['late']:,} late -> "
          f"{cfg.late_topic}, {st['dead']:,} malformed -> {cfg.dead_letter_topic}"
          + (f"; {st['replayed_batches']} batches replayed into the join, "
             f"{st['skipped_records']} records already written" if st["replayed_batches"]
             else ""), flush=True)
    return 0


def main(argv=None) -> int:
    import argparse

    from panjoin.cli import _add_common, _add_join_opts
    from panjoin.kafka.cli import add_pipeline_opts

    ap = argparse.ArgumentParser(prog="python -m spark_conn.pipeline",
                                 description="Kafka R,S -> PanJoin manager -> Kafka output")
    add_pipeline_opts(ap)
    _add_join_opts(ap)
    _add_common(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_from_args(args)


if __name__ == "__main__":
    sys.exit(main())
