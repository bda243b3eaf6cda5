"""A handshake chain node: serves ``panjoin.v1.HandshakeNode`` over ``protocol.Node``.

A thin transport around the same node logic the simulator steps: messages
arriving on the two ``Link`` streams (from the left and the right neighbour, or
the driver at an end) go into one inbox; one thread takes them in order, calls
``Node.process`` and ``Node.forward`` (Figure 9's loop body), puts the result
pairs into the node's bounded result FIFO (waiting, never dropping, while it is
full: the manager's admission control then pauses the input) and sends the
outgoing messages on :class:`panjoin.handshake.transport.LinkSender` streams to
the neighbours, or into the ``Outbox`` stream that the driver reads.

    panjoin handshake-node --port 50061
"""

from __future__ import annotations

import logging
import queue
import threading

import grpc
import numpy as np

from panjoin.handshake.merge import FIFO
from panjoin.handshake.protocol import LEFT, RIGHT, Node
from panjoin.handshake.transport import KEY_WIRE, LinkSender, from_proto, to_proto
from panjoin.proto.panjoin.v1 import handshake_pb2, handshake_pb2_grpc
from panjoin.semantics import SpecError, parse_predicate, parse_window
from panjoin.serving import register, start_server
from panjoin.wire import WireError, to_array

log = logging.getLogger("panjoin.handshake.node")

RESULT_CHUNK = 1 << 16


