"""The manager's backend over gRPC: the paper's commands pipelined to worker processes.

Same methods as :class:`panjoin.manager.backend.LocalBackend`, so the engine
does not know where its subwindows live. One long-lived ``Session`` stream per
worker carries the commands in order, and the manager does not wait for them:
create, insert and expire are fire-and-forget (their feedback is checked
later), and a probe round returns a :class:`ProbeRound` whose answers the
engine collects when it needs them. So while the workers insert and probe
batch k (steps 4-5), the manager already collects and sorts batch k+1 (steps
1-2). Each worker executes its stream in order, so a probe always sees exactly
the inserts sent before it.

A RaP-Table subwindow's successor gets its partition table from the
predecessor's histograms (Algorithm 1): the worker sends it back with the
insert that fills the predecessor, and the manager passes it on in the next
create, whichever worker that lands on (the one place the manager waits for
an insert).

Faults: the manager keeps a copy of every subwindow (its create command and
every insert sent, each with its place in the global command order). A worker
that breaks its stream, or leaves a command unanswered for ``deadline``
seconds, is declared dead; each of its subwindows is created again on a
surviving worker (round-robin) and the copy replayed, interleaved with the
dead worker's unanswered probes in their original order, so each retried
probe sees exactly the tuples it saw the first time: no pair is missing or
doubled. When no worker is left, the join fails with a clear error.

Example: commands 1 insert(#0), 2 probe(#0), 3 insert(#0) to worker A; A dies
with 2 and 3 unanswered. #0 is rebuilt on B as create, insert 1, probe 2,
insert 3, and the probe's answer comes from B.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque

import grpc
import numpy as np

from panjoin.manager.backend import BackendStats, CreateSpec
from panjoin.proto.panjoin.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from panjoin.serving import OPTIONS
from panjoin.subwindow import WindowFilter, make_index
from panjoin.subwindow.bi_sort import RangeResult
from panjoin.wire import from_array, to_array

log = logging.getLogger("panjoin.manager")

STREAM = {"R": common_pb2.STREAM_R, "S": common_pb2.STREAM_S}
# fire-and-forget commands allowed in flight before the manager waits for the oldest:
# bounds how far the manager runs ahead of slow workers
MAX_UNCHECKED = 64


class WorkerError(RuntimeError):
    """A worker answered a command with an error, or the connection broke."""

    def __init__(self, msg: str, code: str = "UNAVAILABLE"):
        super().__init__(msg)
        self.code = code


class _Down(Exception):
    """Internal: the session's worker is dead; the caller fails over and retries."""


class _Call:
    """One command in flight on a session: its place in the global order, and its answer."""

    __slots__ = ("order", "kind", "msg", "sent", "done", "feedback", "session")

    def __init__(self, session, order: int, kind: str, msg):
        self.session = session
        self.order = order
        self.kind = kind
        self.msg = msg
        self.sent = time.monotonic()
        self.done = threading.Event()
        self.feedback: worker_pb2.Feedback | None = None

    def wait(self) -> worker_pb2.Feedback:
        """The feedback; raises _Down when the worker died or went silent for its
        deadline (measured from its last answer, since commands queue behind each other)."""
        s = self.session
        while not self.done.wait(max(0.0, s.last_heard + s.deadline - time.monotonic())):
            if time.monotonic() >= s.last_heard + s.deadline:
                s.down(f"no answer within {s.deadline:g} s")
        if self.feedback is None:
            raise _Down(s.why)
        return self.feedback


