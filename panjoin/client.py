"""Python client of the manager endpoint.

    >>> from panjoin.client import Client                       # doctest: +SKIP
    >>> with Client("127.0.0.1:50050") as c:                    # doctest: +SKIP
    ...     r_id, s_id, late = c.join(events, window="count:1M,1M", predicate="band:10")
    ...     res = c.join(events, window="count:1M,1M", predicate="eq")   # with payloads
    ...     res.r_payload, res.s_payload   # the pairs' payloads

A join belongs to the client that opened it: :meth:`Client.open` keeps the token the
manager returned with the join id and sends it with every later call on that id (a
Join stream, Status, Close); :meth:`Client.ref` is the JoinRef to pass to the stub.

``join`` keeps the events' payloads here and joins them onto the pairs by id, so the
manager and the workers never hold them (a client of ``stream`` may still send
payloads in its JoinInputs; the manager then keeps them for it). As in the
in-process engine, strings in give strings out: string payloads come back as
large_string, binary ones as large_binary (``stream``'s answers are always binary:
the manager keeps bytes).

A join opened with ``max_latency_ms`` streams (issue 27): the manager pushes its pairs
as they complete, between the answers to the inputs. :meth:`Client.live` is the
session for it: ``push`` never waits, ``poll`` returns what has arrived::

    >>> jid = c.open("count:1M,1M", "eq", max_latency_ms=5)     # doctest: +SKIP
    >>> with c.live(jid) as live:                               # doctest: +SKIP
    ...     live.push(chunk)             # returns at once
    ...     out = live.poll()            # pairs so far (an Output), never blocks
    ...     live.flush()                 # end of input: every pair is in the next poll()
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from types import SimpleNamespace
from typing import NamedTuple

import grpc
import numpy as np
import pyarrow as pa

from panjoin.config import DEFAULT_INDEX
from panjoin.proto.panjoin.v1 import manager_pb2, manager_pb2_grpc
from panjoin.result_sources import ResultSources
from panjoin.security import Security, current
from panjoin.security import channel as make_channel
from panjoin.wire import (
    PAYLOAD_TYPE,
    from_array,
    from_payloads,
    narrow,
    to_array,
    to_payloads,
)

#: a live join sends the chunks pushed meanwhile as one message, up to this many tuples
MAX_COALESCE = 1 << 18
#: and sends at most one message per this many ms (see LiveJoin)
LINGER_MS = 1.0


_NO_IDS = np.zeros(0, np.int64)
_NO_IDS.flags.writeable = False


class Output(NamedTuple):
    """The manager's answer to one input batch."""

    batch_id: int
    r_id: np.ndarray
    s_id: np.ndarray
    r_payload: pa.Array | None  # large_binary, one per pair; None without payloads
    s_payload: pa.Array | None
    late_stream: np.ndarray  # uint8, 0 = R, 1 = S
    late_id: np.ndarray
    duplicate: bool  # a replayed batch id, not applied again
    pushed: bool = False  # sent by the manager on its own (a streaming join), batch_id 0


class Result(NamedTuple):
    """A whole join's pairs; unpacks as ``r_id, s_id, late`` (payloads by name)."""

    r_id: np.ndarray
    s_id: np.ndarray
    late: dict
    #: large_string for string payloads, else large_binary (as the in-process engine)
    r_payload: pa.Array | None = None
    s_payload: pa.Array | None = None

    def __iter__(self):
        return iter((self.r_id, self.s_id, self.late))


