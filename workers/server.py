"""The worker: serves the paper's create / insert / probe / expire commands over gRPC.

The servicer is a thin adapter (as in gRPC's route_guide example): it turns
protobuf into numpy, calls a :class:`panjoin.manager.backend.LocalBackend`, and
turns the answer back. One long-lived ``Session`` stream per manager; each
session owns its subwindows, and closing it releases them. A bad command gets
a Feedback with ``code = INVALID_ARGUMENT`` (or ``NOT_FOUND``) and the reason,
and changes nothing.

    panjoin worker --port 50051 --threads 2
    panjoin worker --port 50052 --index-backend opencl --device pocl
"""

from __future__ import annotations

import logging
import threading
import time

import grpc
import numpy as np

from panjoin.manager.backend import CreateSpec, LocalBackend
from panjoin.proto.panjoin.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from panjoin.serving import start_server
from panjoin.subwindow import INDEX_KINDS, Residual, WindowFilter
from panjoin.wire import WireError, from_array, to_array

log = logging.getLogger("panjoin.worker")

STREAM_NAME = {common_pb2.STREAM_R: "R", common_pb2.STREAM_S: "S"}
KEY_DTYPES = {"int64": "<i8", "float64": "<f8"}


class _Bad(Exception):
    def __init__(self, code: str, msg: str):
        super().__init__(msg)
        self.code = code


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, threads: int = 1, index_backend: str = "numba", device: str | None = None):
        self.threads = threads
        # "opencl": the manager's "bisort" subwindows become OpenCL ones (opencl/) on device
        self.index_backend = index_backend
        self.device = device
        self.lock = threading.Lock()
        self.sessions: dict[int, LocalBackend] = {}
        self.commands = 0
        self._next = 0

    # ------------------------------------------------------------------ rpcs

    def Session(self, request_iterator, context):
        with self.lock:
            sid = self._next
            self._next += 1
            backend = LocalBackend(self.threads)
            self.sessions[sid] = backend
        log.info("session %d opened by %s", sid, context.peer())
        try:
            for cmd in request_iterator:
                yield self.handle(backend, cmd)
        finally:
            with self.lock:
                self.sessions.pop(sid, None)
            backend.close()
            log.info("session %d closed", sid)

    def Status(self, request, context):
        with self.lock:
            backends = list(self.sessions.values())
        subs = [ix for b in backends for ix in b.subs.values()]
        return worker_pb2.WorkerStatus(subwindows=len(subs), tuples=sum(len(s) for s in subs),
                                       nbytes=sum(s.nbytes for s in subs),
                                       sessions=len(backends), commands=self.commands,
                                       threads=self.threads)

    # ------------------------------------------------------------------ commands

    def handle(self, backend: LocalBackend, cmd: worker_pb2.Command) -> worker_pb2.Feedback:
        t0 = time.thread_time()
        self.commands += 1
        fb = worker_pb2.Feedback(command_id=cmd.command_id)
        try:
            kind = cmd.WhichOneof("cmd")
            if kind == "create":
                self._create(backend, cmd.create)
                fb.status.CopyFrom(worker_pb2.SubwindowStatus(sub_id=cmd.create.sub_id,
                                                              empty=True))
            elif kind == "insert":
                fb.status.CopyFrom(self._insert(backend, cmd.insert))
            elif kind == "probe":
                fb.results.extend(self._probe(backend, cmd.probe))
            elif kind == "expire":
                if cmd.expire.sub_id not in backend.subs:
                    raise _Bad("NOT_FOUND", f"unknown subwindow {cmd.expire.sub_id}")
                backend.expire(cmd.expire.sub_id)
                fb.status.CopyFrom(worker_pb2.SubwindowStatus(sub_id=cmd.expire.sub_id,
                                                              empty=True))
            else:
                raise _Bad("INVALID_ARGUMENT", "empty command: set create, insert, probe or expire")
        except _Bad as e:
            fb.error, fb.code = str(e), e.code
        except (WireError, ValueError, TypeError) as e:
            fb.error, fb.code = str(e), "INVALID_ARGUMENT"
        except Exception as e:  # a bug: report it rather than kill the session
            log.exception("command %d failed", cmd.command_id)
            fb.error, fb.code = f"internal error: {e}", "INTERNAL"
        fb.load.CopyFrom(self._load(backend))
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
            ix = backend.subs[sub_id]
            n = len(ix)
            load.tuples += n
            load.nbytes += ix.nbytes
            name = backend.streams.get(sub_id)
            if name is None:
                continue
            if name not in first:
                first[name] = sub_id
                setattr(load, f"oldest_{name.lower()}_empty", n == 0)
            setattr(load, f"newest_{name.lower()}_full", bool(ix.full))
        return load

    def _create(self, backend: LocalBackend, c: worker_pb2.Create) -> None:
        if c.sub_id < 0 or c.sub_id in backend.subs:
            raise _Bad("INVALID_ARGUMENT", f"subwindow id {c.sub_id} is negative or exists")
        if c.stream not in STREAM_NAME:
            raise _Bad("INVALID_ARGUMENT", "stream must be STREAM_R or STREAM_S")
        if c.index not in INDEX_KINDS:
            raise _Bad("INVALID_ARGUMENT",
                       f"unknown index {c.index!r}; choose one of {', '.join(INDEX_KINDS)}")
        if c.key_dtype not in KEY_DTYPES:
            raise _Bad("INVALID_ARGUMENT",
                       f"key_dtype must be int64 or float64, not {c.key_dtype!r}")
        if c.capacity < 1 or c.partitions < 1:
            raise _Bad("INVALID_ARGUMENT", "capacity and partitions must be >= 1")
        opts: dict = {}
        for k, v in c.options.items():
            try:
                opts[k] = int(v)
            except ValueError:
                opts[k] = v
        if c.splitters.data:
            opts["splitters"] = from_array(c.splitters, KEY_DTYPES[c.key_dtype], "splitters")
        index = c.index
        if self.index_backend == "opencl" and index == "bisort":
            index = "bisort-opencl"  # same layout and results, so the manager cannot tell
            if self.device:
                opts.setdefault("device", self.device)
        backend.create(CreateSpec(c.sub_id, STREAM_NAME[c.stream], index, int(c.capacity),
                                  c.key_dtype, int(c.partitions), None, opts))

    def _index(self, backend: LocalBackend, sub_id: int):
        if sub_id not in backend.subs:
            raise _Bad("NOT_FOUND", f"unknown subwindow {sub_id}")
        return backend.subs[sub_id]

    def _insert(self, backend: LocalBackend, c: worker_pb2.Insert):
        ix = self._index(backend, c.sub_id)
        want = KEY_DTYPES[str(ix.key_dtype)]
        keys = from_array(c.keys, want, "keys")
        ts = from_array(c.ts, "<i8", "ts")
        seq = from_array(c.seq, "<i8", "seq")
        if not (keys.shape == ts.shape == seq.shape):
            raise _Bad("INVALID_ARGUMENT", "keys, ts and seq differ in length")
        key2 = None
        if c.HasField("key2"):
            key2 = from_array(c.key2, "<f8", "key2")
            if key2.shape != keys.shape:
                raise _Bad("INVALID_ARGUMENT", "key2 must have one value per key")
        if keys.size > 1 and np.any(keys[1:] < keys[:-1]):
            raise _Bad("INVALID_ARGUMENT", "insert batch is not sorted by key")
        backend.insert(c.sub_id, keys, ts, seq, key2)
        st = worker_pb2.SubwindowStatus(sub_id=c.sub_id, count=len(ix), full=ix.full,
                                        nbytes=ix.nbytes)
        if ix.full and hasattr(ix, "successor_splitters"):
            spl = ix.successor_splitters()
            if spl is not None:
                st.successor_splitters.CopyFrom(to_array(np.asarray(spl, dtype=ix.key_dtype)))
        return st

    def _probe(self, backend: LocalBackend, c: worker_pb2.Probe):
        if len(c.filtered) not in (0, len(c.sub_ids)):
            raise _Bad("INVALID_ARGUMENT", "filtered must be empty or one flag per sub_id")
        ixs = [self._index(backend, s) for s in c.sub_ids]
        if not ixs:
            return []
        want = KEY_DTYPES[str(ixs[0].key_dtype)]
        lo = from_array(c.lo, want, "lo")
        hi = from_array(c.hi, want, "hi")
        if lo.ndim == 1:
            lo, hi = lo[None, :], hi[None, :]
        if lo.shape != hi.shape:
            raise _Bad("INVALID_ARGUMENT", "lo and hi differ in shape")
        n = lo.shape[1]
        full = WindowFilter.none(n)
        if c.filter_mode:
            cols = [from_array(a, "<i8", nm) for a, nm in ((c.c0, "c0"), (c.c1, "c1"),
                                                           (c.c2, "c2"))]
            if any(x.shape != (n,) for x in cols):
                raise _Bad("INVALID_ARGUMENT", "c0, c1, c2 must have one value per probe tuple")
            full = WindowFilter(int(c.filter_mode), *cols)
        none = WindowFilter.none(n)
        res = None
        if c.HasField("lo2") or c.HasField("hi2"):
            lo2 = from_array(c.lo2, "<f8", "lo2")
            hi2 = from_array(c.hi2, "<f8", "hi2")
            if lo2.ndim == 1:
                lo2, hi2 = lo2[None, :], hi2[None, :]
            if lo2.shape != hi2.shape or lo2.shape[1] != n:
                raise _Bad("INVALID_ARGUMENT",
                           "lo2 and hi2 must both be (n_bands2, n) for n probe tuples")
            res = Residual(lo2, hi2)
        out = []
        ranges = c.format == worker_pb2.RESULT_FORMAT_RANGES
        if ranges and res is not None:
            raise _Bad("INVALID_ARGUMENT", "a residual (lo2, hi2) needs RESULT_FORMAT_PAIRS: "
                       "ranges would return candidates the residual rejects")
        if ranges and any(not hasattr(ix, "probe_ranges") for ix in ixs):
            raise _Bad("INVALID_ARGUMENT", "RESULT_FORMAT_RANGES needs BI-Sort subwindows")
        for i, sub_id in enumerate(c.sub_ids):
            flt = full if (c.filtered[i] if c.filtered else bool(c.filter_mode)) else none
            if ranges:
                rr = ixs[i].probe_ranges(lo, hi, flt)
                out.append(worker_pb2.ProbeResult(
                    sub_id=sub_id, probe_idx=to_array(rr.buf_probe_idx),
                    seq=to_array(rr.buf_seq), start=to_array(rr.start), end=to_array(rr.end),
                    range_probe_idx=to_array(rr.probe_idx)))
                continue
            pidx, seq = backend.probe(sub_id, lo, hi, flt, res)
            out.append(worker_pb2.ProbeResult(sub_id=sub_id, probe_idx=to_array(pidx),
                                              seq=to_array(seq)))
        return out


def serve(port: int = 0, threads: int = 1, host: str = "127.0.0.1", index_backend: str = "numba",
          device: str | None = None) -> tuple[grpc.Server, int]:
    """Start a worker server; returns it and the bound port (``port=0`` picks a free one).
    ``index_backend="opencl"`` serves BI-Sort subwindows from an OpenCL ``device``."""
    servicer = WorkerServicer(threads, index_backend, device)
    return start_server(lambda srv: worker_pb2_grpc.add_WorkerServicer_to_server(servicer, srv),
                        worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name, port, host,
                        max_workers=8)
