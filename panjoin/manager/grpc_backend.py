"""The manager's backend over gRPC: the paper's commands pipelined to worker processes.

Implements :class:`panjoin.backend.Backend`, so the engine does not know where
its subwindows live. One long-lived ``Session`` stream per worker carries the
commands in order (encoded by :mod:`panjoin.codec`), and the manager does not
wait for them: create, insert and expire are fire-and-forget (their feedback is
checked later), and a probe round returns a :class:`ProbeRound` whose answers
the engine collects when it needs them. So while the workers insert and probe
batch k (steps 4-5), the manager already collects and sorts batch k+1 (steps
1-2). Each worker executes its stream in order, so a probe always sees exactly
the inserts sent before it. The manager holds no tuple: workers keep the ids
and answer probes with them.

A batch's columns (key, ts, seq, id, sorted by key) cross the wire once per
worker that needs them, in a ``Batch`` command; the insert and probe commands
that follow name it by id, and each worker derives the probe tuples' key
intervals and window bounds from the join's predicate and window. Per tuple
that is 32 bytes to each worker involved (16 where the integer columns' spans fit
32 bits: :func:`panjoin.codec.encode_batch`), where an insert and a probe carrying
their own arrays (bounds, filter columns) sent 72 to the one worker holding
both subwindows.

A RaP-Table subwindow's successor gets its partition table from the
predecessor's histograms (Algorithm 1): the worker sends it back with the
insert that fills the predecessor, and the manager passes it on in the next
create, whichever worker that lands on (the one place the manager waits for
an insert).

Faults, by primary/backup replication (``replicas=2``, the default with two or
more workers): each subwindow has a primary on one worker and a *backup* on the
next, which receives the same create, batches, inserts and expire but only logs
the inserts (a memcpy per batch, no index: about 40 bytes a tuple, no probe work).
A worker that breaks its stream, or leaves a command unanswered for
``deadline`` seconds and then does not answer a heartbeat either (its gRPC health
service, served on another thread: a worker busy with a long command, or loading
and compiling its kernels on a loaded machine, answers it and gets another
``deadline``), is declared dead; each of its primaries' backups is
promoted (its index built from the log, once) and the dead worker's
unanswered probes are sent again to the new primaries. Every probe carries,
per subwindow, the seq limit it was first sent with, so a replay that finds
later inserts on the promoted backup answers exactly as the first time: no
pair is missing or doubled (the replay sends its batch again first: the new
primary may never have had it). Subwindows that lost their backup go on without
one until they expire; a subwindow that loses both copies, or a join that
loses every worker, fails with a clear error (``replicas=1``: no backup, no
failover, half the worker memory and insert traffic).

Example: subwindow #0 on A (primary) and B (backup); commands 1 insert(#0) to
both, 2 probe(#0, seq < 64) to A; A dies with 2 unanswered. B promotes #0 and
answers probe 2 with the tuples of seq < 64.

Session life cycle: a worker accepts a session by sending its initial metadata (its
idle timeout and free memory budget, read by :meth:`GrpcBackend.connect`) or refuses
it (RESOURCE_EXHAUSTED: at its session cap); it ends a session that sends nothing for
its idle timeout, so an idle join's sessions get an empty message every third of it
(:meth:`GrpcBackend.keepalive`). :meth:`GrpcBackend.close` ends every session, which
releases all it holds on its worker.
"""

from __future__ import annotations

import itertools
import logging
import queue
import secrets
import threading
import time
from collections import deque

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from panjoin import codec
from panjoin.backend import BackendStats, CreateSpec, IdPairs, PairsRef, SortedBatch
from panjoin.proto.panjoin.v1 import worker_pb2
from panjoin.security import channel
from panjoin.subwindow.store import SubwindowStore
from panjoin.wire import Encoded, from_array

log = logging.getLogger("panjoin.manager")

#: how long a heartbeat may take: a busy worker's health thread waits for the GIL and
#: for a core, but a stopped or vanished one never answers
HEARTBEAT_S = 10.0

# fire-and-forget commands allowed in flight before the manager waits for the oldest:
# bounds how far the manager runs ahead of slow workers
MAX_UNCHECKED = 64

SESSION_METHOD = f"/{worker_pb2.DESCRIPTOR.services_by_name['Worker'].full_name}/Session"