def join_input(join_id: str, batch_id: int, chunk, flush: bool = False,
               watermark: int | None = None, token: str = "", *, ids: bool = True,
               ts: bool = True) -> manager_pb2.JoinInput:
    """The JoinInput of one chunk (anything with stream/id/key/ts arrays and optionally
    ``payload`` and ``key2``); ``watermark``: the client's event-time watermark;
    ``token``: the join's (OpenReply.token). ``ids=False`` leaves the id column out (a
    join opened with ``seq_ids``), ``ts=False`` the ts column (a count window's join
    never reads it)."""
    # int64 columns of span < 2^32 as uint32 offsets: 13 bytes a tuple, not 25
    cols = {"key": narrow(np.asarray(chunk.key))}
    if ids:
        cols["id"] = narrow(np.asarray(chunk.id, np.int64))
    if ts:
        cols["ts"] = narrow(np.asarray(chunk.ts, np.int64))
    msg = manager_pb2.JoinInput(
        join_id=join_id, token=token, batch_id=batch_id,
        stream=to_array(np.asarray(chunk.stream, np.uint8)), flush=flush,
        **{k: to_array(a) for k, (a, _) in cols.items()},
        **{f"{k}_base": base for k, (_, base) in cols.items()})
    to_payloads(getattr(chunk, "payload", None), msg.payload)
    if getattr(chunk, "key2", None) is not None:
        msg.key2.CopyFrom(to_array(np.asarray(chunk.key2, np.float64)))
    if watermark is not None:
        msg.watermark = watermark
    return msg


def output_of(out: manager_pb2.JoinOutput, sources: ResultSources | None = None) -> Output:
    """A JoinOutput's contents; with results past the manager, its references resolved
    by the join's ``sources`` (:mod:`panjoin.result_sources`)."""
    if out.sources:
        sources.add(out.sources)
    refs = from_array(out.ref_source, "<i8")
    if refs.size:
        r, s = sources.take(refs, from_array(out.ref_command, "<i8"),
                            from_array(out.ref_pairs, "<i8"))
    else:
        r, s = from_array(out.r_id, "<i8"), from_array(out.s_id, "<i8")
    return Output(out.batch_id, r, s, from_payloads(out.r_payload, r.size),
                  from_payloads(out.s_payload, s.size), from_array(out.late_stream, "|u1"),
                  from_array(out.late_id, "<i8"), out.duplicate, out.pushed)


def fold(outs: list[Output], last: Output | None = None) -> Output:
    """Outputs as one: their pairs, payloads and late ids in order, with the batch id
    and flags of ``last`` (appended to ``outs``), else those of a pushed output."""
    if last is not None:
        outs = [*outs, last]
    if len(outs) == 1:
        return outs[0]

    def cat(k):
        return np.concatenate([o[k] for o in outs])

    def pays(k):
        parts = [o[k] for o in outs if o[k] is not None]
        return pa.concat_arrays(parts) if parts else None

    bid, dup, pushed = (last.batch_id, last.duplicate, False) if last else (0, False, True)
    return Output(bid, cat(1), cat(2), pays(3), pays(4), cat(5), cat(6), dup, pushed)


class JoinSession:
    """One open join's long-lived Join stream, one batch at a time: :meth:`send` puts a
    JoinInput on the stream and returns its :class:`Output` (the Spark pipeline sends
    each micro-batch so, flushed, and checks its answer)."""

    def __init__(self, client: Client, join_id: str):
        self.client = client
        self.join_id = join_id
        self._q: queue.Queue = queue.Queue()
        self._out = client.stub.Join(iter(self._q.get, None))

    def send(self, batch_id: int, chunk, flush: bool = True,
             watermark: int | None = None) -> Output:
        """The answer to this batch; on a streaming join, with the pairs the manager
        pushed before it folded in (:func:`fold`)."""
        self.client.check_size(chunk)
        self._q.put(self.client.input_of(self.join_id, batch_id, chunk, flush, watermark))
        pushed = []
        while (out := output_of(next(self._out), self.client.direct.get(self.join_id))).pushed:
            pushed.append(out)
        if out.batch_id != batch_id:
            raise RuntimeError(f"manager answered batch {out.batch_id} to batch {batch_id}")
        return fold(pushed, out) if pushed else out

    def close(self) -> None:
        """End the stream and close the join (which the stream's end may have done)."""
        self._q.put(None)
        try:
            self.client.stub.Close(self.client.ref(self.join_id), timeout=30)
        except grpc.RpcError:
            pass
        self.client.drop_sources(self.join_id)


def _concat(chunks):
    """Chunks (stream/id/key/ts arrays, maybe key2 and payload) as one."""
    if len(chunks) == 1:
        return chunks[0]

    def col(name):
        parts = [getattr(c, name, None) for c in chunks]
        return None if parts[0] is None else parts

    pays = col("payload")
    key2 = col("key2")
    return SimpleNamespace(
        stream=np.concatenate([c.stream for c in chunks]),
        id=np.concatenate([c.id for c in chunks]), key=np.concatenate([c.key for c in chunks]),
        ts=np.concatenate([c.ts for c in chunks]),
        key2=np.concatenate(key2) if key2 else None,
        payload=pa.concat_arrays([pa.array(p) if not isinstance(p, pa.Array) else p
                                  for p in pays]) if pays else None)


