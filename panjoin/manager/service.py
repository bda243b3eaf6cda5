"""The manager endpoint: the ``panjoin.v1.Manager`` gRPC service over :class:`JoinEngine`.

A client opens a join (window, predicate, index, batch limits), streams input
batches in arrival order and reads result batches back; each join gets its own
worker sessions, so closing it (or disconnecting) releases its subwindows on
every worker. Batch ids make replays idempotent: a batch id at or below the
last applied one is acknowledged (``duplicate = true``) and not applied again.
A join with a latency bound (``OpenRequest.max_latency_ms``, or the manager's
``--max-latency`` default) streams: its pairs are pushed as they complete, between
the answers (:mod:`panjoin.manager.streaming`); without one, each input gets exactly
one output.

    panjoin manager --workers 127.0.0.1:50051,127.0.0.1:50052 --port 50050
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass

import grpc
import numpy as np

from panjoin.handshake.chain import ChainError
from panjoin.manager.engine import JoinEngine
from panjoin.manager.grpc_backend import GrpcBackend, WorkerError, status_code
from panjoin.manager.streaming import stream_join
from panjoin.proto.panjoin.v1 import manager_pb2, manager_pb2_grpc
from panjoin.semantics import SpecError, parse_predicate, parse_window
from panjoin.serving import start_server
from panjoin.wire import WireError, from_array, from_payloads, to_array, to_payloads

log = logging.getLogger("panjoin.manager")

#: a handshake chain under a latency bound L collects its input for L / COLLECT_SHARE
COLLECT_SHARE = 4
#: one JoinOutput carries at most this many pairs and payload bytes; more go out first
#: as pushed outputs (a band join of 64 partners a tuple made a 1.3 GB answer to one
#: 1M-tuple input, beyond any message limit)
OUTPUT_PAIRS = 2 << 20
OUTPUT_BYTES = 32 << 20


def output_parts(n: int, payloads=(), max_pairs: int | None = None,
                 max_bytes: int | None = None) -> list[tuple[int, int]]:
    """Cut ``n`` pairs into runs ``[a, b)`` of at most ``max_pairs`` pairs and (with
    payloads, Arrow binary arrays of n rows) about ``max_bytes`` payload bytes, at least
    one pair each; ``[(0, 0)]`` when there is none.

    >>> output_parts(5, max_pairs=2)
    [(0, 2), (2, 4), (4, 5)]
    """
    max_pairs = max_pairs or OUTPUT_PAIRS
    max_bytes = max_bytes or OUTPUT_BYTES
    if n == 0:
        return [(0, 0)]
    cum = np.zeros(n + 1, np.int64)
    for arr in payloads:
        if arr is not None:
            offs = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset:arr.offset + n + 1]
            cum += offs - offs[0]
    parts, a = [], 0
    while a < n:
        b = min(n, a + max_pairs)
        if cum[-1]:
            b = min(b, max(a + 1, int(np.searchsorted(cum, cum[a] + max_bytes, "right")) - 1))
        parts.append((a, b))
        a = b
    return parts


@dataclass
class _Join:
    engine: JoinEngine
    backend: GrpcBackend
    settings: manager_pb2.OpenRequest
    lock: threading.Lock
    last_batch_id: int = 0
    applied: bool = False
    closed: bool = False
    streaming: bool = False  # a latency bound: pairs are pushed as they complete
    reader: threading.Thread | None = None  # a streaming Join's input reader
    wake: object = None  # wakes a streaming Join's loop (a Close need not wait for it)


class ManagerServicer(manager_pb2_grpc.ManagerServicer):
    def __init__(self, workers: list[str], threads: int = 1, topology: str = "ring",
                 fifo: int = 1 << 16, segment: str = "nested", replicas: int = 2,
                 max_latency_ms: float | None = None, fast_forward: bool = False,
                 worker_timeout: float = 60.0):
        if not workers:
            raise ValueError("the manager needs at least one worker address")
        if topology not in ("ring", "handshake"):
            raise ValueError(f"unknown topology {topology!r}; choose 'ring' or 'handshake'")
        self.workers = workers
        self.threads = threads
        self.topology = topology  # handshake: `workers` are handshake chain nodes, in order
        self.fifo = fifo
        self.segment = segment
        self.fast_forward = fast_forward  # handshake: the low-latency handshake join
        if not worker_timeout > 0:
            raise ValueError(f"worker timeout must be a positive number of s, got "
                             f"{worker_timeout}")
        self.worker_timeout = worker_timeout  # ring: the heartbeat deadline (GrpcBackend)
        self.replicas = replicas  # ring: copies of each subwindow (GrpcBackend)
        if max_latency_ms is not None and not max_latency_ms > 0:
            raise ValueError(f"max latency must be a positive number of ms, got {max_latency_ms}")
        self.max_latency_ms = max_latency_ms  # for joins opened without one
        self.joins: dict[str, _Join] = {}
        self.lock = threading.Lock()

    def Open(self, request, context):
        try:
            window = parse_window(request.window, request.allowed_lateness)
            pred = parse_predicate(request.predicate)
            fmt = "ranges" if request.result_format == 1 else "pairs"
            bound = self._bound(request)
            if self.topology == "handshake":
                return self._open_handshake(request, window, pred, bound)
            backend = GrpcBackend(self.workers, deadline=self.worker_timeout,
                                  result_format=fmt, replicas=self.replicas)
            engine = JoinEngine(
                window, pred, index=request.index or "bisort",
                key_dtype=request.key_dtype or None,
                subwindow_size=request.subwindow_size or None,
                partitions=request.partitions or None,
                # with a bound the engine picks the batch size, at most the one given
                batch_size=request.batch_size or (None if bound else 32768),
                max_lag=request.max_lag or None,
                max_collect_ms=request.max_collect_ms or None, max_latency_ms=bound,
                threads=self.threads, backend=backend, n_workers=len(self.workers))
        except (SpecError, ValueError, TypeError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        settings = manager_pb2.OpenRequest()
        settings.CopyFrom(request)
        settings.index = engine.index
        settings.subwindow_size = engine.nsub
        settings.partitions = engine.partitions
        settings.batch_size = engine.batch_size
        settings.max_lag = engine.max_lag
        settings.max_latency_ms = bound or 0.0
        join_id = uuid.uuid4().hex[:12]
        with self.lock:
            self.joins[join_id] = _Join(engine, backend, settings, threading.RLock(),
                                        streaming=bound is not None)
        log.info("join %s opened: %s on %s, index %s%s", join_id, window, pred, engine.index,
                 f", max latency {bound:g} ms" if bound else "")
        return manager_pb2.OpenReply(join_id=join_id, settings=settings)

    def _bound(self, request) -> float | None:
        """The join's latency bound: its own, else the manager's default; none if negative."""
        if request.max_latency_ms < 0:
            return None
        return request.max_latency_ms or self.max_latency_ms

    def _open_handshake(self, request, window, pred, bound) -> manager_pb2.OpenReply:
        from panjoin.handshake.chain import HandshakeChain

        chain = HandshakeChain(self.workers, window, pred, key_dtype=request.key_dtype or None,
                               batch_size=min(request.batch_size or 4096, 1 << 16),
                               node_fifo=self.fifo, merger_fifo=self.fifo, index=self.segment,
                               fast_forward=self.fast_forward,
                               max_collect_ms=bound / COLLECT_SHARE if bound else None)
        settings = manager_pb2.OpenRequest()
        settings.CopyFrom(request)
        settings.index = self.segment  # how every node scans its segments
        settings.batch_size = chain.batch_size
        # under a bound the chain collects its input for a share of it (a run per stream
        # and deadline, not a message per client chunk) and streams its pairs out
        settings.max_latency_ms = bound or 0.0
        join_id = uuid.uuid4().hex[:12]
        with self.lock:
            self.joins[join_id] = _Join(chain, chain, settings, threading.RLock(),
                                        streaming=bound is not None)
        log.info("join %s opened on a %d-node handshake chain: %s on %s", join_id,
                 len(self.workers), window, pred)
        return manager_pb2.OpenReply(join_id=join_id, settings=settings)

    def _get(self, join_id: str, context) -> _Join:
        with self.lock:
            j = self.joins.get(join_id)
        if j is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown join {join_id!r}; Open one first")
        return j

    def Join(self, request_iterator, context):
        join_id = None
        try:
            for msg in request_iterator:
                if join_id is None:
                    join_id = msg.join_id
                j = self._get(join_id, context)
                if j.streaming:  # the loop takes the stream over, inputs and all
                    yield from stream_join(j, msg, request_iterator, context,
                                           lambda m, j=j: self._apply(j, m, context),
                                           lambda j=j: self._pushed(j, context),
                                           lambda jid=join_id: self._close(jid))
                    return
                with j.lock:  # not held across the yield: a slow reader blocks no one
                    if j.closed:
                        context.abort(grpc.StatusCode.NOT_FOUND, f"join {join_id!r} is closed")
                    outs = self._apply(j, msg, context)
                yield from outs
        finally:
            if join_id is not None and not context.is_active():
                self._close(join_id)  # the client went away: release the join

    def _apply(self, j: _Join, msg, context) -> list[manager_pb2.JoinOutput]:
        """The answer to one input, last; pushed outputs before it when its pairs are too
        many for one message (:func:`output_parts`)."""
        if j.applied and msg.batch_id <= j.last_batch_id:
            return [manager_pb2.JoinOutput(batch_id=msg.batch_id, duplicate=True)]
        try:
            stream = from_array(msg.stream, "|u1", "stream")
            ids = from_array(msg.id, "<i8", "id")
            keys = from_array(msg.key, None, "key")
            ts = from_array(msg.ts, "<i8", "ts")
            if not (stream.shape == ids.shape == keys.shape == ts.shape):
                raise WireError("stream, id, key and ts must have one length")
            if keys.dtype == np.float64 and not np.isfinite(keys).all():
                raise WireError("keys must be finite (no NaN or inf)")
            if stream.size and stream.max() > 1:
                raise WireError("stream must be 0 (R) or 1 (S)")
            payload = from_payloads(msg.payload, ids.size)
            key2 = from_array(msg.key2, "<f8", "key2") if msg.HasField("key2") else None
            if msg.HasField("watermark"):
                if self.topology == "handshake":
                    raise ValueError("a client watermark needs the ring topology; the "
                                     "handshake chain decides lateness by the largest ts")
                j.engine.push_arrays(stream, ids, keys, ts, payload, key2,
                                     watermark=msg.watermark)
            else:
                j.engine.push_arrays(stream, ids, keys, ts, payload, key2)
            if msg.flush:
                j.engine.flush()
        except (WireError, ValueError, TypeError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except (WorkerError, ChainError) as e:
            _abort_worker_error(context, e)
        j.applied = True
        j.last_batch_id = msg.batch_id
        # without flush, rounds still on the workers stay there: they answer meanwhile
        try:
            return self._outputs(j, msg.flush, msg.batch_id)
        except (WorkerError, ChainError) as e:
            _abort_worker_error(context, e)

    def _pushed(self, j: _Join, context) -> list[manager_pb2.JoinOutput]:
        """A streaming join's pushed outputs: what completed since the last output (none
        if nothing did)."""
        try:
            return self._outputs(j, False, None)
        except (WorkerError, ChainError) as e:
            _abort_worker_error(context, e)

    def _outputs(self, j: _Join, wait: bool, batch_id: int | None
                 ) -> list[manager_pb2.JoinOutput]:
        """The pairs and late ids completed so far (``wait``: every probe round in
        flight, else the answered ones) as JoinOutputs of a bounded size: pushed ones
        (batch id 0), then, for an input (``batch_id``), its answer with the late ids.
        For no input and nothing completed: none."""
        r, s, rp, sp = j.engine.take_results(payloads=True, wait=wait)
        late = j.engine.take_late()
        ls = np.concatenate([np.zeros(len(late["R"]), np.uint8), np.ones(len(late["S"]), np.uint8)])
        if batch_id is None and not (r.size or ls.size):
            return []
        outs = []
        for a, b in output_parts(int(r.size), (rp, sp)):
            out = manager_pb2.JoinOutput(batch_id=0, pushed=True)
            out.r_id.CopyFrom(to_array(r[a:b]))
            out.s_id.CopyFrom(to_array(s[a:b]))
            to_payloads(rp.slice(a, b - a) if rp is not None else None, out.r_payload)
            to_payloads(sp.slice(a, b - a) if sp is not None else None, out.s_payload)
            outs.append(out)
        last = outs[-1]
        last.late_stream.CopyFrom(to_array(ls))
        last.late_id.CopyFrom(to_array(np.concatenate([late["R"], late["S"]])))
        if batch_id is not None:
            last.batch_id, last.pushed = batch_id, False
        return outs

    def _status(self, join_id: str, j: _Join) -> manager_pb2.JoinStatus:
        e = j.engine
        j.backend.sync()  # every command answered: the workers' status bits are current
        w = e.window_tuples()
        rings = getattr(e, "rings", {"R": (), "S": ()})  # a handshake chain has none
        return manager_pb2.JoinStatus(
            join_id=join_id, tuples_in=e.stats.tuples_in, late=e.stats.late,
            batches=e.stats.batches, results=e.stats.results, window_r=w["R"], window_s=w["S"],
            subwindows_r=len(rings["R"]), subwindows_s=len(rings["S"]),
            workers_alive=len(j.backend.alive_workers()), last_batch_id=j.last_batch_id,
            memory_bytes=e.memory_bytes(), workers=j.backend.loads(),
            probes_in_flight=e.status().get("probes_in_flight", 0),
            failovers=j.backend.failovers,
            pauses=e.admission.pauses if hasattr(e, "admission") else 0)

    def _status_or_abort(self, join_id: str, j: _Join, context) -> manager_pb2.JoinStatus:
        if j.closed:  # closed while this call waited for the join's lock
            context.abort(grpc.StatusCode.NOT_FOUND, f"join {join_id!r} is closed")
        try:
            return self._status(join_id, j)
        except (WorkerError, ChainError) as e:
            _abort_worker_error(context, e)

    def Status(self, request, context):
        j = self._get(request.join_id, context)
        with j.lock:
            return self._status_or_abort(request.join_id, j, context)

    def Close(self, request, context):
        j = self._get(request.join_id, context)
        with j.lock:
            st = self._status_or_abort(request.join_id, j, context)
            self._close(request.join_id)
        return st

    def _close(self, join_id: str) -> None:
        with self.lock:
            j = self.joins.pop(join_id, None)
        if j is not None:
            with j.lock:  # after any call in progress on the join
                j.closed = True
                j.backend.close()
            if j.wake is not None:  # a streaming Join's loop ends now, not at its next look
                j.wake()
            log.info("join %s closed", join_id)


def _abort_worker_error(context, e: Exception) -> None:
    """End the call with the status of a worker's (or a chain node's) error: its own
    code (RESOURCE_EXHAUSTED, DATA_LOSS, ...; :func:`status_code`), UNAVAILABLE for a
    chain, and the first cause as the detail."""
    code = status_code(e) if isinstance(e, WorkerError) else grpc.StatusCode.UNAVAILABLE
    context.abort(code, str(e))


def serve_manager(workers: list[str], port: int = 0, host: str = "127.0.0.1",
                  threads: int = 1, topology: str = "ring",
                  fifo: int = 1 << 16, segment: str = "nested",
                  replicas: int = 2, max_latency_ms: float | None = None,
                  fast_forward: bool = False, worker_timeout: float = 60.0
                  ) -> tuple[grpc.Server, int]:
    """Start the manager endpoint; returns the server and its port. ``max_latency_ms``:
    the latency bound of joins opened without one (None: such joins do not stream)."""
    servicer = ManagerServicer(workers, threads, topology, fifo, segment, replicas,
                               max_latency_ms, fast_forward, worker_timeout)
    return start_server(
        lambda srv: manager_pb2_grpc.add_ManagerServicer_to_server(servicer, srv),
        manager_pb2.DESCRIPTOR.services_by_name["Manager"].full_name, port, host)
