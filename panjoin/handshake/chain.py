"""The manager as the handshake chain's driver, over node processes (``--topology handshake``).

``HandshakeChain`` has the engine's interface (``push_arrays``, ``flush``,
``take_results``, ``take_late``, ``status``), so the CLI and the manager
endpoint use it where they would use :class:`panjoin.manager.engine.JoinEngine`.

    addresses ─ Configure ─► node 0 ... node N-1   (each links to its neighbours)
    driver ── Link(left) ──► node 0        node N-1 ◄── Link(right) ── driver
    driver ◄─ Outbox ─────── node 0        node N-1 ─── Outbox ──────► driver
    every node ── Results ──► leaf FIFO ─► merging network ─► collected pairs

Feeding (section 4.4): :class:`.protocol.Driver` numbers the input, drops late
tuples, and turns each run of one stream into one message to its end; its
acknowledgements expire tuples at the far ends as the ends report arrivals.
Admission control: before each input batch the driver waits while any FIFO of
the merging network is full, counting a pause. ``flush`` drains the chain
(every pair meets) and waits until every node's pairs have come through.

A node releases a chain that gets no message and no call for its idle timeout
(:mod:`workers.handshake_node`), and a join may pause longer than that: the driver
calls Status on every node every third of it while the chain is open. If a node
refuses the chain (e.g. RESOURCE_EXHAUSTED: it holds its --max-chains), the nodes
already configured release it at once.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import grpc
import numpy as np

from panjoin import limits
from panjoin.handshake.merge import AdmissionControl, MergingNetwork
from panjoin.handshake.protocol import LEFT, RIGHT, TUPLES, Driver, Msg
from panjoin.handshake.segment import SEGMENT_KINDS
from panjoin.handshake.transport import LinkSender, from_proto, to_proto
from panjoin.proto.panjoin.v1 import handshake_pb2, handshake_pb2_grpc
from panjoin.security import channel
from panjoin.semantics import Predicate, Window, parse_predicate, parse_window
from panjoin.wire import from_array

log = logging.getLogger("panjoin.handshake")


class ChainError(RuntimeError):
    """A node failed or went away; the message says which and why. ``code``: a
    grpc.StatusCode name, what the manager's client gets."""

    def __init__(self, msg: str, code: str = "UNAVAILABLE"):
        super().__init__(msg)
        self.code = code


class _Stats:
    def __init__(self):
        self.tuples_in = 0
        self.late = 0
        self.batches = 0
        self.results = 0