class LiveJoin:
    """A streaming join's session (a join opened with ``max_latency_ms``): :meth:`push`
    hands chunks to the stream and returns at once, :meth:`poll` returns the pairs that
    have arrived (pushed by the manager as they complete, or in answers) and never
    blocks, :meth:`flush` ends the input and waits until every pair has arrived.

    Chunks pushed within ``linger_ms`` of the last message, or while the stream is busy
    sending, go out together as one JoinInput (Kafka's ``linger.ms``): a fast source
    pushing a few tuples at a time would otherwise cost the manager a message, an
    engine push and an answer each (some 0.3 ms of its CPU), more than the tuples
    themselves. Batch ids are numbered per message from ``first_batch_id``. A reader
    thread takes the outputs off the stream."""

    def __init__(self, client: Client, join_id: str, first_batch_id: int = 1,
                 linger_ms: float = LINGER_MS):
        self.client = client
        self.join_id = join_id
        self._cond = threading.Condition()
        self._chunks: list = []  # pushed, not yet sent
        self._flush = False  # a flush is asked for: the message with the last chunk flushes
        self._flush_id: int | None = None  # the batch id that carried it
        self._ended = False
        self._next_id = first_batch_id
        self._sent_id = first_batch_id - 1  # the last batch id sent
        self._answered_id = first_batch_id - 1  # the last batch id answered
        self._outs: list[Output] = []  # arrived, not yet polled
        self._linger = linger_ms / 1000.0
        self._last_sent = 0.0  # time.monotonic() of the last message
        self._error: grpc.RpcError | None = None
        self._call = client.stub.Join(self._inputs())
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"live-join-{join_id}")
        self._reader.start()

    def _inputs(self):
        """The request stream: waits for pushes, sends all that are waiting as one."""
        while True:
            with self._cond:
                while not (self._chunks or self._flush or self._ended):
                    self._cond.wait()
                if not (self._chunks or self._flush):
                    return  # ended: the stream half-closes
                hold = self._last_sent + self._linger - time.monotonic()
                if hold > 0 and not (self._flush or self._ended):
                    self._cond.wait(hold)  # what is pushed meanwhile goes along
                # what waits goes out together, up to MAX_COALESCE tuples a message and
                # half the message limit (each chunk alone is below it: push checked)
                k, n, size = 0, 0, 0
                cap = self.client.security.max_message_bytes // 2
                while k < len(self._chunks) and (k == 0 or (
                        n < MAX_COALESCE and size + input_bytes(self._chunks[k]) <= cap)):
                    n += len(self._chunks[k].id)
                    size += input_bytes(self._chunks[k])
                    k += 1
                chunks, self._chunks = self._chunks[:k], self._chunks[k:]
                flush = self._flush and not self._chunks
                self._flush = self._flush and not flush
                bid = self._next_id
                self._next_id += 1
                self._sent_id = bid
                if flush:
                    self._flush_id = bid
                self._last_sent = time.monotonic()
            if chunks:
                msg = self.client.input_of(self.join_id, bid, _concat(chunks), flush)
            else:
                msg = manager_pb2.JoinInput(join_id=self.join_id, batch_id=bid, flush=flush,
                                            token=self.client.token(self.join_id))
            yield msg

    def _read(self) -> None:
        try:
            sources = self.client.direct.get(self.join_id)
            for pb in self._call:
                out = output_of(pb, sources)
                with self._cond:
                    self._outs.append(out)
                    if not out.pushed:
                        self._answered_id = out.batch_id
                    self._cond.notify_all()
        except grpc.RpcError as e:
            with self._cond:
                if not self._ended:
                    self._error = e
                self._cond.notify_all()

    def push(self, chunk) -> None:
        """Queue an arrival-ordered chunk (as :meth:`Client.stream` takes); never waits."""
        with self._cond:
            self._raise()
            if self._ended:
                raise RuntimeError("this live join is closed")
            self.client.check_size(chunk)
            self._chunks.append(chunk)
            self._cond.notify_all()

    def poll(self) -> Output:
        """Everything that arrived since the last poll, as one :class:`Output` (pairs,
        payloads, late ids); never blocks."""
        with self._cond:
            self._raise()
            outs, self._outs = self._outs, []
        if not outs:
            z = np.zeros(0, np.int64)
            return Output(0, z, z, None, None, np.zeros(0, np.uint8), z, False, True)
        return fold(outs)

    def wait(self, timeout: float) -> bool:
        """Block until an output has arrived that :meth:`poll` has not returned (True),
        the stream failed, or ``timeout`` seconds passed (False): a caller with nothing
        else to do takes its pairs the moment they arrive, not at its next poll."""
        with self._cond:
            return self._cond.wait_for(lambda: bool(self._outs) or self._error is not None,
                                       max(timeout, 0.0)) and bool(self._outs)

    def pending(self) -> bool:
        """Inputs pushed or sent whose answers have not arrived."""
        with self._cond:
            return bool(self._chunks) or self._answered_id < self._sent_id

    def flush(self, timeout: float | None = 600.0) -> None:
        """End of input: the manager processes everything buffered and in flight; returns
        once its answer is here (every pair is then in the next :meth:`poll`)."""
        with self._cond:
            self._raise()
            self._flush, self._flush_id = True, None
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: self._error is not None or (
                    self._flush_id is not None and self._answered_id >= self._flush_id),
                    timeout):
                raise TimeoutError(f"no answer to the flush within {timeout} s")
            self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """End the stream, close the join (which the stream's end may have done) and
        stop the reader thread."""
        with self._cond:
            self._ended = True
            self._cond.notify_all()
        try:
            self.client.stub.Close(self.client.ref(self.join_id), timeout=30)
        except grpc.RpcError:
            pass
        self._reader.join(30)
        if self._reader.is_alive():  # the server never ended the stream
            self._call.cancel()
            self._reader.join(5)
        self.client.drop_sources(self.join_id)

    def __enter__(self) -> LiveJoin:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def payloads_of(events, stream: int, ids: np.ndarray) -> pa.Array:
    """The payloads of ``events``' tuples of ``stream`` with ``ids``, in that order
    (:func:`payload_lookup`, for one look)."""
    return payload_lookup(events)(stream, ids)