class WorkerError(RuntimeError):
    """A worker answered a command with an error, or the connection broke. ``code``: a
    grpc.StatusCode name, what the manager's client gets (:func:`status_code`);
    ``order``: the failed command's place in the join's command order, if it had one."""

    def __init__(self, msg: str, code: str = "UNAVAILABLE", order: int | None = None):
        super().__init__(msg)
        self.code = code
        self.order = order


def status_code(e: WorkerError) -> grpc.StatusCode:
    """The status a client gets for ``e``. A worker's NOT_FOUND (a subwindow or batch it
    does not have) is the manager's fault, never the client's: INTERNAL."""
    if e.code == "NOT_FOUND":
        return grpc.StatusCode.INTERNAL
    return getattr(grpc.StatusCode, e.code, grpc.StatusCode.UNAVAILABLE)


class _Down(Exception):
    """Internal: the session's worker is dead; the caller fails over and retries."""


class _Call:
    """One command in flight on a session: its place in the global order, and its answer."""

    __slots__ = ("order", "kind", "msg", "sent", "done", "feedback", "session")

    def __init__(self, session, order: int, kind: str, msg=None):
        self.session = session
        self.order = order
        self.kind = kind
        self.msg = msg  # probes: (batch, Probe), to send again after a failure
        self.sent = time.monotonic()
        self.done = threading.Event()
        self.feedback: worker_pb2.Feedback | None = None

    def wait(self) -> worker_pb2.Feedback:
        """The feedback; raises _Down when the worker died or went silent for its
        deadline (measured from its last answer, since commands queue behind each other)."""
        s = self.session
        s.flush()  # the command may still wait in the outbox
        while not self.done.wait(max(0.0, s.last_heard + s.deadline - time.monotonic())):
            if time.monotonic() >= s.last_heard + s.deadline:
                if s.heartbeat():  # busy, not gone: the deadline starts again
                    log.warning("worker %s: no answer for %g s, but it answers its "
                                "heartbeat: waiting on", s.address, s.deadline)
                    s.last_heard = time.monotonic()
                    continue
                s.down(f"no answer within {s.deadline:g} s, nor to a heartbeat")
        if self.feedback is None:
            raise _Down(s.why)
        return self.feedback


