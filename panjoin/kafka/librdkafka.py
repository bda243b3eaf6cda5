"""librdkafka's clients (confluent-kafka): the one module that builds them.

The project's own Kafka path (:mod:`panjoin.kafka.fetcher`, :mod:`panjoin.kafka.writer`)
speaks the protocol itself; librdkafka serves what it does not (TLS, SASL, a broker
it cannot read) and the tools (topic creation, :mod:`panjoin.kafka.io`). Every client
here is configured by :func:`client_config` from the user's ``--kafka-option``
properties (:mod:`panjoin.kafka.options`)::

    >>> client_config("10.0.0.5:9092", {"linger.ms": "20"}, {"linger.ms": 5, "acks": "all"})
    {'linger.ms': '20', 'acks': 'all', 'bootstrap.servers': '10.0.0.5:9092'}
"""

from __future__ import annotations

import time
import uuid


class KafkaIOError(RuntimeError):
    """A Kafka client failed: a topic missing, a read or write not done in time."""


def confluent():
    """The confluent_kafka module, or a KafkaIOError that says how to install it."""
    try:
        import confluent_kafka
    except ModuleNotFoundError:
        raise KafkaIOError("confluent-kafka is not installed; run `make .venv/.installed` "
                           "(or pip install confluent-kafka)") from None
    return confluent_kafka


def client_config(bootstrap: str, options: dict | None = None, defaults: dict | None = None,
                  extra: dict | None = None) -> dict:
    """The config of one librdkafka client: the client's ``defaults`` (tuning the user
    may change), then the user's ``options``, then ``extra`` (what this call needs, e.g.
    ``enable.partition.eof``), then ``bootstrap.servers``."""
    conf = dict(defaults or {})
    conf.update(options or {})
    conf.update(extra or {})
    conf["bootstrap.servers"] = bootstrap
    return conf


def admin(bootstrap: str, options: dict | None = None):
    confluent()
    from confluent_kafka.admin import AdminClient

    return AdminClient(client_config(bootstrap, options, {"log_level": 0}))


def consumer(bootstrap: str, options: dict | None = None, **extra):
    """A consumer that reads assigned ranges: no group membership, no commits (the
    group id is random and never used), read committed."""
    ck = confluent()
    tuning = {"log_level": 0,
              # we read ranges that exist: a fetch at the end should answer at once
              "fetch.wait.max.ms": 10,
              # noida-db answers a fetch with everything from the offset on, whatever
              # fetch.max.bytes says: past 100 MB librdkafka would drop the answer
              "receive.message.max.bytes": 2_000_000_000}
    fixed = {"group.id": f"panjoin-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
             "enable.auto.offset.store": False, "auto.offset.reset": "earliest"}
    return ck.Consumer(client_config(bootstrap, options, tuning, {**fixed, **extra}))


def producer(bootstrap: str, options: dict | None = None, **extra):
    """An idempotent producer: a retried send is never written twice, and records of
    one partition land in the order they were produced."""
    ck = confluent()
    tuning = {"linger.ms": 5, "batch.num.messages": 10000, "log_level": 0}
    fixed = {"enable.idempotence": True, "acks": "all"}
    return ck.Producer(client_config(bootstrap, options, tuning, {**fixed, **extra}))


def log_ends(c, topic: str, timeout: float = 10.0,
             where: str = "the cluster") -> dict[int, tuple[int, int]]:
    """:func:`end_offsets` through librdkafka, for clusters the built-in protocol cannot
    reach (TLS, SASL), with the consumer ``c`` (``enable.partition.eof``). The
    watermarks first; then, as :func:`panjoin.kafka.protocol.log_ends` does, a read
    from one record before each high watermark to the end-of-partition event, which
    puts ``end`` where the log really ends on brokers whose watermark is short
    (Tansu: one produce batch). A partition's end: 3 records in one batch after 1,
    watermark 2 -> read from offset 1, records 1..3, EOF at 4 -> end 4."""
    ck = confluent()
    md = c.list_topics(topic, timeout=timeout)
    t = md.topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        raise KafkaIOError(f"topic {topic!r} does not exist on {where}; create it first "
                           f"(panjoin kafka produce creates its topics)")
    lo, end, pos = {}, {}, {}
    for p in sorted(t.partitions):
        a, b = c.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=timeout,
                                       cached=False)
        lo[p], end[p] = max(a, 0), max(b, 0)
        pos[p] = max(lo[p], end[p] - 1)
    c.assign([ck.TopicPartition(topic, p, pos[p]) for p in pos])
    todo = set(pos)
    deadline = time.monotonic() + timeout
    try:
        while todo:
            for m in c.consume(num_messages=10_000, timeout=0.05):
                err, p = m.error(), m.partition()
                if err is None:
                    end[p] = max(end[p], m.offset() + 1)
                elif err.code() == ck.KafkaError._PARTITION_EOF:
                    end[p] = max(end[p], m.offset())
                    todo.discard(p)
                else:
                    raise KafkaIOError(f"reading {topic}[{p}]: {err}")
            if todo and time.monotonic() > deadline:
                raise KafkaIOError(f"{topic} partitions {sorted(todo)}: the log's end not "
                                   f"found in {timeout:.0f}s")
    finally:
        c.unassign()
    return {p: (lo[p], end[p]) for p in sorted(lo)}


def read_range(c, topic: str, partition: int, start: int, end: int, timeout: float = 60.0):
    """Records of ``[start, end)`` of one partition, in offset order, read with the
    given consumer (configured with ``enable.partition.eof``). Offsets that hold no
    record (transaction markers) are skipped; the read ends on the offset."""
    ck = confluent()
    if end <= start:
        return []
    c.assign([ck.TopicPartition(topic, partition, start)])
    out = []
    deadline = time.monotonic() + timeout
    done = False
    while not done:
        nxt = out[-1].offset() + 1 if out else start
        msgs = c.consume(num_messages=min(100_000, max(1, end - nxt)), timeout=0.05)
        for m in msgs:
            err = m.error()
            if err is None:
                if m.offset() >= end:
                    done = True
                    break
                out.append(m)
                if m.offset() >= end - 1:
                    done = True
                    break
            elif err.code() == ck.KafkaError._PARTITION_EOF:
                if m.offset() >= end:
                    done = True
                    break
            else:
                raise KafkaIOError(f"reading {topic}[{partition}]: {err}")
        if not done and time.monotonic() > deadline:
            raise KafkaIOError(f"reading {topic}[{partition}] offsets {start}..{end}: only "
                               f"{len(out)} records in {timeout:.0f}s")
    c.unassign()
    return out
