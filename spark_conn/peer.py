"""Spark Structured Streaming's own stream-stream join: the peer PanJoin is compared with.

What a Spark user writes for a windowed join: both streams with a watermark on
event time, and an inner join on an equality key plus an event-time range
condition, which lets Spark drop state the watermark has passed::

    r.withWatermark("r_time", L).join(s.withWatermark("s_time", L),
        (r_key = s_key) AND (s_time > r_time - TS) AND (s_time < r_time + TR))

:func:`join_condition` builds that condition from a :class:`~panjoin.semantics.Window`
and :class:`~panjoin.semantics.Predicate` (the Kafka benchmark in
``benchmarks/pipeline.py`` uses it too); :func:`spark_stream_join` runs it on an
:class:`~panjoin.events.EventTable` through Spark's file source (Parquet chunks,
one per micro-batch and stream) and counts the pairs: the hook of ``panjoin bench
peers``.

Windows, as DESIGN section 2 defines them:

- time windows: event time = ``ts``; tuples that are late by the definition
  (more than L behind the largest ts before them, in arrival order) are removed
  first, as the reference does, and the watermark delay is L, so Spark drops none
  of the others (its watermark trails every non-late tuple);
- count windows: Spark has none. Each tuple gets its per-stream arrival number
  ``seq`` and the count ``opp`` of the other stream's tuples before it, and the
  exact count condition ``s.seq >= r.opp - WS AND r.seq >= s.opp - WR`` joins the
  key condition (as in :mod:`panjoin.baselines.duckdb_join`). Event time is the
  arrival position ``pos`` (ms), and the range condition ``s.pos - r.pos`` in
  ``(-BS, BR)`` is the widest that a pair of this file can span (computed from
  it; a count window spans more positions when the other stream is busier), so
  the range only lets Spark evict state and never removes a pair. Positions start at
  10^12 ms: Spark takes a row at time 0 for late before its first watermark.

Example: ``count:2,2``, arrivals R0 S0 S1 S2 R1: S2 is seq 2 with opp 1, R0 seq
0; ``r.seq >= s.opp - WR`` is 0 >= -1, so (R0, S2) qualifies if the keys are
equal, and R1 (seq 1, opp 3) pairs with S1 and S2 only (``s.seq >= 3 - 2``).

Band predicates: Spark refuses a stream-stream join without an equality
predicate (``AnalysisException: Stream-stream join without equality predicate is
not supported``), so :func:`spark_stream_join` raises :class:`SparkCannotJoin`
for them (and for ``ne``); a caller catches it and reports the peer as skipped.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from panjoin.semantics import Predicate, Window, parse_predicate, parse_window

_EPOCH_OFFSET = 1_000_000_000_000  # ms


class SparkCannotJoin(ValueError):
    """The join has no equality predicate: Spark Structured Streaming cannot run it."""


def check_predicate(pred: Predicate) -> None:
    if pred.kind != "eq":
        raise SparkCannotJoin(
            f"Spark Structured Streaming cannot run predicate {pred}: a stream-stream join "
            f"needs an equality predicate (Spark: 'Stream-stream join without equality "
            f"predicate is not supported'); only 'eq' runs on the Spark peer, report "
            f"band joins as not expressible in Spark")


def join_condition(window: Window, pred: Predicate, bounds: tuple[int, int] | None = None,
                   allow_band: bool = False):
    """The join condition over columns ``r_key, r_time, s_key, s_time`` (times are
    timestamps) and, for count windows, ``r_seq, r_opp, s_seq, s_opp``. The event-time
    range is ``(-TS, TR)`` for time windows and ``(-bounds[1], bounds[0])`` ms of
    arrival position for count windows. ``allow_band`` builds band conditions too
    (Spark refuses them; the Kafka benchmark shows that)."""
    from pyspark.sql import functions as F

    if not allow_band:
        check_predicate(pred)
    if window.kind == "time":
        up, down = window.r, window.s
    else:
        if bounds is None:
            raise ValueError("count windows need bounds (count_bounds())")
        up, down = bounds
    cond = ((F.col("s_time") > F.col("r_time") - F.expr(f"INTERVAL {int(down)} MILLISECONDS"))
            & (F.col("s_time") < F.col("r_time") + F.expr(f"INTERVAL {int(up)} MILLISECONDS")))
    if window.kind == "count":
        cond = cond & (F.col("s_seq") >= F.col("r_opp") - window.s) & (
            F.col("r_seq") >= F.col("s_opp") - window.r)
    if pred.kind == "eq":
        return (F.col("r_key") == F.col("s_key")) & cond
    if pred.kind in ("band", "bands"):
        d = F.col("s_key") - F.col("r_key")
        key = None
        for a, b in pred.bands:
            c = (d >= a) & (d <= b)
            key = c if key is None else key | c
        return key & cond
    raise SparkCannotJoin(f"predicate {pred} has no Spark condition here")


def count_columns(stream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per tuple: ``seq`` (arrival number in its stream) and ``opp`` (tuples of the
    other stream before it)."""
    is_s = stream.astype(bool)
    n_s = np.cumsum(is_s) - is_s  # S tuples before each tuple
    pos = np.arange(len(stream))
    n_r = pos - n_s
    seq = np.where(is_s, n_s, n_r)
    return seq, pos - seq


