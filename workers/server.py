"""The worker: serves the paper's create / insert / probe / expire commands over gRPC.

The servicer is a thin adapter (as in gRPC's route_guide example): each command
is decoded by :mod:`panjoin.codec`, carried out by a
:class:`panjoin.backend.LocalBackend` (the same subwindow stores the
in-process engine uses), and its answer encoded back. One long-lived
``Session`` stream per manager, several commands to a message, one Feedback per
command (the answers to a message's commands go back together, but a probe's
answer goes at once: the inserts after it would hold its pairs back); each session
owns its subwindows (and the batches its commands name), and closing it releases
them. A bad command gets a Feedback with ``code =
INVALID_ARGUMENT`` (or ``NOT_FOUND``) and the reason, and changes nothing.

Sessions are bounded, so that no number of idle or abandoned streams starves the
joins (each session holds one of the server's threads while it lives): at most
``max_sessions`` at once (one more is refused with RESOURCE_EXHAUSTED at once, and its
join fails fast with that), the thread pool has room for all of them plus Status and
health, and a session that sends no message for ``idle_timeout`` seconds is ended
(DEADLINE_EXCEEDED) and releases what it held. A manager keeps its idle joins'
sessions alive with empty messages. A session opened with a results token sends its
probes' pairs to the join's client instead of the manager (results past the manager,
:mod:`workers.results`): one ``Results`` stream a session, so the pool has room for
those too. Each session's subwindows reserve their estimated
bytes (:func:`panjoin.limits.subwindow_bytes`) against the worker's ``memory_limit``;
a Create beyond it is refused with RESOURCE_EXHAUSTED. Its default: 80% of what the
process may use once its kernels are loaded (:mod:`panjoin.memory`: MemAvailable, or
its cgroup's limit less its working set), less ``WORKER_IN_FLIGHT`` for the batches
in flight.

    panjoin worker --port 50051 --threads 2
    panjoin worker --port 50052 --index-backend opencl --device pocl
    panjoin worker --port 50053 --null      # holds nothing: the manager's ceiling
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import grpc

from panjoin import codec, jit
from panjoin.backend import LocalBackend, NullBackend, SortedBatch
from panjoin.config import tune_allocator
from panjoin.limits import (
    MAX_PARTITIONS,
    WORKER_IN_FLIGHT,
    default_memory_limit,
    fmt_bytes,
    subwindow_bytes,
)
from panjoin.ops.metrics import WorkerCollector, with_metrics
from panjoin.proto.panjoin.v1 import worker_pb2, worker_pb2_grpc
from panjoin.serving import END, SPARE_THREADS, abort_full, read_ahead, register, start_server
from panjoin.wire import WireError, narrow, to_array
from workers.results import END as RESULTS_END
from workers.results import MAX_TOKEN, ChannelError, ResultChannel

log = logging.getLogger("panjoin.worker")

#: sessions a worker holds at once by default (a join holds one on each worker)
MAX_SESSIONS = 64
#: seconds a session may send nothing before the worker ends it, by default
IDLE_TIMEOUT_S = 600.0
#: the longest a DIRECT probe waits for a client that takes none of its pairs (or the
#: idle timeout, if shorter)
RESULTS_WAIT_S = 60.0


class ResourceExhausted(Exception):
    """A command that would take the worker past its memory budget."""


class _Session:
    """What one session holds: its backend, the batches its commands name, and the
    bytes each of its subwindows reserves."""

    def __init__(self, backend):
        self.backend = backend
        self.batches: dict[int, SortedBatch] = {}
        self.reserved: dict[int, int] = {}  # sub_id -> bytes
        #: where its DIRECT probes' pairs go (a session opened with a results token)
        self.results: ResultChannel | None = None


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, threads: int = 1, index_backend: str = "numba", device: str | None = None,
                 null: bool = False, max_sessions: int = MAX_SESSIONS,
                 idle_timeout: float = IDLE_TIMEOUT_S, memory_limit: int | None = None):
        if max_sessions < 1:
            raise ValueError(f"max sessions must be >= 1, got {max_sessions}")
        if not idle_timeout > 0:
            raise ValueError(f"idle timeout must be a positive number of s, got {idle_timeout}")
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.memory_given = bool(memory_limit)
        self.memory_limit = (int(memory_limit) if memory_limit
                             else default_memory_limit(WORKER_IN_FLIGHT))
        self.threads = threads
        # "opencl": the manager's "bisort" subwindows become OpenCL ones (opencl/) on device
        self.index_backend = index_backend
        self.device = device
        self.null = null
        self.lock = threading.Lock()
        self.sessions: dict[int, _Session] = {}
        self.channels: dict[str, ResultChannel] = {}  # results token -> its session's
        self.reserved = 0  # bytes reserved by every session's subwindows
        self.retired_s = (0.0, 0.0)  # insert and probe seconds of the sessions that ended
        self.commands = 0
        self._next = 0

    # ------------------------------------------------------------------ rpcs

    def Session(self, request_iterator, context):
        with self.lock:
            if len(self.sessions) >= self.max_sessions:
                full = True
            else:
                full = False
                sid = self._next
                self._next += 1
                sess = self.sessions[sid] = _Session(None)
        if full:
            abort_full(context, f"worker holds {self.max_sessions} sessions", "--max-sessions",
                       "close joins", self.idle_timeout)
        token = None
        try:
            # Numba's thread count is per calling thread: without this a session's parallel
            # kernels would use every core, and idle team threads spin
            jit.set_threads(self.threads)
            sess.backend = (NullBackend if self.null else LocalBackend)(self.threads)
            token = self._results_channel(sess, context)
            context.send_initial_metadata((
                ("panjoin-idle-timeout", f"{self.idle_timeout:g}"),
                ("panjoin-memory-free", str(max(0, self.memory_limit - self.reserved)))))
            log.info("session %d opened by %s", sid, context.peer())
            yield from self._serve(sess, request_iterator, context)
        finally:
            with self.lock:
                self.sessions.pop(sid, None)
                self.reserved -= sum(sess.reserved.values())
                if sess.backend is not None:  # the metrics' seconds never go down
                    ins, prb = self.retired_s
                    self.retired_s = (ins + sess.backend.stats.insert_s,
                                      prb + sess.backend.stats.probe_s)
            if sess.backend is not None:
                sess.backend.close()
            if sess.results is not None:  # its subscriber gets what is queued, then the end
                sess.results.close()
                with self.lock:
                    if self.channels.get(token) is sess.results:
                        del self.channels[token]
            log.info("session %d closed", sid)

    def _results_channel(self, sess: _Session, context) -> str | None:
        """A session opened with a results token gets a channel its client subscribes to
        by that token (:meth:`Results`); the token, or None."""
        token = dict(context.invocation_metadata() or ()).get(codec.RESULTS_TOKEN_KEY)
        if token is None:
            return None
        if not 16 <= len(token) <= MAX_TOKEN:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{codec.RESULTS_TOKEN_KEY} must be 16 to {MAX_TOKEN} characters")
        with self.lock:
            if token in self.channels:
                taken = True
            else:
                taken = False
                sess.results = self.channels[token] = ResultChannel(
                    wait_s=min(RESULTS_WAIT_S, self.idle_timeout))
        if taken:
            context.abort(grpc.StatusCode.ALREADY_EXISTS,
                          f"another session holds this {codec.RESULTS_TOKEN_KEY}")
        return token

    def Results(self, request, context):
        """A DIRECT session's pairs, to the join's client (:mod:`workers.results`)."""
        token = request.token
        if not 1 <= len(token) <= MAX_TOKEN:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"a results token has 1 to {MAX_TOKEN} characters "
                          "(OpenReply.sources)")
        with self.lock:
            ch = self.channels.get(token)
        if ch is None:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          "no session on this worker has this results token: its join "
                          "ended, or the token is wrong")
        if not ch.subscribe():
            context.abort(grpc.StatusCode.ALREADY_EXISTS,
                          "this join's results on this worker already have a subscriber")
        ch.attach(context.cancel)  # a subscriber that reads nothing is cut, not waited on
        context.send_initial_metadata(())
        try:
            while True:
                piece = ch.take(1.0)
                if piece is RESULTS_END:
                    return
                if piece is None:
                    if not context.is_active():
                        return
                    continue
                cid, r, s = piece
                (r, rb), (s, sb) = narrow(r), narrow(s)  # half the bytes where they fit
                yield worker_pb2.ResultPiece(command_id=cid, r_id=to_array(r), r_base=rb,
                                             s_id=to_array(s), s_base=sb)
        finally:
            ch.leave()  # a client that left takes no more: later probes fail at once

    def _serve(self, sess: _Session, request_iterator, context):
        """Answer the session's messages until it ends or sends none for idle_timeout
        (they come through :func:`panjoin.serving.read_ahead`)."""
        inbox = read_ahead(request_iterator, "session-reader")
        while True:
            try:
                cmds = inbox.get(timeout=self.idle_timeout)
            except queue.Empty:
                log.warning("session idle for %g s: ending it", self.idle_timeout)
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                              f"session sent nothing for {self.idle_timeout:g} s (the "
                              "worker's --idle-timeout): ended, its subwindows released")
            if cmds is END:
                return
            out = worker_pb2.Feedbacks()
            last = len(cmds.commands) - 1
            for i, cmd in enumerate(cmds.commands):
                self.handle(sess.backend, cmd, sess.batches, out.feedback.add(), sess)
                if i < last and cmd.WhichOneof("cmd") == "probe":
                    # the manager waits for a probe's answer, not for the inserts that
                    # follow it in the message (its batch's own, the backups'): it
                    # leaves at once, so a pair's latency holds no insert (issue 27)
                    yield out
                    out = worker_pb2.Feedbacks()
            if out.feedback:  # the session's status once per message, after the last
                out.feedback[-1].load.CopyFrom(self._load(sess.backend))
            yield out

    def Status(self, request, context):
        with self.lock:
            backends = [s.backend for s in self.sessions.values() if s.backend is not None]
            n, reserved = len(self.sessions), self.reserved
        subs = [st for b in backends for st in list(b.subs.values())]
        return worker_pb2.WorkerStatus(subwindows=len(subs), tuples=sum(len(s) for s in subs),
                                       nbytes=sum(s.nbytes for s in subs),
                                       sessions=n, commands=self.commands,
                                       threads=self.threads, memory_limit=self.memory_limit,
                                       memory_reserved=reserved)

    # ------------------------------------------------------------------ memory

    def settle_memory_limit(self) -> None:
        """Take the default budget again once the kernels are loaded (``panjoin worker``
        calls it after its warm-up): they and their libraries hold 50-100 MB that the
        budget taken at start did not see, and under a cgroup memory limit that
        difference is an OOM kill instead of a refusal (a worker of a 512 MiB host
        accepted a 222 MB join and was killed filling it). A given limit stays."""
        if not self.memory_given:
            self.memory_limit = default_memory_limit(WORKER_IN_FLIGHT)

    def _reserve(self, sess: _Session | None, sub_id: int, nbytes: int) -> None:
        """Reserve ``nbytes`` for subwindow ``sub_id`` of ``sess`` (replacing what it had),
        or raise ResourceExhausted, naming the numbers."""
        if sess is None:
            return
        with self.lock:
            old = sess.reserved.get(sub_id, 0)
            if self.reserved - old + nbytes > self.memory_limit:
                raise ResourceExhausted(
                    f"subwindow {sub_id} needs about {fmt_bytes(nbytes)}, and this worker has "
                    f"{fmt_bytes(self.memory_limit - self.reserved + old)} of its "
                    f"{fmt_bytes(self.memory_limit)} budget left (--memory-limit): use a smaller "
                    "window or subwindow_size, more workers, or raise --memory-limit")
            sess.reserved[sub_id] = nbytes
            self.reserved += nbytes - old

    def _release(self, sess: _Session | None, sub_id: int) -> None:
        if sess is None:
            return
        with self.lock:
            self.reserved -= sess.reserved.pop(sub_id, 0)

    # ------------------------------------------------------------------ commands

    def handle(self, backend: LocalBackend, cmd: worker_pb2.Command,
               batches: dict[int, SortedBatch] | None = None,
               fb: worker_pb2.Feedback | None = None,
               sess: _Session | None = None) -> worker_pb2.Feedback:
        """Carry out one command; its answer goes into ``fb`` (a new Feedback if None).
        ``sess``: the session whose memory reservations it changes (None: no budget)."""
        t0 = time.thread_time()
        self.commands += 1
        fb = worker_pb2.Feedback() if fb is None else fb
        fb.command_id = cmd.command_id
        try:
            kind = cmd.WhichOneof("cmd")
            if kind is None:
                raise ValueError("empty command: set create, insert, probe, expire or promote")
            getattr(self, "_" + kind)(backend, getattr(cmd, kind), fb,
                                      batches if batches is not None else {}, sess)
        except ResourceExhausted as e:
            fb.error, fb.code = str(e), "RESOURCE_EXHAUSTED"
        except codec.NotFound as e:
            fb.error, fb.code = str(e), "NOT_FOUND"
        except ChannelError as e:
            fb.error, fb.code = str(e), "FAILED_PRECONDITION"
        except (WireError, ValueError, TypeError) as e:
            fb.error, fb.code = str(e), "INVALID_ARGUMENT"
        except MemoryError as e:  # numpy's "Unable to allocate 1.78 PiB ...": the join's size
            fb.error = (f"out of memory: {e}; give the join a smaller window, subwindow size "
                        "or partition count, or more workers")
            fb.code = "RESOURCE_EXHAUSTED"
        except Exception as e:  # a bug: report it rather than kill the session
            log.exception("command %d failed", cmd.command_id)
            fb.error, fb.code = f"internal error: {e}", "INTERNAL"
        fb.seconds = time.thread_time() - t0
        return fb

    @staticmethod
    def _load(backend: LocalBackend) -> worker_pb2.WorkerLoad:
        """The session's status bits: what it holds, and the oldest/newest subwindow per stream."""
        load = worker_pb2.WorkerLoad(subwindows=len(backend.subs), oldest_r_empty=True,
                                     oldest_s_empty=True, newest_r_full=True,
                                     newest_s_full=True)
        first: dict[str, int] = {}
        for sub_id in sorted(backend.subs):
            st = backend.subs[sub_id]
            n = len(st)
            load.tuples += n
            load.nbytes += st.nbytes
            name = backend.streams[sub_id]
            if name not in first:
                first[name] = sub_id
                setattr(load, f"oldest_{name.lower()}_empty", n == 0)
            setattr(load, f"newest_{name.lower()}_full", bool(st.full))
        return load

    @staticmethod
    def _store(backend: LocalBackend, sub_id: int):
        st = backend.subs.get(sub_id)
        if st is None:
            raise codec.NotFound(f"unknown subwindow {sub_id}")
        return st

    @staticmethod
    def _batch_of(batches: dict, batch_id: int) -> SortedBatch:
        b = batches.get(batch_id)
        if b is None:
            raise codec.NotFound(f"unknown batch {batch_id}: send the Batch before the "
                                 "commands that name it")
        return b

    def _create(self, backend: LocalBackend, c: worker_pb2.Create, fb, batches, sess) -> None:
        spec = codec.decode_create(c)
        if spec.sub_id in backend.subs:
            raise ValueError(f"subwindow id {spec.sub_id} exists")
        if spec.partitions > MAX_PARTITIONS:
            raise ValueError(f"partitions {spec.partitions} is above {MAX_PARTITIONS}")
        self._reserve(sess, spec.sub_id, subwindow_bytes(spec.kind, spec.capacity,
                                                         spec.partitions, spec.backup))
        if self.index_backend == "opencl" and spec.kind == "bisort":
            spec.kind = "bisort-opencl"  # same layout and results: the manager cannot tell
            if self.device:
                spec.opts.setdefault("device", self.device)
        try:
            backend.create(spec)
        except BaseException:
            self._release(sess, spec.sub_id)
            raise
        fb.status.CopyFrom(worker_pb2.SubwindowStatus(sub_id=c.sub_id, empty=True))

    def _batch(self, backend: LocalBackend, c: worker_pb2.Batch, fb, batches, sess) -> None:
        batch = codec.decode_batch(c)
        for old in [b for b in batches if b < c.release_below]:
            del batches[old]
        batches[batch.batch_id] = batch

    def _insert(self, backend: LocalBackend, c: worker_pb2.Insert, fb, batches, sess) -> None:
        st = self._store(backend, c.sub_id)
        if c.seal and not c.batch_id:  # key placement: no rows here, the subwindow is done
            st.seal()
            fb.status.sub_id, fb.status.count, fb.status.nbytes = c.sub_id, len(st), st.nbytes
            return
        batch = self._batch_of(batches, c.batch_id)
        if c.row_to:  # key placement: the rows of this worker's key range
            if not 0 <= c.row_from < c.row_to <= len(batch):
                raise ValueError(f"insert rows [{c.row_from}, {c.row_to}) are not within "
                                 f"batch {c.batch_id}'s {len(batch)} rows")
            batch = batch.rows(c.row_from, c.row_to)
        codec.check_batch_for(batch, backend.streams[c.sub_id], backend.key_dtype(c.sub_id),
                              c.sub_id)
        backend.insert(c.sub_id, batch, c.seq_from, c.seq_to)
        if c.seal:
            st.seal()
        fb.status.sub_id, fb.status.count = c.sub_id, len(st)
        fb.status.full, fb.status.nbytes = st.full, st.nbytes
        spl = st.successor_splitters() if st.full else None
        if spl is not None:
            fb.status.successor_splitters.CopyFrom(to_array(spl))

    def _probe(self, backend: LocalBackend, c: worker_pb2.Probe, fb, batches, sess) -> None:
        batch = self._batch_of(batches, c.batch_id)
        for sub_id in c.sub_ids:
            self._store(backend, sub_id)
            codec.check_batch_for(batch, backend.streams[sub_id], backend.key_dtype(sub_id),
                                  sub_id, probe=True)
        if not c.sub_ids:
            return
        req = codec.decode_probe(c, batch)
        if req.direct and (sess is None or sess.results is None):
            raise ValueError("RESULT_FORMAT_DIRECT needs a session opened with "
                             f"{codec.RESULTS_TOKEN_KEY}: its pairs have nowhere to go")
        if req.ranges and batch.sent is not None:
            raise ValueError(f"batch {batch.batch_id} came in arrival order: its probes "
                             "answer with pairs, not BI-Sort ranges")
        lo, hi, _, res = batch.probe_inputs()
        for sub_id, flt, limit in req.targets:
            if req.ranges:
                fb.results.append(codec.encode_ranges(
                    sub_id, backend.store(sub_id).probe_ranges(lo, hi, flt)))
                continue
            pidx, ids, seq = backend.probe(sub_id, lo, hi, flt, res, limit)
            if req.id_pairs:  # the probe tuples' ids here, not on the manager
                xs = batch.ids[pidx]
                r_id, s_id = (ids, xs) if backend.streams[sub_id] == "R" else (xs, ids)
                if req.direct:  # the pairs to the client, their count to the manager
                    for a, b in codec.piece_cuts(r_id.size):
                        sess.results.put(fb.command_id, r_id[a:b], s_id[a:b])
                    fb.results.append(worker_pb2.ProbeResult(sub_id=sub_id, pairs=r_id.size))
                    continue
                fb.results.extend(codec.encode_id_pairs(sub_id, r_id, s_id))
                continue
            if batch.sent is not None:  # the probe indexes of the rows as they were sent
                pidx = batch.sent.take(pidx)
            fb.results.append(codec.encode_answer(sub_id, pidx, ids,
                                                  seq if req.want_seq else None))

    def _expire(self, backend: LocalBackend, c: worker_pb2.Expire, fb, batches, sess) -> None:
        self._store(backend, c.sub_id)
        backend.expire(c.sub_id)
        self._release(sess, c.sub_id)
        fb.status.CopyFrom(worker_pb2.SubwindowStatus(sub_id=c.sub_id, empty=True))

    def _promote(self, backend: LocalBackend, c: worker_pb2.Promote, fb, batches, sess
                 ) -> None:
        st = self._store(backend, c.sub_id)
        self._reserve(sess, c.sub_id, subwindow_bytes(st.kind, st.capacity, st.partitions))
        backend.promote(c.sub_id)
        fb.status.CopyFrom(worker_pb2.SubwindowStatus(sub_id=c.sub_id, count=len(st),
                                                      full=st.full, nbytes=st.nbytes))


