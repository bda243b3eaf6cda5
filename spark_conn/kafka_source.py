"""Kafka source and sink for PySpark 4.x on the Python Data Source API and confluent-kafka.

Spark's JVM Kafka connector cannot be installed from the registries here, so this is
``format("panjoin_kafka")`` with the options and row schema of the native
``format("kafka")`` (a subset)::

    spark.readStream.format("panjoin_kafka")
        .option("kafka.bootstrap.servers", "127.0.0.1:9092")
        .option("subscribe", "R,S")
        .option("startingOffsets", "earliest")      # or latest, or {"R": {"0": 42}}
        .option("maxOffsetsPerTrigger", 10000)      # admission control
        .option("endingOffsets", '{"R": {"0": 900}}')  # optional cap (see below)
        .load()
    -> topic string, partition int, offset long, timestamp long, key binary, value binary

Offsets are ``{topic: {partition: next offset}}`` (partition as a string: the dict
travels as JSON). A micro-batch reads ``[start, end)`` of every partition, one
Spark task per partition (split every ``splitSize`` records). With
``maxOffsetsPerTrigger`` N, :meth:`latestOffset` admits at most N records over
all partitions, shared out in proportion to what each has waiting (floors, then
the records left over by largest remainder; a partition left out now gets a
larger share later, as the others drain). Worked
example, N = 10, partitions waiting 25, 10, 5, 0 -> 6, 3, 1, 0 (floors of 6.25, 2.5,
1.25 and 0 make 9; the one left over goes to the largest remainder, 2.5).
Spark 4.3 runs ``Trigger.AvailableNow`` on a Python source as ONE batch (it asks
:meth:`latestOffset` with ReadAllAvailable), so "available now" under a limit is
done by the pipeline: it snapshots the end offsets, passes them as
``endingOffsets`` (a cap on every partition) and stops the query once Spark's
progress reports that end.

With ``.option("ranges", "true")`` the source reads no record: each micro-batch is
one row per partition range, ``topic, partition, start, end`` (one Spark task for
all of them), and the job fetches the records itself. Spark still plans the
offsets, admits them and keeps them in its checkpoint; the records skip the trip
through a Python worker, the JVM's rows and back (see :mod:`spark_conn.pipeline`).

Where each partition ends is asked of a fetch (see :func:`panjoin.kafka.io.end_offsets`):
Tansu's ListOffsets is one produce batch short.

Every other ``kafka.*`` option is a librdkafka client property, as the native source
passes ``kafka.*`` to its Kafka client: ``.option("kafka.security.protocol",
"SASL_SSL")``, ``.option("kafka.sasl.mechanism", "PLAIN")``, ... They are checked
when the reader or writer is made (in the driver: an unknown name fails the query
before any task runs) and reach every client the source and sink open, in the driver
and in the tasks. TLS or SASL turn the built-in fast path off (see
:mod:`panjoin.kafka.options`).

The sink (``df.write.format("panjoin_kafka")`` or ``writeStream``) produces column
``value`` (string or binary; optional ``key``, and ``topic`` to override the
``topic`` option) with an idempotent producer, flushed before the task commits:
at least once across task retries, like the native sink. The pipeline gets its
exactly-once output from its own batch ids (see :mod:`spark_conn.pipeline`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

SCHEMA = "topic string, partition int, offset long, timestamp long, key binary, value binary"
RANGES_SCHEMA = "topic string, partition int, start long, end long"
ARROW_SCHEMA = pa.schema([("topic", pa.string()), ("partition", pa.int32()),
                          ("offset", pa.int64()), ("timestamp", pa.int64()),
                          ("key", pa.binary()), ("value", pa.binary())])


class KafkaOptionError(ValueError):
    pass


def _opt(options, name: str, default=None):
    for k, v in options.items():
        if k.lower() == name.lower():
            return v
    return default


def _bootstrap(options) -> str:
    b = _opt(options, "kafka.bootstrap.servers")
    if not b:
        raise KafkaOptionError("option kafka.bootstrap.servers is required "
                               "(e.g. .option('kafka.bootstrap.servers', '127.0.0.1:9092'))")
    return b


def client_options(options) -> dict[str, str]:
    """The librdkafka properties among the source's options: ``kafka.X`` -> ``X``
    (``kafka.bootstrap.servers`` aside), checked by librdkafka
    (:func:`panjoin.kafka.options.validate`; :class:`KafkaOptionError` names a bad one)."""
    from panjoin.kafka.options import KafkaOptionError as Bad
    from panjoin.kafka.options import validate

    got = {k[len("kafka."):]: v for k, v in options.items()
           if k.lower().startswith("kafka.") and k.lower() != "kafka.bootstrap.servers"}
    if not got:
        return {}
    try:
        return validate(got)
    except Bad as e:
        raise KafkaOptionError(f"{e} (given as option kafka.<name>)") from None


def _topics(options) -> list[str]:
    t = _opt(options, "subscribe")
    if not t:
        raise KafkaOptionError("option subscribe is required: comma-separated topic names")
    return [x.strip() for x in t.split(",") if x.strip()]


def share_limit(waiting: dict, limit: int) -> dict:
    """Split ``limit`` records over partitions in proportion to ``waiting`` (see the
    module docstring): exactly ``min(limit, total)``, never more than a partition has."""
    total = sum(waiting.values())
    if total <= limit:
        return dict(waiting)
    take = {p: limit * w // total for p, w in waiting.items()}
    left = limit - sum(take.values())
    by_rem = sorted(waiting, key=lambda p: -((limit * waiting[p]) % total))
    for p in by_rem:
        if left <= 0:
            break
        extra = min(left, waiting[p] - take[p])
        take[p] += extra
        left -= extra
    return take


def plan_batch(begin: dict, end: dict, limit: int | None) -> dict:
    """The next micro-batch's end offsets ``{topic: {partition: offset}}``: from
    ``begin`` towards ``end`` on every partition, at most ``limit`` records in all
    (shared out by :func:`share_limit`; None: everything up to ``end``). The source
    plans with it, and the pipeline predicts the next plan with it to read ahead."""
    if limit is None:
        return {t: dict(ps) for t, ps in end.items()}
    waiting = {(t, p): end[t][p] - begin[t][p] for t in end for p in end[t]}
    take = share_limit(waiting, int(limit))
    return {t: {p: begin[t][p] + take[(t, p)] for p in end[t]} for t in end}


def _ranges_mode(options) -> bool:
    v = str(_opt(options, "ranges", "false")).lower()
    if v not in ("true", "false"):
        raise KafkaOptionError(f"ranges={v!r}: give true or false")
    return v == "true"


class RangesPartition(InputPartition):
    """Every partition range of one micro-batch, read as rows by one task."""

    def __init__(self, ranges: list):
        super().__init__(ranges)
        self.ranges = ranges


class KafkaPartition(InputPartition):
    def __init__(self, topic: str, partition: int, start: int, end: int):
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


def read_partition(bootstrap: str, part: KafkaPartition,
                   kafka_options: dict | None = None) -> Iterator[pa.RecordBatch]:
    """Records of one partition range as Arrow batches (the source's row schema), read
    in bulk by :class:`panjoin.kafka.fetcher.Fetcher`."""
    from panjoin.kafka.fetcher import Fetcher

    f = Fetcher(bootstrap, options=kafka_options)
    try:
        t = f.read([(part.topic, part.partition, part.start, part.end)])[
            (part.topic, part.partition)]
    finally:
        f.close()
    n = t.num_rows
    t = pa.table([pa.array([part.topic] * n, pa.string()),
                  pa.array(np.full(n, part.partition, np.int32)), t.column("offset"),
                  t.column("timestamp"), t.column("key").cast(pa.binary()),
                  t.column("value").cast(pa.binary())], schema=ARROW_SCHEMA)
    yield from t.to_batches(max_chunksize=65536)


class KafkaStreamReader(DataSourceStreamReader):
    def __init__(self, options):
        self.bootstrap = _bootstrap(options)
        self.kafka_options = client_options(options)
        self.topics = _topics(options)
        self.starting = _opt(options, "startingOffsets", "earliest")
        mo = _opt(options, "maxOffsetsPerTrigger")
        try:
            self.max_offsets = int(mo) if mo is not None else None
        except ValueError:
            raise KafkaOptionError(f"maxOffsetsPerTrigger={mo!r}: give a whole number") from None
        if self.max_offsets is not None and self.max_offsets < 1:
            raise KafkaOptionError(f"maxOffsetsPerTrigger={mo!r}: must be >= 1")
        self.split = int(_opt(options, "splitSize", 1 << 20))
        ending = _opt(options, "endingOffsets")
        try:  # a cap on every partition's end: how the pipeline runs "available now"
            self.ending = json.loads(ending) if ending else None
        except ValueError:
            raise KafkaOptionError(f"endingOffsets={ending!r}: give JSON like "
                                   f"{{\"R\": {{\"0\": 42}}}}") from None
        self.ranges = _ranges_mode(options)
        self._probe = None  # protocol.Brokers, or a librdkafka consumer under TLS/SASL
        self._reached = None  # the broker's ends once they reached every ending offset

    def _ends(self) -> dict:
        # the protocol module alone (no Numba, no event files): this runs in the
        # process Spark starts for the source at each query start, on its critical path
        from panjoin.kafka import protocol
        from panjoin.kafka.options import fast_path_off

        if self._reached is not None:
            # ends only grow: past the ending offsets, asking the broker again would
            # change no plan (it saves a round trip per partition at every trigger)
            return self._reached
        if fast_path_off("Spark source", self.kafka_options):
            from panjoin.kafka import librdkafka

            if self._probe is None:
                self._probe = librdkafka.consumer(self.bootstrap, self.kafka_options,
                                                  **{"enable.partition.eof": True})
            ends = {t: {str(p): v for p, v in librdkafka.log_ends(
                self._probe, t, where=self.bootstrap).items()}
                    for t in self.topics}
        else:
            if self._probe is None:
                self._probe = protocol.Brokers(self.bootstrap)
            ends = {t: {str(p): v for p, v in protocol.log_ends(self._probe, t).items()}
                    for t in self.topics}
        capped = self.ending is not None and all(  # every partition has an ending offset
            p in self.ending.get(t, {}) for t, ps in ends.items() for p in ps)
        if capped and all(int(o) <= ends.get(t, {}).get(str(p), (0, -1))[1]
                          for t, ps in self.ending.items() for p, o in ps.items()):
            self._reached = ends
        return ends

    def initialOffset(self) -> dict:
        ends = self._ends()
        if self.starting in ("earliest", "latest"):
            i = 0 if self.starting == "earliest" else 1
            return {t: {p: v[i] for p, v in ps.items()} for t, ps in ends.items()}
        try:
            given = json.loads(self.starting)
        except ValueError:
            raise KafkaOptionError(f"startingOffsets={self.starting!r}: use earliest, latest "
                                   f"or JSON like {{\"R\": {{\"0\": 42}}}}") from None
        out = {}
        for t, ps in ends.items():  # partitions not named start at their earliest offset
            out[t] = {p: int(given.get(t, {}).get(p, v[0])) for p, v in ps.items()}
        return out

    def latestOffset(self, start: dict, limit) -> dict:
        ends = self._ends()
        end = {t: {p: max(v[1], start.get(t, {}).get(p, v[0])) for p, v in ps.items()}
               for t, ps in ends.items()}
        if self.ending is not None:
            end = {t: {p: min(e, int(self.ending.get(t, {}).get(p, e))) for p, e in ps.items()}
                   for t, ps in end.items()}
            end = {t: {p: max(e, start.get(t, {}).get(p, e)) for p, e in ps.items()}
                   for t, ps in end.items()}
        n = None
        if isinstance(limit, ReadMaxRows):
            n = limit.max_rows if hasattr(limit, "max_rows") else limit.maxRows
        elif not isinstance(limit, ReadAllAvailable) and self.max_offsets is not None:
            n = self.max_offsets
        begin = {t: {p: start.get(t, {}).get(p, ends[t][p][0]) for p in ps}
                 for t, ps in end.items()}
        return plan_batch(begin, end, n)

    def getDefaultReadLimit(self):
        if self.max_offsets is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.max_offsets)

    def partitions(self, start: dict, end: dict):
        if self.ranges:
            return [RangesPartition([(t, int(p), start.get(t, {}).get(p, 0), e)
                                     for t, ps in end.items() for p, e in ps.items()
                                     if e > start.get(t, {}).get(p, 0)])]
        parts = []
        for t, ps in end.items():
            for p, e in ps.items():
                s = start.get(t, {}).get(p, 0)
                for a in range(s, e, self.split):
                    parts.append(KafkaPartition(t, int(p), a, min(e, a + self.split)))
        return parts

    def read(self, partition):
        if isinstance(partition, RangesPartition):
            return iter(partition.ranges)
        return read_partition(self.bootstrap, partition, self.kafka_options)

    def commit(self, end: dict) -> None:
        pass  # progress lives in Spark's checkpoint, not in a consumer group

    def stop(self) -> None:
        """Spark's end of this reader (the query stops): its runner process learns of it
        by the JVM closing the runner's socket, and then reports the closed socket as
        an error on that same socket (:func:`quiet_hang_up`)."""
        self.close_probe()
        quiet_hang_up()

    def close_probe(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None


def quiet_hang_up() -> None:
    """Leave out the traceback of a process whose peer hung up: Spark 4's Python
    streaming source runner has no stop message; a query's stop closes the runner's
    socket, the runner reads the end of it (EOFError), calls the reader's ``stop()``,
    and then writes that error back to the closed socket, whose BrokenPipeError ends
    the process with three chained tracebacks on the job's terminal (a race with the
    JVM killing the process: seen under load, and after every correct run). Installed
    from ``stop()``, in the runner only; any other uncaught error still prints."""
    default = sys.excepthook

    def hook(kind, exc, tb):
        if issubclass(kind, (BrokenPipeError, ConnectionResetError)):
            return
        default(kind, exc, tb)

    sys.excepthook = hook


class KafkaBatchReader(DataSourceReader):
    """``spark.read.format("panjoin_kafka")``: everything between startingOffsets
    (default earliest) and what the topics hold now."""

    def __init__(self, options):
        self.stream = KafkaStreamReader(options)

    def partitions(self):
        start = self.stream.initialOffset()
        end = self.stream.latestOffset(start, ReadAllAvailable())
        self.stream.close_probe()
        return self.stream.partitions(start, end)

    def read(self, partition):
        if isinstance(partition, RangesPartition):
            return iter(partition.ranges)
        return read_partition(self.stream.bootstrap, partition, self.stream.kafka_options)


class _Sent(WriterCommitMessage):
    def __init__(self, count: int):
        self.count = count


def write_rows(options, rows) -> _Sent:
    """Produce rows (value, optional key and topic) and flush; raise if any failed."""
    from panjoin.kafka import io

    bootstrap = _bootstrap(options)
    default_topic = _opt(options, "topic")
    p = io.producer(bootstrap, client_options(options))
    failed = []
    n = 0

    def on_delivery(err, _m):
        if err is not None:
            failed.append(err)

    for row in rows:
        d = row.asDict()
        topic = d.get("topic") or default_topic
        if not topic:
            raise KafkaOptionError("no topic: set option topic or give a topic column")
        v = d.get("value")
        k = d.get("key")
        while True:
            try:
                p.produce(topic, v.encode() if isinstance(v, str) else v,
                          key=k.encode() if isinstance(k, str) else k, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.1)
        n += 1
    left = p.flush(120)
    if left or failed:
        raise RuntimeError(f"Kafka sink: {left} records undelivered, {len(failed)} failed: "
                           f"{failed[:1]}")
    return _Sent(n)


class KafkaBatchWriter(DataSourceWriter):
    def __init__(self, options):
        self.options = dict(options)
        _bootstrap(self.options)
        client_options(self.options)  # a bad one fails here, in the driver

    def write(self, iterator):
        return write_rows(self.options, iterator)


class KafkaStreamWriter(DataSourceStreamWriter):
    def __init__(self, options):
        self.options = dict(options)
        _bootstrap(self.options)
        client_options(self.options)  # a bad one fails here, in the driver

    def write(self, iterator):
        return write_rows(self.options, iterator)

    def commit(self, messages, batchId) -> None:
        pass  # records were flushed by each task before it reported

    def abort(self, messages, batchId) -> None:
        pass  # what was flushed stays: at least once, like the native sink


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "panjoin_kafka"

    def schema(self):
        return RANGES_SCHEMA if _ranges_mode(self.options) else SCHEMA

    def reader(self, schema):
        return KafkaBatchReader(self.options)

    def streamReader(self, schema):
        return KafkaStreamReader(self.options)

    def writer(self, schema, overwrite: bool):
        return KafkaBatchWriter(self.options)

    def streamWriter(self, schema, overwrite: bool):
        return KafkaStreamWriter(self.options)
