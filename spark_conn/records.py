"""A micro-batch's Kafka records -> the tuples the manager joins, and the rejects.

The records of a micro-batch's offset ranges are read in bulk (:func:`fetch_ranges`,
whole Kafka record batches decoded by :mod:`panjoin.kafka.fetcher`) and parsed by
schema (:func:`parse_batch`: ``id``, ``key`` and ``ts`` found by a Numba pass over
the JSON values, :mod:`panjoin.kafka.json_fields`). A record that is not a JSON
object with whole-number fields goes to the dead-letter topic with the reason; the
good ones become a :class:`Parsed` batch in event-time order, each tuple keeping the
row of its record (the job joins the records back onto the pairs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from panjoin.kafka import fetcher, json_fields
from panjoin.kafka.fetcher import Fetcher
from panjoin.semantics import I64_MAX, I64_MIN
from spark_conn.config import PipelineConfig


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
    if not I64_MIN <= v <= I64_MAX:
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
    if not I64_MIN <= k <= I64_MAX:
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


#: bytes of a rejected record that its dead letter keeps. A broker takes about 1 MiB
#: per record (message.max.bytes) and base64 grows a binary record by a third: a
#: 900 KB record in full would be refused, and the job would fail on it at every
#: restart. The first 64 KiB say what the record was.
DEAD_LETTER_KEEP = 64 * 1024


def raw_record(v: bytes | None, keep: int | None = None) -> dict:
    """A rejected record as it came: text, or base64 when it is not UTF-8. One longer
    than ``keep`` bytes (default :data:`DEAD_LETTER_KEEP`) keeps its first ``keep``,
    marked::

        {"record_base64": "...", "truncated": true, "original_bytes": 900000}
    """
    if v is None:
        return {"record": None}
    keep = DEAD_LETTER_KEEP if keep is None else keep
    cut: dict = {}
    ends = (0,)
    if len(v) > keep:
        cut = {"truncated": True, "original_bytes": len(v)}
        v = v[:keep]
        ends = (0, 1, 2, 3)  # text cut inside a character: without its first bytes
    for back in ends:
        try:
            return {"record": v[:len(v) - back].decode("utf-8"), **cut}
        except UnicodeDecodeError:
            pass
    import base64

    return {"record_base64": base64.b64encode(v).decode(), **cut}
