"""The manager's backend over gRPC: the paper's commands sent to worker processes.

Same four methods as :class:`panjoin.manager.backend.LocalBackend`, so the
engine does not know where its subwindows live. One long-lived ``Session``
stream per worker carries the commands in order; a request queue feeds it.
A RaP-Table subwindow's successor gets its partition table from the
predecessor's histograms (Algorithm 1): the worker sends it back with the
insert that fills the predecessor, and the manager passes it on in the next
create, whichever worker that lands on.
"""

from __future__ import annotations

import itertools
import queue
import threading

import grpc
import numpy as np

from panjoin.manager.backend import BackendStats, CreateSpec
from panjoin.proto.panjoin.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from panjoin.subwindow import WindowFilter
from panjoin.wire import from_array, to_array

STREAM = {"R": common_pb2.STREAM_R, "S": common_pb2.STREAM_S}
OPTIONS = [("grpc.max_receive_message_length", 1 << 30),
           ("grpc.max_send_message_length", 1 << 30)]


class WorkerError(RuntimeError):
    """A worker answered a command with an error, or the connection broke."""

    def __init__(self, msg: str, code: str = "UNAVAILABLE"):
        super().__init__(msg)
        self.code = code


class _Session:
    """One worker's command stream: send a Command, wait for its Feedback."""

    _END = object()

    def __init__(self, address: str):
        self.address = address
        self.channel = grpc.insecure_channel(address, options=OPTIONS)
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)
        self.requests: queue.Queue = queue.Queue()
        self.responses = self.stub.Session(iter(self.requests.get, self._END))
        self.ids = itertools.count()
        self.lock = threading.Lock()

    def call(self, **cmd) -> worker_pb2.Feedback:
        with self.lock:
            cid = next(self.ids)
            self.requests.put(worker_pb2.Command(command_id=cid, **cmd))
            try:
                fb = next(self.responses)
            except (grpc.RpcError, StopIteration) as e:
                raise WorkerError(f"worker {self.address} is unreachable: {e}") from None
        if fb.command_id != cid:
            raise WorkerError(f"worker {self.address} answered command {fb.command_id}, "
                              f"expected {cid}")
        if fb.error:
            raise WorkerError(f"worker {self.address}: {fb.error}", fb.code)
        return fb

    def close(self) -> None:
        self.requests.put(self._END)
        self.channel.close()


class GrpcBackend:
    """Subwindows on worker processes, addressed ``host:port``."""

    def __init__(self, addresses: list[str]):
        if not addresses:
            raise ValueError("a cluster needs at least one worker address")
        self.sessions = [_Session(a) for a in addresses]
        self.where: dict[int, int] = {}  # sub_id -> worker index
        self.splitters: dict[int, np.ndarray] = {}  # sub_id -> successor's partition table
        self.sizes: dict[int, int] = {}
        self.stats = BackendStats()

    @property
    def n_workers(self) -> int:
        return len(self.sessions)

    def create(self, spec: CreateSpec) -> None:
        w = spec.worker % self.n_workers
        msg = worker_pb2.Create(sub_id=spec.sub_id, stream=STREAM[spec.stream], index=spec.kind,
                                capacity=spec.capacity, key_dtype=spec.key_dtype,
                                partitions=spec.partitions,
                                options={k: str(v) for k, v in spec.opts.items()})
        spl = self.splitters.pop(spec.predecessor, None) if spec.predecessor is not None else None
        if spl is not None:
            msg.splitters.CopyFrom(to_array(spl))
        self.sessions[w].call(create=msg)
        self.where[spec.sub_id] = w
        self.stats.creates += 1

    def insert(self, sub_id: int, keys, ts, seq) -> None:
        fb = self.sessions[self.where[sub_id]].call(insert=worker_pb2.Insert(
            sub_id=sub_id, keys=to_array(keys), ts=to_array(ts), seq=to_array(seq)))
        self.sizes[sub_id] = fb.status.nbytes
        if fb.status.successor_splitters.data:
            self.splitters[sub_id] = from_array(fb.status.successor_splitters)
        self.stats.inserts += 1

    def probe(self, sub_id: int, lo, hi, flt: WindowFilter):
        c0, c1, c2 = flt.arrays(lo.shape[-1]) if flt.mode else (None, None, None)
        msg = worker_pb2.Probe(sub_ids=[sub_id], filtered=[bool(flt.mode)], lo=to_array(lo),
                               hi=to_array(hi), filter_mode=flt.mode)
        if flt.mode:
            msg.c0.CopyFrom(to_array(c0))
            msg.c1.CopyFrom(to_array(c1))
            msg.c2.CopyFrom(to_array(c2))
        fb = self.sessions[self.where[sub_id]].call(probe=msg)
        r = fb.results[0]
        self.stats.probes += 1
        return from_array(r.probe_idx, "<i8").copy(), from_array(r.seq, "<i8").copy()

    def expire(self, sub_id: int) -> None:
        w = self.where.pop(sub_id, None)
        self.splitters.pop(sub_id, None)
        self.sizes.pop(sub_id, None)
        if w is not None:
            self.sessions[w].call(expire=worker_pb2.Expire(sub_id=sub_id))
        self.stats.expires += 1

    def nbytes(self) -> int:
        return sum(self.sizes.values())

    def close(self) -> None:
        for s in self.sessions:
            s.close()
