"""Kafka's wire protocol: the few requests that the bulk reader and writer need.

A request is ``int32 size | int16 api_key | int16 api_version | int32 correlation id
| string client_id | body``, and its answer is ``int32 size | int32 correlation id |
body``. All the versions used here predate the "flexible" versions with tagged
fields:

* ApiVersions v0, to check that the broker speaks the others;
* Metadata v1, for the partitions of a topic and their leaders;
* ListOffsets v1, for where partitions begin and (about) end;
* Fetch v4, which returns record batches (magic 2);
* Produce v3, which writes one record batch per partition and request.

Record batches themselves are decoded and encoded by Numba kernels in
:mod:`panjoin.kafka.record_batch`. A connection may have several requests in
flight: Kafka answers them in the order they were sent.

    >>> conn = Connection("127.0.0.1:9092")              # doctest: +SKIP
    >>> conn.metadata(["R"]).partitions["R"]             # doctest: +SKIP
    {0: 1}                                               # partition -> leader node
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS = 0, 1, 2, 3, 18
#: the versions this module writes and reads
VERSIONS = {PRODUCE: 3, FETCH: 4, LIST_OFFSETS: 1, METADATA: 1, API_VERSIONS: 0}
EARLIEST, LATEST = -2, -1  # ListOffsets' timestamps that ask for the log's ends
READ_COMMITTED = 1
CLIENT_ID = b"panjoin"


class ProtocolError(RuntimeError):
    """The broker answered with an error, or in a way this module cannot read."""


class Unsupported(ProtocolError):
    """The broker lacks a request version used here: use the librdkafka path instead."""


#: error codes of the requests used here: name, and whether a retry may succeed
ERRORS = {1: "OFFSET_OUT_OF_RANGE", 2: "CORRUPT_MESSAGE", 3: "UNKNOWN_TOPIC_OR_PARTITION",
          5: "LEADER_NOT_AVAILABLE", 6: "NOT_LEADER_OR_FOLLOWER", 7: "REQUEST_TIMED_OUT",
          10: "MESSAGE_TOO_LARGE", 19: "NOT_ENOUGH_REPLICAS",
          20: "NOT_ENOUGH_REPLICAS_AFTER_APPEND", 29: "TOPIC_AUTHORIZATION_FAILED",
          35: "UNSUPPORTED_VERSION", 87: "INVALID_RECORD"}


def error_name(code: int) -> str:
    return ERRORS.get(code, f"error code {code}")


# --------------------------------------------------------------------------- encoding


def _str(s: str | bytes | None) -> bytes:
    if s is None:
        return b"\xff\xff"
    b = s.encode() if isinstance(s, str) else s
    return struct.pack(">h", len(b)) + b


def _array(items: list[bytes]) -> bytes:
    return struct.pack(">i", len(items)) + b"".join(items)


class Cursor:
    """Reads big-endian fields from an answer, front to back (no copies)."""

    def __init__(self, buf: memoryview):
        self.buf = buf
        self.pos = 0

    def _unpack(self, fmt: str):
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def i8(self) -> int:
        return self._unpack(">b")

    def i16(self) -> int:
        return self._unpack(">h")

    def i32(self) -> int:
        return self._unpack(">i")

    def i64(self) -> int:
        return self._unpack(">q")

    def string(self) -> str | None:
        n = self.i16()
        if n < 0:
            return None
        s = bytes(self.buf[self.pos:self.pos + n]).decode()
        self.pos += n
        return s

    def bytes_(self) -> memoryview | None:
        n = self.i32()
        if n < 0:
            return None
        v = self.buf[self.pos:self.pos + n]
        self.pos += n
        return v

    def array(self, item) -> list | None:
        n = self.i32()
        return None if n < 0 else [item() for _ in range(n)]


# --------------------------------------------------------------------------- answers


@dataclass
class Metadata:
    brokers: dict  # node id -> "host:port"
    partitions: dict  # topic -> {partition: leader node id}
    errors: dict  # topic -> error code, for topics the broker refused


@dataclass
class FetchedPartition:
    error: int
    high_watermark: int
    aborted: list | None  # [(producer id, first offset)] of aborted transactions
    records: memoryview | None  # record batches; the last one may be cut short


# --------------------------------------------------------------------------- a connection


class Connection:
    """One TCP connection to one broker, with requests pipelined over it."""

    def __init__(self, address: str, timeout: float = 60.0):
        host, _, port = address.rpartition(":")
        self.address = address
        try:
            self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        except OSError as e:
            raise ProtocolError(f"cannot connect to Kafka broker {address}: {e}; is it "
                                f"up, and is --bootstrap-servers right?") from e
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.next_id = 0
        self.pending: list[int] = []  # correlation ids in flight, oldest first

    def close(self) -> None:
        self.sock.close()

    # -- framing

    def send(self, api: int, body: bytes | list) -> int:
        """Send a request without waiting; returns its correlation id."""
        cid = self.next_id
        self.next_id += 1
        head = struct.pack(">hhi", api, VERSIONS[api], cid) + _str(CLIENT_ID)
        parts = body if isinstance(body, list) else [body]
        size = len(head) + sum(len(p) for p in parts)
        self.sock.sendall(struct.pack(">i", size) + head)
        for p in parts:
            self.sock.sendall(p)
        self.pending.append(cid)
        return cid

    def _exactly(self, n: int) -> memoryview:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                raise ProtocolError(f"broker {self.address} closed the connection")
            got += k
        return view

    def receive(self) -> Cursor:
        """The answer to the oldest request in flight."""
        size = struct.unpack(">i", self._exactly(4))[0]
        view = self._exactly(size)
        cid = struct.unpack_from(">i", view)[0]
        want = self.pending.pop(0)
        if cid != want:
            raise ProtocolError(f"broker {self.address} answered request {cid}, "
                                f"expected {want}")
        c = Cursor(view)
        c.pos = 4
        return c

    def call(self, api: int, body: bytes) -> Cursor:
        self.send(api, body)
        return self.receive()

    # -- requests

    def check_versions(self) -> None:
        """Raise :class:`Unsupported` unless the broker speaks every version used here."""
        c = self.call(API_VERSIONS, b"")
        err = c.i16()
        ranges = {k: (lo, hi) for k, lo, hi in c.array(lambda: (c.i16(), c.i16(), c.i16()))}
        if err:
            raise Unsupported(f"ApiVersions: {error_name(err)}")
        for api, v in VERSIONS.items():
            lo, hi = ranges.get(api, (1, 0))
            if not lo <= v <= hi:
                raise Unsupported(f"broker {self.address} does not speak version {v} of "
                                  f"API {api} (it speaks {lo}..{hi})")

    def metadata(self, topics: list[str] | None) -> Metadata:
        """Brokers and partition leaders of ``topics``; None asks for every topic (and,
        unlike naming one, never makes a broker create a missing topic)."""
        body = struct.pack(">i", -1) if topics is None else _array([_str(t) for t in topics])
        c = self.call(METADATA, body)
        brokers = {}
        for node, host, port, _rack in c.array(lambda: (c.i32(), c.string(), c.i32(),
                                                          c.string())):
            brokers[node] = f"{host}:{port}"
        c.i32()  # controller
        parts, errors = {}, {}

        def partition():
            err, p, leader = c.i16(), c.i32(), c.i32()
            c.array(c.i32)
            c.array(c.i32)
            return err, p, leader

        for err, name, _internal, ps in c.array(lambda: (c.i16(), c.string(), c.i8(),
                                                           c.array(partition))):
            if err:
                errors[name] = err
            else:
                parts[name] = {p: leader for _e, p, leader in ps}
        return Metadata(brokers, parts, errors)

    def list_offsets(self, want: dict, when: int) -> dict:
        """``{(topic, partition): offset}`` at ``when`` (:data:`EARLIEST` or
        :data:`LATEST`, the high watermark) for ``{topic: [partitions]}``."""
        topics = [_str(t) + _array([struct.pack(">iq", p, when) for p in ps])
                  for t, ps in want.items()]
        c = self.call(LIST_OFFSETS, struct.pack(">i", -1) + _array(topics))
        out = {}
        for _ in range(c.i32()):
            t = c.string()
            for _ in range(c.i32()):
                p, err, _ts, off = c.i32(), c.i16(), c.i64(), c.i64()
                if err:
                    raise ProtocolError(f"ListOffsets {t}[{p}]: {error_name(err)}")
                out[(t, p)] = off
        return out

    def send_fetch(self, want: dict, max_bytes: int, partition_max_bytes: int,
                   max_wait_ms: int = 10) -> int:
        """Fetch ``{topic: {partition: offset}}`` (read committed); see :meth:`read_fetch`."""
        topics = []
        for t, ps in want.items():
            topics.append(_str(t) + _array([struct.pack(">iqi", p, off, partition_max_bytes)
                                             for p, off in ps.items()]))
        body = struct.pack(">iiiib", -1, max_wait_ms, 1, max_bytes, READ_COMMITTED)
        return self.send(FETCH, body + _array(topics))

    def read_fetch(self) -> dict:
        """``{(topic, partition): FetchedPartition}`` of the oldest fetch in flight."""
        c = self.receive()
        c.i32()  # throttle time
        out = {}
        for _ in range(c.i32()):
            t = c.string()
            for _ in range(c.i32()):
                p, err, hw, _lso = c.i32(), c.i16(), c.i64(), c.i64()
                aborted = c.array(lambda: (c.i64(), c.i64()))
                out[(t, p)] = FetchedPartition(err, hw, aborted, c.bytes_())
        return out

    def send_produce(self, batches: dict, acks: int = -1, timeout_ms: int = 30000) -> int:
        """Write ``{topic: {partition: record batch bytes}}``; see :meth:`read_produce`."""
        parts: list = [_str(None) + struct.pack(">hii", acks, timeout_ms, len(batches))]
        for t, ps in batches.items():
            parts.append(_str(t) + struct.pack(">i", len(ps)))
            for p, records in ps.items():
                parts.append(struct.pack(">ii", p, len(records)))
                parts.append(records)
        return self.send(PRODUCE, parts)

    def read_produce(self) -> dict:
        """``{(topic, partition): (error code, base offset)}`` of the oldest produce."""
        c = self.receive()
        out = {}
        for _ in range(c.i32()):
            t = c.string()
            for _ in range(c.i32()):
                p, err, base, _time = c.i32(), c.i16(), c.i64(), c.i64()
                out[(t, p)] = (err, base)
        return out


# --------------------------------------------------------------------------- a cluster


class Brokers:
    """Connections to a Kafka cluster, opened as needed, and each partition's leader:
    what the reader and the writer share. One thread at a time."""

    def __init__(self, bootstrap: str, timeout: float = 60.0):
        self.bootstrap, self.timeout = bootstrap, timeout
        boot = Connection(bootstrap, timeout)
        boot.check_versions()  # raises Unsupported: the caller uses librdkafka then
        self.conns: dict = {None: boot}
        self.addresses: dict = {}  # node id -> "host:port"
        self.topics: dict = {}  # topic -> {partition: leader node id}

    def partitions(self, topic: str) -> dict[int, int]:
        """``{partition: leader node}`` (metadata of every topic: naming a missing one
        may make the broker create it)."""
        if topic not in self.topics:
            md = self.conns[None].metadata(None)
            self.addresses.update(md.brokers)
            self.topics.update(md.partitions)
            if not self.topics.get(topic):
                raise ProtocolError(f"topic {topic!r} does not exist on {self.bootstrap}; "
                                    f"create it first (panjoin kafka produce creates its "
                                    f"topics)")
        return self.topics[topic]

    def leader(self, topic: str, partition: int) -> Connection:
        node = self.partitions(topic).get(partition)
        if node is None:
            raise ProtocolError(f"topic {topic!r} has no partition {partition}")
        if node not in self.conns:
            self.conns[node] = Connection(self.addresses[node], self.timeout)
        return self.conns[node]

    def close(self) -> None:
        for c in self.conns.values():
            c.close()
        self.conns.clear()


# --------------------------------------------------------------------------- log ends

_BATCH = struct.Struct(">qi")  # base offset, batch length (after these 12 bytes)


def next_offset(records, start: int) -> int:
    """One past the last complete record batch (magic 2) in a fetch's ``records``, or
    ``start`` if none: where a following fetch would begin. Headers only: base offset
    at byte 0, length at 8, magic at 16, last offset delta at 23."""
    buf = memoryview(records) if records is not None else memoryview(b"")
    pos, nxt = 0, start
    while pos + 61 <= len(buf):
        base, length = _BATCH.unpack_from(buf, pos)
        if pos + 12 + length > len(buf) or buf[pos + 16] != 2:
            break
        nxt = max(nxt, base + struct.unpack_from(">i", buf, pos + 23)[0] + 1)
        pos += 12 + length
    return nxt


def log_ends(brokers: Brokers, topic: str, timeout: float = 10.0) -> dict[int, tuple[int, int]]:
    """``{partition: (low, end)}``: the first offset and one past the last record.

    ListOffsets gives both ends, but some brokers' high watermark is short (Tansu's
    is the last produce batch's first offset + 1), so fetches from one record
    before it go on until one returns nothing: ``end`` is where the log really
    ends, as librdkafka's end-of-partition event would say."""
    by_leader: dict = {}
    for p in sorted(brokers.partitions(topic)):
        by_leader.setdefault(brokers.leader(topic, p), []).append(p)
    out = {}
    deadline = time.monotonic() + timeout
    for conn, parts in by_leader.items():
        lo = conn.list_offsets({topic: parts}, EARLIEST)
        hi = conn.list_offsets({topic: parts}, LATEST)
        pos = {p: max(lo[(topic, p)], hi[(topic, p)] - 1, 0) for p in parts}
        end = {p: max(hi[(topic, p)], 0) for p in parts}
        todo = set(parts)
        while todo:
            conn.send_fetch({topic: {p: pos[p] for p in todo}}, 1 << 20, 1 << 20)
            for (_, p), fp in conn.read_fetch().items():
                if fp.error:
                    raise ProtocolError(
                        f"{topic}[{p}] at offset {pos[p]}: {error_name(fp.error)}")
                nxt = next_offset(fp.records, pos[p])
                if nxt > pos[p]:
                    pos[p] = nxt
                else:
                    end[p] = max(end[p], pos[p])
                    todo.discard(p)
            if todo and time.monotonic() > deadline:
                raise ProtocolError(f"{topic} partitions {sorted(todo)}: the log's end not "
                                    f"found in {timeout:.0f}s")
        for p in parts:
            out[p] = (max(lo[(topic, p)], 0), end[p])
    return out