def payload_lookup(events):
    """``take(stream, ids)``: the payloads of ``events``' tuples of ``stream`` with
    ``ids``, in that order: each stream's ids sorted once (at its first look), then one
    binary search per id. Strings stay text (large_string), anything else is
    large_binary: the types the in-process engine gives for the same input, so a file
    joined on a cluster or in-process is the same file."""
    pay = events.payload
    if isinstance(pay, pa.ChunkedArray):
        pay = pay.combine_chunks()
    pay = pa.array(pay)
    text = pa.types.is_string(pay.type) or pa.types.is_large_string(pay.type)
    pay = pay.cast(pa.large_string() if text else PAYLOAD_TYPE)
    sorted_ids = {}

    def take(stream: int, ids: np.ndarray) -> pa.Array:
        if stream not in sorted_ids:
            rows = np.flatnonzero(events.stream == stream)
            order = np.argsort(events.id[rows], kind="stable")
            sorted_ids[stream] = rows[order], events.id[rows][order]
        rows, keys = sorted_ids[stream]
        return pay.take(pa.array(rows[np.searchsorted(keys, ids)]))

    return take


def rows_of(events, rows: np.ndarray) -> SimpleNamespace:
    """The chunk of ``events``' ``rows`` (stream, id, key, ts and key2; no payloads)."""
    key2 = getattr(events, "key2", None)
    if rows.size and rows[-1] - rows[0] + 1 == rows.size:  # a run of rows: views
        rows = slice(int(rows[0]), int(rows[-1]) + 1)
    return SimpleNamespace(stream=events.stream[rows], id=events.id[rows],
                           key=events.key[rows], ts=events.ts[rows],
                           key2=None if key2 is None else key2[rows])


