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

A join belongs to the client that opened it: Open returns an unguessable token
(``secrets.token_urlsafe``) that Join's first message, Status and Close must carry;
another caller gets PERMISSION_DENIED and touches nothing. Every join ends: Close; a
client that goes away during a Join stream (cancels, disconnects); an error the join
cannot go on from (a worker's); or ``idle_timeout`` seconds with no Join stream
attached and no call (a client that opened it and vanished, or half-closed its stream
and never came back: a client may legitimately open another Join stream, e.g. to
replay after a crash). A background reaper closes idle joins and keeps the worker
sessions of the others alive. Open checks every number (:mod:`panjoin.limits`) and
the join's memory estimate against the workers' budgets before it keeps anything;
whatever fails after the workers were asked releases their sessions.

    panjoin manager --workers 127.0.0.1:50051,127.0.0.1:50052 --port 50050
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field

import grpc
import numpy as np
import pyarrow as pa

from panjoin import limits
from panjoin.codec import ID_PAIRS_PIECE, piece_cuts
from panjoin.config import DEFAULT_INDEX
from panjoin.handshake.chain import ChainError
from panjoin.manager.engine import JoinEngine
from panjoin.manager.grpc_backend import GrpcBackend, WorkerError, status_code
from panjoin.manager.key_placement import PLACEMENTS, KeyPlacedBackend
from panjoin.manager.resize import ResizeError, ResizeGate, add_worker, remove_worker
from panjoin.manager.streaming import stream_join
from panjoin.ops.metrics import ManagerCollector, Retired, with_metrics
from panjoin.ops.page import with_page
from panjoin.proto.panjoin.v1 import manager_pb2, manager_pb2_grpc
from panjoin.security import current
from panjoin.semantics import SpecError, parse_predicate, parse_window
from panjoin.serving import register, start_server
from panjoin.wire import (
    Encoded,
    WireError,
    from_array,
    from_payloads,
    int_column,
    to_payloads,
)

log = logging.getLogger("panjoin.manager")

#: a handshake chain under a latency bound L collects its input for L / COLLECT_SHARE
COLLECT_SHARE = 4
#: one JoinOutput carries at most this many pairs and payload bytes; more go out first
#: as pushed outputs (a band join of 64 partners a tuple made a 1.3 GB answer to one
#: 1M-tuple input, beyond any message limit). At most L/128 pairs and L/4 payload
#: bytes for the message limit L (panjoin.security: 32 bytes a pair with payload
#: offsets, room left for the late ids), and no more than these, since a message of
#: megabytes is built in fresh memory: 2M pairs (32 MB) cost 130 ns a pair in page
#: faults to build and serialise on this VM, 128K pairs 15 ns.
OUTPUT_PAIRS = 128 << 10
OUTPUT_BYTES = 4 << 20


def output_caps() -> tuple[int, int]:
    """(pairs, payload bytes) one JoinOutput may carry under the message limit."""
    limit = current().max_message_bytes
    return min(OUTPUT_PAIRS, limit // 128), min(OUTPUT_BYTES, limit // 4)


def output_parts(n: int, payloads=(), max_pairs: int | None = None,
                 max_bytes: int | None = None) -> list[tuple[int, int]]:
    """Cut ``n`` pairs into runs ``[a, b)`` of at most ``max_pairs`` pairs and (with
    payloads, Arrow binary arrays of n rows) about ``max_bytes`` payload bytes, at least
    one pair each; ``[(0, 0)]`` when there is none.

    >>> output_parts(5, max_pairs=2)
    [(0, 2), (2, 4), (4, 5)]
    """
    caps = output_caps()
    max_pairs = max_pairs or caps[0]
    max_bytes = max_bytes or caps[1]
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


def regroup(pieces, max_pairs: int):
    """Result pieces ``(r_id, s_id, r_payload, s_payload)`` (payloads Arrow arrays or
    None) as runs of ``max_pairs`` pairs (the last one shorter): small pieces joined,
    big ones cut, each pair copied at most once.

    >>> import numpy as np
    >>> ps = [(np.arange(3), np.arange(3), None, None), (np.arange(4), np.arange(4), None, None)]
    >>> [r.tolist() for r, _, _, _ in regroup(ps, 5)]
    [[0, 1, 2, 0, 1], [2, 3]]
    """
    run, n = [], 0
    for r, s, rp, sp in pieces:
        a, m = 0, int(r.size)
        while a < m:
            take = min(m - a, max_pairs - n)
            run.append((r[a:a + take], s[a:a + take],
                        rp.slice(a, take) if rp is not None else None,
                        sp.slice(a, take) if sp is not None else None))
            n += take
            a += take
            if n == max_pairs:
                yield _joined(run)
                run, n = [], 0
    if run:
        yield _joined(run)


def _joined(run):
    if len(run) == 1:
        return run[0]
    pays = [pa.concat_arrays([p[k] for p in run]) if run[0][k] is not None else None
            for k in (2, 3)]
    return (np.concatenate([p[0] for p in run]), np.concatenate([p[1] for p in run]), *pays)


#: seconds a join may have no Join stream and no call before the manager closes it
IDLE_TIMEOUT_S = 300.0


class _Unconnected:
    """The engine's backend until Open has checked everything: no worker is asked
    before that."""


@dataclass
class _Join:
    engine: JoinEngine
    backend: GrpcBackend
    settings: manager_pb2.OpenRequest
    lock: threading.Lock
    token: str = ""
    attached: int = 0  # Join streams of its owner in progress
    last_used: float = field(default_factory=time.monotonic)  # end of its last call
    last_batch_id: int = 0
    applied: bool = False
    closed: bool = False
    streaming: bool = False  # a latency bound: pairs are pushed as they complete
    reader: threading.Thread | None = None  # a streaming Join's input reader
    wake: object = None  # wakes a streaming Join's loop (a Close need not wait for it)
    announced: int = 0  # results past the manager: the sources its client knows of


class ManagerServicer(manager_pb2_grpc.ManagerServicer):
    def __init__(self, workers: list[str], threads: int = 1, topology: str = "ring",
                 fifo: int = 1 << 16, segment: str = "nested", replicas: int = 2,
                 max_latency_ms: float | None = None, fast_forward: bool = False,
                 worker_timeout: float = 60.0, idle_timeout: float = IDLE_TIMEOUT_S,
                 max_input_tuples: int = limits.MAX_INPUT_TUPLES, placement: str = "time"):
        if not workers:
            raise ValueError("the manager needs at least one worker address")
        if topology not in ("ring", "handshake"):
            raise ValueError(f"unknown topology {topology!r}; choose 'ring' or 'handshake'")
        self.workers = list(workers)  # AddWorker and RemoveWorker change it
        self.gate = ResizeGate()
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
        if placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {placement!r}; choose one of "
                             f"{', '.join(PLACEMENTS)}")
        if placement == "key" and replicas != 1:
            raise ValueError("key placement keeps one copy of each piece: replicas must be 1")
        self.placement = placement  # ring: whole subwindows (time) or key pieces (key)
        if max_latency_ms is not None and not max_latency_ms > 0:
            raise ValueError(f"max latency must be a positive number of ms, got {max_latency_ms}")
        self.max_latency_ms = max_latency_ms  # for joins opened without one
        if not idle_timeout > 0:
            raise ValueError(f"idle timeout must be a positive number of s, got {idle_timeout}")
        self.idle_timeout = idle_timeout
        self.max_input_tuples = max_input_tuples
        self.joins: dict[str, _Join] = {}
        self.retired = Retired()  # the closed joins' counters (panjoin.ops.metrics)
        self.lock = threading.Lock()
        self._reaper = threading.Thread(target=self._reap, daemon=True, name="join-reaper")
        self._reaper.start()

    # ------------------------------------------------------------------ life cycle

    def _reap(self) -> None:
        """Close joins idle for idle_timeout (no stream attached, no call); keep the
        worker sessions of the others open (their workers end idle sessions)."""
        tick = min(1.0, self.idle_timeout / 4)
        while True:
            time.sleep(tick)
            now = time.monotonic()
            with self.lock:
                joins = list(self.joins.items())
            for jid, j in joins:
                if j.attached == 0 and now - j.last_used > self.idle_timeout:
                    log.warning("join %s idle for %g s (no Join stream, no call): closing it",
                                jid, self.idle_timeout)
                    self._close(jid)
                elif hasattr(j.backend, "keepalive"):
                    j.backend.keepalive()

    def Open(self, request, context):
        with self.gate.opening():  # the worker list stays as it is until registered
            return self._open(request, context)

    def _open(self, request, context):
        try:
            limits.check_open(request)
            window = parse_window(request.window, request.allowed_lateness)
            limits.check_window(window)
            pred = parse_predicate(request.predicate)
            fmt = "ranges" if request.result_format == 1 else "pairs"
            bound = self._bound(request)
            if self.topology == "handshake":
                return self._open_handshake(request, window, pred, bound)
            engine = JoinEngine(
                window, pred, index=request.index or DEFAULT_INDEX,
                key_dtype=request.key_dtype or None,
                subwindow_size=request.subwindow_size or None,
                partitions=request.partitions or None,
                # with a bound the engine picks the batch size, at most the one given
                batch_size=request.batch_size or (None if bound else 32768),
                max_lag=request.max_lag or None,
                max_collect_ms=request.max_collect_ms or None, max_latency_ms=bound,
                threads=self.threads, backend=_Unconnected(), n_workers=len(self.workers),
                # the client numbers its tuples: granted for count windows (the reply's
                # settings say so), else it sends its ids
                seq_ids=request.seq_ids and window.kind == "count")
            limits.check_sizes(engine.nsub, engine.partitions)
        except (SpecError, ValueError, TypeError, OverflowError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except ChainError as e:  # a chain with a key dtype is configured at Open
            _abort_worker_error(context, e)
        direct, why = self._direct(request, fmt)
        # everything checked: now the workers are asked, and released on any failure
        placed = KeyPlacedBackend if self.placement == "key" else GrpcBackend
        try:
            backend = placed(self.workers, deadline=self.worker_timeout, result_format=fmt,
                             replicas=self.replicas, direct=direct)
        except ValueError as e:  # key placement and BI-Sort ranges
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        try:
            self._check_memory(backend, engine, window)
        except WorkerError as e:
            backend.close()
            context.abort(getattr(grpc.StatusCode, e.code, grpc.StatusCode.UNAVAILABLE), str(e))
        except BaseException:
            backend.close()
            raise
        engine.backend = backend
        settings = manager_pb2.OpenRequest()
        settings.CopyFrom(request)
        settings.index = engine.index
        settings.subwindow_size = engine.nsub
        settings.partitions = engine.partitions
        settings.batch_size = engine.batch_size
        settings.max_lag = engine.max_lag
        settings.max_latency_ms = bound or 0.0
        settings.seq_ids = engine.seq_ids
        return self._register(_Join(engine, backend, settings, threading.RLock(),
                                    streaming=bound is not None),
                              f"{window} on {pred}, index {engine.index}"
                              + (f", max latency {bound:g} ms" if bound else "")
                              + (", results past the manager" if direct else ""), why)

    def _direct(self, request, fmt: str) -> tuple[bool, str]:
        """Results past the manager, if asked for: granted, or why not."""
        if not request.direct_results:
            return False, ""
        if self.replicas != 1:
            return False, (f"the manager keeps {self.replicas} replicas of each subwindow "
                           "(--replicas): a pair a lost worker already sent could not be "
                           "recalled on failover; a manager with --replicas 1 sends results "
                           "past itself")
        if fmt != "pairs":
            return False, "result_format RANGES has the manager expand the pairs"
        return True, ""

    def _register(self, j: _Join, what: str, direct_why: str = "") -> manager_pb2.OpenReply:
        """Keep an opened join under a new id and token; its OpenReply (with the result
        sources of a join whose pairs go past the manager, or why they do not)."""
        join_id = uuid.uuid4().hex[:12]
        j.token = secrets.token_urlsafe(24)
        j.last_used = time.monotonic()
        with self.lock:
            self.joins[join_id] = j
        log.info("join %s opened: %s", join_id, what)
        reply = manager_pb2.OpenReply(join_id=join_id, token=j.token, settings=j.settings,
                                      direct_results_why=direct_why)
        if getattr(j.backend, "direct", False):
            reply.direct_results = True
            reply.sources.extend(self._new_sources(j))
        elif direct_why:
            log.info("join %s: results through the manager: %s", join_id, direct_why)
        return reply

    @staticmethod
    def _new_sources(j: _Join) -> list[manager_pb2.ResultSource]:
        """The result sources (worker sessions) its client has not been told of."""
        new = j.backend.sources()[j.announced:]
        j.announced += len(new)
        return [manager_pb2.ResultSource(source=i, address=a, token=t) for i, a, t in new]

    def _check_memory(self, backend: GrpcBackend, engine: JoinEngine, window) -> None:
        """Connect the join's worker sessions and check its estimate against the least
        memory free on a worker; raises WorkerError (RESOURCE_EXHAUSTED) naming both."""
        free = backend.connect(self.worker_timeout)
        alive = len(backend.alive_workers())
        need = limits.join_bytes_per_worker(window, engine.nsub, engine.partitions,
                                            engine.index, alive, backend.replicas)
        if free >= 0 and need > free:
            raise WorkerError(
                f"the join needs about {limits.fmt_bytes(need)} on each of {alive} workers (window "
                f"{window}, subwindow_size {engine.nsub}, partitions {engine.partitions}, "
                f"index {engine.index}, replicas {backend.replicas}), but a worker has "
                f"{limits.fmt_bytes(free)} of its memory budget free: use a smaller window or "
                "subwindow_size, more workers, or raise their --memory-limit",
                "RESOURCE_EXHAUSTED")

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
        settings.seq_ids = False  # the chain's nodes keep the client's ids
        return self._register(_Join(chain, chain, settings, threading.RLock(),
                                    streaming=bound is not None),
                              f"{window} on {pred}, a {len(self.workers)}-node handshake chain",
                              "the handshake chain's pairs meet in its result merging network "
                              "on the manager" if request.direct_results else "")

    def _get(self, join_id: str, token: str, context) -> _Join:
        """The join, if ``token`` is its own (NOT_FOUND, PERMISSION_DENIED otherwise)."""
        with self.lock:
            j = self.joins.get(join_id)
        if j is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown join {join_id!r}; Open one first")
        if not hmac.compare_digest(token.encode(), j.token.encode()):
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"join {join_id!r} belongs to the client that opened it: send the "
                          "token its Open returned")
        return j

    def Join(self, request_iterator, context):
        join_id = None  # set once the stream proved it is the owner's
        j = None
        try:
            for msg in request_iterator:
                if join_id is None:
                    j = self._get(msg.join_id, msg.token, context)
                    join_id = msg.join_id
                    with self.lock:
                        j.attached += 1
                    context.add_callback(lambda jid=join_id: self._on_end(jid, context))
                elif j.closed:
                    context.abort(grpc.StatusCode.NOT_FOUND, f"join {join_id!r} is closed")
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
            if j is not None:
                with self.lock:
                    j.attached -= 1
                    j.last_used = time.monotonic()
            if join_id is not None and not context.is_active():
                self._close(join_id)  # the client went away: release the join

    def _on_end(self, join_id: str, context) -> None:
        """Called by gRPC when a Join stream ends: one the client cancelled releases its
        join. A cancel can reach the handler as a plain end of input (gRPC reads the
        reset stream as a half-close), so the handler alone cannot tell it from a client
        that is done sending; only the call's final state can. gRPC runs this on its
        polling thread: the release, which waits for the join's lock, gets its own."""
        if _cancelled(context):
            threading.Thread(target=self._close, args=(join_id,), daemon=True,
                             name=f"release-{join_id}").start()

    def _apply(self, j: _Join, msg, context) -> list[manager_pb2.JoinOutput]:
        """The answer to one input, last; pushed outputs before it when its pairs are too
        many for one message (:func:`output_parts`)."""
        if j.applied and msg.batch_id <= j.last_batch_id:
            return [manager_pb2.JoinOutput(batch_id=msg.batch_id, duplicate=True)]
        if _gone(context):  # read after the client's deadline, or the client went away
            context.abort(grpc.StatusCode.CANCELLED, "the client is gone (its deadline "
                          "passed or it went away); the input was not applied")
        try:
            # each read of a bytes field copies it: the two columns that count the tuples
            # are decoded (views of one copy each, within the message size limit) and
            # counted before anything else is
            stream = from_array(msg.stream, "|u1", "stream")
            ids = int_column(msg.id, msg.id_base, "id")  # (wire.narrow: maybe uint32)
            seq_ids = getattr(j.engine, "seq_ids", False)
            if seq_ids and ids.size:
                raise WireError("this join was opened with seq_ids: each tuple's id is its "
                                "seq, so a JoinInput carries no id column")
            n = max(stream.size, ids.size)
            if n > self.max_input_tuples:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"{n} tuples in one JoinInput; send at most "
                              f"{self.max_input_tuples} a message (split the batch)")
            # int64 or float64 keys; narrowed int64 ones with their base (wire.narrow)
            keys = (int_column(msg.key, msg.key_base, "key")
                    if msg.key.dtype == "<u4" or msg.key_base else from_array(msg.key, None, "key"))
            ts = int_column(msg.ts, msg.ts_base, "ts")
            count = j.engine.window.kind == "count"
            if count and ts.size == 0:  # a count window never reads ts
                ts = np.zeros(n, np.int64) if self.topology == "handshake" else None
            if not (stream.shape == keys.shape and (seq_ids or ids.shape == stream.shape)
                    and (ts is None or ts.shape == stream.shape)):
                raise WireError("stream, id, key and ts must have one length" +
                                (" (a count window's ts may be empty)" if count else "")
                                + (" (this join's ids are seqs: no id column)"
                                   if seq_ids else ""))
            if keys.dtype == np.float64 and not np.isfinite(keys).all():
                raise WireError("keys must be finite (no NaN or inf)")
            if stream.size and stream.max() > 1:
                raise WireError("stream must be 0 (R) or 1 (S)")
            payload = from_payloads(msg.payload, stream.size)
            if payload is not None and getattr(j.backend, "direct", False):
                raise WireError("this join sends its pairs past the manager, which then "
                                "keeps no payloads: keep them at the client (replay does), "
                                "or open the join without direct_results")
            key2 = from_array(msg.key2, "<f8", "key2") if msg.HasField("key2") else None
            if msg.HasField("watermark"):
                if self.topology == "handshake":
                    raise ValueError("a client watermark needs the ring topology; the "
                                     "handshake chain decides lateness by the largest ts")
                j.engine.push_arrays(stream, None if seq_ids else ids, keys, ts, payload, key2,
                                     watermark=msg.watermark)
            else:
                j.engine.push_arrays(stream, None if seq_ids else ids, keys, ts, payload, key2)
            if msg.flush:
                j.engine.flush()
        except (WireError, ValueError, TypeError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except (WorkerError, ChainError) as e:
            self._fail(j, e, context)
        j.applied = True
        j.last_batch_id = msg.batch_id
        # without flush, rounds still on the workers stay there: they answer meanwhile
        try:
            return self._outputs(j, msg.flush, msg.batch_id)
        except (WorkerError, ChainError) as e:
            self._fail(j, e, context)

    def _fail(self, j: _Join, e: Exception, context) -> None:
        """A worker (or chain) error the join cannot go on from: release its sessions on
        every worker now, and end the call with the error's code (:func:`_abort_worker_error`)."""
        self._close_after(j)
        _abort_worker_error(context, e)

    def _pushed(self, j: _Join, context) -> list[manager_pb2.JoinOutput]:
        """A streaming join's pushed outputs: what completed since the last output (none
        if nothing did)."""
        try:
            return self._outputs(j, False, None)
        except (WorkerError, ChainError) as e:
            self._fail(j, e, context)

    def _outputs(self, j: _Join, wait: bool, batch_id: int | None) -> list[Encoded]:
        """The pairs and late ids completed so far (``wait``: every probe round in
        flight, else the answered ones) as JoinOutputs of a bounded size, encoded
        (:func:`encode_output`): pushed ones (batch id 0), then, for an input
        (``batch_id``), its answer with the late ids. For no input and nothing
        completed: none."""
        pieces = j.engine.take_result_pieces(payloads=True, wait=wait)
        late = j.engine.take_late()
        ls = np.concatenate([np.zeros(len(late["R"]), np.uint8), np.ones(len(late["S"]), np.uint8)])
        if batch_id is None and not (pieces or ls.size):
            return []
        if getattr(j.backend, "direct", False):  # references to the pairs
            groups = ref_groups(pieces, ID_PAIRS_PIECE)
            outs = [encode_output(0, True, refs=g.T) for g in groups[:-1]]
            outs.append(encode_output(batch_id or 0, batch_id is None,
                                      late=(ls, np.concatenate([late["R"], late["S"]])),
                                      refs=groups[-1].T))
            new = self._new_sources(j)  # before the first reference to them
            return [encode_output(0, True, sources=new), *outs] if new else outs
        parts = [(r[a:b], s[a:b], rp.slice(a, b - a) if rp is not None else None,
                  sp.slice(a, b - a) if sp is not None else None)
                 for r, s, rp, sp in regroup(pieces, output_caps()[0])
                 for a, b in output_parts(int(r.size), (rp, sp))]
        outs = [encode_output(0, True, *p) for p in parts[:-1]]
        last = parts[-1] if parts else (None, None, None, None)
        outs.append(encode_output(batch_id or 0, batch_id is None, *last,
                                  late=(ls, np.concatenate([late["R"], late["S"]]))))
        return outs

    def _status(self, join_id: str, j: _Join, sync: bool = True) -> manager_pb2.JoinStatus:
        """The join's counters; ``sync``: after every command is answered (the caller
        holds the join's lock), else as of the last feedback, without the lock (the
        rings are then read while the join may change them: a retry if one did)."""
        e = j.engine
        if sync:
            j.backend.sync()  # every command answered: the workers' status bits are current
            if getattr(e, "pending_expires", 0):  # and the expires their rounds held back
                e.settle()
                j.backend.sync()
        for _ in range(10):
            try:
                w = e.window_tuples()
                break
            except RuntimeError:  # a ring changed while it was read
                continue
        else:
            w = {"R": 0, "S": 0}
        rings = getattr(e, "rings", {"R": (), "S": ()})  # a handshake chain has none
        loads = j.backend.loads()
        return manager_pb2.JoinStatus(
            join_id=join_id, tuples_in=e.stats.tuples_in, late=e.stats.late,
            batches=e.stats.batches, results=e.stats.results, window_r=w["R"], window_s=w["S"],
            subwindows_r=len(rings["R"]), subwindows_s=len(rings["S"]),
            workers_alive=len(j.backend.alive_workers()), last_batch_id=j.last_batch_id,
            memory_bytes=e.memory_bytes() if sync else sum(x.nbytes for x in loads),
            workers=loads,
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
        j = self._get(request.join_id, request.token, context)
        j.last_used = time.monotonic()
        with j.lock:
            return self._status_or_abort(request.join_id, j, context)

    def ClusterStatus(self, request, context):
        return self.cluster_status()

    def cluster_status(self) -> manager_pb2.ClusterStatusReply:
        """Every open join's counters (unsynced: a busy join is not waited for) and every
        worker's own Status, asked in parallel with a short deadline."""
        from concurrent.futures import ThreadPoolExecutor

        with self.lock:
            joins = list(self.joins.items())
        reply = manager_pb2.ClusterStatusReply(
            topology=self.topology, placement=self.placement if self.topology == "ring" else "")
        for jid, j in joins:
            reply.joins.add(status=self._status(jid, j, sync=False), settings=j.settings)
        with ThreadPoolExecutor(max_workers=min(16, len(self.workers))) as pool:
            reply.workers.extend(pool.map(self._worker_summary, self.workers))
        return reply

    def _worker_summary(self, address: str) -> manager_pb2.WorkerSummary:
        if self.topology == "handshake":  # a chain node has no worker Status
            return manager_pb2.WorkerSummary(address=address, reachable=True)
        from panjoin.proto.panjoin.v1 import worker_pb2, worker_pb2_grpc
        from panjoin.security import channel

        try:
            with channel(address, peer=True) as ch:
                st = worker_pb2_grpc.WorkerStub(ch).Status(worker_pb2.StatusRequest(),
                                                           timeout=10)
            return manager_pb2.WorkerSummary(address=address, reachable=True, status=st)
        except grpc.RpcError as e:
            return manager_pb2.WorkerSummary(address=address, reachable=False,
                                             error=f"{e.code().name}: {e.details()}")

    def Close(self, request, context):
        j = self._get(request.join_id, request.token, context)
        with j.lock:
            try:
                st = self._status_or_abort(request.join_id, j, context)
            finally:  # a status that fails (a worker lost) still closes
                self._close(request.join_id)
        return st

    # ---- resizing (issue 30; panjoin.manager.resize) ----

    def AddWorker(self, request, context):
        return self._resize(add_worker, request.address.strip(), context,
                            timeout=self.worker_timeout)

    def RemoveWorker(self, request, context):
        return self._resize(remove_worker, request.address.strip(), context)

    def _resize(self, change, address: str, context, **kw) -> manager_pb2.ResizeReply:
        if self.topology != "ring":
            context.abort(grpc.StatusCode.UNIMPLEMENTED,
                          "the handshake topology cannot resize: its chain of nodes is fixed "
                          "when a join opens; restart the manager with the new --workers")
        with self.gate.resizing():
            with self.lock:
                joins = list(self.joins.items())
            try:
                n = change(self.workers, joins, address, **kw)
            except ResizeError as e:
                context.abort(e.code, str(e))
            return manager_pb2.ResizeReply(workers=self.workers, joins=n)

    # ---- end of resizing ----

    def _close_after(self, j: _Join) -> None:
        """Close join ``j`` (its caller may hold its lock: the reentrant lock allows it)."""
        with self.lock:
            ids = [jid for jid, x in self.joins.items() if x is j]
        for jid in ids:
            self._close(jid)

    def _close(self, join_id: str) -> None:
        with self.lock:
            j = self.joins.pop(join_id, None)
        if j is not None:
            with j.lock:  # after any call in progress on the join
                j.closed = True
                j.backend.close()
                self.retired.add(j.engine, j.backend)
            if j.wake is not None:  # a streaming Join's loop ends now, not at its next look
                j.wake()
            log.info("join %s closed", join_id)


def _cancelled(context) -> bool:
    """Whether an ended call was cancelled (the client went away, or its deadline
    passed). grpc's sync server keeps this in the call's state only (``_state.client``,
    "cancelled"); where a grpc release lacks it, the idle timeout releases the join."""
    return getattr(getattr(context, "_state", None), "client", None) == "cancelled"


def ref_groups(refs, piece: int) -> list[np.ndarray]:
    """References ``(source, command, pairs)`` (results past the manager) as the
    ``(k, 3)`` int64 references of each output: about ``piece`` pairs an output, a
    reference past a piece cut where its worker cut the pairs into pieces, so that an
    output names about one piece, which its client passes on as it came, without
    joining pieces into fresh arrays (a band join's gigabytes of pairs).

    >>> [g.tolist() for g in ref_groups([(0, 5, 3), (1, 7, 9)], 4)]
    [[[0, 5, 3]], [[1, 7, 4]], [[1, 7, 4]], [[1, 7, 1]]]
    """
    groups, cur, n = [], [], 0
    for src, cid, pairs in refs:
        for a, b in piece_cuts(pairs, piece):
            k = b - a
            if cur and n + k > piece:
                groups.append(cur)
                cur, n = [], 0
            cur.append((src, cid, k))
            n += k
    groups.append(cur)
    return [np.array(g, np.int64).reshape(-1, 3) for g in groups]


def encode_output(batch_id: int, pushed: bool, r=None, s=None, rp=None, sp=None,
                  late=None, refs=None, sources=()) -> Encoded:
    """A JoinOutput written straight into protobuf's wire format (:class:`Encoded`):
    each pair's ids are copied once, into the message's bytes, where building the
    message copies them three times (to bytes, into the message, serialised) and a
    band join's manager spends its time copying pairs."""
    enc = Encoded(manager_pb2.JoinOutput).scalar("batch_id", batch_id).scalar("pushed", pushed)
    if r is not None:
        enc.array("r_id", r).array("s_id", s)
    if rp is not None or sp is not None:
        pays = manager_pb2.JoinOutput()
        to_payloads(rp, pays.r_payload)
        to_payloads(sp, pays.s_payload)
        enc.message(pays)
    if late is not None:
        enc.array("late_stream", late[0]).array("late_id", late[1])
    if refs is not None:  # results past the manager: (source, command, pairs) columns
        enc.array("ref_source", refs[0]).array("ref_command", refs[1])
        enc.array("ref_pairs", refs[2])
    if sources:
        enc.message(manager_pb2.JoinOutput(sources=sources))
    return enc


def _serialize_output(out) -> bytes:
    return out.tobytes() if isinstance(out, Encoded) else out.SerializeToString()


def add_manager(servicer, server) -> None:
    """Register ``servicer``'s rpcs (:func:`panjoin.serving.register`), with Join's
    outputs serialised by :func:`_serialize_output` (they come :class:`Encoded`)."""
    register(server, manager_pb2_grpc.add_ManagerServicer_to_server, servicer,
             {"Join": _serialize_output})


def _gone(context) -> bool:
    """Has the call's client gone: cancelled, disconnected, or past its deadline? The
    deadline counts by the server's clock: gRPC cancels the call a moment after it
    passes, and an input read in that moment is the client's no more."""
    left = context.time_remaining()
    return not context.is_active() or (left is not None and left <= 0)


def _abort_worker_error(context, e: Exception) -> None:
    """End the call with the status of a worker's (or a chain node's) error: its own
    code (RESOURCE_EXHAUSTED, DATA_LOSS, ...; :func:`status_code`; a chain's: UNAVAILABLE
    unless a node refused it, e.g. RESOURCE_EXHAUSTED at its --max-chains), and the
    first cause as the detail."""
    code = (status_code(e) if isinstance(e, WorkerError)
            else getattr(grpc.StatusCode, getattr(e, "code", ""), grpc.StatusCode.UNAVAILABLE))
    context.abort(code, str(e))


def serve_manager(workers: list[str], port: int = 0, host: str = "127.0.0.1",
                  threads: int = 1, topology: str = "ring",
                  fifo: int = 1 << 16, segment: str = "nested",
                  replicas: int = 2, max_latency_ms: float | None = None,
                  fast_forward: bool = False, worker_timeout: float = 60.0,
                  idle_timeout: float = IDLE_TIMEOUT_S,
                  max_input_tuples: int = limits.MAX_INPUT_TUPLES,
                  metrics_port: int | None = None,
                  http_port: int | None = None,
                  placement: str = "time") -> tuple[grpc.Server, int]:
    """Start the manager endpoint; returns the server and its port. ``max_latency_ms``:
    the latency bound of joins opened without one (None: such joins do not stream);
    ``idle_timeout``: close a join with no Join stream and no call for this many s;
    ``max_input_tuples``: most tuples in one JoinInput; ``metrics_port``: serve
    Prometheus metrics on ``host`` there (0: any free port; ``server.metrics_port``
    says which), None: none; ``http_port``: the live status page likewise
    (:mod:`panjoin.ops.page`, ``server.http_port``)."""
    servicer = ManagerServicer(workers, threads, topology, fifo, segment, replicas,
                               max_latency_ms, fast_forward, worker_timeout, idle_timeout,
                               max_input_tuples, placement)
    server, port = start_server(
        lambda srv: add_manager(servicer, srv),
        manager_pb2.DESCRIPTOR.services_by_name["Manager"].full_name, port, host)
    server.servicer = servicer
    try:
        with_metrics(server, ManagerCollector(servicer), metrics_port, host)
        with_page(server, servicer, http_port, host)
    except BaseException:
        server.stop(None)  # e.g. a port taken: no half-started manager stays behind
        raise
    return server, port
