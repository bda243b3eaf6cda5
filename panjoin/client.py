"""Python client of the manager endpoint.

    >>> from panjoin.client import Client                       # doctest: +SKIP
    >>> with Client("127.0.0.1:50050") as c:                    # doctest: +SKIP
    ...     r_id, s_id, late = c.join(events, window="count:1M,1M", predicate="band:10")
"""

from __future__ import annotations

import grpc
import numpy as np

from panjoin.proto.panjoin.v1 import manager_pb2, manager_pb2_grpc
from panjoin.serving import OPTIONS
from panjoin.wire import from_array, to_array


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

    def stream(self, join_id: str, chunks, first_batch_id: int = 1):
        """Send arrival-ordered chunks (anything with stream/id/key/ts arrays); yields
        ``(batch_id, r_id, s_id, late_stream, late_id)`` per chunk, the last one flushed."""
        chunks = list(chunks)

        def inputs():
            for i, ch in enumerate(chunks):
                yield manager_pb2.JoinInput(
                    join_id=join_id, batch_id=first_batch_id + i,
                    stream=to_array(np.asarray(ch.stream, np.uint8)),
                    id=to_array(np.asarray(ch.id, np.int64)), key=to_array(np.asarray(ch.key)),
                    ts=to_array(np.asarray(ch.ts, np.int64)), flush=(i == len(chunks) - 1))

        for out in self.stub.Join(inputs()):
            yield (out.batch_id, from_array(out.r_id, "<i8"), from_array(out.s_id, "<i8"),
                   from_array(out.late_stream, "|u1"), from_array(out.late_id, "<i8"))

    def join(self, events, window: str, predicate: str, index: str = "bisort",
             chunk: int = 1 << 18, **settings):
        """Join a whole event table; returns (r_id, s_id, late_ids by stream)."""
        join_id = self.open(window, predicate, index, **settings)
        chunks = [events.slice(a, min(len(events), a + chunk))
                  for a in range(0, max(1, len(events)), chunk)]
        rs, ss, lstream, lid = [], [], [], []
        for _, r, s, ls, li in self.stream(join_id, chunks):
            rs.append(r)
            ss.append(s)
            lstream.append(ls)
            lid.append(li)
        self.stub.Close(manager_pb2.JoinRef(join_id=join_id))
        ls = np.concatenate(lstream) if lstream else np.zeros(0, np.uint8)
        li = np.concatenate(lid) if lid else np.zeros(0, np.int64)
        return np.concatenate(rs), np.concatenate(ss), {"R": li[ls == 0], "S": li[ls == 1]}

    def status(self, join_id: str):
        return self.stub.Status(manager_pb2.JoinRef(join_id=join_id))