def seq_ids_of(events) -> tuple[np.ndarray, np.ndarray]:
    """Each stream's ids in arrival order: a tuple's id is ``ids[x][seq]`` (the pairs of
    a join opened with ``seq_ids`` name tuples by seq).

        >>> ev = SimpleNamespace(stream=np.array([0, 1, 0]), id=np.array([7, 8, 9]))
        >>> [a.tolist() for a in seq_ids_of(ev)]
        [[7, 9], [8]]
    """
    ids = np.asarray(events.id, np.int64)
    s = np.asarray(events.stream) != 0
    return np.compress(~s, ids), np.compress(s, ids)  # (a third of a mask's time)


def with_payloads(events, r: np.ndarray, s: np.ndarray, late: dict, lookup=None) -> Result:
    """The :class:`Result` of pairs ``r``, ``s``, with ``events``' payloads joined on by
    id where it has them (``lookup``: a :func:`payload_lookup` of ``events`` to reuse)."""
    if getattr(events, "payload", None) is None:
        return Result(r, s, late)
    take = lookup or payload_lookup(events)
    return Result(r, s, late, take(0, r), take(1, s))


def answer_writer(events, out, lock=None):
    """``each(output)`` for :meth:`Client.run_join`: an answer's pairs, with ``events``'
    payloads where it has them (each stream's ids sorted once), written to ``out`` (a
    :class:`panjoin.events.PairsWriter`), under ``lock`` where several threads answer."""
    lookup = payload_lookup(events) if getattr(events, "payload", None) is not None else None
    lock = lock or contextlib.nullcontext()

    def each(o: Output) -> None:
        res = with_payloads(events, o.r_id, o.s_id, {}, lookup)
        with lock:
            out.write(res.r_id, res.s_id, res.r_payload, res.s_payload)

    return each


def input_bytes(chunk) -> int:
    """About the size of ``chunk``'s JoinInput on the wire (its arrays and payloads), at
    most: int64 columns whose span fits 32 bits go at half (:func:`join_input`)."""
    n = len(chunk.id)
    size = n * (1 + 8 + 8) + np.asarray(chunk.key).nbytes
    if getattr(chunk, "key2", None) is not None:
        size += 8 * n
    pay = getattr(chunk, "payload", None)
    if pay is not None:
        size += 8 * (n + 1) + (pay.nbytes if isinstance(pay, pa.Array | pa.ChunkedArray)
                               else sum(len(p) for p in pay))
    return size


