"""Kafka topics in and out, on confluent-kafka: event files to topics, topics to Parquet.

An input record is one tuple as a JSON object, in the record's value::

    {"id": 7, "key": 1234, "ts": 1700000000123, "payload": "anything"}

with the Kafka record timestamp set to ``ts`` and the record key to the id (so a
multi-partition topic spreads tuples by id). :func:`produce_events` writes an
:class:`~panjoin.events.EventTable`'s R rows to one topic and S rows to another,
in arrival order per stream.

Offsets are read the way both brokers agree on (see :mod:`panjoin.kafka.broker`):
:func:`end_offsets` takes the ListOffsets high watermark and then lets fetches say
where the partition really ends (:meth:`panjoin.kafka.fetcher.Fetcher.end_offsets`),
because Tansu's ListOffsets is one produce batch short. :func:`read_range` reads
``[start, end)`` of one partition with librdkafka and stops on the offset, never on
"no message for a while"; the pipeline's bulk path is :mod:`panjoin.kafka.fetcher`
and :mod:`panjoin.kafka.writer`.

Every function takes ``options``: librdkafka client properties from the user (TLS,
SASL, ...; see :mod:`panjoin.kafka.options`), passed to every client it opens
(:mod:`panjoin.kafka.librdkafka`). With TLS or SASL among them, :func:`end_offsets`
asks librdkafka (:func:`~panjoin.kafka.librdkafka.log_ends`) instead of the built-in
protocol.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pyarrow as pa

from panjoin.events import EventTable
from panjoin.kafka.librdkafka import KafkaIOError, admin, consumer, producer, read_range

#: Headers on every record the pipeline writes: which micro-batch, which position.
BATCH_HEADER = "panjoin.batch"
SEQ_HEADER = "panjoin.seq"


def create_topics(bootstrap: str, topics, partitions: int = 1, timeout: float = 30.0,
                  options: dict | None = None) -> None:
    """Create topics (``retention.ms=-1``: records carry old event time as timestamps,
    which a time-based retention would delete at once). Existing topics are kept."""
    from confluent_kafka.admin import NewTopic

    a = admin(bootstrap, options)
    new = [NewTopic(t, num_partitions=partitions, replication_factor=1,
                    config={"retention.ms": "-1"}) for t in topics]
    for name, fut in a.create_topics(new, operation_timeout=timeout).items():
        try:
            fut.result(timeout)
        except Exception as e:  # KafkaException
            err = e.args[0] if e.args else None
            if getattr(err, "name", lambda: "")() != "TOPIC_ALREADY_EXISTS":
                raise KafkaIOError(f"cannot create topic {name!r} on {bootstrap}: {e}") from e
    # metadata may lag the creation on some brokers: wait until every topic shows up
    deadline = time.monotonic() + timeout
    while True:
        md = a.list_topics(timeout=timeout)
        if all(t in md.topics and md.topics[t].partitions for t in topics):
            return
        if time.monotonic() > deadline:
            raise KafkaIOError(f"topics {list(topics)} did not appear on {bootstrap}")
        time.sleep(0.1)


def end_offsets(bootstrap: str, topic: str, timeout: float = 10.0,
                probe=None, options: dict | None = None) -> dict[int, tuple[int, int]]:
    """``{partition: (low, end)}``: the first offset and one past the last record, exact
    on brokers whose ListOffsets is short (see :meth:`Fetcher.end_offsets`). ``probe``:
    a :class:`~panjoin.kafka.fetcher.Fetcher` to reuse (its connections stay open; it
    has its own ``options``)."""
    from panjoin.kafka.fetcher import Fetcher
    from panjoin.kafka.protocol import ProtocolError

    f = probe or Fetcher(bootstrap, timeout, options)
    try:
        return f.end_offsets(topic, timeout)
    except ProtocolError as e:
        raise KafkaIOError(str(e)) from e
    finally:
        if probe is None:
            f.close()


# --------------------------------------------------------------------------- events


def event_records(events: EventTable, rows: np.ndarray) -> list[bytes]:
    """JSON values of the given rows: id, key, ts, payload (null when absent)."""
    ids = events.id[rows].tolist()
    ts = events.ts[rows].tolist()
    keys = events.key[rows].tolist()  # python int/float; float repr round-trips exactly
    if events.payload is not None:
        pay = events.payload.take(pa.array(rows)).to_pylist()
        pay = [p.decode() if isinstance(p, bytes) else p for p in pay]
    else:
        pay = [None] * len(ids)
    return [json.dumps({"id": i, "key": k, "ts": t, "payload": p}).encode()
            for i, k, t, p in zip(ids, keys, ts, pay, strict=True)]


def produce_events(bootstrap: str, events: EventTable, r_topic: str, s_topic: str,
                   partitions: int = 1, create: bool = True, timeout: float = 120.0,
                   options: dict | None = None) -> dict:
    """Write R rows to ``r_topic`` and S rows to ``s_topic`` (each in arrival order;
    Kafka timestamp = ts, Kafka key = id). Returns counts per topic."""
    if create:
        create_topics(bootstrap, [r_topic, s_topic], partitions, options=options)
    p = producer(bootstrap, options)
    failed = []

    def on_delivery(err, _msg):
        if err is not None:
            failed.append(err)

    counts = {}
    for code, topic in ((0, r_topic), (1, s_topic)):
        rows = np.flatnonzero(events.stream == code)
        values = event_records(events, rows)
        ids = events.id[rows].tolist()
        ts = events.ts[rows].tolist()
        for v, i, t in zip(values, ids, ts, strict=True):
            while True:
                try:
                    p.produce(topic, v, key=str(i).encode(), timestamp=max(int(t), 0),
                              on_delivery=on_delivery)
                    break
                except BufferError:  # local queue full: let deliveries drain
                    p.poll(0.1)
            p.poll(0)
        counts[topic] = len(values)
    left = p.flush(timeout)
    if left or failed:
        raise KafkaIOError(f"{left} records not delivered, {len(failed)} failed "
                           f"({failed[:1]}) to {bootstrap}")
    return counts


def read_topic(bootstrap: str, topic: str, timeout: float = 60.0,
               options: dict | None = None) -> list:
    """Every record of a topic now, partition by partition in offset order."""
    c = consumer(bootstrap, options, **{"enable.partition.eof": True})
    try:
        out = []
        for p, (lo, end) in sorted(end_offsets(bootstrap, topic, options=options).items()):
            out.extend(read_range(c, topic, p, lo, end, timeout))
        return out
    finally:
        c.close()


def records_table(msgs) -> pa.Table:
    """Records as an Arrow table: kafka_partition, kafka_offset, kafka_timestamp,
    kafka_key, kafka_value (text), kafka_batch and kafka_seq (the pipeline's
    headers; null elsewhere)."""
    batch, seq = [], []
    for m in msgs:
        h = dict(m.headers() or ())
        batch.append(int(h[BATCH_HEADER]) if BATCH_HEADER in h else None)
        seq.append(int(h[SEQ_HEADER]) if SEQ_HEADER in h else None)
    return pa.table({
        "kafka_partition": pa.array([m.partition() for m in msgs], pa.int32()),
        "kafka_offset": pa.array([m.offset() for m in msgs], pa.int64()),
        "kafka_timestamp": pa.array([m.timestamp()[1] for m in msgs], pa.int64()),
        "kafka_key": pa.array([m.key() for m in msgs], pa.binary()),
        "kafka_value": pa.array([(m.value() or b"").decode("utf-8", "replace") for m in msgs],
                          pa.string()),
        "kafka_batch": pa.array(batch, pa.int64()),
        "kafka_seq": pa.array(seq, pa.int64()),
    })


def consume_to_parquet(bootstrap: str, topic: str, out: str,
                       options: dict | None = None) -> int:
    """Dump a topic into Parquet (see :func:`records_table`); JSON-object values
    also get their fields as columns (r_id, s_id, r, s for the join output)."""
    import pyarrow.parquet as pq

    from panjoin.events.files import atomic_write

    table = records_table(read_topic(bootstrap, topic, options=options))
    values = table.column("kafka_value").to_pylist()
    try:
        objs = [json.loads(v) for v in values]
        if objs and all(isinstance(o, dict) for o in objs):
            fields = pa.Table.from_pylist(objs)
            for name in fields.column_names:
                if name not in table.column_names:
                    table = table.append_column(name, fields.column(name))
    except (ValueError, pa.ArrowException):
        pass  # not all JSON objects (e.g. a dead-letter topic): raw values only
    atomic_write(out, lambda tmp: pq.write_table(table, tmp))
    return table.num_rows
