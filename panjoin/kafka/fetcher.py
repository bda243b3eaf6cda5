"""Offset ranges of Kafka partitions read straight into Arrow arrays.

The pipeline reads the ranges Spark planned, ``(topic, partition, start, end)``.
:class:`Fetcher` sends Fetch requests itself (:mod:`panjoin.kafka.protocol`) to
each partition's leader, all partitions of a leader in one request, and decodes
the answers with the Numba kernels of :mod:`panjoin.kafka.record_batch`: a
range comes back as one Arrow table (offset, timestamp, key, value), with no
Python object made per record (librdkafka's consumer makes one per record, which
cost more than the join itself).

It keeps what a fetch returned past a range's end for the range that starts
there: a broker that answers a fetch with the rest of the partition (noida-db) is asked
once, not once per micro-batch. Records in compressed batches, in the old message
formats or under aborted transactions are read with librdkafka instead
(:func:`~panjoin.kafka.librdkafka.read_range`), so every topic reads right.

With client ``options`` that ask for TLS or SASL (see :mod:`panjoin.kafka.options`),
which the plain TCP connections here cannot speak, every range is read that way:
same tables, same order, no connection of its own.

    >>> f = Fetcher("127.0.0.1:9092")                            # doctest: +SKIP
    >>> got = f.read([("R", 0, 0, 100), ("R", 0, 100, 250)])     # doctest: +SKIP
    >>> got[("R", 0)].column_names, got[("R", 0)].num_rows     # doctest: +SKIP
    (['offset', 'timestamp', 'key', 'value'], 250)
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pyarrow as pa

from panjoin.kafka import librdkafka, protocol
from panjoin.kafka import record_batch as rb
from panjoin.kafka.options import fast_path_off

log = logging.getLogger("panjoin.kafka")

#: bytes per fetch answer and per partition in it (brokers may send more: noida-db)
MAX_BYTES = 64 << 20
PARTITION_MAX_BYTES = 32 << 20
#: the columns of what :meth:`Fetcher.read` returns
SCHEMA = pa.schema([("offset", pa.int64()), ("timestamp", pa.int64()),
                    ("key", pa.large_binary()), ("value", pa.large_binary())])


def values_array(data: np.ndarray, offs: np.ndarray, null: np.ndarray | None = None):
    """An Arrow ``large_binary`` array on ``data``/``offs`` (as from
    :func:`record_batch.gather`), null where ``null`` says, without copying."""
    n = len(offs) - 1
    validity = None
    if null is not None and null.any():
        validity = pa.py_buffer(np.packbits(~null, bitorder="little"))
    return pa.Array.from_buffers(pa.large_binary(), n, [
        validity, pa.py_buffer(offs.astype(np.int64, copy=False)), pa.py_buffer(data)])


def value_buffers(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(data, offsets)`` of a binary array, for :func:`record_batch.encode`: offsets
    index ``data`` directly (a slice's offset is applied); nulls read as empty."""
    values = values.cast(pa.large_binary())
    _, offs, data = values.buffers()
    o = np.frombuffer(offs, np.int64)[values.offset:values.offset + len(values) + 1]
    d = np.frombuffer(data, np.uint8) if data is not None else np.empty(0, np.uint8)
    return d, o


def _table(buf: np.ndarray, offs, ts, kstart, klen, vstart, vlen) -> pa.Table:
    kdata, koffs = rb.gather(buf, kstart, klen)
    vdata, voffs = rb.gather(buf, vstart, vlen)
    return pa.table([pa.array(offs), pa.array(ts), values_array(kdata, koffs, klen < 0),
                     values_array(vdata, voffs, vlen < 0)], schema=SCHEMA)


def _concat(parts: list) -> pa.Table:
    if len(parts) == 1:
        return parts[0]
    return pa.concat_tables(parts) if parts else SCHEMA.empty_table()


def _first(t: pa.Table) -> int:
    return t.column("offset")[0].as_py()


