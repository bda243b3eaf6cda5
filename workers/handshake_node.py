"""A handshake chain node: serves ``panjoin.v1.HandshakeNode`` over ``protocol.Node``.

A thin transport around the same node logic the simulator steps: messages
arriving on the two ``Link`` streams (from the left and the right neighbour, or
the driver at an end) go into one inbox; one thread takes them in order, calls
``Node.process`` and ``Node.forward`` (Figure 9's loop body), puts the result
pairs into the node's bounded result FIFO (waiting, never dropping, while it is
full: the manager's admission control then pauses the input) and sends the
outgoing messages on :class:`panjoin.handshake.transport.LinkSender` streams to
the neighbours, or into the ``Outbox`` stream that the driver reads.

A node's chains are bounded as a worker's sessions are (:mod:`workers.server`), so
that no number of bad, abandoned or idle chains and streams starves the joins: at
most ``max_chains`` chains (one more is refused with RESOURCE_EXHAUSTED at once), each
with at most 4 streams here (a Link from each side, Outbox, Results), so the thread
pool has room for every stream plus the short calls; every ChainConfig size is
range-checked before anything is built (:func:`panjoin.limits.check_chain_config`);
a chain that gets no message and no call for ``idle_timeout`` seconds is released
and its streams end (DEADLINE_EXCEEDED), as does a Link whose first message does not
come; a stream whose client goes away gives its place back. A driver keeps its
chain alive with a Status call every third of the idle timeout
(:class:`panjoin.handshake.chain.HandshakeChain`). Example, ``--max-chains 2``: a
node holds chains a and b; Configure(c) is RESOURCE_EXHAUSTED; b's driver dies, and
after the idle timeout b is released and Configure(c) succeeds.

    panjoin handshake-node --port 50061 --max-chains 16 --idle-timeout 600
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import grpc
import numpy as np

from panjoin import limits
from panjoin.handshake.merge import FIFO
from panjoin.handshake.protocol import LEFT, RIGHT, Node
from panjoin.handshake.transport import (
    CHAIN_KEY,
    KEY_WIRE,
    LinkSender,
    from_proto,
    to_proto,
)
from panjoin.proto.panjoin.v1 import handshake_pb2, handshake_pb2_grpc
from panjoin.semantics import SpecError, parse_predicate, parse_window
from panjoin.serving import END, SPARE_THREADS, abort_full, read_ahead, register, start_server
from panjoin.wire import WireError, to_array

log = logging.getLogger("panjoin.handshake.node")

RESULT_CHUNK = 1 << 16
#: chains a node holds at once by default (a join holds one on every node)
MAX_CHAINS = 16
#: seconds a chain may get no message and no call before the node releases it, by default
IDLE_TIMEOUT_S = 600.0
#: streams one chain holds on a node: a Link from each side, Outbox, Results
STREAMS_PER_CHAIN = 4
#: seconds between a waiting stream's looks at whether its chain was released
POLL_S = 0.1


class ChainNode:
    """One node of one chain: inbox, protocol loop, result FIFO, links to the neighbours."""

    def __init__(self, cfg: handshake_pb2.ChainConfig):
        """``cfg``: checked by :func:`panjoin.limits.check_chain_config` first."""
        window = parse_window(cfg.window, cfg.allowed_lateness)
        limits.check_window(window)
        pred = parse_predicate(cfg.predicate)
        if cfg.key_dtype not in KEY_WIRE:
            raise ValueError(f"key_dtype {cfg.key_dtype!r}: use 'int64' or 'float64'")
        self.cfg = cfg
        self.last_active = time.monotonic()  # its last message or call
        self.streams = 0  # its streams open on this node
        self.ended: str | None = None  # released: "" by Release, else why
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

    def touch(self) -> None:
        self.last_active = time.monotonic()

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
    def __init__(self, threads: int = 1, max_chains: int = MAX_CHAINS,
                 idle_timeout: float = IDLE_TIMEOUT_S):
        if max_chains < 1:
            raise ValueError(f"max chains must be >= 1, got {max_chains}")
        if not idle_timeout > 0:
            raise ValueError(f"idle timeout must be a positive number of s, got {idle_timeout}")
        self.threads = threads
        self.max_chains = max_chains
        self.idle_timeout = idle_timeout
        #: every open stream (a chain's, or a Link that has not named its chain yet): a
        #: chain's STREAMS_PER_CHAIN plus a pending Link for each chain at most
        self.max_streams = (STREAMS_PER_CHAIN + 1) * max_chains
        self.chains: dict[str, ChainNode | None] = {}  # None: being configured
        self.streams = 0
        self.pending = 0  # Links whose first message has not come
        self.lock = threading.Lock()
        threading.Thread(target=self._reap, daemon=True, name="chain-reaper").start()

    # ------------------------------------------------------------------ chains

    def _get(self, chain_id: str, context) -> ChainNode:
        """The chain (NOT_FOUND if this node has none of that id); a call on it counts as
        its activity."""
        with self.lock:
            c = self.chains.get(chain_id)
        if c is None:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"unknown chain {chain_id!r}; Configure it first (a chain idle for "
                          f"{self.idle_timeout:g} s is released)")
        c.touch()
        return c

    def _release(self, chain_id: str, c: ChainNode, why: str) -> None:
        """Forget ``c`` (if it is still ``chain_id``'s) and stop it; its streams end
        (with ``why``, if not empty, as DEADLINE_EXCEEDED)."""
        with self.lock:
            if self.chains.get(chain_id) is not c:
                return
            del self.chains[chain_id]
        c.ended = why
        c.close()
        log.info("chain %s released%s", chain_id, f": {why}" if why else "")

    def _reap(self) -> None:
        """Release chains that got no message and no call for idle_timeout."""
        tick = min(1.0, self.idle_timeout / 4)
        while True:
            time.sleep(tick)
            now = time.monotonic()
            with self.lock:
                idle = [(k, c) for k, c in self.chains.items()
                        if c is not None and now - c.last_active > self.idle_timeout]
            for chain_id, c in idle:
                log.warning("chain %s idle for %g s: releasing it", chain_id, self.idle_timeout)
                self._release(chain_id, c, f"chain {chain_id!r} got no message and no call for "
                              f"{self.idle_timeout:g} s (the node's --idle-timeout): released")

    # ------------------------------------------------------------------ stream places

    def _take(self, context, c: ChainNode | None = None) -> None:
        """Hold a place for a stream of ``c`` (None: a Link that has not named its chain),
        or end the call with RESOURCE_EXHAUSTED."""
        with self.lock:
            if self.streams >= self.max_streams:
                why = "streams"
            elif c is None and self.pending >= self.max_chains:
                why = "pending"
            elif c is not None and c.streams >= STREAMS_PER_CHAIN:
                why = "chain"
            else:
                why = ""
                self.streams += 1
                if c is None:
                    self.pending += 1
                else:
                    c.streams += 1
        if why == "streams":
            abort_full(context, f"handshake node holds {self.streams} streams ("
                       f"{STREAMS_PER_CHAIN + 1} for each of its --max-chains "
                       f"{self.max_chains})", "--max-chains", "release chains",
                       self.idle_timeout)
        if why == "pending":
            abort_full(context, f"handshake node has {self.pending} Links whose first "
                       "message has not come", "--max-chains",
                       "send a Link's first message (it names the chain) at once",
                       self.idle_timeout)
        if why == "chain":
            self._chain_full(context, c)

    def _attach(self, context, c: ChainNode) -> ChainNode:
        """Move a Link's place from pending to its chain ``c`` (RESOURCE_EXHAUSTED if the
        chain has all its streams here: the place stays pending until the call ends)."""
        with self.lock:
            full = c.streams >= STREAMS_PER_CHAIN
            if not full:
                self.pending -= 1
                c.streams += 1
        if full:
            self._chain_full(context, c)
        return c

    @staticmethod
    def _chain_full(context, c: ChainNode) -> None:
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"chain {c.cfg.chain_id!r} has its {STREAMS_PER_CHAIN} streams on this "
                      "node (a Link from each side, Outbox, Results): open each once")

    def _give(self, c: ChainNode | None = None) -> None:
        with self.lock:
            self.streams -= 1
            if c is None:
                self.pending -= 1
            else:
                c.streams -= 1

    @staticmethod
    def _over(c: ChainNode, context) -> bool:
        """Should a stream of ``c`` end now? Yes, after Release; a chain released for
        idleness, or failed, ends the call with the cause."""
        if c.ended is None:
            return False
        if c.ended:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, c.ended)
        return True

    # ------------------------------------------------------------------ rpcs

    def Configure(self, request, context):
        try:
            limits.check_chain_config(request)  # before a place or anything else is taken
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        chain_id = request.chain_id
        with self.lock:
            taken = chain_id in self.chains
            full = len(self.chains) >= self.max_chains
            if not (taken or full):
                self.chains[chain_id] = None  # its place, while it is built
        if taken:
            context.abort(grpc.StatusCode.ALREADY_EXISTS,
                          f"chain {chain_id!r} exists on this node")
        if full:
            abort_full(context, f"handshake node holds {self.max_chains} chains",
                       "--max-chains", "close joins", self.idle_timeout)
        c = None
        try:
            c = ChainNode(request)
        except (SpecError, ValueError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        finally:
            with self.lock:
                if c is None:
                    del self.chains[chain_id]
                else:
                    self.chains[chain_id] = c
        log.info("chain %s: node %d of %d", chain_id, request.position, request.n_nodes)
        return self._with_node(c.status())

    def Link(self, request_iterator, context):
        """A neighbour's (or the driver's) messages, in order. A Link that names its
        chain in its metadata (:data:`CHAIN_KEY`, as every PanJoin sender does) takes
        that chain's place at once; one that does not waits in a pending place (at most
        ``max_chains`` of them) for its first message, at most ``idle_timeout``."""
        named = dict(context.invocation_metadata()).get(CHAIN_KEY)
        c = self._get(named, context) if named else None
        self._take(context, c)
        try:
            inbox = read_ahead(request_iterator, "link-reader")
            m = self._next(inbox, c, context)
            if m is not END and c is None:
                c = self._attach(context, self._get(m.chain_id, context))
            elif m is not END and m.chain_id != named:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"the Link's first message names chain {m.chain_id!r}, its "
                              f"metadata {named!r}")
            n = 0
            while m is not END:
                try:
                    c.inbox.put(from_proto(m, c.key_dtype))
                except (WireError, ValueError) as e:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                n += 1
                c.touch()
                m = self._next(inbox, c, context)
            return handshake_pb2.LinkSummary(messages=n)
        finally:
            self._give(c)

    def _next(self, inbox, c: ChainNode | None, context):
        """A Link's next message, or END when the stream ends or its chain ``c`` was
        released (after Release; :meth:`_over`). A Link whose chain is not known yet
        (``c`` None) ends after ``idle_timeout`` without a message."""
        deadline = time.monotonic() + self.idle_timeout
        while True:
            try:
                return inbox.get(timeout=POLL_S)
            except queue.Empty:
                pass
            if c is not None and self._over(c, context):
                return END
            if c is None and time.monotonic() > deadline:
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                              f"no message on the Link for {self.idle_timeout:g} s (the "
                              "node's --idle-timeout): its first one names the chain")

    def Outbox(self, request, context):
        c = self._get(request.chain_id, context)
        self._take(context, c)
        try:
            while context.is_active() and not self._over(c, context):
                if c.error:
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                  f"the node failed: {c.error}")
                try:
                    m = c.outbox.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                # the driver sits on our left at node 0 (S arrivals) and on our right at N-1
                yield to_proto(m, RIGHT if m.stream == "S" else LEFT)
        finally:
            self._give(c)

    def Results(self, request, context):
        c = self._get(request.chain_id, context)
        self._take(context, c)
        try:
            while context.is_active() and not self._over(c, context):
                if c.error and len(c.fifo) == 0:  # a failed node's last pairs are out
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                  f"the node failed: {c.error}")
                r, s = c.fifo.get(RESULT_CHUNK)
                if r.size:
                    yield handshake_pb2.ResultBatch(r_id=to_array(r), s_id=to_array(s))
        finally:
            self._give(c)

    def Status(self, request, context):
        if not request.chain_id:
            return self._with_node(handshake_pb2.NodeStatus())
        return self._with_node(self._get(request.chain_id, context).status())

    def _with_node(self, st: handshake_pb2.NodeStatus) -> handshake_pb2.NodeStatus:
        with self.lock:
            st.chains, st.streams = len(self.chains), self.streams
        st.max_chains, st.idle_timeout_s = self.max_chains, self.idle_timeout
        return st

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
        return self._with_node(c.status())

    def Release(self, request, context):
        c = self._get(request.chain_id, context)
        self._release(request.chain_id, c, "")
        return self._with_node(c.status())


def serve(port: int = 0, threads: int = 1, host: str = "127.0.0.1", serving: bool = True,
          max_chains: int = MAX_CHAINS, idle_timeout: float = IDLE_TIMEOUT_S
          ) -> tuple[grpc.Server, int]:
    """Start a handshake node server; returns it and the bound port. ``max_chains`` and
    ``idle_timeout`` (s) bound what its chains may hold (see the module doc).
    ``serving=False``: NOT_SERVING until :func:`panjoin.serving.set_serving` (after
    the warm-up)."""
    servicer = HandshakeNodeServicer(threads, max_chains, idle_timeout)
    return start_server(
        lambda srv: register(srv, handshake_pb2_grpc.add_HandshakeNodeServicer_to_server,
                             servicer),
        handshake_pb2.DESCRIPTOR.services_by_name["HandshakeNode"].full_name, port, host,
        max_workers=servicer.max_streams + SPARE_THREADS, serving=serving)