def count_bounds(stream: np.ndarray, window: Window) -> tuple[int, int]:
    """``(BR, BS)``: every pair of a count window has ``-BS < s.pos - r.pos < BR`` in
    this arrival order. For an S tuple the oldest R tuple it can pair with is R number
    ``opp - WR``; BR is one more than the largest distance to it (BS alike)."""
    seq, opp = count_columns(stream)
    pos = np.arange(len(stream))
    out = []
    for me, other, w in ((1, 0, window.r), (0, 1, window.s)):
        other_pos = pos[stream == other]
        mine = stream == me
        if not len(other_pos) or not mine.any():
            out.append(1)
            continue
        first = np.clip(opp[mine] - w, 0, len(other_pos) - 1)
        has = opp[mine] > 0
        span = (pos[mine] - other_pos[first])[has]
        out.append(int(span.max()) + 1 if len(span) else 1)
    return out[0], out[1]


def without_late(events, window: Window):
    """Time windows: the events minus the late tuples (more than L behind the largest
    ts before them), as the reference removes them."""
    if window.kind != "time" or not len(events):
        return events
    prev_max = np.maximum.accumulate(np.concatenate([[np.iinfo(np.int64).min],
                                                     events.ts[:-1]]))
    late = events.ts < prev_max - window.lateness
    late[0] = False
    return events.take(np.flatnonzero(~late)) if late.any() else events


def _side_table(events, code: int, window: Window) -> pa.Table:
    rows = np.flatnonzero(events.stream == code)
    name = "rs"[code]
    cols = {f"{name}_id": events.id[rows], f"{name}_key": events.key[rows]}
    if window.kind == "count":
        seq, opp = count_columns(events.stream)
        cols[f"{name}_seq"] = seq[rows]
        cols[f"{name}_opp"] = opp[rows]
        # arrival position as event time, from 2001 on: Spark's first watermark is 0 and
        # it drops a row at time 0 as late
        cols[f"{name}_ms"] = rows.astype(np.int64) + _EPOCH_OFFSET
    else:
        cols[f"{name}_ms"] = events.ts[rows]
    return pa.table(cols)


def spark_stream_join(events, window, predicate, spark=None, batch: int | None = None,
                      workdir: str | None = None, on_pairs=None) -> tuple[int, float]:
    """Spark's stream-stream join of ``events`` (an EventTable in arrival order) with
    ``window`` and ``predicate`` (specs or parsed): ``(result count, seconds)``, the
    seconds from the query's start to its end (Spark's start-up and the Parquet chunks'
    writing excluded). Micro-batches of ``batch`` arrivals (default: the larger of 64K
    and a quarter of the window), read by Spark's file source from one Parquet file
    per micro-batch and stream. ``on_pairs(r_ids, s_ids)``, if given, gets each
    micro-batch's pairs, fetched to the driver as Arrow (the query's sink; without it
    the sink only counts them). Raises :class:`SparkCannotJoin` for predicates other
    than ``eq``."""
    from pyspark.sql import functions as F

    from spark_conn.session import spark_session

    window = parse_window(window)
    pred = parse_predicate(predicate)
    check_predicate(pred)
    events = without_late(events, window)
    n = len(events)
    batch = batch or max(1 << 16, max(window.r, window.s) // 4)
    bounds = count_bounds(events.stream, window) if window.kind == "count" else None
    spark = spark or spark_session("panjoin-peer")
    work = tempfile.mkdtemp(prefix="panjoin-spark-peer-", dir=workdir)
    try:
        frames = []
        for code in (0, 1):
            name = "rs"[code]
            d = os.path.join(work, name)
            os.makedirs(d)
            table = _side_table(events, code, window)
            # chunk k holds this stream's tuples among arrivals [k * batch, (k+1) * batch):
            # micro-batch k reads chunk k of both streams (files in modification order)
            rows = np.flatnonzero(events.stream == code)
            cut = np.searchsorted(rows, np.arange(0, n + batch, batch))
            base = time.time() - 10 * len(cut)
            for k in range(len(cut) - 1):
                path = os.path.join(d, f"part-{k:06d}.parquet")
                pq.write_table(table.slice(int(cut[k]), int(cut[k + 1] - cut[k])), path)
                os.utime(path, (base + k, base + k))
            ddl = ", ".join(f"{f.name} {'double' if pa.types.is_floating(f.type) else 'long'}"
                            for f in table.schema)
            df = spark.readStream.schema(ddl).option("maxFilesPerTrigger", 1).parquet(d)
            delay = window.lateness if window.kind == "time" else 0
            df = df.withColumn(f"{name}_time", F.timestamp_millis(F.col(f"{name}_ms")))
            frames.append(df.withWatermark(f"{name}_time", f"{delay} milliseconds"))
        joined = frames[0].join(frames[1], join_condition(window, pred, bounds), "inner")
        counts = []

        def sink(df, _batch):
            if on_pairs is None:
                counts.append(df.count())
                return
            t = df.select("r_id", "s_id").toArrow()
            counts.append(t.num_rows)
            on_pairs(t["r_id"].to_numpy(), t["s_id"].to_numpy())

        t0 = time.perf_counter()
        q = (joined.writeStream.foreachBatch(sink)
             .option("checkpointLocation", os.path.join(work, "ckpt"))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        secs = time.perf_counter() - t0
        if q.exception() is not None:
            raise RuntimeError(f"Spark's stream-stream join failed: {q.exception()}")
        return int(sum(counts)), secs
    finally:
        shutil.rmtree(work, ignore_errors=True)
