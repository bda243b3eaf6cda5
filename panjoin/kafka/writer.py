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

    >>> w = BatchWriter("127.0.0.1:9092")                       # doctest: +SKIP
    >>> w.write("out", pa.array([b"a", b"b"]), batch=7)          # doctest: +SKIP
    2
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from panjoin.kafka import protocol
from panjoin.kafka import record_batch as rb
from panjoin.kafka.fetcher import value_buffers

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
    """Writes values to Kafka topics, one micro-batch at a time; see the module doc."""

    def __init__(self, bootstrap: str, max_batch_bytes: int = 1_000_000, in_flight: int = 8,
                 timeout: float = 60.0):
        self.bootstrap, self.limit = bootstrap, max_batch_bytes
        self.in_flight, self.timeout = in_flight, timeout
        self.brokers = protocol.Brokers(bootstrap, timeout)
        self.next: dict = {}  # topic -> the partition its next record batch goes to

    def write(self, topic: str, values: pa.Array, batch: int, skip=()) -> int:
        """Write ``values`` (record i with ``panjoin.seq = i``), except the positions in
        ``skip``; returns how many were written once all are acknowledged."""
        n = len(values)
        if n == 0:
            return 0
        order = sorted(self.brokers.partitions(topic))
        data, offs = value_buffers(values)
        keep = np.ones(n, bool)
        if skip:
            keep[np.fromiter((i for i in skip if 0 <= i < n), np.int64)] = False
        tag = str(batch).encode()
        now = int(time.time() * 1000)
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
        for lo, hi in runs(keep):
            for a, b in chunks(offs, lo, hi, self.limit):
                i = self.next.get(topic, 0) % len(order)
                self.next[topic] = i + 1
                p = order[i]
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

    def close(self) -> None:
        self.brokers.close()