class _Session:
    """One worker's command stream: commands go out in order, feedback is matched by id.

    Commands gather in an outbox and go out together at :meth:`flush` (the backend
    flushes after each batch's inserts, and a wait for an answer flushes first): a
    gRPC message costs some 100 us of thread hand-offs on each side, a command
    in a message almost nothing."""

    _END = object()

    def __init__(self, address: str, deadline: float, results_token: str | None = None):
        self.address = address
        #: results past the manager: the client subscribes to this session's pairs by it
        self.results_token = results_token
        self.source = 0  # its number among the join's sessions (GrpcBackend._session)
        self.deadline = deadline
        self.alive = True
        self.why = ""
        self.retiring = False  # removed (RemoveWorker): no new subwindow, released when empty
        self.released = False  # its session ended by us, not a failure
        self.code = ""  # the status code name of a stream that ended (e.g. refused)
        # set once the worker accepted the session (its initial metadata: idle timeout,
        # free memory) or the stream ended
        self.accepted = threading.Event()
        self.meta: dict[str, str] = {}
        self.last_sent = time.monotonic()
        self.load = worker_pb2.WorkerLoad()
        self.channel = channel(address, peer=True)
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.pending: dict[int, _Call] = {}  # command_id -> call, in send order
        self.last_heard = time.monotonic()  # last feedback, or the send that ended idleness
        self.busy_s = 0.0  # seconds the worker reported spending on this session's commands
        self.batch_id = 0  # the newest batch sent on this session (0: none)
        self.ids = itertools.count()
        self.lock = threading.Lock()
        self.wake = None  # called after feedback answered a call (GrpcBackend.set_wake)
        self.outbox = Encoded(worker_pb2.Commands)
        # commands go out as the bytes flush() joins (each array copied once, see
        # panjoin.wire.Encoded), so the stream has no request serializer
        self.responses = self.channel.stream_stream(
            SESSION_METHOD, request_serializer=None,
            response_deserializer=worker_pb2.Feedbacks.FromString,
        )(iter(self.requests.get, self._END),
          metadata=((codec.RESULTS_TOKEN_KEY, results_token),) if results_token else None)
        self.reader = threading.Thread(target=self._read, daemon=True,
                                       name=f"feedback-{address}")
        self.reader.start()

    def _read(self) -> None:
        """Match each feedback to its call (the worker answers in order)."""
        try:
            self.meta = dict(self.responses.initial_metadata() or ())
            if "panjoin-idle-timeout" in self.meta:  # else it refused: the loop raises
                self.accepted.set()
            for fbs in self.responses:
                with self.lock:
                    if not self.alive:  # declared dead (deadline): its calls are replayed
                        return
                    calls = [self.pending.pop(fb.command_id, None) for fb in fbs.feedback]
                    self.last_heard = time.monotonic()
                for fb, call in zip(fbs.feedback, calls, strict=True):
                    self.busy_s += fb.seconds
                    if fb.HasField("load"):
                        self.load = fb.load
                    if call is not None:
                        call.feedback = fb
                        call.done.set()
                if self.wake is not None:
                    self.wake()
            why = "the worker closed its stream"
        except grpc.RpcError as e:
            why = f"{e.code().name}: {e.details()}"
            self.code = e.code().name
        self.down(why)
        self.accepted.set()

    def keepalive(self) -> None:
        """Send an empty message if the session sent nothing for a third of the worker's
        idle timeout (the worker ends a session idle that long)."""
        idle = float(self.meta.get("panjoin-idle-timeout", 0) or 0)
        if self.alive and idle and time.monotonic() - self.last_sent > idle / 3:
            self.last_sent = time.monotonic()
            self.requests.put(b"")

    def heartbeat(self) -> bool:
        """Does the worker's process answer at all? Its health service runs on another
        gRPC thread than the session, so it answers while a command computes."""
        if not self.alive:
            return False
        try:
            r = health_pb2_grpc.HealthStub(self.channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=HEARTBEAT_S)
        except grpc.RpcError:
            return False
        return r.status == health_pb2.HealthCheckResponse.SERVING

    def send(self, order: int, kind: str, msg, again=None) -> _Call:
        """Send ``msg`` (a generated message, or an :class:`Encoded` one) as the
        Command's field ``kind``; a probe keeps ``again``, what its replay needs."""
        if not self.alive:
            raise _Down(self.why)
        with self.lock:
            cid = next(self.ids)
            call = _Call(self, order, kind, again)
            if not self.pending:
                self.last_heard = call.sent
            self.pending[cid] = call
        if isinstance(msg, Encoded):
            cmd = msg.wrap(worker_pb2.Command, kind,
                           worker_pb2.Command(command_id=cid).SerializeToString())
        else:
            cmd = Encoded(worker_pb2.Command).message(
                worker_pb2.Command(command_id=cid, **{kind: msg}))
        with self.lock:
            self.outbox.extend(cmd.wrap(worker_pb2.Commands, "commands"))
        return call

    def flush(self) -> None:
        """Send the commands in the outbox, as one message."""
        with self.lock:
            if not self.outbox.nbytes:
                return
            out, self.outbox = self.outbox, Encoded(worker_pb2.Commands)
            self.last_sent = time.monotonic()
        self.requests.put(out.tobytes())

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
        if self.wake is not None:
            self.wake()
        self.channel.close()

    def unanswered(self) -> list[_Call]:
        with self.lock:
            out = list(self.pending.values())
            self.pending.clear()
        return out

    def close(self) -> None:
        self.flush()
        self.requests.put(self._END)
        self.channel.close()

    def release(self) -> None:
        """End the session of a removed worker that holds nothing and owes no answer: the
        worker frees what the session held; no failover, it is not dead."""
        with self.lock:
            self.released = True
            self.alive = False
            self.why = f"worker {self.address} was removed from the join"
            self.load = worker_pb2.WorkerLoad()
        self.requests.put(self._END)
        self.channel.close()


def _check(call: _Call) -> worker_pb2.Feedback:
    fb = call.wait()
    if fb.error:
        raise WorkerError(f"worker {call.session.address}: {fb.error}", fb.code, call.order)
    return fb


