"""The manager's backend over gRPC: the paper's commands sent to worker processes.

Same four methods as :class:`panjoin.manager.backend.LocalBackend`, so the
engine does not know where its subwindows live. One long-lived ``Session``
stream per worker carries the commands in order; a request queue feeds it.
A RaP-Table subwindow's successor gets its partition table from the
predecessor's histograms (Algorithm 1): the worker sends it back with the
insert that fills the predecessor, and the manager passes it on in the next
create, whichever worker that lands on.

Faults: the manager keeps a copy of every subwindow (its create command and
the batches inserted). A worker that breaks its stream, or does not answer a
command within ``deadline`` seconds, is declared dead; each of its subwindows
is created again on a surviving worker (round-robin) from the copy, and the
command is retried there. Inserts are recorded only once acknowledged, so a
rebuilt subwindow holds every tuple exactly once. When no worker is left, the
join fails with a clear error.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

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


class WorkerError(RuntimeError):
    """A worker answered a command with an error, or the connection broke."""

    def __init__(self, msg: str, code: str = "UNAVAILABLE"):
        super().__init__(msg)
        self.code = code


class _Session:
    """One worker's command stream: send a Command, wait for its Feedback."""

    _END = object()

    def __init__(self, address: str, deadline: float):
        self.address = address
        self.deadline = deadline
        self.alive = True
        self.channel = grpc.insecure_channel(address, options=OPTIONS)
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)
        self.requests: queue.Queue = queue.Queue()
        self.answers: queue.Queue = queue.Queue()
        self.responses = self.stub.Session(iter(self.requests.get, self._END))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.ids = itertools.count()
        self.lock = threading.Lock()

    def _read(self) -> None:
        """Move feedback to a queue, so a caller can wait on it with a deadline."""
        try:
            for fb in self.responses:
                self.answers.put(fb)
        except grpc.RpcError as e:
            self.answers.put(e)
        self.answers.put(None)

    def call(self, **cmd) -> worker_pb2.Feedback:
        if not self.alive:
            raise WorkerError(f"worker {self.address} is down")
        with self.lock:
            cid = next(self.ids)
            self.requests.put(worker_pb2.Command(command_id=cid, **cmd))
            try:
                fb = self.answers.get(timeout=self.deadline)
            except queue.Empty:
                fb = f"no answer within {self.deadline:g} s"
            if not isinstance(fb, worker_pb2.Feedback):
                self.alive = False
                self.channel.close()
                raise WorkerError(f"worker {self.address} is unreachable: {fb}")
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
        self.splitters: dict[int, np.ndarray] = {}  # sub_id -> successor's partition table
        self.sizes: dict[int, int] = {}
        # the manager's copy of each subwindow: its create message and acknowledged inserts
        self.copies: dict[int, tuple[worker_pb2.Create, list]] = {}
        self.failovers = 0
        self.pool = ThreadPoolExecutor(max_workers=len(addresses), thread_name_prefix="probe")
        self.stats = BackendStats()

    def alive_workers(self) -> list[int]:
        return [i for i, s in enumerate(self.sessions) if s.alive]

    def _call(self, sub_id: int, **cmd) -> worker_pb2.Feedback:
        """Send a command to the worker holding ``sub_id``; on a dead worker, rebuild its
        subwindows elsewhere and retry."""
        while True:
            w = self.where[sub_id]
            try:
                return self.sessions[w].call(**cmd)
            except WorkerError as e:
                if self.sessions[w].alive:
                    raise  # the worker answered with an error: bad input, not a fault
                log.warning("%s; rebuilding its subwindows on the others", e)
                self._rebuild(w)

    def _rebuild(self, dead: int) -> None:
        alive = self.alive_workers()
        if not alive:
            raise WorkerError("every worker is down; the join cannot go on "
                              "(restart workers and the join)", "UNAVAILABLE")
        lost = sorted(s for s, w in self.where.items() if w == dead)
        for k, sub_id in enumerate(lost):
            target = alive[k % len(alive)]
            self.where[sub_id] = target
            create, inserts = self.copies[sub_id]
            try:
                self.sessions[target].call(create=create)
                for ins in inserts:
                    self.sessions[target].call(insert=ins)
            except WorkerError:
                if self.sessions[target].alive:
                    raise
                return self._rebuild(target) if self.alive_workers() else self._rebuild(dead)
        self.failovers += 1

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
        alive = self.alive_workers()
        if not alive:
            raise WorkerError("every worker is down; the join cannot go on", "UNAVAILABLE")
        if w not in alive:
            w = alive[spec.sub_id % len(alive)]
        self.where[spec.sub_id] = w
        self.copies[spec.sub_id] = (msg, [])
        if self.result_format == "ranges" and spec.kind == "bisort":
            self.mirrors[spec.sub_id] = make_index("bisort", spec.capacity, spec.key_dtype,
                                                   spec.partitions, 1, **spec.opts)
        try:
            self._call(spec.sub_id, create=msg)
        except WorkerError:
            if self.sessions[self.where[spec.sub_id]].alive:
                self.where.pop(spec.sub_id, None)
                self.copies.pop(spec.sub_id, None)
            raise
        self.stats.creates += 1

    def insert(self, sub_id: int, keys, ts, seq) -> None:
        ins = worker_pb2.Insert(sub_id=sub_id, keys=to_array(keys), ts=to_array(ts),
                                seq=to_array(seq))
        mirror = self.mirrors.get(sub_id)
        if mirror is None:
            fb = self._call(sub_id, insert=ins)
        else:  # the mirror's insert runs while the worker does the same one
            fut = self.pool.submit(self._call, sub_id, insert=ins)
            mirror.insert(keys, ts, seq)
            fb = fut.result()
        self.copies[sub_id][1].append(ins)
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
        fb = self._call(sub_id, probe=msg)
        r = fb.results[0]
        self.stats.probes += 1
        return from_array(r.probe_idx, "<i8").copy(), from_array(r.seq, "<i8").copy()

    def probe_many(self, targets, lo, hi) -> list[tuple[np.ndarray, np.ndarray]]:
        """One Probe command per worker, all workers at once; per-subwindow retry on a fault."""
        if not targets:
            return []
        full = next((f for _, f in targets if f.mode), None)
        base = worker_pb2.Probe(lo=to_array(lo), hi=to_array(hi),
                                filter_mode=full.mode if full else 0)
        if full is not None:
            c0, c1, c2 = full.arrays(lo.shape[-1])
            base.c0.CopyFrom(to_array(c0))
            base.c1.CopyFrom(to_array(c1))
            base.c2.CopyFrom(to_array(c2))
        by_worker: dict[int, list[int]] = {}
        for i, (sub_id, _) in enumerate(targets):
            by_worker.setdefault(self.where[sub_id], []).append(i)

        def send(w, idxs):
            msg = worker_pb2.Probe()
            msg.CopyFrom(base)
            if all(targets[i][0] in self.mirrors for i in idxs):
                msg.format = worker_pb2.RESULT_FORMAT_RANGES
            msg.sub_ids.extend(targets[i][0] for i in idxs)
            msg.filtered.extend(bool(targets[i][1].mode) for i in idxs)
            return self.sessions[w].call(probe=msg)

        out: list = [None] * len(targets)
        futs = {w: self.pool.submit(send, w, idxs) for w, idxs in by_worker.items()}
        for w, fut in futs.items():
            try:
                fb = fut.result()
            except WorkerError:
                if self.sessions[w].alive:
                    raise
                continue  # answered below, one by one, after the rebuild
            for i, r in zip(by_worker[w], fb.results, strict=True):
                pidx, seq = from_array(r.probe_idx, "<i8"), from_array(r.seq, "<i8")
                if r.range_probe_idx.data or r.start.data:
                    pidx, seq = self._expand(r, targets[i][1], pidx, seq)
                out[i] = (pidx, seq)
        for i, (sub_id, flt) in enumerate(targets):
            if out[i] is None:
                out[i] = self.probe(sub_id, lo, hi, flt)
        self.stats.probes += len(targets)
        return out

    def _expand(self, r, flt: WindowFilter, buf_pidx, buf_seq):
        """Main-array ranges -> (probe_idx, seq) on the mirror, filtered, plus buffer pairs."""
        rr = RangeResult(from_array(r.range_probe_idx, "<i8"), from_array(r.start, "<i8"),
                         from_array(r.end, "<i8"), buf_pidx, buf_seq)
        _, ts, seq = self.mirrors[r.sub_id].main_columns()
        self.ranges_expanded += int(rr.start.size)
        return rr.expand(None, ts, seq, flt if flt.mode else None)

    def expire(self, sub_id: int) -> None:
        self.mirrors.pop(sub_id, None)
        if sub_id in self.where:
            self._call(sub_id, expire=worker_pb2.Expire(sub_id=sub_id))
        self.where.pop(sub_id, None)
        self.copies.pop(sub_id, None)
        self.splitters.pop(sub_id, None)
        self.sizes.pop(sub_id, None)
        self.stats.expires += 1

    def nbytes(self) -> int:
        return sum(self.sizes.values())

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        for s in self.sessions:
            s.close()