class _Session:
    """One worker's command stream: commands go out in order, feedback is matched by id."""

    _END = object()

    def __init__(self, address: str, deadline: float):
        self.address = address
        self.deadline = deadline
        self.alive = True
        self.why = ""
        self.load = worker_pb2.WorkerLoad()
        self.channel = grpc.insecure_channel(address, options=OPTIONS)
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.pending: dict[int, _Call] = {}  # command_id -> call, in send order
        self.last_heard = time.monotonic()  # last feedback, or the send that ended idleness
        self.busy_s = 0.0  # seconds the worker reported spending on this session's commands
        self.ids = itertools.count()
        self.lock = threading.Lock()
        self.responses = self.stub.Session(iter(self.requests.get, self._END))
        self.reader = threading.Thread(target=self._read, daemon=True,
                                       name=f"feedback-{address}")
        self.reader.start()

    def _read(self) -> None:
        """Match each feedback to its call (the worker answers in order)."""
        try:
            for fb in self.responses:
                with self.lock:
                    if not self.alive:  # declared dead (deadline): its calls are replayed
                        return
                    call = self.pending.pop(fb.command_id, None)
                    self.last_heard = time.monotonic()
                self.busy_s += fb.seconds
                if fb.HasField("load"):
                    self.load = fb.load
                if call is not None:
                    call.feedback = fb
                    call.done.set()
            why = "the worker closed its stream"
        except grpc.RpcError as e:
            why = f"{e.code().name}: {e.details()}"
        self.down(why)

    def send(self, order: int, kind: str, msg) -> _Call:
        if not self.alive:
            raise _Down(self.why)
        with self.lock:
            cid = next(self.ids)
            call = _Call(self, order, kind, msg)
            if not self.pending:
                self.last_heard = call.sent
            self.pending[cid] = call
        self.requests.put(worker_pb2.Command(command_id=cid, **{kind: msg}))
        return call

    def down(self, why: str) -> None:
        """Declare the worker dead: wake every waiter (their feedback stays None)."""
        with self.lock:
            if self.alive:
                self.alive = False
                self.why = f"worker {self.address} is unreachable: {why}"
                self.load = worker_pb2.WorkerLoad()
            calls = list(self.pending.values())
        for c in calls:
            c.done.set()
        self.channel.close()

    def unanswered(self) -> list[_Call]:
        with self.lock:
            out = list(self.pending.values())
            self.pending.clear()
        return out

    def close(self) -> None:
        self.requests.put(self._END)
        self.channel.close()


def _check(call: _Call) -> worker_pb2.Feedback:
    fb = call.wait()
    if fb.error:
        raise WorkerError(f"worker {call.session.address}: {fb.error}", fb.code)
    return fb


class ProbeRound:
    """The answers of one probe batch sent to every worker at once; ``result()`` collects
    them, failing over dead workers, as ``[(probe_idx, stored_seq), ...]`` per target."""

    def __init__(self, backend: GrpcBackend, targets, parts):
        self.backend = backend
        self.targets = targets
        self.parts = parts  # [(target indexes, call)]
        self._out = None

    def result(self) -> list[tuple[np.ndarray, np.ndarray]]:
        if self._out is None:
            out: list = [None] * len(self.targets)
            todo = deque(self.parts)
            while todo:
                idxs, call = todo.popleft()
                try:
                    fb = _check(call)
                except _Down:
                    todo.extend(self.backend._failover_probe(call, idxs))
                    continue
                for i, r in zip(idxs, fb.results, strict=True):
                    out[i] = self.backend._answer(r, self.targets[i][1])
            self._out = out
            self.backend.rounds_in_flight -= 1
        return self._out