def serve(port: int = 0, threads: int = 1, host: str = "127.0.0.1", index_backend: str = "numba",
          device: str | None = None, null: bool = False, max_sessions: int = MAX_SESSIONS,
          idle_timeout: float = IDLE_TIMEOUT_S, memory_limit: int | None = None,
          serving: bool = True, metrics_port: int | None = None) -> tuple[grpc.Server, int]:
    """Start a worker server; returns it and the bound port (``port=0`` picks a free one).
    ``index_backend="opencl"`` serves BI-Sort subwindows from an OpenCL ``device``;
    ``null`` holds nothing and answers every probe empty (the manager's ceiling).
    ``max_sessions``, ``idle_timeout`` (s), ``memory_limit`` (bytes; None: the default
    share of the host's memory) bound what sessions may hold (see the module doc).
    ``serving=False``: NOT_SERVING until :func:`panjoin.serving.set_serving` (the
    ``panjoin worker`` process first compiles its kernels, :mod:`workers.warm_up`).
    ``metrics_port``: Prometheus metrics on ``host`` there (0: any free port;
    ``server.metrics_port`` says which), None: none."""
    tune_allocator()
    servicer = WorkerServicer(threads, index_backend, device, null, max_sessions, idle_timeout,
                              memory_limit)
    server, port = start_server(
        lambda srv: register(srv, worker_pb2_grpc.add_WorkerServicer_to_server, servicer),
        worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name, port, host,
        # a session's thread, and its client's Results stream's
        max_workers=2 * max_sessions + SPARE_THREADS, serving=serving)
    with_metrics(server, WorkerCollector(servicer), metrics_port, host)
    server.servicer = servicer  # for settle_memory_limit after the warm-up
    return server, port