class HandshakeChain:
    def __init__(self, addresses: list[str], window: str | Window, predicate: str | Predicate,
                 *, allowed_lateness: int = 0, key_dtype: str | None = None,
                 batch_size: int = 4096, node_fifo: int = 1 << 16, merger_fifo: int = 1 << 16,
                 max_batch: int = 4096, max_in_flight: int | None = None,
                 index: str = "nested", fast_forward: bool = False,
                 max_collect_ms: float | None = None, timeout: float = 300.0):
        if not addresses:
            raise ValueError("a handshake chain needs at least one node address")
        self.addresses = list(addresses)
        self.window = (parse_window(window, allowed_lateness) if isinstance(window, str)
                       else window)
        self.pred = parse_predicate(predicate)
        if batch_size < 1 or node_fifo < 1 or merger_fifo < 1 or max_batch < 1:
            raise ValueError("batch_size, FIFO sizes and max_batch must be >= 1")
        limits.check_chain_sizes(len(addresses), node_fifo, max_batch)  # the nodes' limits
        self.batch_size = int(batch_size)
        self.node_fifo, self.merger_fifo, self.max_batch = node_fifo, merger_fifo, max_batch
        self.timeout = timeout
        if index not in SEGMENT_KINDS:
            raise ValueError(f"segment index {index!r}: choose one of {', '.join(SEGMENT_KINDS)}")
        self.index = index
        self.fast_forward = bool(fast_forward)  # the low-latency handshake join
        # a collect deadline (a streaming join): pushed tuples wait up to this long, or
        # until batch_size of them are here, and go in as one run per stream; every
        # message costs each node its handling, so a chain fed a few tuples at a time
        # falls behind on messages long before it does on tuples
        if max_collect_ms is not None and not max_collect_ms > 0:
            raise ValueError(f"max_collect_ms must be positive, got {max_collect_ms}")
        self.max_collect_ms = max_collect_ms
        self._buf: list[tuple] = []  # (stream, ids, keys, ts, key2) waiting to be fed
        self._buf_n = 0
        self._buf_since: float | None = None  # monotonic time of the oldest buffered
        #: fed tuples the entry nodes may have not processed yet (beyond it the driver waits)
        self.max_in_flight = int(max_in_flight or 4 * self.batch_size)
        self.credit_waits = 0
        self.key_dtype = np.dtype(key_dtype) if key_dtype else None
        self.chain_id = uuid.uuid4().hex[:12]
        self.driver = Driver(self.window, self.pred)
        self.net = MergingNetwork(len(addresses), node_fifo, merger_fifo)
        self.admission = AdmissionControl(self.net)
        self.stats = _Stats()
        self.lock = threading.Lock()  # the driver's state
        self.drained = threading.Condition(self.lock)
        self.stop = threading.Event()
        self.received = [0] * len(addresses)  # pairs read from each node
        self._collected: list[tuple[np.ndarray, np.ndarray]] = []
        self._collected_lock = threading.Lock()
        self.collected_total = 0
        self.wake = None  # called after pairs reached the root (set_wake)
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []
        self.started = False
        self.channels = [channel(a) for a in addresses]
        self.stubs = [handshake_pb2_grpc.HandshakeNodeStub(c) for c in self.channels]
        self.links: dict[str, LinkSender] = {}
        if self.key_dtype is not None:
            self._start()

    # ------------------------------------------------------------------ wiring

    def _start(self) -> None:
        n = len(self.addresses)
        idle = []  # each node's idle timeout (s)
        for i, stub in enumerate(self.stubs):
            try:
                st = stub.Configure(handshake_pb2.ChainConfig(
                    chain_id=self.chain_id, position=i, n_nodes=n,
                    left=self.addresses[i - 1] if i > 0 else "",
                    right=self.addresses[i + 1] if i < n - 1 else "",
                    window=str(self.window), predicate=str(self.pred),
                    allowed_lateness=self.window.lateness, key_dtype=str(self.key_dtype),
                    result_fifo=self.node_fifo, max_batch=self.max_batch,
                    index=self.index, fast_forward=self.fast_forward), timeout=30)
            except grpc.RpcError as e:
                self._release(self.stubs[:i])  # what the others hold, now
                raise ChainError(f"configuring the chain failed on node {i} "
                                 f"({self.addresses[i]}): {e.details()}",
                                 e.code().name if e.code() else "UNAVAILABLE") from e
            if st.idle_timeout_s > 0:
                idle.append(st.idle_timeout_s)
        self.started = True
        # the driver sits on node 0's left and on node N-1's right
        self.links = {LEFT: LinkSender(self.addresses[0], self.chain_id, LEFT),
                      RIGHT: LinkSender(self.addresses[-1], self.chain_id, RIGHT)}
        ends = {0, n - 1}
        for i in ends:
            self._thread(self._read_outbox, i)
        for i in range(n):
            self._thread(self._read_results, i)
        self._thread(self._pump)
        if idle:
            self._thread(self._keep_alive, min(idle) / 3)

    def _thread(self, fn, *args) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True, name=f"{fn.__name__}{args}")
        t.start()
        self.threads.append(t)

    def _send(self, msgs) -> None:
        for end, m in msgs:
            self.links[end].send(m)

    def _read_outbox(self, i: int) -> None:
        try:
            for pb in self.stubs[i].Outbox(handshake_pb2.ChainRef(chain_id=self.chain_id)):
                _, msg = from_proto(pb, str(self.key_dtype))
                end = LEFT if msg.stream == "S" else RIGHT
                with self.lock:
                    self._send(self.driver.receive(end, msg))
                    self.drained.notify_all()
        except grpc.RpcError as e:
            if not self.stop.is_set():
                self._fail(f"node {i} ({self.addresses[i]}): outbox stream broke: {e.details()}")
        except ConnectionError as e:  # a link of ours broke: its node says why
            if not self.stop.is_set():
                self._fail(f"node {i} ({self.addresses[i]}): {e}")

    def _read_results(self, i: int) -> None:
        leaf = self.net.leaves[i]
        try:
            for pb in self.stubs[i].Results(handshake_pb2.ChainRef(chain_id=self.chain_id)):
                r = from_array(pb.r_id, "<i8", "r_id")
                s = from_array(pb.s_id, "<i8", "s_id")
                leaf.put(r, s, self.stop)  # waits while the leaf FIFO is full
                self.received[i] += r.shape[0]
        except InterruptedError:
            pass
        except grpc.RpcError as e:
            if not self.stop.is_set():
                self._fail(f"node {i} ({self.addresses[i]}): result stream broke: {e.details()}")

    def _keep_alive(self, every: float) -> None:
        """A Status call on every node each ``every`` s while the chain is open: each
        node then counts the chain active, however long the join pauses."""
        while not self.stop.wait(every):
            for i, stub in enumerate(self.stubs):
                try:
                    stub.Status(handshake_pb2.ChainRef(chain_id=self.chain_id),
                                timeout=max(every, 10.0))
                except grpc.RpcError as e:
                    # a busy node may answer late (the call counted on arrival); one
                    # that no longer has the chain fails the join
                    if e.code() == grpc.StatusCode.NOT_FOUND and not self.stop.is_set():
                        self._fail(f"node {i} ({self.addresses[i]}) released the chain: "
                                   f"{e.details()}")
                        return

    def _release(self, stubs) -> None:
        for stub in stubs:
            try:
                stub.Release(handshake_pb2.ChainRef(chain_id=self.chain_id), timeout=10)
            except grpc.RpcError:
                pass

    def _pump(self) -> None:
        """The merging network's clock: every merger steps, the manager drains the root."""
        while not self.stop.is_set():
            moved = self.net.step()
            r, s = self.net.root.take(1 << 20)
            if r.size:
                with self._collected_lock:
                    self._collected.append((r, s))
                    self.collected_total += r.shape[0]
                if self.wake is not None:
                    self.wake()
            elif not moved:
                with self.net.leaves[0].cond:  # idle: wait a little for new pairs
                    self.net.leaves[0].cond.wait(0.002)

    def _fail(self, why: str) -> None:
        log.error("%s", why)
        self.errors.append(why)
        with self.lock:
            self.drained.notify_all()

    def _check(self) -> None:
        if self.errors:
            raise ChainError("; ".join(self.errors))

    # ------------------------------------------------------------------ the engine interface

    def push(self, events) -> None:
        self.push_arrays(events.stream, events.id, events.key, events.ts,
                         key2=getattr(events, "key2", None))

    def push_arrays(self, stream, ids, keys, ts, payload=None, key2=None) -> None:
        """Feed arrival-ordered tuples; ``key2`` iff the predicate has a residual."""
        if payload is not None:
            raise ValueError("the handshake topology does not carry payloads; use the ring "
                             "topology (the default) to join payloads back onto the pairs")
        keys = np.asarray(keys)
        if keys.shape[0] == 0:
            return
        if self.key_dtype is None:
            if keys.dtype not in (np.int64, np.float64):
                raise TypeError(f"keys must be int64 or float64, got {keys.dtype}")
            self.key_dtype = keys.dtype
        if self.pred.residual is not None and key2 is None:
            raise ValueError(f"predicate {self.pred} has a residual on key2: push key2 "
                             "(EventTable.key2, a float64 per tuple)")
        k2 = np.asarray(key2, np.float64) if self.pred.residual is not None else None
        if not self.started:
            self._start()
        self._check()
        if self.max_collect_ms is None:
            self._feed(stream, ids, keys, ts, k2)
            return
        self._buf.append((np.asarray(stream), np.asarray(ids), keys, np.asarray(ts), k2))
        self._buf_n += keys.shape[0]
        if self._buf_since is None:
            self._buf_since = time.monotonic()
        if self._buf_n >= self.batch_size:
            self._feed_buffered()

    def tick(self, now: float | None = None) -> None:
        """Feed what is buffered once its oldest tuple has waited the collect deadline."""
        due = self.next_tick()
        if due is not None and (time.monotonic() if now is None else now) >= due:
            self._feed_buffered()

    def next_tick(self) -> float | None:
        """Monotonic time at which :meth:`tick` will feed the buffer (None: empty)."""
        if self._buf_since is None:
            return None
        return self._buf_since + self.max_collect_ms / 1000.0

    def _feed_buffered(self) -> None:
        if not self._buf:
            return
        parts, self._buf, self._buf_n, self._buf_since = self._buf, [], 0, None
        cols = [np.concatenate([p[i] for p in parts]) for i in range(4)]
        k2 = np.concatenate([p[4] for p in parts]) if parts[0][4] is not None else None
        self._feed(*cols, k2)

    def _feed(self, stream, ids, keys, ts, k2) -> None:
        n = keys.shape[0]
        for a in range(0, n, self.batch_size):
            b = min(n, a + self.batch_size)
            self._admit()
            with self.lock:
                late0 = self.driver.n_late
                self._send(self.driver.feed(np.asarray(stream)[a:b], np.asarray(ids)[a:b],
                                            keys[a:b], np.asarray(ts)[a:b],
                                            k2[a:b] if k2 is not None else None))
                self.stats.late += self.driver.n_late - late0
            self.stats.tuples_in += b - a
            self.stats.batches += 1

    def bulk_fill(self, events) -> None:
        """Fill both windows at once (benchmarks): the tuples go straight into the nodes'
        segments, balanced (:meth:`Driver.preload`), without being scanned; count
        windows, before any input. Pairs among loaded tuples on one node, or whose S
        sits left of the R (they would have crossed already), are NOT produced; pairs
        whose S sits right of the R are, when the two cross, as in a chain that had run
        all along. With fast forwarding no pair among loaded tuples is produced (stored
        tuples do not scan), only those whose later tuple is pushed. A nested-loop chain
        would otherwise spend about W^2 comparisons filling windows of W tuples (10^12
        at W = 1M)."""
        if self.key_dtype is None:
            self.key_dtype = np.asarray(events.key).dtype
        if not self.started:
            self._start()
        n = len(self.addresses)
        # the driver's lock is held until every node has its load queued: the end nodes'
        # arrival reports wait for it, so no acknowledgement (and no balancing report it
        # triggers) reaches a node before its load
        with self.lock:
            runs = self.driver.preload(events.stream, events.id, events.key, events.ts,
                                       getattr(events, "key2", None), n)
            for i, (r, s) in enumerate(runs):
                left_s = len(runs[i - 1][1]) if i > 0 else 0
                right_r = len(runs[i + 1][0]) if i < n - 1 else 0
                try:
                    self.stubs[i].Load(handshake_pb2.LoadRequest(
                        chain_id=self.chain_id, r=to_proto(Msg(TUPLES, "R", tuples=r), LEFT),
                        s=to_proto(Msg(TUPLES, "S", tuples=s), LEFT), left_s=left_s,
                        right_r=right_r, fed_r=self.driver.total["R"],
                        fed_s=self.driver.total["S"]), timeout=self.timeout)
                except grpc.RpcError as e:
                    raise ChainError(f"node {i} ({self.addresses[i]}): load failed: "
                                     f"{e.details()}") from e
        self.stats.tuples_in += len(events)

    def _admit(self) -> None:
        """Admission control: hold the input while any FIFO is full (one pause per wait),
        and while the entry nodes have more than ``max_in_flight`` fed tuples unprocessed
        (a node waiting for room in its result FIFO stops acknowledging)."""
        deadline = time.monotonic() + self.timeout
        counted = waited = False
        while True:
            full = self.net.any_full()
            with self.lock:
                busy = self.driver.in_flight() > self.max_in_flight
            if not (full or busy):
                break
            if full and not counted:
                self.admission.admit()  # counts the pause
                counted = True
            if busy and not waited:
                self.credit_waits += 1
                waited = True
            self._check()
            if time.monotonic() > deadline:
                raise ChainError(f"admission control paused for {self.timeout:.0f}s: the "
                                 "chain or its result FIFOs never drained")
            time.sleep(0.0005)
        self.admission.paused = False

    def flush(self) -> None:
        """Drain: every fed pair meets; returns once all their pairs are collected."""
        if not self.started:
            return
        self._check()
        self._feed_buffered()
        deadline = time.monotonic() + self.timeout
        with self.lock:
            self._send(self.driver.drain())
            while not all(self.driver.drained.values()):
                self._check()
                if time.monotonic() > deadline:
                    raise ChainError("drain markers did not come back in time")
                self.drained.wait(0.05)
        # every pair has been evaluated and queued in a node FIFO: wait until all are here
        produced = [st.results for st in self.node_status()]
        while self.collected_total < sum(produced) or \
                any(got < want for got, want in zip(self.received, produced, strict=True)):
            self._check()
            if time.monotonic() > deadline:
                raise ChainError(f"results missing after drain: got {self.collected_total} "
                                 f"of {sum(produced)}")
            time.sleep(0.002)
        # and until the far ends have removed what the last arrivals' acknowledgements
        # expired (sent as the markers came back): the segments then hold the window
        want = self.window_tuples()
        while True:
            nodes = self.node_status()
            held = {"R": sum(st.segment_r for st in nodes),
                    "S": sum(st.segment_s for st in nodes)}
            if held == want:
                break
            if time.monotonic() > deadline:
                raise ChainError(f"the chain holds {held} tuples after the drain, its "
                                 f"window {want}: acknowledgements not applied in time")
            time.sleep(0.002)

    def take_results(self, payloads: bool = False, wait: bool = True):
        """The (r_id, s_id) pairs merged so far; ``payloads=True`` adds (None, None), as
        the chain carries no payloads (the engine's interface; ``wait`` is the engine's
        too: the chain's results arrive by themselves)."""
        parts = self.take_result_pieces()
        if not parts:
            r, s = np.zeros(0, np.int64), np.zeros(0, np.int64)
        else:
            r = np.concatenate([a for a, _, _, _ in parts])
            s = np.concatenate([b for _, b, _, _ in parts])
        return (r, s, None, None) if payloads else (r, s)

    def take_result_pieces(self, payloads: bool = False, wait: bool = True) -> list[tuple]:
        """:meth:`take_results` as the pieces merged, ``[(r_id, s_id, None, None)]``
        (the engine's interface)."""
        with self._collected_lock:
            parts, self._collected = self._collected, []
        self.stats.results += sum(int(a.shape[0]) for a, _ in parts)
        return [(a, b, None, None) for a, b in parts if a.shape[0]]

    # the backend's interface, for the manager's Status
    failovers = 0

    def set_wake(self, fn) -> None:
        """Have the merging network's clock call ``fn()`` (from its thread) whenever
        pairs reach the root: a streaming join hands them out at once."""
        self.wake = fn

    def sync(self) -> None:
        self._check()

    def alive_workers(self) -> list[int]:
        return list(range(len(self.addresses)))

    def loads(self) -> list:
        return []

    def take_late(self) -> dict[str, np.ndarray]:
        with self.lock:
            return self.driver.take_late()

    def window_tuples(self) -> dict[str, int]:
        with self.lock:
            return self.driver.window_tuples()

    def memory_bytes(self) -> int:
        return 0  # held by the node processes; see node_status()

    def node_status(self) -> list[handshake_pb2.NodeStatus]:
        out = []
        for i, stub in enumerate(self.stubs):
            try:
                st = stub.Status(handshake_pb2.ChainRef(chain_id=self.chain_id), timeout=30)
            except grpc.RpcError as e:
                raise ChainError(f"node {i} ({self.addresses[i]}): {e.details()}") from e
            if st.error:
                raise ChainError(f"node {i} ({self.addresses[i]}) failed: {st.error}")
            out.append(st)
        return out

    def status(self) -> dict:
        nodes = self.node_status() if self.started else []
        return {
            "topology": "handshake",
            "tuples_in": self.stats.tuples_in,
            "late": self.stats.late,
            "batches": self.stats.batches,
            "results": self.collected_total,
            "pauses": self.admission.pauses,
            "credit_waits": self.credit_waits,
            "window_tuples": self.window_tuples(),
            "segments": {"R": [st.segment_r for st in nodes], "S": [st.segment_s for st in nodes]},
            "stalls": [st.stalls for st in nodes],
            "fifo_high_water": [f.high_water for f in self.net.fifos()],
        }

    def close(self) -> None:
        self.stop.set()
        for link in self.links.values():
            link.close()
        if self.started:
            self._release(self.stubs)
        for t in self.threads:
            t.join(5)
        for c in self.channels:
            c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