class Fetcher:
    """Reads offset ranges ``(topic, partition, start, end)``; see the module doc. One
    thread at a time: its connections carry one request stream each. ``options``:
    librdkafka client properties (:mod:`panjoin.kafka.options`)."""

    def __init__(self, bootstrap: str, timeout: float = 60.0, options: dict | None = None):
        self.bootstrap = bootstrap
        self.timeout = timeout
        self.options = dict(options or {})
        # TLS/SASL: no connection of our own; librdkafka reads every range
        self.librdkafka_only = fast_path_off("reader", self.options)
        self.brokers = None if self.librdkafka_only else protocol.Brokers(bootstrap, timeout)
        self.pos: dict = {}  # (topic, partition) -> next offset to fetch
        self.buf: dict = {}  # (topic, partition) -> [tables] fetched, not yet read
        self.cover: dict = {}  # (topic, partition) -> where buf (then pos) goes on from
        self._consumer = None
        self.fell_back = 0  # ranges read with librdkafka

    def end_offsets(self, topic: str, timeout: float = 10.0) -> dict[int, tuple[int, int]]:
        """``{partition: (low, end)}``, exact (:func:`protocol.log_ends`, or
        :func:`panjoin.kafka.librdkafka.log_ends` through librdkafka)."""
        if self.librdkafka_only:
            return librdkafka.log_ends(self._librdkafka(), topic, timeout, self.bootstrap)
        return protocol.log_ends(self.brokers, topic, timeout)

    # -- reading

    def read(self, ranges: list, timeout: float | None = None) -> dict:
        """``{(topic, partition): table}`` for the ranges, each in offset order (see
        :data:`SCHEMA`; a record without a key or value has a null there); offsets
        without a record (transaction markers) are skipped."""
        timeout = self.timeout if timeout is None else timeout
        out = {(t, p): [] for t, p, _, _ in ranges}
        todo = {}  # (topic, partition) -> end of its range
        for t, p, a, b in ranges:
            key = (t, p)
            if b <= a:
                continue
            if self.cover.get(key) == a:  # goes on from the last range
                self._take(key, b, out[key])
                if self.pos[key] < b:
                    todo[key] = b
            else:  # a seek: what was fetched ahead is of no use
                self.buf.pop(key, None)
                self.pos[key] = a
                todo[key] = b
            self.cover[key] = b
        if self.librdkafka_only:
            for key in list(todo):
                self._read_with_librdkafka(key, todo, out, timeout)
        deadline = time.monotonic() + timeout
        while todo:
            by_leader: dict = {}
            for key in todo:
                by_leader.setdefault(self.brokers.leader(*key), []).append(key)
            sent = []
            for conn, keys in by_leader.items():
                want: dict = {}
                for t, p in keys:
                    want.setdefault(t, {})[p] = self.pos[(t, p)]
                conn.send_fetch(want, MAX_BYTES, PARTITION_MAX_BYTES)
                sent.append(conn)
            progress = False
            for conn in sent:
                for key, fp in conn.read_fetch().items():
                    if key in todo:
                        progress |= self._absorb(key, fp, todo, out)
            if not progress and time.monotonic() > deadline:
                left = {k: (self.pos[k], e) for k, e in todo.items()}
                raise protocol.ProtocolError(f"reading {left} (next offset, end): no "
                                             f"records came in {timeout:.0f}s")
        return {k: _concat(v) for k, v in out.items()}

    def _take(self, key, end: int, into: list) -> None:
        """Move buffered records below ``end`` into ``into``."""
        parts = self.buf.get(key, [])
        while parts:
            t = parts[0]
            k = int(np.searchsorted(t.column("offset").to_numpy(), end))
            if k == t.num_rows:
                into.append(parts.pop(0))
                continue
            if k:
                into.append(t.slice(0, k))
                parts[0] = t.slice(k)
            break
        if not parts:
            self.buf.pop(key, None)

    def _absorb(self, key, fp: protocol.FetchedPartition, todo: dict, out: dict) -> bool:
        """Decode one partition's answer; True if it moved on."""
        if fp.error:
            raise protocol.ProtocolError(
                f"fetching {key[0]}[{key[1]}] at offset {self.pos[key]}: "
                f"{protocol.error_name(fp.error)}")
        if fp.aborted:  # read committed needs the aborted transactions filtered
            self._read_with_librdkafka(key, todo, out, self.timeout, "transactional records")
            return True
        if fp.records is None or not len(fp.records):
            return False
        buf = np.frombuffer(fp.records, np.uint8)
        start = self.pos[key]
        offs, ts, kstart, klen, vstart, vlen, nxt, flags = rb.scan(buf, start, 1 << 62)
        if len(offs):
            self.buf.setdefault(key, []).append(_table(buf, offs, ts, kstart, klen, vstart,
                                                       vlen))
        moved = nxt > start
        self.pos[key] = nxt
        if flags & (rb.COMPRESSED | rb.OLD_FORMAT):
            self._read_with_librdkafka(key, todo, out, self.timeout,
                                       "compressed or old-format records")
            return True
        if flags & rb.TRUNCATED_RECORD:
            raise protocol.ProtocolError(f"{key[0]}[{key[1]}] near offset {nxt}: a record "
                                         f"batch that does not decode")
        self._take(key, todo[key], out[key])
        if self.pos[key] >= todo[key]:
            del todo[key]
        return moved

    def _librdkafka(self):
        """The librdkafka consumer of the ranges the built-in path does not read."""
        if self._consumer is None:
            self._consumer = librdkafka.consumer(self.bootstrap, self.options,
                                         **{"enable.partition.eof": True})
        return self._consumer

    def _read_with_librdkafka(self, key, todo: dict, out: dict, timeout: float,
                              why: str | None = None) -> None:
        """Read the rest of ``key``'s range (buffered records first) with librdkafka;
        ``why``: the reason to log (none when every range goes this way)."""
        self._take(key, todo[key], out[key])
        a, b = self.pos[key], todo.pop(key)
        msgs = librdkafka.read_range(self._librdkafka(), key[0], key[1], a, b, timeout)
        if why:
            log.info("%s[%d] %d..%d read with librdkafka (%s)", key[0], key[1], a, b, why)
        self.fell_back += 1
        if msgs:
            out[key].append(pa.table([
                pa.array([m.offset() for m in msgs], pa.int64()),
                pa.array([m.timestamp()[1] for m in msgs], pa.int64()),
                pa.array([m.key() for m in msgs], pa.large_binary()),
                pa.array([m.value() for m in msgs], pa.large_binary())], schema=SCHEMA))
        self.buf.pop(key, None)
        self.pos[key] = b

    def unread(self, got: dict) -> None:
        """Give back what :meth:`read` returned, to be read again first: a read-ahead
        that guessed the wrong ranges loses nothing."""
        for key, t in got.items():
            if t.num_rows:
                self.buf[key] = [t] + self.buf.get(key, [])
                self.cover[key] = _first(t)

    def close(self) -> None:
        if self.brokers is not None:
            self.brokers.close()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
