"""The worker: serves the paper's create / insert / probe / expire commands over gRPC.

The servicer is a thin adapter (as in gRPC's route_guide example): each command
is decoded by :mod:`panjoin.codec`, carried out by a
:class:`panjoin.backend.LocalBackend` (the same subwindow stores the
in-process engine uses), and its answer encoded back. One long-lived
``Session`` stream per manager, several commands to a message, one Feedback per
command; each session owns its subwindows (and the batches its commands name),
and closing it releases them. A bad command gets a Feedback with ``code =
INVALID_ARGUMENT`` (or ``NOT_FOUND``) and the reason, and changes nothing.

    panjoin worker --port 50051 --threads 2
    panjoin worker --port 50052 --index-backend opencl --device pocl
    panjoin worker --port 50053 --null      # holds nothing: the manager's ceiling
"""

from __future__ import annotations

import logging
import threading
import time

import grpc
import numba

from panjoin import codec
from panjoin.backend import LocalBackend, NullBackend, SortedBatch
from panjoin.config import tune_allocator
from panjoin.proto.panjoin.v1 import worker_pb2, worker_pb2_grpc
from panjoin.serving import start_server
from panjoin.wire import WireError, to_array

log = logging.getLogger("panjoin.worker")


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, threads: int = 1, index_backend: str = "numba", device: str | None = None,
                 null: bool = False):
        self.threads = threads
        # "opencl": the manager's "bisort" subwindows become OpenCL ones (opencl/) on device
        self.index_backend = index_backend
        self.device = device
        self.null = null
        self.lock = threading.Lock()
        self.sessions: dict[int, LocalBackend] = {}
        self.commands = 0
        self._next = 0

    # ------------------------------------------------------------------ rpcs

    def Session(self, request_iterator, context):
        # Numba's thread count is per calling thread: without this a session's parallel
        # kernels would use every core, and idle team threads spin
        numba.set_num_threads(min(self.threads, numba.config.NUMBA_NUM_THREADS))
        backend = (NullBackend if self.null else LocalBackend)(self.threads)
        batches: dict[int, SortedBatch] = {}  # the batches later commands may name
        with self.lock:
            sid = self._next
            self._next += 1
            self.sessions[sid] = backend
        log.info("session %d opened by %s", sid, context.peer())
        try:
            for cmds in request_iterator:
                out = worker_pb2.Feedbacks()
                for cmd in cmds.commands:
                    self.handle(backend, cmd, batches, out.feedback.add())
                if out.feedback:  # the session's status once per message, after the last
                    out.feedback[-1].load.CopyFrom(self._load(backend))
                yield out
        finally:
            with self.lock:
                self.sessions.pop(sid, None)
            backend.close()
            log.info("session %d closed", sid)

    def Status(self, request, context):
        with self.lock:
            backends = list(self.sessions.values())
        subs = [st for b in backends for st in b.subs.values()]
        return worker_pb2.WorkerStatus(subwindows=len(subs), tuples=sum(len(s) for s in subs),
                                       nbytes=sum(s.nbytes for s in subs),
                                       sessions=len(backends), commands=self.commands,
                                       threads=self.threads)

    # ------------------------------------------------------------------ commands

    def handle(self, backend: LocalBackend, cmd: worker_pb2.Command,
               batches: dict[int, SortedBatch] | None = None,
               fb: worker_pb2.Feedback | None = None) -> worker_pb2.Feedback:
        """Carry out one command; its answer goes into ``fb`` (a new Feedback if None)."""
        t0 = time.thread_time()
        self.commands += 1
        fb = worker_pb2.Feedback() if fb is None else fb
        fb.command_id = cmd.command_id
        try:
            kind = cmd.WhichOneof("cmd")
            if kind is None:
                raise ValueError("empty command: set create, insert, probe, expire or promote")
            getattr(self, "_" + kind)(backend, getattr(cmd, kind), fb,
                                      batches if batches is not None else {})
        except codec.NotFound as e:
            fb.error, fb.code = str(e), "NOT_FOUND"
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

    def _create(self, backend: LocalBackend, c: worker_pb2.Create, fb, batches) -> None:
        spec = codec.decode_create(c)
        if spec.sub_id in backend.subs:
            raise ValueError(f"subwindow id {spec.sub_id} exists")
        if self.index_backend == "opencl" and spec.kind == "bisort":
            spec.kind = "bisort-opencl"  # same layout and results: the manager cannot tell
            if self.device:
                spec.opts.setdefault("device", self.device)
        backend.create(spec)
        fb.status.CopyFrom(worker_pb2.SubwindowStatus(sub_id=c.sub_id, empty=True))

    def _batch(self, backend: LocalBackend, c: worker_pb2.Batch, fb, batches) -> None:
        batch = codec.decode_batch(c)
        for old in [b for b in batches if b < c.release_below]:
            del batches[old]
        batches[batch.batch_id] = batch

    def _insert(self, backend: LocalBackend, c: worker_pb2.Insert, fb, batches) -> None:
        st = self._store(backend, c.sub_id)
        batch = self._batch_of(batches, c.batch_id)
        codec.check_batch_for(batch, backend.streams[c.sub_id], backend.key_dtype(c.sub_id),
                              c.sub_id)
        backend.insert(c.sub_id, batch, c.seq_from, c.seq_to)
        fb.status.sub_id, fb.status.count = c.sub_id, len(st)
        fb.status.full, fb.status.nbytes = st.full, st.nbytes
        spl = st.successor_splitters() if st.full else None
        if spl is not None:
            fb.status.successor_splitters.CopyFrom(to_array(spl))

    def _probe(self, backend: LocalBackend, c: worker_pb2.Probe, fb, batches) -> None:
        batch = self._batch_of(batches, c.batch_id)
        for sub_id in c.sub_ids:
            self._store(backend, sub_id)
            codec.check_batch_for(batch, backend.streams[sub_id], backend.key_dtype(sub_id),
                                  sub_id, probe=True)
        if not c.sub_ids:
            return
        req = codec.decode_probe(c, batch)
        lo, hi, _, res = batch.probe_inputs()
        for sub_id, flt, limit in req.targets:
            if req.ranges:
                fb.results.append(codec.encode_ranges(
                    sub_id, backend.store(sub_id).probe_ranges(lo, hi, flt)))
                continue
            pidx, ids, seq = backend.probe(sub_id, lo, hi, flt, res, limit)
            fb.results.append(codec.encode_answer(sub_id, pidx, ids,
                                                  seq if req.want_seq else None))

    def _expire(self, backend: LocalBackend, c: worker_pb2.Expire, fb, batches) -> None:
        self._store(backend, c.sub_id)
        backend.expire(c.sub_id)
        fb.status.CopyFrom(worker_pb2.SubwindowStatus(sub_id=c.sub_id, empty=True))

    def _promote(self, backend: LocalBackend, c: worker_pb2.Promote, fb, batches) -> None:
        st = self._store(backend, c.sub_id)
        backend.promote(c.sub_id)
        fb.status.CopyFrom(worker_pb2.SubwindowStatus(sub_id=c.sub_id, count=len(st),
                                                      full=st.full, nbytes=st.nbytes))


def serve(port: int = 0, threads: int = 1, host: str = "127.0.0.1", index_backend: str = "numba",
          device: str | None = None, null: bool = False, serving: bool = True
          ) -> tuple[grpc.Server, int]:
    """Start a worker server; returns it and the bound port (``port=0`` picks a free one).
    ``index_backend="opencl"`` serves BI-Sort subwindows from an OpenCL ``device``;
    ``null`` holds nothing and answers every probe empty (the manager's ceiling);
    ``serving=False``: NOT_SERVING until :func:`panjoin.serving.set_serving` (the
    ``panjoin worker`` process first compiles its kernels, :mod:`workers.warm_up`)."""
    tune_allocator()
    servicer = WorkerServicer(threads, index_backend, device, null)
    return start_server(lambda srv: worker_pb2_grpc.add_WorkerServicer_to_server(servicer, srv),
                        worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name, port, host,
                        max_workers=8, serving=serving)