class ProbeRound:
    """The answers of one probe batch sent to every worker at once; ``result()`` collects
    them, failing over dead workers, as ``[(probe_idx, stored_id, stored_seq)]`` per
    target."""

    def __init__(self, backend: GrpcBackend, targets, batch: SortedBatch, parts):
        self.backend = backend
        self.targets = targets
        self.batch = batch
        self.parts = parts  # [(target indexes, call)]
        self._out = None

    def done(self) -> bool:
        """Every answer is in (or a worker died: ``result()`` fails it over)."""
        if self._out is None:
            self.backend.flush()
        return self._out is not None or all(
            c.done.is_set() for _, c in self.parts if not isinstance(c, list))

    def result(self):
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
                except WorkerError as e:
                    raise self.backend.first_error(e) from None
                results = iter(fb.results)
                for i in idxs:
                    r = next(results)
                    out[i] = (PairsRef(call.session.source, fb.command_id, r.pairs)
                              if self.backend.direct else
                              self.backend._answer(r, self.targets[i][1], self.batch, results))
            self._out = out
            self.backend.rounds_in_flight -= 1
        return self._out


class GrpcBackend:
    """Subwindows on worker processes, addressed ``host:port``; ``replicas`` (1 or 2)
    copies of each, the second a backup on the next worker."""

    def __init__(self, addresses: list[str], deadline: float = 60.0,
                 result_format: str = "pairs", replicas: int = 2, direct: bool = False):
        if not addresses:
            raise ValueError("a cluster needs at least one worker address")
        if result_format not in ("pairs", "ranges"):
            raise ValueError(f"result format must be pairs or ranges, not {result_format!r}")
        if replicas not in (1, 2):
            raise ValueError(f"replicas must be 1 (no failover) or 2 (primary and backup), "
                             f"not {replicas}")
        # ranges: BI-Sort workers answer with main-array ranges; the manager keeps a mirror
        # of each BI-Sort subwindow (the same inserts: O(window) memory here) to expand them
        self.result_format = result_format
        self.mirrors: dict[int, SubwindowStore] = {}
        self.ranges_expanded = 0
        # rounds whose answers are ranges into a mirror: expanded before that mirror
        # changes (an insert may merge into the main array and move its rows)
        self._ranged: list[ProbeRound] = []
        self.max_replicas = replicas  # what the join asked for; replicas: what it gets
        self.replicas = min(replicas, len(addresses))
        self.want_seq = False  # the engine keeps payloads by seq: answers carry it
        self.deadline = deadline
        self._wake = None
        # results past the manager: each session's probe pairs go to the join's client
        # (RESULT_FORMAT_DIRECT), the engine passes on references to them (PairsRef)
        self.direct = direct
        self.sessions = [self._session(a, i) for i, a in enumerate(addresses)]
        self.where: dict[int, int] = {}  # sub_id -> worker of the primary
        self.backup: dict[int, int] = {}  # sub_id -> worker of the backup, while it has one
        self.kinds: dict[int, str] = {}
        self.splitters: dict[int, np.ndarray] = {}  # sub_id -> successor's partition table
        self.sizes: dict[int, int] = {}
        self.order = itertools.count()  # global command order (logs, tests)
        self.unchecked: deque[tuple[int, _Call]] = deque()  # (sub_id, fire-and-forget call)
        self.error: WorkerError | None = None  # the first a worker answered (first_error)
        self.failovers = 0
        self.promoted = 0
        self.closed = False
        self.rounds_in_flight = 0
        self._busy_seen: list[float] = []  # each session's busy_s at the last busiest_worker_s
        self._batch_enc: tuple | None = None  # (batch, its encoding): sent once per worker
        self.stats = BackendStats()

    def _session(self, address: str, source: int) -> _Session:
        s = _Session(address, self.deadline, secrets.token_urlsafe(24) if self.direct else None)
        s.source = source
        return s

    def sources(self) -> list[tuple[int, str, str]]:
        """Results past the manager: ``(source, address, token)`` of every session, the
        source being its index (sessions are only ever appended)."""
        return [(s.source, s.address, s.results_token) for s in self.sessions]

    @property
    def n_workers(self) -> int:
        return len(self.sessions)

    def alive_workers(self) -> list[int]:
        return [i for i, s in enumerate(self.sessions) if s.alive]

    def placeable(self) -> list[int]:
        """Workers that may get a new subwindow (primary or backup): alive, not removed."""
        return [i for i, s in enumerate(self.sessions) if s.alive and not s.retiring]

    # ------------------------------------------------------------------ resizing

    def add_worker(self, address: str, timeout: float) -> None:
        """Open a session on ``address``; new subwindows may go there from now on (the
        caller holds the join's lock, so no batch is half sent). A worker removed before
        and still held (its subwindows not all expired) is simply taken back. Raises
        WorkerError if the worker does not accept the session within ``timeout`` s."""
        for s in self.sessions:
            if s.address == address and s.alive:
                s.retiring = False
                self.replicas = min(self.max_replicas, len(self.placeable()))
                return
        s = self._session(address, len(self.sessions))
        if not s.accepted.wait(timeout) or "panjoin-idle-timeout" not in s.meta:
            why = s.why or f"worker {address} did not accept a session within {timeout:g} s"
            s.close()
            raise WorkerError(why, s.code or "UNAVAILABLE")
        s.wake = self._wake
        self.sessions.append(s)
        self.replicas = min(self.max_replicas, len(self.placeable()))

    def can_remove(self, address: str) -> bool:
        """Would a worker other than ``address`` be left to place new subwindows on?"""
        return any(self.sessions[i].address != address for i in self.placeable())

    def remove_worker(self, address: str) -> bool:
        """Stop placing new subwindows (primaries and backups) on ``address``; its
        subwindows stay where they are, answer probes and get their inserts until they
        expire, so every subwindow keeps the copies it had and new ones get theirs on
        the other workers. Its session ends once it holds nothing (at once if it holds
        nothing now). False if the join has no session there."""
        mine = [s for s in self.sessions if s.address == address and s.alive]
        for s in mine:
            s.retiring = True
        self.replicas = min(self.max_replicas, max(1, len(self.placeable())))
        self._release_retired()
        return bool(mine)

    def _release_retired(self) -> None:
        """End the sessions of removed workers that hold no copy and owe no answer."""
        held = set(self.where.values()) | set(self.backup.values())
        for i, s in enumerate(self.sessions):
            if s.retiring and s.alive and i not in held:
                s.flush()
                with s.lock:
                    idle = not s.pending
                if idle:
                    log.info("worker %s holds nothing of this join any more: session "
                             "released", s.address)
                    s.release()

    def loads(self) -> list[worker_pb2.WorkerLoad]:
        return [s.load for s in self.sessions]

    # ------------------------------------------------------------------ sending

    def _send(self, sub_id: int, kind: str, msg) -> None:
        """A fire-and-forget command to every copy of ``sub_id`` (primary, then backup).
        A copy found dead is failed over; the surviving copies got the command."""
        order = next(self.order)
        for w in (self.where.get(sub_id), self.backup.get(sub_id)):
            if w is None:
                continue
            try:
                self.unchecked.append((sub_id, self.sessions[w].send(order, kind, msg)))
            except _Down:
                self._failover(w)

    def _settle(self, sub_id: int, call: _Call) -> None:
        """Apply a finished fire-and-forget command's feedback (sizes, splitters, errors)."""
        try:
            fb = _check(call)
        except _Down:
            self._failover(self.sessions.index(call.session))
            return  # the surviving copy got the same command
        except WorkerError as e:
            raise self.first_error(e) from None
        if fb.status.sub_id == sub_id and self.where.get(sub_id) == \
                self.sessions.index(call.session):
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
        if any(s.retiring and s.alive for s in self.sessions):
            self._release_retired()  # its last expire may just have been answered

    def first_error(self, e: WorkerError) -> WorkerError:
        """The join's first worker error, which caused ``e`` or is ``e``. A command
        fails after an earlier fire-and-forget one did (a create that could not allocate
        its arrays, then a probe of that subwindow: "unknown subwindow 0"): the client
        must see the cause, so the earliest error already answered wins, for good."""
        if self.error is None:
            failed = [c for _, c in self.unchecked
                      if c.done.is_set() and c.feedback is not None and c.feedback.error
                      and (e.order is None or c.order < e.order)]
            if failed:
                c = min(failed, key=lambda c: c.order)
                e = WorkerError(f"worker {c.session.address}: {c.feedback.error}",
                                c.feedback.code, c.order)
            self.error = e
        return self.error

    def sync(self) -> None:
        """Wait until every command sent so far is answered (errors raise here)."""
        self._collect(block_all=True)

    # ------------------------------------------------------------------ faults

    def _failover(self, dead: int) -> None:
        """Promote the backups of the dead worker's primaries and send its unanswered
        probes again (their calls get answered by the new primaries)."""
        s = self.sessions[dead]
        if self.closed:
            raise WorkerError("the join was closed", "CANCELLED")
        s.down(s.why or "declared dead")
        unanswered = s.unanswered()
        alive = self.alive_workers()
        lost = sorted(sub for sub, w in self.where.items() if w == dead)
        if not alive:
            # subwindows gone with the last worker are lost tuples, not a pause
            raise WorkerError(f"every worker is down; the join cannot go on "
                              f"(restart workers and the join). Last: {s.why}",
                              "DATA_LOSS" if lost else "UNAVAILABLE")
        orphans = [sub for sub, w in self.backup.items() if w == dead]
        for sub in orphans:
            del self.backup[sub]
        if not lost and not unanswered:
            return
        bare = [sub for sub in lost if sub not in self.backup]
        if bare:
            raise WorkerError(
                f"{s.why}; subwindows {bare} had no other copy (replicas={self.replicas}, "
                f"or their backup was lost before), so the join cannot go on exactly. "
                "Restart it (from the source); run with --replicas 2 and 2+ workers to "
                "survive a worker's loss", "DATA_LOSS")
        log.warning("%s; promoting %d backups on %d other workers (%d subwindows lost "
                    "their backup)", s.why, len(lost), len(alive), len(orphans))
        order = next(self.order)
        for sub in lost:
            w = self.backup.pop(sub)
            self.where[sub] = w
            try:
                self.unchecked.append((sub, self.sessions[w].send(
                    order, "promote", worker_pb2.Promote(sub_id=sub))))
            except _Down as e:
                raise self._lost_during("promoting the backups", e) from e
            self.promoted += 1
        self.unchecked = deque((sub, c) for sub, c in self.unchecked if c.session is not s)
        for call in unanswered:
            if call.kind != "probe":
                continue  # creates, inserts, expires: the backups got them too
            # one probe per subwindow now, as pairs (ranges index the first main array)
            parts = []
            batch, msg = call.msg
            for j, sid in enumerate(msg.sub_ids):
                one = worker_pb2.Probe(batch_id=msg.batch_id, sub_ids=[sid],
                                       want_seq=msg.want_seq,
                                       format=worker_pb2.RESULT_FORMAT_PAIRS)
                if msg.filtered:
                    one.filtered.append(msg.filtered[j])
                if msg.seq_limit:
                    one.seq_limit.append(msg.seq_limit[j])
                w = self.where[sid]
                try:
                    # the new primary may never have had this batch, or dropped it since
                    self._send_batch(w, batch, call.order, replay=True)
                    parts.append((j, self.sessions[w].send(call.order, "probe", one,
                                                            again=(batch, one))))
                except _Down as e:
                    raise self._lost_during("replaying the probes", e) from e
            call.msg = parts  # ProbeRound picks these up (see _failover_probe)
        self.flush()
        self.failovers += 1

    def _lost_during(self, doing: str, e: _Down) -> WorkerError:
        """The error when a second worker dies while the first one's failover runs:
        when it was the last one, say so (workers killed together race to be first)."""
        if not self.alive_workers():
            return WorkerError(f"every worker is down; the join cannot go on (restart "
                               f"workers and the join). Last: {e}", "DATA_LOSS")
        return WorkerError(f"{e} while {doing} of another failed worker; "
                           "the join cannot go on: restart it", "UNAVAILABLE")

    def _failover_probe(self, call: _Call, idxs: list[int]):
        """The replacement parts of a probe whose worker died: [(target idxs, call)]."""
        if not isinstance(call.msg, list):
            self._failover(self.sessions.index(call.session))
        return [([idxs[j]], c) for j, c in call.msg]

    # ------------------------------------------------------------------ the commands

    def create(self, spec: CreateSpec) -> None:
        if spec.kind == "rap" and spec.predecessor in self.where:
            # Algorithm 1 needs the predecessor's final histograms: wait for its inserts
            self.sync()
        if spec.predecessor is not None:
            spec.splitters = self.splitters.pop(spec.predecessor, None)
        alive = self.placeable()  # a removed worker gets no new subwindow, nor a backup
        if not alive:
            raise WorkerError("every worker is down; the join cannot go on", "UNAVAILABLE")
        w = spec.worker % self.n_workers
        if w not in alive:
            w = alive[spec.sub_id % len(alive)]
        self.where[spec.sub_id] = w
        if self.replicas > 1 and len(alive) > 1:
            self.backup[spec.sub_id] = alive[(alive.index(w) + 1) % len(alive)]
        self.kinds[spec.sub_id] = spec.kind
        if self.result_format == "ranges" and spec.kind == "bisort":
            self.mirrors[spec.sub_id] = SubwindowStore("bisort", spec.capacity, spec.key_dtype,
                                                       spec.partitions, opts=spec.opts)
        primary = codec.encode_create(spec)
        order = next(self.order)
        for ww, msg in ((w, primary), (self.backup.get(spec.sub_id), None)):
            if ww is None:
                continue
            if msg is None:
                msg = worker_pb2.Create()
                msg.CopyFrom(primary)
                msg.backup = True
            try:
                self.unchecked.append((spec.sub_id, self.sessions[ww].send(order, "create",
                                                                             msg)))
            except _Down:
                self._failover(ww)
        self.stats.creates += 1

    def _send_batch(self, w: int, batch: SortedBatch, order: int, replay: bool = False
                    ) -> None:
        """Send ``batch`` to worker ``w`` unless it has it: once per worker, however many
        of its commands name it. A normal send lets the worker drop older batches; a
        replay's does not (the worker may need its newer one still)."""
        s = self.sessions[w]
        if s.batch_id == batch.batch_id and not replay:
            return
        if self._batch_enc is None or self._batch_enc[0] is not batch:
            self._batch_enc = (batch, codec.encode_batch(batch))
        msg = self._batch_enc[1].copy().message(
            worker_pb2.Batch(release_below=0 if replay else batch.batch_id))
        self.unchecked.append((-1, s.send(order, "batch", msg)))
        if not replay:
            s.batch_id = batch.batch_id

    def insert(self, sub_id: int, batch: SortedBatch, seq_from: int, seq_to: int) -> None:
        order = next(self.order)
        msg = worker_pb2.Insert(sub_id=sub_id, batch_id=batch.batch_id, seq_from=seq_from,
                                seq_to=seq_to)
        for w in (self.where.get(sub_id), self.backup.get(sub_id)):  # primary, then backup
            if w is None:
                continue
            try:
                self._send_batch(w, batch, order)
                self.unchecked.append((sub_id, self.sessions[w].send(order, "insert", msg)))
            except _Down:
                self._failover(w)  # the surviving copy got the insert
        mirror = self.mirrors.get(sub_id)
        if mirror is not None:  # runs while the worker does the same insert
            for rnd in self._ranged:
                if rnd._out is None and any(t[0] == sub_id for t in rnd.targets):
                    rnd.result()  # its ranges index the mirror as it is now
            self._ranged = [r for r in self._ranged if r._out is None]
            mirror.insert(*batch.columns(seq_from, seq_to)[:4])
        self.flush()  # the batch's commands go out together: Batch, Probe, Insert
        self._collect()
        self.stats.inserts += 1

    def probe_many(self, targets, batch: SortedBatch) -> ProbeRound:
        """One Probe command per worker, sent to all workers at once; returns at once.
        ``targets`` = [(sub_id, filtered, seq_limit)]; each worker derives the batch's
        key intervals, window bounds and residual itself."""
        self._collect()
        parts: list = []
        self._send_probe(batch, targets, list(range(len(targets))), next(self.order), parts)
        self.stats.probes += len(targets)
        self.rounds_in_flight += 1
        rnd = ProbeRound(self, targets, batch, parts)
        if any(t[0] in self.mirrors for t in targets):
            self._ranged.append(rnd)
        return rnd

    def _send_probe(self, batch: SortedBatch, targets, idxs, order: int, parts: list) -> None:
        """One Probe per worker holding some of ``targets[idxs]``; a worker found dead
        while sending is failed over and its share regrouped by the new placement."""
        by_worker: dict[int, list[int]] = {}
        for i in idxs:
            by_worker.setdefault(self.where[targets[i][0]], []).append(i)
        for w, mine in by_worker.items():
            msg = worker_pb2.Probe(batch_id=batch.batch_id, want_seq=self.want_seq,
                                   sub_ids=[targets[i][0] for i in mine],
                                   filtered=[bool(targets[i][1]) for i in mine],
                                   seq_limit=[int(targets[i][2]) for i in mine])
            # ranges: the manager expands them; with a residual the workers filter
            if batch.predicate.residual is None and all(targets[i][0] in self.mirrors
                                                        for i in mine):
                msg.format = worker_pb2.RESULT_FORMAT_RANGES
            elif self.direct:  # the pairs go to the client, their counts come here
                msg.format = worker_pb2.RESULT_FORMAT_DIRECT
            elif not self.want_seq:  # the pairs' bytes pass through here unmapped
                msg.format = worker_pb2.RESULT_FORMAT_ID_PAIRS
            try:
                self._send_batch(w, batch, order)
                parts.append((mine, self.sessions[w].send(order, "probe", msg,
                                                           again=(batch, msg))))
            except _Down:
                self._failover(w)
                self._send_probe(batch, targets, mine, order, parts)

    def _answer(self, r, filtered: bool, batch: SortedBatch, results):
        """One target's answer from its ProbeResult ``r`` (and, for ID_PAIRS pieces, the
        ones after it in ``results``)."""
        if codec.is_id_pairs(r):
            pieces = [codec.decode_id_pairs(r)]
            while r.more:
                r = next(results)
                pieces.append(codec.decode_id_pairs(r))
            return IdPairs(pieces)
        if not codec.is_ranges(r):
            return codec.decode_answer(r)
        # main-array ranges -> (probe_idx, seq) on the mirror, filtered, plus buffer pairs
        rr = codec.decode_ranges(r)
        mirror = self.mirrors[r.sub_id]
        _, ts, sq = mirror.index.main_columns()
        self.ranges_expanded += int(rr.start.size)
        pidx, seq = rr.expand(None, ts, sq, batch.probe_inputs()[2] if filtered else None)
        return pidx, mirror.ids_of(seq), seq

    def expire(self, sub_id: int) -> None:
        """Drop a subwindow (every copy). The engine expires one once the probe rounds
        sent before its expiry are collected, so no unanswered probe can need it."""
        self.mirrors.pop(sub_id, None)
        if sub_id in self.where:
            self._send(sub_id, "expire", worker_pb2.Expire(sub_id=sub_id))
        for d in (self.where, self.backup, self.splitters, self.sizes, self.kinds):
            d.pop(sub_id, None)
        self.stats.expires += 1
        if any(s.retiring and s.alive for s in self.sessions):
            self.flush()  # the expire goes out now: the session ends once it is answered

    def busiest_worker_s(self) -> float:
        """The most seconds one worker spent on this join's commands since the last call,
        as its feedback reported them: a latency bound's engine counts them as busy time
        of the batch it collects (workers that fall behind must get larger batches, though
        the engine's own time per batch is small)."""
        now = [s.busy_s for s in self.sessions]
        # sessions are only ever appended (AddWorker)
        seen = (self._busy_seen + [0.0] * len(now))[:len(now)]
        self._busy_seen = now
        return max([a - b for a, b in zip(now, seen, strict=True)] + [0.0])

    def set_wake(self, fn) -> None:
        """Have every worker's feedback reader call ``fn()`` (no arguments, from its own
        thread) after each answer: a streaming join's loop notices answered probe
        rounds at once instead of polling :meth:`ProbeRound.done`."""
        self._wake = fn  # sessions added later get it too
        for s in self.sessions:
            s.wake = fn

    def flush(self) -> None:
        """Send every session's waiting commands."""
        for s in self.sessions:
            if s.alive:
                s.flush()

    def connect(self, timeout: float) -> int:
        """Wait (at most ``timeout`` s) until every worker accepted its session; returns
        the least memory free on one of them (bytes; -1 if none said). A worker that
        refused the session (RESOURCE_EXHAUSTED: at its --max-sessions) fails the join
        now; one that is down only if none is up (the join goes on without it)."""
        end = time.monotonic() + timeout
        for s in self.sessions:
            s.accepted.wait(max(0.0, end - time.monotonic()))
        for s in self.sessions:
            if s.code == "RESOURCE_EXHAUSTED":
                raise WorkerError(s.why, s.code)
        if not self.alive_workers():
            raise WorkerError("every worker is down: " + "; ".join(s.why for s in self.sessions),
                              "UNAVAILABLE")
        free = [int(s.meta["panjoin-memory-free"]) for s in self.sessions
                if s.alive and "panjoin-memory-free" in s.meta]
        return min(free) if free else -1

    def keepalive(self) -> None:
        """Keep idle sessions open (see :meth:`_Session.keepalive`)."""
        for s in self.sessions:
            s.keepalive()

    def nbytes(self) -> int:
        """Bytes the workers hold for this join (backups included), as of their last
        feedback."""
        self._collect()
        return sum(s.load.nbytes for s in self.sessions if s.alive)

    def __enter__(self) -> GrpcBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.closed = True  # sessions ending now are not worker failures
        for s in self.sessions:
            if not s.released:
                s.close()