class Client:
    """A connection to the manager endpoint at ``address`` under ``security`` (None:
    the process's, :func:`panjoin.security.use`): TLS, the token, the message limit."""

    def __init__(self, address: str, security: Security | None = None):
        self.address = address
        self.security = security or current()
        self.channel = make_channel(address, self.security, token=True)
        self.stub = manager_pb2_grpc.ManagerStub(self.channel)
        self.tokens: dict[str, str] = {}  # join id -> its token (OpenReply.token)
        #: join id -> (its tuples' ids are seqs, it has a count window): the columns
        #: its JoinInputs leave out (:meth:`input_of`)
        self.columns: dict[str, tuple[bool, bool]] = {}
        #: join id -> where its pairs come from, for joins with results past the manager
        self.direct: dict[str, ResultSources] = {}

    def check_size(self, chunk) -> None:
        """Refuse a chunk too large for one message (a ValueError that says what to do):
        the manager would refuse it, and its batch id cannot be split."""
        size, cap = input_bytes(chunk), self.security.max_message_bytes
        if size > cap * 0.99:  # a margin for the message's own framing
            raise ValueError(
                f"a chunk of {len(chunk.id):,} tuples is {size / 2**20:.1f} MiB, over the "
                f"{cap >> 20} MiB message limit; send smaller chunks (the pipeline: "
                "--max-offsets-per-trigger) or raise --max-message-mb on the manager and "
                "the client")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        for rs in self.direct.values():
            rs.close()
        self.direct.clear()
        self.channel.close()

    def open(self, window: str, predicate: str, index: str = DEFAULT_INDEX, **settings) -> str:
        """Open a join; settings are OpenRequest fields (batch_size, subwindow_size, ...).
        Returns its id; its token stays here (:meth:`token`). ``direct_results=True`` asks
        for results past the manager (the workers send the pairs here); where the manager
        does not grant it (:attr:`why_not_direct`), or a worker cannot be subscribed to
        (e.g. it asks for a client certificate this client lacks), the pairs come through
        the manager as usual."""
        req = manager_pb2.OpenRequest(window=window, predicate=predicate, index=index,
                                      **settings)
        reply = self.stub.Open(req)
        self.why_not_direct = reply.direct_results_why
        try:
            return self.adopt(reply)
        except (grpc.RpcError, TimeoutError) as e:
            why = f"{e.code().name}: {e.details()}" if isinstance(e, grpc.RpcError) else str(e)
            self.why_not_direct = f"a worker's pairs could not be subscribed to ({why})"
            with contextlib.suppress(grpc.RpcError):
                self.stub.Close(manager_pb2.JoinRef(join_id=reply.join_id, token=reply.token),
                                timeout=30)
            req.direct_results = False
            return self.adopt(self.stub.Open(req))

    #: why the last :meth:`open` that asked for results past the manager did not get them
    why_not_direct = ""

    def adopt(self, reply: manager_pb2.OpenReply) -> str:
        """Keep the token of a join opened through the stub (and, for results past the
        manager, subscribe to its result sources); returns its id."""
        if reply.direct_results:
            rs = ResultSources(self.security)
            try:
                rs.add(reply.sources)
            except BaseException:
                rs.close()
                raise
            self.direct[reply.join_id] = rs
        self.tokens[reply.join_id] = reply.token
        self.columns[reply.join_id] = (reply.settings.seq_ids,
                                       reply.settings.window.strip().startswith("count"))
        return reply.join_id

    def token(self, join_id: str) -> str:
        """The token of a join this client opened ("" for another's: the manager then
        refuses the call with PERMISSION_DENIED)."""
        return self.tokens.get(join_id, "")

    def ref(self, join_id: str) -> manager_pb2.JoinRef:
        """The JoinRef of ``join_id`` with its token, for Status and Close."""
        return manager_pb2.JoinRef(join_id=join_id, token=self.token(join_id))

    def close_join(self, join_id: str, timeout: float | None = None):
        """Flush and close a join; its final JoinStatus."""
        try:
            st = self.stub.Close(self.ref(join_id), timeout=timeout)
        finally:
            self.drop_sources(join_id)
        self.tokens.pop(join_id, None)
        self.columns.pop(join_id, None)
        return st

    def drop_sources(self, join_id: str) -> None:
        """End a closed join's subscriptions to its workers' pairs, if it had any."""
        rs = self.direct.pop(join_id, None)
        if rs is not None:
            rs.close()

    def stream(self, join_id: str, chunks, first_batch_id: int = 1, flush_last: bool = True):
        """Send arrival-ordered chunks (EventTables, or anything with stream/id/key/ts
        arrays and optionally ``payload``; a chunk with a ``watermark`` attribute sends
        that event-time watermark, see :func:`join_input`); yields one :class:`Output` per
        chunk, the last one flushed (``flush_last``), and on a streaming join the outputs
        the manager pushes between them (``pushed``, batch id 0). Chunk i gets batch id
        ``first_batch_id + i``; the manager applies a batch id at most once, so a replay
        after a crash is safe. The chunks stream without waiting for answers (see
        :meth:`session` for one at a time, :meth:`live` to push and poll). A list is
        checked against the message limit before anything is sent; an iterator is taken
        as it yields (one chunk ahead, to flag the last), its chunks sized by the caller."""
        if isinstance(chunks, list | tuple):
            for ch in chunks:
                self.check_size(ch)
        sources = self.direct.get(join_id)
        for out in self.stub.Join(self._inputs(join_id, chunks, first_batch_id, flush_last)):
            yield output_of(out, sources)

    def _inputs(self, join_id: str, chunks, first_batch_id: int, flush_last: bool):
        """The JoinInputs of ``chunks``, the last one flushed when ``flush_last``."""
        end = object()
        it = iter(chunks)
        ch, bid = next(it, end), first_batch_id
        while ch is not end:
            nxt = next(it, end)
            yield self.input_of(join_id, bid, ch, flush_last and nxt is end,
                                getattr(ch, "watermark", None))
            ch, bid = nxt, bid + 1

    def input_of(self, join_id: str, batch_id: int, chunk, flush: bool = False,
                 watermark: int | None = None) -> manager_pb2.JoinInput:
        """The JoinInput of ``chunk`` for ``join_id`` (:func:`join_input`), with the
        columns the join reads: no ids where it numbers the tuples (``seq_ids``
        granted), no ts on a count window (4 bytes a tuple each)."""
        seq_ids, count = self.columns.get(join_id, (False, False))
        return join_input(join_id, batch_id, chunk, flush, watermark, self.token(join_id),
                          ids=not seq_ids, ts=not count)

    def session(self, join_id: str) -> JoinSession:
        """A long-lived Join stream on ``join_id`` that sends one batch at a time."""
        return JoinSession(self, join_id)

    def live(self, join_id: str, first_batch_id: int = 1,
             linger_ms: float = LINGER_MS) -> LiveJoin:
        """A streaming session on ``join_id`` (opened with ``max_latency_ms``): push
        without waiting, poll the pairs that have arrived (:class:`LiveJoin`)."""
        return LiveJoin(self, join_id, first_batch_id, linger_ms)

    def join(self, events, window: str, predicate: str, index: str = DEFAULT_INDEX,
             chunk: int = 1 << 18, out=None, **settings) -> Result:
        """Join a whole event table; returns a :class:`Result` (which unpacks as
        ``r_id, s_id, late_ids_by_stream``). ``out``: a
        :class:`panjoin.events.PairsWriter` (anything with ``write(r_id, s_id,
        r_payload, s_payload)``) that takes each answer's pairs as it arrives, so they
        are never all held here; the Result then has the late ids and no pairs.

        ``seq_ids=True`` (a count window) keeps the ids here: the JoinInputs carry none,
        the join names each tuple by its seq (its row among its stream's events) and
        the pairs are mapped back here, one gather an id: less for the manager to carry
        (its id column's passes and 8 bytes a tuple on the wire), more for this process
        where a tuple has many partners."""
        join_id = self.open(window, predicate, index, **settings)
        by_seq = seq_ids_of(events) if self.columns[join_id][0] else None
        n = len(events)
        step = self.chunk_rows(chunk)
        chunks = [rows_of(events, np.arange(a, min(n, a + step)))
                  for a in range(0, max(1, n), step)]  # no payloads: they stay here
        each = None if out is None else answer_writer(events, out)
        if by_seq is not None and each is not None:
            write = each

            def each(o: Output) -> None:  # seqs -> ids, then as any answer
                write(o._replace(r_id=by_seq[0].take(o.r_id), s_id=by_seq[1].take(o.s_id)))
        outs = self.run_join(join_id, chunks, each)
        ls = np.concatenate([o.late_stream for o in outs])
        li = np.concatenate([o.late_id for o in outs])
        r = np.concatenate([o.r_id for o in outs])
        s = np.concatenate([o.s_id for o in outs])
        if by_seq is not None and out is None:
            r, s = by_seq[0].take(r), by_seq[1].take(s)
        late = {"R": li[ls == 0], "S": li[ls == 1]}
        return Result(r, s, late) if out is not None else with_payloads(events, r, s, late)

    def chunk_rows(self, chunk: int) -> int:
        """Rows a chunk may hold below the message limit: 33 bytes a tuple without
        payloads (stream, id, key, ts, key2), and a margin."""
        return max(1, min(chunk, self.security.max_message_bytes // 40))

    def run_join(self, join_id: str, chunks, each=None) -> list[Output]:
        """Stream ``chunks`` to an open join (:meth:`stream`, the last flushed) and close
        it; its outputs. ``each(output)``, where given, takes each output's pairs as it
        arrives, and the outputs returned keep only their late ids. A join that fails is
        closed at once, not at the manager's idle timeout."""
        try:
            outs = []
            for o in self.stream(join_id, chunks):
                if each is not None:
                    each(o)
                    o = o._replace(r_id=_NO_IDS, s_id=_NO_IDS, r_payload=None, s_payload=None)
                outs.append(o)
            self.close_join(join_id)
        except BaseException:
            try:
                self.close_join(join_id, timeout=30)
            except grpc.RpcError:
                pass
            raise
        return outs

    def status(self, join_id: str):
        return self.stub.Status(self.ref(join_id))