class GrpcBackend:
    """Subwindows on worker processes, addressed ``host:port``."""

    def __init__(self, addresses: list[str], deadline: float = 60.0,
                 result_format: str = "pairs"):
        if not addresses:
            raise ValueError("a cluster needs at least one worker address")
        if result_format not in ("pairs", "ranges"):
            raise ValueError(f"result format must be pairs or ranges, not {result_format!r}")
        # ranges: BI-Sort workers answer with main-array ranges; the manager keeps a mirror
        # of each BI-Sort subwindow (the same inserts) to expand and filter them
        self.result_format = result_format
        self.mirrors: dict[int, object] = {}
        self.ranges_expanded = 0
        self.sessions = [_Session(a, deadline) for a in addresses]
        self.where: dict[int, int] = {}  # sub_id -> worker index
        self.kinds: dict[int, str] = {}
        self.splitters: dict[int, np.ndarray] = {}  # sub_id -> successor's partition table
        self.sizes: dict[int, int] = {}
        # the manager's copy of each subwindow: its create and every insert sent, in order
        self.copies: dict[int, tuple[tuple[int, worker_pb2.Create], list]] = {}
        self.order = itertools.count()  # global command order, for replay after a failure
        self.unchecked: deque[tuple[int, _Call]] = deque()  # (sub_id, fire-and-forget call)
        self.failovers = 0
        self.closed = False
        self.rounds_in_flight = 0
        self.stats = BackendStats()

    @property
    def n_workers(self) -> int:
        return len(self.sessions)

    def alive_workers(self) -> list[int]:
        return [i for i, s in enumerate(self.sessions) if s.alive]

    def loads(self) -> list[worker_pb2.WorkerLoad]:
        return [s.load for s in self.sessions]

    # ------------------------------------------------------------------ sending

    def _send(self, sub_id: int, kind: str, msg, order: int | None = None) -> _Call:
        """Send to the worker holding ``sub_id``; a dead one is failed over first."""
        order = next(self.order) if order is None else order
        while True:
            w = self.where[sub_id]
            try:
                return self.sessions[w].send(order, kind, msg)
            except _Down:
                self._failover(w)

    def _send_recorded(self, sub_id: int, kind: str, msg, order: int) -> None:
        """Send a create or insert already in the subwindow's copy. If its worker is
        found dead, the failover's replay of the copy delivers it: never send it twice."""
        w = self.where[sub_id]
        try:
            self.unchecked.append((sub_id, self.sessions[w].send(order, kind, msg)))
        except _Down:
            self._failover(w)

    def _resend(self, sub_id: int, kind: str, msg, order: int) -> _Call:
        """A replayed command during a failover; a second failure there is fatal."""
        w = self.where[sub_id]
        try:
            return self.sessions[w].send(order, kind, msg)
        except _Down as e:
            raise WorkerError(f"{e} while rebuilding subwindows of another failed worker; "
                              "the join cannot go on safely: restart it", "UNAVAILABLE") from e

    def _settle(self, sub_id: int, call: _Call) -> None:
        """Apply a finished fire-and-forget command's feedback (sizes, splitters, errors)."""
        while True:
            try:
                fb = _check(call)
                break
            except _Down:
                self._failover(self.sessions.index(call.session))
                # the replay re-sent the command; its new call is in the copy or the queue
                return
        if fb.status.sub_id == sub_id and sub_id in self.where:
            self.sizes[sub_id] = fb.status.nbytes
            if fb.status.successor_splitters.data:
                self.splitters[sub_id] = from_array(fb.status.successor_splitters)

    def _collect(self, block_all: bool = False) -> None:
        """Settle finished fire-and-forget commands; wait for the oldest while too many
        are in flight (or for all with ``block_all``)."""
        while self.unchecked:
            sub_id, call = self.unchecked[0]
            if not (block_all or len(self.unchecked) > MAX_UNCHECKED or call.done.is_set()):
                return
            self.unchecked.popleft()
            self._settle(sub_id, call)

    def sync(self) -> None:
        """Wait until every command sent so far is answered (errors raise here)."""
        self._collect(block_all=True)

    # ------------------------------------------------------------------ faults

    def _failover(self, dead: int) -> None:
        """Rebuild the dead worker's subwindows on the others and replay its unanswered
        probes in their original order (their calls get answered by the new workers)."""
        s = self.sessions[dead]
        if self.closed:
            raise WorkerError("the join was closed", "CANCELLED")
        s.down(s.why or "declared dead")
        unanswered = s.unanswered()
        alive = self.alive_workers()
        if not alive:
            raise WorkerError(f"every worker is down; the join cannot go on "
                              f"(restart workers and the join). Last: {s.why}", "UNAVAILABLE")
        lost = sorted(sub for sub, w in self.where.items() if w == dead)
        if not lost and not unanswered:
            return
        log.warning("%s; rebuilding %d subwindows on %d other workers", s.why, len(lost),
                    len(alive))
        for k, sub_id in enumerate(lost):
            self.where[sub_id] = alive[k % len(alive)]
        # the replay: creates and inserts of the lost subwindows, with the probes that were
        # in flight, in the order they were first sent
        replay = []
        for sub_id in lost:
            (corder, create), inserts = self.copies[sub_id]
            replay.append((corder, sub_id, "create", create, None))
            replay.extend((o, sub_id, "insert", ins, None) for o, ins in inserts)
        for call in unanswered:
            if call.kind == "probe":
                replay.append((call.order, None, "probe", call.msg, call))
        replay.sort(key=lambda t: t[0])
        self.unchecked = deque((sub, c) for sub, c in self.unchecked if c.session is not s)
        for order, sub_id, kind, msg, old in replay:
            if kind != "probe":
                self.unchecked.append((sub_id, self._resend(sub_id, kind, msg, order)))
                continue
            # one probe per subwindow now, since they may sit on different workers
            parts = []
            for j, sid in enumerate(msg.sub_ids):
                one = worker_pb2.Probe()
                one.CopyFrom(msg)
                del one.sub_ids[:]
                del one.filtered[:]
                one.sub_ids.append(sid)
                if msg.filtered:
                    one.filtered.append(msg.filtered[j])
                parts.append((j, self._resend(sid, "probe", one, order)))
            old.msg = parts  # ProbeRound picks these up (see _failover_probe)
        self.failovers += 1

    def _failover_probe(self, call: _Call, idxs: list[int]):
        """The replacement parts of a probe whose worker died: [(target idxs, call)]."""
        if not isinstance(call.msg, list):
            self._failover(self.sessions.index(call.session))
        return [([idxs[j]], c) for j, c in call.msg]

    # ------------------------------------------------------------------ the four commands

    def create(self, spec: CreateSpec) -> None:
        msg = worker_pb2.Create(sub_id=spec.sub_id, stream=STREAM[spec.stream], index=spec.kind,
                                capacity=spec.capacity, key_dtype=spec.key_dtype,
                                partitions=spec.partitions,
                                options={k: str(v) for k, v in spec.opts.items()})
        if spec.kind == "rap" and spec.predecessor in self.where:
            # Algorithm 1 needs the predecessor's final histograms: wait for its inserts
            self.sync()
        spl = self.splitters.pop(spec.predecessor, None) if spec.predecessor is not None else None
        if spl is not None:
            msg.splitters.CopyFrom(to_array(spl))
        alive = self.alive_workers()
        if not alive:
            raise WorkerError("every worker is down; the join cannot go on", "UNAVAILABLE")
        w = spec.worker % self.n_workers
        if w not in alive:
            w = alive[spec.sub_id % len(alive)]
        self.where[spec.sub_id] = w
        self.kinds[spec.sub_id] = spec.kind
        order = next(self.order)
        self.copies[spec.sub_id] = ((order, msg), [])
        if self.result_format == "ranges" and spec.kind == "bisort":
            self.mirrors[spec.sub_id] = make_index("bisort", spec.capacity, spec.key_dtype,
                                                   spec.partitions, 1, **spec.opts)
        self._send_recorded(spec.sub_id, "create", msg, order)
        self.stats.creates += 1

    def insert(self, sub_id: int, keys, ts, seq, key2=None) -> None:
        ins = worker_pb2.Insert(sub_id=sub_id, keys=to_array(keys), ts=to_array(ts),
                                seq=to_array(seq))
        if key2 is not None:  # for a residual condition, checked by the worker's probe
            ins.key2.CopyFrom(to_array(np.asarray(key2, dtype=np.float64)))
        order = next(self.order)
        self.copies[sub_id][1].append((order, ins))
        self._send_recorded(sub_id, "insert", ins, order)
        mirror = self.mirrors.get(sub_id)
        if mirror is not None:  # runs while the worker does the same insert
            mirror.insert(keys, ts, seq)
        self._collect()
        self.stats.inserts += 1

    def probe_many(self, targets, lo, hi, res=None) -> ProbeRound:
        """One Probe command per worker, sent to all workers at once; returns at once.
        ``res`` (:class:`panjoin.subwindow.Residual`): the residual intervals on key2,
        which the workers check while probing."""
        self._collect()
        full = next((f for _, f in targets if f.mode), None)
        base = worker_pb2.Probe(lo=to_array(lo), hi=to_array(hi),
                                filter_mode=full.mode if full else 0)
        if res is not None:
            base.lo2.CopyFrom(to_array(res.lo))
            base.hi2.CopyFrom(to_array(res.hi))
        if full is not None:
            c0, c1, c2 = full.arrays(lo.shape[-1])
            base.c0.CopyFrom(to_array(c0))
            base.c1.CopyFrom(to_array(c1))
            base.c2.CopyFrom(to_array(c2))
        parts: list = []
        self._send_probe(base, targets, list(range(len(targets))), next(self.order), parts)
        self.stats.probes += len(targets)
        self.rounds_in_flight += 1
        return ProbeRound(self, targets, parts)

    def _send_probe(self, base, targets, idxs, order: int, parts: list) -> None:
        """One Probe per worker holding some of ``targets[idxs]``; a worker found dead
        while sending is failed over and its share regrouped by the new placement."""
        by_worker: dict[int, list[int]] = {}
        for i in idxs:
            by_worker.setdefault(self.where[targets[i][0]], []).append(i)
        for w, mine in by_worker.items():
            msg = worker_pb2.Probe()
            msg.CopyFrom(base)
            if not base.HasField("lo2") and all(targets[i][0] in self.mirrors for i in mine):
                # ranges: the manager expands them; with a residual the workers filter
                msg.format = worker_pb2.RESULT_FORMAT_RANGES
            msg.sub_ids.extend(targets[i][0] for i in mine)
            msg.filtered.extend(bool(targets[i][1].mode) for i in mine)
            try:
                parts.append((mine, self.sessions[w].send(order, "probe", msg)))
            except _Down:
                self._failover(w)
                self._send_probe(base, targets, mine, order, parts)

    def _answer(self, r, flt: WindowFilter):
        pidx, seq = from_array(r.probe_idx, "<i8"), from_array(r.seq, "<i8")
        if not (r.range_probe_idx.data or r.start.data):
            return pidx, seq
        # main-array ranges -> (probe_idx, seq) on the mirror, filtered, plus buffer pairs
        rr = RangeResult(from_array(r.range_probe_idx, "<i8"), from_array(r.start, "<i8"),
                         from_array(r.end, "<i8"), pidx, seq)
        _, ts, sq = self.mirrors[r.sub_id].main_columns()
        self.ranges_expanded += int(rr.start.size)
        return rr.expand(None, ts, sq, flt if flt.mode else None)

    def expire(self, sub_id: int) -> None:
        """Drop a subwindow. The engine collects every probe round in flight before it
        expires one, so no unanswered probe can need the subwindow's copy or mirror."""
        self.mirrors.pop(sub_id, None)
        if sub_id in self.where:
            call = self._send(sub_id, "expire", worker_pb2.Expire(sub_id=sub_id))
            self.unchecked.append((sub_id, call))
        for d in (self.where, self.copies, self.splitters, self.sizes, self.kinds):
            d.pop(sub_id, None)
        self.stats.expires += 1

    def nbytes(self) -> int:
        self._collect()
        return sum(self.sizes.values())

    def close(self) -> None:
        self.closed = True  # sessions ending now are not worker failures
        for s in self.sessions:
            s.close()
