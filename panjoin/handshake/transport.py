"""The chain's messages on the wire, and one outgoing FIFO channel (a ``Link`` stream).

:class:`.protocol.Msg` <-> ``panjoin.v1.ChainMessage`` (tuple columns as packed
Arrays, :mod:`panjoin.wire`), and :class:`LinkSender`: a thread that keeps one
client-streaming ``HandshakeNode.Link`` call open to a neighbour (or, from the
driver, to an end node) and writes queued messages to it in order, so the
channel is FIFO as the protocol requires. The queue does not block the
sender's protocol loop (two neighbours that both waited for room in the other's
inbox would deadlock); what travels is bounded by what the driver admits. The call
opens with its first message, and names its chain in its metadata too
(:data:`CHAIN_KEY`).
"""

from __future__ import annotations

import logging
import queue
import threading

import grpc

from panjoin.handshake.protocol import LEFT, RIGHT, Msg
from panjoin.handshake.segment import Tuples
from panjoin.proto.panjoin.v1 import common_pb2, handshake_pb2, handshake_pb2_grpc
from panjoin.security import channel
from panjoin.wire import from_array, to_array

log = logging.getLogger("panjoin.handshake")

KINDS = {"tuples": handshake_pb2.KIND_TUPLES, "ack": handshake_pb2.KIND_ACK,
         "drain": handshake_pb2.KIND_DRAIN, "report": handshake_pb2.KIND_REPORT,
         "arrived": handshake_pb2.KIND_ARRIVED, "drained": handshake_pb2.KIND_DRAINED,
         "express": handshake_pb2.KIND_EXPRESS}
KIND_NAMES = {v: k for k, v in KINDS.items()}
STREAMS = {"R": common_pb2.STREAM_R, "S": common_pb2.STREAM_S, "": common_pb2.STREAM_UNSPECIFIED}
STREAM_NAMES = {v: k for k, v in STREAMS.items()}
SIDES = {LEFT: handshake_pb2.SIDE_LEFT, RIGHT: handshake_pb2.SIDE_RIGHT}
SIDE_NAMES = {v: k for k, v in SIDES.items()}
KEY_WIRE = {"int64": "<i8", "float64": "<f8"}
#: call metadata naming a Link's chain: the node gives the stream its chain's place at
#: once (a Link without it waits in one of few pending places for its first message)
CHAIN_KEY = "panjoin-chain-id"


def to_proto(msg: Msg, side: str, chain_id: str = "") -> handshake_pb2.ChainMessage:
    """``side``: where the sender sits as seen from the receiver."""
    out = handshake_pb2.ChainMessage(chain_id=chain_id, side=SIDES[side], kind=KINDS[msg.kind],
                                     stream=STREAMS[msg.stream], n=msg.n, size=msg.size,
                                     received=msg.received)
    if msg.tuples is not None:
        t = msg.tuples
        for name in ("id", "key", "ts", "seq", "opp", "key2"):
            getattr(out, name).CopyFrom(to_array(getattr(t, name)))
    return out


def from_proto(m: handshake_pb2.ChainMessage, key_dtype: str) -> tuple[str, Msg]:
    """(side the sender is on, message); raises WireError/ValueError on a malformed one."""
    if m.side not in SIDE_NAMES:
        raise ValueError("ChainMessage.side must be SIDE_LEFT or SIDE_RIGHT")
    if m.kind not in KIND_NAMES:
        raise ValueError(f"ChainMessage.kind {m.kind} is not a known kind")
    msg = Msg(KIND_NAMES[m.kind], STREAM_NAMES.get(m.stream, ""), n=int(m.n), size=int(m.size),
              received=int(m.received))
    if msg.kind in ("tuples", "express"):
        cols = {name: from_array(getattr(m, name), "<i8", name) for name in
                ("id", "ts", "seq", "opp")}
        key = from_array(m.key, KEY_WIRE[key_dtype], "key")
        if not all(c.shape == key.shape for c in cols.values()):
            raise ValueError("ChainMessage: id, key, ts, seq and opp must have one length")
        key2 = from_array(m.key2, "<f8", "key2") if m.HasField("key2") else None
        if key2 is not None and key2.shape != key.shape:
            raise ValueError("ChainMessage: key2 must have one value per tuple")
        msg.tuples = Tuples(cols["id"].copy(), key.copy(), cols["ts"].copy(),
                            cols["seq"].copy(), cols["opp"].copy(),
                            key2.copy() if key2 is not None else None)
    return SIDE_NAMES[m.side], msg


_CLOSE = object()


class LinkSender:
    """One open ``Link`` call to ``address``; ``send`` queues, a thread writes in order."""

    def __init__(self, address: str, chain_id: str, side: str, key_dtype: str = "int64"):
        self.address = address
        self.chain_id = chain_id
        self.side = side  # where we sit, seen from the receiver
        self.q: queue.Queue = queue.Queue()
        self.channel = channel(address)
        self.stub = handshake_pb2_grpc.HandshakeNodeStub(self.channel)
        self.error: BaseException | None = None
        self.closing = False
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"link->{address}")
        self.thread.start()

    def _messages(self, item):
        pb = to_proto(item, self.side, self.chain_id)  # the first names the chain
        while True:
            self.sent += 1
            yield pb
            item = self.q.get()
            if item is _CLOSE:
                return
            pb = to_proto(item, self.side)

    def _run(self):
        # the call opens with the first message, not before: the receiver then knows at
        # once which chain the stream is for (a Link that names none is ended), and the
        # neighbour is configured by then (the driver configures every node first)
        first = self.q.get()
        if first is _CLOSE:
            return
        try:
            self.stub.Link(self._messages(first), metadata=((CHAIN_KEY, self.chain_id),))
            if not self.closing:  # the receiver ended it: what we sent next would be lost
                self.error = ConnectionError("the receiver ended the link")
        except grpc.RpcError as e:
            self.error = e
            if not self.closing:
                log.warning("link to %s failed: %s", self.address, e)

    def send(self, msg: Msg) -> None:
        if self.error is not None:
            raise ConnectionError(f"link to {self.address} failed: {self.error}")
        self.q.put(msg)

    def close(self, timeout: float = 10.0) -> None:
        self.closing = True
        self.q.put(_CLOSE)
        self.thread.join(timeout)
        self.channel.close()