class ChainNode:
    """One node of one chain: inbox, protocol loop, result FIFO, links to the neighbours."""

    def __init__(self, cfg: handshake_pb2.ChainConfig):
        window = parse_window(cfg.window, cfg.allowed_lateness)
        pred = parse_predicate(cfg.predicate)
        if cfg.key_dtype not in KEY_WIRE:
            raise ValueError(f"key_dtype {cfg.key_dtype!r}: use 'int64' or 'float64'")
        if not 0 <= cfg.position < cfg.n_nodes:
            raise ValueError(f"position {cfg.position} outside 0..{cfg.n_nodes - 1}")
        if cfg.result_fifo < 1 or cfg.max_batch < 1:
            raise ValueError("result_fifo and max_batch must be >= 1")
        self.cfg = cfg
        self.key_dtype = cfg.key_dtype
        self.node = Node(cfg.position, cfg.n_nodes, window, pred, np.dtype(cfg.key_dtype),
                         int(cfg.max_batch), index=cfg.index or "nested",
                         fast_forward=cfg.fast_forward)
        self.inbox: queue.Queue = queue.Queue()
        self.outbox: queue.Queue = queue.Queue()  # for the driver (end nodes)
        self.fifo = FIFO(int(cfg.result_fifo), f"node {cfg.position}")
        self.stop = threading.Event()
        self.lock = threading.Lock()  # node state vs Status
        self.stalls = 0
        self.error = ""
        # we sit on the right of our left neighbour, and on the left of our right one
        self.links = {
            LEFT: LinkSender(cfg.left, cfg.chain_id, RIGHT) if cfg.position > 0 else None,
            RIGHT: (LinkSender(cfg.right, cfg.chain_id, LEFT)
                    if cfg.position < cfg.n_nodes - 1 else None),
        }
        self.thread = threading.Thread(target=self._loop, daemon=True,
                                       name=f"node-{cfg.position}")
        self.thread.start()

    def _loop(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    side, msg = self.inbox.get(timeout=0.1)
                except queue.Empty:
                    continue
                with self.lock:
                    if side == "load":  # a bulk fill (Load), queued before any input
                        out = self.node.load(*msg)
                    else:
                        out = self.node.process(side, msg)
                        out += self.node.forward()
                    r, s = self.node.take_results()
                if r.size:
                    # results first: once a message leaves, its pairs are already queued
                    if self.fifo.room < r.size:
                        self.stalls += 1
                    self.fifo.put(r, s, self.stop)
                for to, m in out:
                    link = self.links[to]
                    if link is None:
                        self.outbox.put(m)
                    else:
                        link.send(m)
        except InterruptedError:
            pass
        except Exception as e:  # a broken invariant: report it, stop this chain
            log.exception("node %d failed", self.cfg.position)
            self.error = f"{type(e).__name__}: {e}"
            self.stop.set()

    def status(self) -> handshake_pb2.NodeStatus:
        with self.lock:
            nd = self.node
            return handshake_pb2.NodeStatus(
                chain_id=self.cfg.chain_id, position=self.cfg.position, segment_r=len(nd.R),
                segment_s=len(nd.S), tuples_in=nd.stats.tuples_in, results=nd.stats.results,
                forwarded=nd.stats.forwarded, messages=nd.stats.messages,
                scanned_pairs=nd.stats.scanned_pairs, stalls=self.stalls, error=self.error)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        for link in self.links.values():
            if link is not None:
                link.close()


class HandshakeNodeServicer(handshake_pb2_grpc.HandshakeNodeServicer):
    def __init__(self, threads: int = 1):
        self.threads = threads
        self.chains: dict[str, ChainNode] = {}
        self.lock = threading.Lock()

    def _get(self, chain_id: str, context) -> ChainNode:
        with self.lock:
            c = self.chains.get(chain_id)
        if c is None:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"unknown chain {chain_id!r}; Configure it first")
        return c

    def Configure(self, request, context):
        with self.lock:
            if request.chain_id in self.chains:
                context.abort(grpc.StatusCode.ALREADY_EXISTS,
                              f"chain {request.chain_id!r} exists on this node")
        try:
            c = ChainNode(request)
        except (SpecError, ValueError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        with self.lock:
            self.chains[request.chain_id] = c
        log.info("chain %s: node %d of %d", request.chain_id, request.position, request.n_nodes)
        return c.status()

    def Link(self, request_iterator, context):
        c, n = None, 0
        for m in request_iterator:
            if c is None:
                c = self._get(m.chain_id, context)
            try:
                c.inbox.put(from_proto(m, c.key_dtype))
            except (WireError, ValueError) as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            n += 1
        return handshake_pb2.LinkSummary(messages=n)

    def Outbox(self, request, context):
        c = self._get(request.chain_id, context)
        while context.is_active() and not c.stop.is_set():
            try:
                m = c.outbox.get(timeout=0.1)
            except queue.Empty:
                continue
            # the driver sits on our left at node 0 (S arrivals) and on our right at N-1
            yield to_proto(m, RIGHT if m.stream == "S" else LEFT)

    def Results(self, request, context):
        c = self._get(request.chain_id, context)
        while context.is_active() and not (c.stop.is_set() and len(c.fifo) == 0):
            r, s = c.fifo.get(RESULT_CHUNK)
            if r.size:
                yield handshake_pb2.ResultBatch(r_id=to_array(r), s_id=to_array(s))

    def Status(self, request, context):
        return self._get(request.chain_id, context).status()

    def Load(self, request, context):
        c = self._get(request.chain_id, context)
        try:
            _, r = from_proto(request.r, c.key_dtype)
            _, s = from_proto(request.s, c.key_dtype)
        except (WireError, ValueError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if r.tuples is None or s.tuples is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Load needs KIND_TUPLES r and s")
        with c.lock:
            nd = c.node
            if nd.stats.tuples_in or nd.recv_r or nd.recv_s or len(nd.R) or len(nd.S):
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              "Load only into an empty chain, before any input")
        # through the inbox, so the protocol loop sees it before any later message
        c.inbox.put(("load", (r.tuples, s.tuples, request.left_s, request.right_r,
                              request.fed_r, request.fed_s)))
        return c.status()

    def Release(self, request, context):
        c = self._get(request.chain_id, context)
        with self.lock:
            self.chains.pop(request.chain_id, None)
        c.close()
        return c.status()


def serve(port: int = 0, threads: int = 1, host: str = "127.0.0.1", serving: bool = True
          ) -> tuple[grpc.Server, int]:
    """Start a handshake node server; returns it and the bound port. ``serving=False``:
    NOT_SERVING until :func:`panjoin.serving.set_serving` (after the warm-up)."""
    servicer = HandshakeNodeServicer(threads)
    return start_server(
        lambda srv: register(srv, handshake_pb2_grpc.add_HandshakeNodeServicer_to_server,
                             servicer),
        handshake_pb2.DESCRIPTOR.services_by_name["HandshakeNode"].full_name, port, host,
        max_workers=32, serving=serving)
