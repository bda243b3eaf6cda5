"""Python client of the manager endpoint.

    >>> from panjoin.client import Client                       # doctest: +SKIP
    >>> with Client("127.0.0.1:50050") as c:                    # doctest: +SKIP
    ...     r_id, s_id, late = c.join(events, window="count:1M,1M", predicate="band:10")
    ...     res = c.join(events, window="count:1M,1M", predicate="eq")   # with payloads
    ...     res.r_payload, res.s_payload   # the pairs' payloads

``join`` keeps the events' payloads here and joins them onto the pairs by id, so the
manager and the workers never hold them (a client of ``stream`` may still send
payloads in its JoinInputs; the manager then keeps them for it).
"""

from __future__ import annotations

import queue
from types import SimpleNamespace
from typing import NamedTuple

import grpc
import numpy as np
import pyarrow as pa

from panjoin.proto.panjoin.v1 import manager_pb2, manager_pb2_grpc
from panjoin.serving import OPTIONS
from panjoin.wire import PAYLOAD_TYPE, from_array, from_payloads, to_array, to_payloads


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


class Result(NamedTuple):
    """A whole join's pairs; unpacks as ``r_id, s_id, late`` (payloads by name)."""

    r_id: np.ndarray
    s_id: np.ndarray
    late: dict
    r_payload: pa.Array | None = None
    s_payload: pa.Array | None = None

    def __iter__(self):
        return iter((self.r_id, self.s_id, self.late))


def join_input(join_id: str, batch_id: int, chunk, flush: bool = False,
               watermark: int | None = None) -> manager_pb2.JoinInput:
    """The JoinInput of one chunk (anything with stream/id/key/ts arrays and optionally
    ``payload`` and ``key2``); ``watermark``: the client's event-time watermark."""
    msg = manager_pb2.JoinInput(
        join_id=join_id, batch_id=batch_id, stream=to_array(np.asarray(chunk.stream, np.uint8)),
        id=to_array(np.asarray(chunk.id, np.int64)), key=to_array(np.asarray(chunk.key)),
        ts=to_array(np.asarray(chunk.ts, np.int64)), flush=flush)
    to_payloads(getattr(chunk, "payload", None), msg.payload)
    if getattr(chunk, "key2", None) is not None:
        msg.key2.CopyFrom(to_array(np.asarray(chunk.key2, np.float64)))
    if watermark is not None:
        msg.watermark = watermark
    return msg


def output_of(out: manager_pb2.JoinOutput) -> Output:
    r, s = from_array(out.r_id, "<i8"), from_array(out.s_id, "<i8")
    return Output(out.batch_id, r, s, from_payloads(out.r_payload, r.size),
                  from_payloads(out.s_payload, s.size), from_array(out.late_stream, "|u1"),
                  from_array(out.late_id, "<i8"), out.duplicate)


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
        self._q.put(join_input(self.join_id, batch_id, chunk, flush, watermark))
        out = output_of(next(self._out))
        if out.batch_id != batch_id:
            raise RuntimeError(f"manager answered batch {out.batch_id} to batch {batch_id}")
        return out

    def close(self) -> None:
        """End the stream and close the join (which the stream's end may have done)."""
        self._q.put(None)
        try:
            self.client.stub.Close(manager_pb2.JoinRef(join_id=self.join_id), timeout=30)
        except grpc.RpcError:
            pass


def payloads_of(events, stream: int, ids: np.ndarray) -> pa.Array:
    """The payloads (large_binary) of ``events``' tuples of ``stream`` with ``ids``, in
    that order: a sort of the stream's ids and one binary search per id."""
    rows = np.flatnonzero(events.stream == stream)
    order = np.argsort(events.id[rows], kind="stable")
    pos = np.searchsorted(events.id[rows][order], ids)
    pay = events.payload
    if isinstance(pay, pa.ChunkedArray):
        pay = pay.combine_chunks()
    return pa.array(pay).cast(PAYLOAD_TYPE).take(pa.array(rows[order[pos]]))


class Client:
    def __init__(self, address: str):
        self.address = address
        self.channel = grpc.insecure_channel(address, options=OPTIONS)
        self.stub = manager_pb2_grpc.ManagerStub(self.channel)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self.channel.close()

    def open(self, window: str, predicate: str, index: str = "bisort", **settings) -> str:
        """Open a join; settings are OpenRequest fields (batch_size, subwindow_size, ...)."""
        reply = self.stub.Open(manager_pb2.OpenRequest(window=window, predicate=predicate,
                                                       index=index, **settings))
        return reply.join_id

    def stream(self, join_id: str, chunks, first_batch_id: int = 1, flush_last: bool = True):
        """Send arrival-ordered chunks (EventTables, or anything with stream/id/key/ts
        arrays and optionally ``payload``); yields one :class:`Output` per chunk, the last
        one flushed (``flush_last``). Chunk i gets batch id ``first_batch_id + i``; the
        manager applies a batch id at most once, so a replay after a crash is safe. The
        chunks stream without waiting for answers (see :meth:`session` for one at a time)."""
        chunks = list(chunks)
        inputs = (join_input(join_id, first_batch_id + i, ch,
                             flush=flush_last and i == len(chunks) - 1)
                  for i, ch in enumerate(chunks))
        for out in self.stub.Join(inputs):
            yield output_of(out)

    def session(self, join_id: str) -> JoinSession:
        """A long-lived Join stream on ``join_id`` that sends one batch at a time."""
        return JoinSession(self, join_id)

    def join(self, events, window: str, predicate: str, index: str = "bisort",
             chunk: int = 1 << 18, **settings) -> Result:
        """Join a whole event table; returns a :class:`Result` (which unpacks as
        ``r_id, s_id, late_ids_by_stream``)."""
        join_id = self.open(window, predicate, index, **settings)
        n = len(events)
        chunks = [SimpleNamespace(stream=events.stream[a:a + chunk], id=events.id[a:a + chunk],
                                  key=events.key[a:a + chunk], ts=events.ts[a:a + chunk],
                                  key2=None if getattr(events, "key2", None) is None
                                  else events.key2[a:a + chunk])
                  for a in range(0, max(1, n), chunk)]  # no payloads: they stay here
        outs = list(self.stream(join_id, chunks))
        self.stub.Close(manager_pb2.JoinRef(join_id=join_id))
        ls = np.concatenate([o.late_stream for o in outs])
        li = np.concatenate([o.late_id for o in outs])
        r = np.concatenate([o.r_id for o in outs])
        s = np.concatenate([o.s_id for o in outs])
        pays = None
        if getattr(events, "payload", None) is not None:
            pays = (payloads_of(events, 0, r), payloads_of(events, 1, s))
        return Result(r, s, {"R": li[ls == 0], "S": li[ls == 1]},
                      pays[0] if pays else None, pays[1] if pays else None)

    def status(self, join_id: str):
        return self.stub.Status(manager_pb2.JoinRef(join_id=join_id))
