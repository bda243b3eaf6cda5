"""A micro-batch's output records written to Kafka as whole record batches.

:class:`BatchWriter` takes an Arrow binary array of values, cuts it into record
batches of at most ``max_batch_bytes`` (Kafka's default ``message.max.bytes`` is
about 1 MB), encodes each with the Numba kernel :func:`record_batch.encode` (the
headers ``panjoin.batch`` and ``panjoin.seq`` included, so a restart can tell what
was written), and sends them with Produce requests (``acks=all``), batches spread
round-robin over the topic's partitions and several requests in flight per
broker. No Python object is made per record: librdkafka's ``produce()`` costs a
Python call per record.

A write either returns with every record acknowledged or raises. It never
retries on its own: the pipeline's restart finds what a failed write left in the
topic by those headers and writes only the rest, which is what keeps the output
exactly once without an idempotent producer.

With client ``options`` that ask for TLS or SASL (see :mod:`panjoin.kafka.options`),
which the plain TCP connections here cannot speak, the same records (same
partitions, headers and timestamp) go through a librdkafka producer instead:
idempotent with ``acks=all`` (its own retries never duplicate a record), flushed,
and every delivery error raised. A write that raises may have left some records
in the topic, as above; it also drops whatever librdkafka still holds, so nothing
of it arrives after the write failed.

    >>> w = BatchWriter("127.0.0.1:9092")                       # doctest: +SKIP
    >>> w.write("out", pa.array([b"a", b"b"]), batch=7)          # doctest: +SKIP
    2
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from panjoin.kafka import io, librdkafka, protocol
from panjoin.kafka import record_batch as rb
from panjoin.kafka.fetcher import value_buffers
from panjoin.kafka.options import fast_path_off

#: bytes a record adds to its value in a batch, about (varints, two headers)
RECORD_OVERHEAD = 48


def runs(keep: np.ndarray) -> list[tuple[int, int]]:
    """``[(lo, hi)]``: the maximal runs of True in ``keep``."""
    d = np.diff(np.concatenate([[False], keep, [False]]).astype(np.int8))
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(),
                    strict=True))


def chunks(offs: np.ndarray, lo: int, hi: int, limit: int) -> list[tuple[int, int]]:
    """Cut values ``lo..hi-1`` into consecutive pieces of about ``limit`` bytes each
    (a value larger than that is a piece of its own)."""
    size = np.diff(offs[lo:hi + 1]) + RECORD_OVERHEAD
    cum = np.cumsum(size)
    cuts = [lo]
    while cuts[-1] < hi:
        base = cum[cuts[-1] - lo - 1] if cuts[-1] > lo else 0
        k = int(np.searchsorted(cum, base + limit, side="right")) + lo
        cuts.append(min(hi, max(k, cuts[-1] + 1)))
    return list(zip(cuts[:-1], cuts[1:], strict=True))


class BatchWriter:
    """Writes values to Kafka topics, one micro-batch at a time; see the module doc.
    ``options``: librdkafka client properties (:mod:`panjoin.kafka.options`)."""

    def __init__(self, bootstrap: str, max_batch_bytes: int = 1_000_000, in_flight: int = 8,
                 timeout: float = 60.0, options: dict | None = None):
        self.bootstrap, self.limit = bootstrap, max_batch_bytes
        self.in_flight, self.timeout = in_flight, timeout
        self.options = dict(options or {})
        # TLS/SASL: no connection of our own; a librdkafka producer writes
        self.librdkafka_only = fast_path_off("writer", self.options)
        self.brokers = None if self.librdkafka_only else protocol.Brokers(bootstrap, timeout)
        self._producer = None
        self._topics: dict = {}  # topic -> its partitions (librdkafka path)
        self.next: dict = {}  # topic -> the partition its next record batch goes to

    def write(self, topic: str, values: pa.Array, batch: int, skip=()) -> int:
        """Write ``values`` (record i with ``panjoin.seq = i``), except the positions in
        ``skip``; returns how many were written once all are acknowledged."""
        n = len(values)
        if n == 0:
            return 0
        order = self._partitions(topic)
        data, offs = value_buffers(values)
        keep = np.ones(n, bool)
        if skip:
            keep[np.fromiter((i for i in skip if 0 <= i < n), np.int64)] = False
        tag = str(batch).encode()
        now = int(time.time() * 1000)
        # record batches round-robin over the partitions, whichever path sends them
        pieces = []  # (partition, lo, hi)
        for lo, hi in runs(keep):
            for a, b in chunks(offs, lo, hi, self.limit):
                i = self.next.get(topic, 0) % len(order)
                self.next[topic] = i + 1
                pieces.append((order[i], a, b))
        if self.librdkafka_only:
            return self._produce(topic, pieces, data, offs, tag, now, batch)
        pending: dict = {}  # connection -> {partition: batch bytes} not yet sent
        flying: dict = {}  # connection -> requests in flight
        errors: list = []

        def send(conn):
            conn.send_produce({topic: pending.pop(conn)}, timeout_ms=int(self.timeout * 1000))
            flying[conn] = flying.get(conn, 0) + 1
            while flying[conn] >= self.in_flight:
                settle(conn)

        def settle(conn):
            for (t, p), (err, _) in conn.read_produce().items():
                if err:
                    errors.append(f"{t}[{p}]: {protocol.error_name(err)}")
            flying[conn] -= 1

        written = 0
        for p, a, b in pieces:
            conn = self.brokers.leader(topic, p)
            if p in pending.get(conn, {}):
                send(conn)
            pending.setdefault(conn, {})[p] = rb.encode(data, offs, a, b, tag, a, now)
            written += b - a
        for conn in list(pending):
            send(conn)
        for conn, k in flying.items():
            for _ in range(k):
                settle(conn)
        if errors:
            raise protocol.ProtocolError(f"batch {batch}: writing to {topic!r} failed: "
                                         f"{', '.join(errors[:3])}")
        return written

    # -- through librdkafka (TLS, SASL)

    def _partitions(self, topic: str) -> list[int]:
        if self.brokers is not None:
            return sorted(self.brokers.partitions(topic))
        if topic not in self._topics:  # known once, as the built-in path knows them
            # every topic's metadata, as the built-in path asks: naming a missing topic
            # would make a producer's request create it
            md = self._librdkafka().list_topics(timeout=self.timeout).topics.get(topic)
            if md is None or md.error is not None or not md.partitions:
                raise protocol.ProtocolError(f"topic {topic!r} does not exist on "
                                             f"{self.bootstrap}; create it first")
            self._topics[topic] = sorted(md.partitions)
        return self._topics[topic]

    def _librdkafka(self):
        if self._producer is None:
            # librdkafka gives up on a record after delivery.timeout.ms; the write waits
            # as long (a user may set it), so nothing is still pending when it returns
            self._producer = librdkafka.producer(self.bootstrap, {
                "delivery.timeout.ms": int(self.timeout * 1000), **self.options})
        return self._producer

    def _produce(self, topic: str, pieces: list, data, offs, tag: bytes, now: int,
                 batch: int) -> int:
        """The records of ``pieces`` through librdkafka, each with the headers the
        record batches carry; returns how many, once every one is acknowledged."""
        ck = librdkafka.confluent()
        p = self._librdkafka()
        failed: list = []

        def on_delivery(err, msg):
            if err is not None:
                failed.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")

        raw, o = data.tobytes(), offs.tolist()  # produce() takes bytes, not views
        written = 0
        try:
            for part, a, b in pieces:
                for i in range(a, b):
                    headers = [(io.BATCH_HEADER, tag), (io.SEQ_HEADER, str(i).encode())]
                    while True:
                        try:
                            p.produce(topic, raw[o[i]:o[i + 1]], partition=part,
                                      timestamp=now, headers=headers,
                                      on_delivery=on_delivery)
                            break
                        except BufferError:  # local queue full: let deliveries drain
                            p.poll(0.1)
                written += b - a
                p.poll(0)
            wait = float(self.options.get("delivery.timeout.ms", self.timeout * 1000)) / 1000
            left = p.flush(wait + 5)
        except ck.KafkaException as e:
            self._drop()
            raise protocol.ProtocolError(f"batch {batch}: writing to {topic!r} failed: "
                                         f"{e}") from e
        if left or failed:
            self._drop()
            raise protocol.ProtocolError(
                f"batch {batch}: writing to {topic!r} failed: {left} records not "
                f"acknowledged, {len(failed)} refused ({', '.join(failed[:3])})")
        return written

    def _drop(self) -> None:
        """Forget the producer after a failed write, with what it still holds: a record
        of that write must not arrive later (the restart writes the rest)."""
        p, self._producer = self._producer, None
        if p is not None:
            p.purge(in_queue=True, in_flight=True)
            p.flush(0)

    def close(self) -> None:
        if self.brokers is not None:
            self.brokers.close()
        if self._producer is not None:
            self._producer.flush(self.timeout)
            self._producer = None
