"""The manager's five steps without a network: ``JoinEngine`` (PanJoin paper, section III-A).

1. Collect: one buffer per stream. A buffer is cut into a batch when it holds
   ``batch_size`` tuples, when the other stream has received ``max_lag``
   tuples since the buffer's oldest tuple arrived (so a slow stream never holds
   the fast one's subwindows back), when its oldest tuple has waited
   ``max_collect_ms`` of wall-clock time (:meth:`JoinEngine.tick`), or on flush.
   With ``max_latency_ms`` the engine picks ``batch_size`` and ``max_collect_ms``
   itself after every batch, from the measured batch costs and input rate, so that
   pairs come out within the bound (:mod:`panjoin.manager.latency`).
2. Preprocess: number the tuples (``seq`` per stream, in arrival order), mark
   late tuples (time windows), sort the batch by key, decide create/expire.
3. Send: probe every non-empty subwindow of the opposite stream whose tuples
   can still pair with the batch; insert into the newest subwindow of the
   batch's stream (creating a successor when it is full); expire whole oldest
   subwindows that no future tuple can reach.
4. Process (the backend: in-process indexes here, workers in the cluster).
5. Feedback: map stored seqs back to ids (and payloads), collect the pairs.

Steps 1-2 of the next batch overlap 4-5 of this one: a probe round comes back
as a handle whose answers are collected later (up to ``pipeline`` rounds stay
in flight, and all of them before a subwindow expires or results are taken).
The manager keeps no per-tuple state of the window: the subwindows' holders
keep key, ts, seq and id, and answer probes with ids (payloads, when a client
pushes them, are kept here by seq; a thin client keeps its own).

Why this is exact whatever the batching (DESIGN section 2): a pair (x, y) is
found once, by whichever of x and y is processed later, probing the
subwindows where the other is stored. Where a subwindow straddles a window
edge, each candidate pair is checked against per-tuple bounds (the paper's
filtering of the oldest subwindow), both for stored tuples that arrived before
the probe tuple and, since buffers are cut independently, after it:

- count windows: the index's ``ts`` column holds the number of
  opposite-stream arrivals before the tuple (``opp``); the probe tuple x of
  stream X pairs with stored y of stream Y iff ``opp_x - W_Y <= seq_y < opp_x``
  (y arrived before x, among the last W_Y) or ``seq_y >= opp_x`` and
  ``opp_y <= seq_x + W_X`` (y arrived after x, x among the last W_X);
- time windows: ``x.ts - W_Y < y.ts < x.ts + W_X``.

A subwindow of Y expires when its newest tuple is out of reach of every tuple
of X that is still buffered or yet to come.

Example, count:2,2, batch size 2, arrivals r0 s0 r1 s1 (keys all equal):
the R buffer is cut after r1: r0, r1 probe nothing (no S stored), then are
inserted; the S batch s0, s1 probes R: r0 (opp 0) / s0 (seq 0): s0 arrived
after r0 and r0 is among the last 2 R before s0 -> pair; r1 (opp 1) / s0:
s0 arrived before r1 -> pair; likewise (r0, s1), (r1, s1): four pairs.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from panjoin import jit
from panjoin.backend import (
    CreateSpec,
    IdPairs,
    LocalBackend,
    PairsRef,
    SortedBatch,
    key_order,
)
from panjoin.config import (
    DEFAULT_BATCH,
    DEFAULT_INDEX,
    INDEX_CHOICES,
    advise_heap_hugepages,
    default_threads,
    freeze_heap,
    thread_budget,
    tune_allocator,
)
from panjoin.events.arrays import PAYLOAD_TYPE
from panjoin.manager.index_choice import IndexChooser
from panjoin.manager.kernels import late_tuples, split_streams
from panjoin.manager.latency import CAP_MAX, LatencyBound
from panjoin.manager.ring import SubwindowRing
from panjoin.ops.timings import Timings
from panjoin.semantics import (
    I64_MAX,
    I64_MIN,
    Predicate,
    Window,
    parse_predicate,
    parse_window,
)

log = logging.getLogger("panjoin.manager")
_THREADS_LOGGED = False


def _log_threads(why: str) -> None:
    """Say once per process how many threads the default is and why (an engine is
    made per warm-up and per replay; the reason is the same for all)."""
    global _THREADS_LOGGED
    if not _THREADS_LOGGED:
        _THREADS_LOGGED = True
        log.info("%s (--threads overrides)", why)

STREAM_NAMES = ("R", "S")
_I64 = np.int64
#: rows a push is numbered and split in at a time: the split's 88 bytes a row (11 MiB
#: here) stay below the allocator's mmap threshold (panjoin.config.tune_allocator), so
#: each piece reuses the last one's pages; a 1M-row piece took fresh pages every push
#: (page faults, or a huge page's compaction: 22-118 ms a push against 4-5 ms)
PIECE_ROWS = 1 << 17


@dataclass
class EngineStats:
    tuples_in: int = 0
    late: int = 0
    batches: int = 0
    results: int = 0
    probes_skipped: int = 0
    probes_filtered: int = 0
    probes_unfiltered: int = 0
    preprocess_s: float = 0.0
    map_s: float = 0.0
    # per stream (R, S): tuples pushed and late ones (the metrics, panjoin.ops.metrics)
    tuples_by: dict = field(default_factory=lambda: {"R": 0, "S": 0})
    late_by: dict = field(default_factory=lambda: {"R": 0, "S": 0})
    #: subwindows created per index kind (``--index auto`` may mix them)
    index_by: Counter = field(default_factory=Counter)
    #: wall time of each batch's steps 2-3 (and of collecting the rounds beyond the
    #: pipeline), and each pair's latency: its round collected minus the arrival of the
    #: oldest tuple of the probing batch (an upper bound: the later tuple of a pair is
    #: the probing one, and it arrived at or after the batch's oldest)
    batch_s: Timings = field(default_factory=Timings)
    latency_s: Timings = field(default_factory=Timings)


def default_subwindow_size(window: Window, latency_bound: bool = False) -> int:
    """NSub when none is given: a quarter of the count window (at least 1), else 64K.
    Under a latency bound, half the count window: small batches probe every subwindow
    at random places, so fewer, larger ones cost less (1.1-1.3x at NBat 1K-4K, W 256K
    and 1M; benchmarks/RESULTS.md, issue 27), while large batches scan them whole."""
    if window.kind == "count":
        return max(1, math.ceil(max(window.r, window.s) / (2 if latency_bound else 4)))
    return 1 << 16


def default_partitions(subwindow_size: int, index: str = "bisort") -> int:
    """P when none is given: about 128 tuples per partition (the paper: 8M / 64K), but 8
    for BI-Sort, whose P is only its index array's length (one key per partition):
    at step 8 a dense probe scans the index and then one 8-row partition, with
    predictable branches (bisort's ``locate_dense``; 14 ns a probe tuple at NSub 1M,
    NBat 64K, against 24 at step 128), for one more byte per tuple."""
    if index == "bisort":
        return int(min(1 << 20, max(1, subwindow_size // 8)))
    return int(min(1 << 16, max(1, subwindow_size // 128)))


class _Buffer:
    """The collect buffer of one stream (step 1): runs of rows in arrival order, each a
    range ``[lo, hi)`` of one pushed piece's columns for this stream. A cut of the other
    stream appends the rows before it, so a batch is built from many appends: the run
    grows while they continue each other, and :meth:`take` hands out views of it."""

    __slots__ = ("runs", "n", "first_opp", "min_ts", "track_ts")

    def __init__(self, track_ts: bool = True):
        self.track_ts = track_ts  # min_ts is read by time windows' expiry only
        #: [cols, lo, hi]: cols = (key, ts, seq, id, opp, payload or None, key2 or None)
        self.runs: list[list] = []
        self.n = 0
        self.first_opp = -1
        self.min_ts = I64_MAX

    def append(self, cols: tuple, lo: int, hi: int) -> None:
        if hi <= lo:
            return
        if self.n == 0:
            self.first_opp = int(cols[4][lo])
        last = self.runs[-1] if self.runs else None
        if last is not None and last[0] is cols and last[2] == lo:
            last[2] = hi
        else:
            self.runs.append([cols, lo, hi])
        self.n += hi - lo
        if self.track_ts:
            self.min_ts = min(self.min_ts, int(cols[1][lo:hi].min()))

    def take(self):
        """(key, ts, seq, id, opp, payload or None, key2 or None), all in arrival order."""
        parts = [tuple(None if c is None else c.slice(lo, hi - lo) if isinstance(c, pa.Array)
                       else c[lo:hi] for c in cols) for cols, lo, hi in self.runs]
        if len(parts) == 1:  # one run of one piece: views, nothing to copy
            out = parts[0]
        else:
            out = tuple(c[0] if c[0] is None else pa.concat_arrays(c)
                        if isinstance(c[0], pa.Array) else np.concatenate(c)
                        for c in zip(*parts, strict=True))
        self.__init__(self.track_ts)
        return out


def as_payload(payload, n: int) -> pa.Array | None:
    """A payload column as one large_binary Arrow array of ``n`` rows (None stays None)."""
    if payload is None:
        return None
    if isinstance(payload, pa.ChunkedArray):
        payload = payload.combine_chunks()
    if not isinstance(payload, pa.Array):
        payload = pa.array(payload)
    if len(payload) != n:
        raise ValueError(f"payload has {len(payload)} rows for {n} tuples")
    if not (pa.types.is_binary(payload.type) or pa.types.is_string(payload.type)
            or pa.types.is_large_binary(payload.type) or pa.types.is_large_string(payload.type)):
        raise TypeError(f"payload must be strings or bytes, not {payload.type}")
    return payload.cast(PAYLOAD_TYPE)


@dataclass
class _InFlight:
    """A probe round sent but not yet collected, with what step 5 needs to map it."""

    answers: object  # has .result() -> [(probe_idx, stored_id, stored_seq)] per target
    x: str
    #: the probe batch's ids in key order; None where the workers send the pairs to the
    #: client themselves (nothing to map here, and the batch's arrays are let go)
    ids: np.ndarray | None
    payload: pa.Array | None  # the probe batch's payloads in arrival order
    #: key order -> arrival order (payloads are gathered once, per pair); None: the
    #: batch is in arrival order (its workers sort it)
    order: np.ndarray | None
    stores: list  # per target: (seq_start, payloads in seq order or None)
    #: under a latency bound, (when the batch's processing began, its tuples, the
    #: engine's own seconds on it): the round is the batch's end when its answers come
    #: later (workers), see JoinEngine._process
    timed: tuple[float, int, float] | None = None
    #: time.monotonic() when the probing batch's oldest tuple arrived (pair latency)
    since: float | None = None


class JoinEngine:
    """A sliding-window join over two streams, driven like the PanJoin manager.

    >>> import numpy as np
    >>> eng = JoinEngine("count:2,2", "eq", index="nested", batch_size=2)
    >>> eng.push_arrays(np.array([0, 1, 0, 1], np.uint8), np.arange(4), np.full(4, 7),
    ...                 np.arange(4))
    >>> eng.flush(); len(eng.take_results()[0])
    4
    """

    def __init__(
        self,
        window: str | Window,
        predicate: str | Predicate,
        index: str = DEFAULT_INDEX,
        *,
        allowed_lateness: int = 0,
        key_dtype: str | None = None,
        subwindow_size: int | None = None,
        partitions: int | None = None,
        batch_size: int | None = None,
        max_lag: int | None = None,
        max_collect_ms: float | None = None,
        max_latency_ms: float | None = None,
        threads: int | None = None,
        backend=None,
        n_workers: int = 1,
        index_opts: dict | None = None,
        pipeline: int = 8,
        memory_limit: int | None = None,
        window_tuples: int | None = None,
        seq_ids: bool = False,
    ):
        self.window = parse_window(window, allowed_lateness) if isinstance(window, str) else window
        if seq_ids and self.window.kind != "count":
            raise ValueError("seq_ids needs a count window: a time window's late tuples "
                             "get no seq, so a client could not number its tuples")
        #: the tuples' ids are their seqs (OpenRequest.seq_ids): pushes carry no ids
        self.seq_ids = seq_ids
        self.pred = parse_predicate(predicate)
        if index not in INDEX_CHOICES:
            raise ValueError(f"unknown index {index!r}; choose one of {', '.join(INDEX_CHOICES)}")
        if index == "hash":
            from panjoin.subwindow.hash_table import warn_predicate
            warn_predicate(self.pred, key_dtype)
        self.index = index
        self.key_dtype = np.dtype(key_dtype) if key_dtype else None
        # auto: each new subwindow's index from what the engine observes
        self.chooser = None
        self._choice = None  # the last auto choice (logged when it changes)
        self._pairs_seen = 0  # results when auto last looked
        self.partitions_given = partitions
        self.nsub = int(subwindow_size or default_subwindow_size(
            self.window, latency_bound=max_latency_ms is not None))
        if self.nsub <= 0:
            raise ValueError(f"subwindow size must be positive, got {self.nsub}")
        if index == "auto":
            self.chooser = IndexChooser(self.pred, self.nsub, bounded=max_latency_ms is not None)
        self.partitions = int(partitions or default_partitions(
            self.nsub, "bisort" if index == "auto" else index))
        if batch_size is not None and batch_size <= 0:
            raise ValueError(f"batch size must be positive, got {batch_size}")
        # with a latency bound the engine sizes its batches itself (panjoin.manager.latency):
        # a given batch size is then only the largest it may pick
        # on workers (which report their busy time) the engine's busy time leaves out the
        # wire and the other processes on the hosts: less of it is safe to use
        self.bound = LatencyBound(max_latency_ms, remote=hasattr(backend, "busiest_worker_s")) \
            if max_latency_ms is not None else None
        self.batch_limit = int(batch_size or (CAP_MAX if self.bound else DEFAULT_BATCH))
        self.batch_size = self.batch_limit
        self.fixed_lag = max_lag
        self.max_lag = int(max_lag or self.batch_size)
        self.max_collect_ms = max_collect_ms
        if self.bound is not None:
            self._resize()
            freeze_heap()  # no full collection over startup's objects mid-stream
        if threads:
            self.threads = threads
        else:
            self.threads, why = thread_budget()
            _log_threads(why)
        tune_allocator()
        advise_heap_hugepages()
        jit.set_threads(self.threads)
        self.backend = backend if backend is not None else LocalBackend(self.threads)
        self.index_opts = dict(index_opts or {})
        if backend is None:  # workers check their own budgets
            self._check_memory(memory_limit, window_tuples)
        self.rings = {s: SubwindowRing(s, self.nsub, n_workers, first_worker=i)
                      for i, s in enumerate(STREAM_NAMES)}
        self.buffers = {s: _Buffer(track_ts=self.window.kind == "time") for s in STREAM_NAMES}
        self.buf_since = {s: None for s in STREAM_NAMES}  # wall clock of the oldest buffered
        self.total = {s: 0 for s in STREAM_NAMES}  # tuples stored so far = next seq
        self.maxts: int | None = None  # largest ts pushed (decides lateness)
        self.seen_maxts: int | None = None  # largest ts appended to a buffer (the watermark)
        # the client's watermark W (push_arrays(watermark=...)); once given, it alone
        # decides lateness and expiry: None = never given, I64_MIN = none yet (-inf)
        self.client_wm: int | None = None
        self.late_ids: dict[str, list[np.ndarray]] = {s: [] for s in STREAM_NAMES}
        self._results: list[tuple] = []  # (r_id, s_id, r_payload, s_payload)
        self._inflight: deque[_InFlight] = deque()
        self.pipeline = max(0, int(pipeline))  # probe rounds left in flight
        self._rounds = 0  # probe rounds sent so far
        self._last_round: _InFlight | None = None
        self._collected = 0  # of which collected
        #: (sub_id, rounds sent before it expired): expires that wait for those rounds
        self._expiring: deque[tuple[int, int]] = deque()
        self.with_payload: bool | None = None  # decided by the first push
        self.payload_text: bool | None = None  # strings in, strings out
        self._next_sub = 0
        self.stats = EngineStats()

    def _check_memory(self, limit: int | None, window_tuples: int | None) -> None:
        """Refuse, before anything is stored, a window whose subwindows will not fit in
        ``limit`` bytes (default: :func:`panjoin.limits.default_memory_limit`, which
        follows the cgroup's memory limit); without ``window_tuples`` (the most tuples
        the window will hold per stream: a replay knows it from its file) the window is
        checked at each new subwindow instead."""
        from panjoin.limits import check_engine_memory, default_memory_limit, engine_bytes

        limit = int(limit) if limit else default_memory_limit()
        need = engine_bytes(self.window, self.nsub, self.partitions, self.index, window_tuples)
        if need is None:
            self.backend.memory_limit = limit
            return
        check_engine_memory(need, limit, f"window {self.window} ({self.index}, NSub {self.nsub})")

    # ------------------------------------------------------------------ step 1: collect

    def push(self, events) -> None:
        """Push an arrival-ordered :class:`panjoin.events.EventTable` (or anything with
        ``stream``, ``id``, ``key``, ``ts`` arrays, and optionally ``payload``)."""
        self.push_arrays(events.stream, events.id, events.key, events.ts,
                         getattr(events, "payload", None), getattr(events, "key2", None))

    def push_arrays(self, stream, ids, keys, ts, payload=None, key2=None, *,
                    watermark: int | None = None) -> None:
        """Push tuples in arrival order; ``stream`` holds 0 for R and 1 for S.

        ``watermark`` (time windows) is the client's event-time watermark W, as in
        Flink: a pushed tuple is late iff ``ts < W - L``, and subwindows expire once no
        tuple at or above ``W - L`` can reach them. The Kafka pipeline takes W as the
        least, over its input partitions, of the largest ts read from each (DESIGN,
        addendum). A join given one watermark keeps that rule for good (a later push
        without one keeps the last W); without any, a tuple is late iff it is more than
        L behind the largest ts pushed before it.

        ``ids`` is None for a join with ``seq_ids``: each tuple's id is then its seq (its
        arrival number in its stream, from 0), and so are the pairs' ids. ``ts`` may be
        None for a count window, which never reads it.

        ``payload`` (strings or bytes, one per tuple) is kept by the manager and joined
        back onto the results (:meth:`take_results` with ``payloads=True``); a join has
        payloads on every push or on none. ``key2`` (float64, one per tuple) is needed
        iff the predicate has a residual condition (e.g. ``band:10&band2:10``); the
        workers keep it beside their subwindows and check the residual while probing."""
        t0 = time.perf_counter()
        stream = np.asarray(stream, dtype=np.uint8)
        keys = np.asarray(keys)
        n = stream.shape[0]
        if self.seq_ids:
            if ids is not None and len(ids):
                raise ValueError("this join numbers its tuples (seq_ids): each tuple's id is "
                                 "its seq; push no ids")
            ids = None
        elif ids is None:
            raise ValueError("push an id per tuple (only a join opened with seq_ids takes none)")
        else:
            ids = np.asarray(ids, dtype=_I64)
        if self.window.kind == "count":
            ts = None  # a count window never reads ts (nor keeps it)
        elif ts is None:
            raise ValueError("a time window needs a ts per tuple")
        else:
            ts = np.asarray(ts, dtype=_I64)
        if not all(c.shape == (n,) for c in (keys, ids, ts) if c is not None):
            raise ValueError("stream, id, key and ts must be 1-d arrays of one length")
        if self.pred.residual is not None:
            if key2 is None:
                raise ValueError(f"predicate {self.pred} has a residual on key2: push key2 "
                                 "(EventTable.key2, a float64 per tuple)")
            key2 = np.asarray(key2, dtype=np.float64)
            if key2.shape != (n,):
                raise ValueError("key2 must be a 1-d array with one value per tuple")
            if not np.isfinite(key2).all():
                raise ValueError("key2 values must be finite numbers")
        else:
            key2 = None  # no residual: the join never looks at key2
        if n == 0:
            return
        if payload is not None and self.payload_text is None:
            t = payload.type
            self.payload_text = pa.types.is_string(t) or pa.types.is_large_string(t)
        payload = as_payload(payload, n)
        if self.with_payload is None:
            self.with_payload = payload is not None
            if self.with_payload:  # payloads are kept here by seq: answers must carry it
                self.backend.want_seq = True
        elif self.with_payload != (payload is not None):
            raise ValueError("this join's pushes " + ("carry" if self.with_payload else "lack")
                             + " payloads; push every batch with a payload or none")
        if self.key_dtype is None:
            if keys.dtype not in (np.int64, np.float64):
                raise TypeError(f"keys must be int64 or float64, got {keys.dtype}")
            self.key_dtype = keys.dtype
        elif keys.dtype != self.key_dtype:
            raise TypeError(f"keys are {keys.dtype} but this join's keys are {self.key_dtype}")
        if np.any(stream > 1):
            raise ValueError("stream must be 0 (R) or 1 (S)")
        if watermark is not None:
            if self.window.kind != "time":
                raise ValueError("a watermark applies to time windows only")
            if self.client_wm is None and self.maxts is not None:
                raise ValueError("this join's lateness is already decided by the largest ts "
                                 "pushed; give a watermark from its first push on")
            self.client_wm = max(int(watermark), self.client_wm if self.client_wm is not None
                                 else I64_MIN)
        self.stats.tuples_in += n
        n_s = int(np.count_nonzero(stream))
        self.stats.tuples_by["S"] += n_s
        self.stats.tuples_by["R"] += n - n_s
        if self.bound is not None:
            if self.bound.observe_input(n, time.monotonic()):
                # input after a pause: the deadline the last batch left (a backlog's: the
                # whole bound) would hold back its first batch
                self._resize()

        keep = None  # None: every tuple is on time
        if self.client_wm is not None:
            low = self.client_wm - self.window.lateness
            if low > I64_MIN:  # an int64 compare: W = -inf (none yet) makes nothing late
                keep = ts >= low
        elif self.window.kind == "time":
            # late iff ts < (largest ts of all earlier arrivals) - L, in arrival order
            late, n_late, self.maxts = late_tuples(ts, self.maxts, self.window.lateness)
            keep = ~late if n_late else None
        if keep is not None and not keep.all():
            for x, name in enumerate(STREAM_NAMES):
                lm = ~keep & (stream == x)
                if lm.any():
                    self.late_ids[name].append(ids[lm])
                    self.stats.late += int(lm.sum())
                    self.stats.late_by[name] += int(lm.sum())
            stream, ids, keys, ts = stream[keep], ids[keep], keys[keep], ts[keep]
            if key2 is not None:
                key2 = key2[keep]
            if payload is not None:
                payload = payload.filter(pa.array(keep))
        self.stats.preprocess_s += time.perf_counter() - t0
        k = stream.shape[0]
        for a in range(0, k, PIECE_ROWS):
            b = min(k, a + PIECE_ROWS)
            self._push_piece(stream[a:b], keys[a:b], None if ts is None else ts[a:b],
                             None if ids is None else ids[a:b],
                             payload.slice(a, b - a) if payload is not None else None,
                             key2[a:b] if key2 is not None else None)
        if self.bound is not None:
            self.tick()  # a deadline may have passed while this chunk was cut

    def _push_piece(self, stream, keys, ts, ids, payload, key2) -> None:
        """Step 1 for rows on time, in arrival order: numbered, gathered per stream, and
        cut into batches as they fill (or wait too long for the other stream)."""
        t0 = time.perf_counter()
        k = stream.shape[0]
        # each stream's tuples gathered once, numbered (seq, opp; see split_streams); a
        # cut appends a contiguous slice of them (views)
        sk, st, sseq, sid, sopp, n_r, n_s, c_r = split_streams(
            stream, keys, ts, ids, self.total["R"], self.total["S"])
        cnt = {"R": c_r, "S": np.arange(1, k + 1, dtype=_I64) - c_r}  # arrivals up to each row
        split = {}
        for x, (name, n_x) in enumerate((("R", n_r), ("S", n_s))):
            idx = np.flatnonzero(stream == x) if payload is not None or key2 is not None \
                else None
            # ts only where a time window reads it; ids None where they are the seqs
            split[name] = (sk[x, :n_x], st[x, :n_x] if ts is not None else None,
                           sseq[x, :n_x], sid[x, :n_x] if sid is not None else None,
                           sopp[x, :n_x],
                           payload.take(pa.array(idx)) if payload is not None else None,
                           key2[idx] if key2 is not None else None)
        # the watermark only moves time windows' expiry: the largest ts appended so far
        cols = (split, cnt, ts if self.window.kind == "time" else None)
        self.stats.preprocess_s += time.perf_counter() - t0

        pos = 0
        while pos < k:
            # the earliest cut event of either buffer within [pos, k)
            best_e, best_x = k, None
            for name in STREAM_NAMES:
                e = self._next_cut(name, pos, k, cnt, split[name][4])
                if e < best_e:
                    best_e, best_x = e, name
            if best_x is None:
                self._append(pos, k, cols)
                break
            self._append(pos, best_e + 1, cols)
            self._process(best_x)
            pos = best_e + 1
        # cuts that became due exactly at the piece's end
        for name in STREAM_NAMES:
            if self.buffers[name].n >= self.batch_size or self._lag_due(name):
                self._process(name)

    def _lag_due(self, name: str) -> bool:
        b = self.buffers[name]
        o = "S" if name == "R" else "R"
        # total[] counts every numbered tuple, buffered or stored
        return b.n > 0 and self.total[o] - b.first_opp >= self.max_lag

    def _next_cut(self, name, pos, k, cnt, opps) -> int:
        """Chunk index of the tuple whose arrival cuts ``name``'s buffer (k if none);
        ``opps``: the opp column of the chunk's ``name`` tuples."""
        b = self.buffers[name]
        o = "S" if name == "R" else "R"
        c = cnt[name]
        before = int(c[pos - 1]) if pos > 0 else 0
        need = self.batch_size - b.n
        e = k
        if need <= 0 or self._lag_due(name):
            return pos - 1 if pos > 0 else 0
        i = int(np.searchsorted(c, before + need, side="left"))
        if i < k:
            e = i
        # lag: the other stream reaches first_opp + max_lag arrivals
        if b.n > 0:
            first_opp = b.first_opp
        else:
            if before >= int(c[-1]):  # no tuple of this stream left in the chunk
                return e
            first_opp = int(opps[before])
        o_base = self.total[o] - (int(cnt[o][pos - 1]) if pos > 0 else 0)
        target = first_opp + self.max_lag - o_base  # count of o within the chunk
        j = int(np.searchsorted(cnt[o], target, side="left"))
        if j < k:
            e = min(e, max(j, pos))
        return e

    def _append(self, a, b, cols) -> None:
        """Append chunk rows [a, b) to the buffers: per stream, one contiguous slice of
        its gathered columns."""
        if b <= a:
            return
        split, cnt, ts = cols
        # the watermark moves with the tuples appended so far, not the whole chunk (the
        # appends of a chunk cover it in order, so each takes the max of its own rows)
        if ts is not None:
            top = int(ts[a:b].max())
            self.seen_maxts = top if self.seen_maxts is None else max(self.seen_maxts, top)
        for name in STREAM_NAMES:
            c = cnt[name]
            lo, hi = (int(c[a - 1]) if a > 0 else 0), int(c[b - 1])
            if hi <= lo:
                continue
            if self.buffers[name].n == 0:
                self.buf_since[name] = time.monotonic()
            self.buffers[name].append(split[name], lo, hi)
            self.total[name] += hi - lo

    def tick(self, now: float | None = None) -> None:
        """Cut buffers whose oldest tuple has waited ``max_collect_ms`` (wall clock)."""
        if self.max_collect_ms is None:
            return
        now = time.monotonic() if now is None else now
        for name in STREAM_NAMES:
            since = self.buf_since[name]
            if self.buffers[name].n and since is not None and \
                    (now - since) * 1000.0 >= self.max_collect_ms:
                self._process(name)

    def next_tick(self) -> float | None:
        """When (``time.monotonic()``) :meth:`tick` will next cut a buffer; None when
        nothing is buffered or there is no collect deadline. A caller that ticks the
        engine in a loop sleeps until then (or until input or answers arrive)."""
        if self.max_collect_ms is None:
            return None
        due = [since + self.max_collect_ms / 1000.0 for name, since in self.buf_since.items()
               if since is not None and self.buffers[name].n]
        return min(due, default=None)

    def flush(self) -> None:
        """Process whatever is buffered (end of input)."""
        for name in STREAM_NAMES:
            if self.buffers[name].n:
                self._process(name)

    # ------------------------------------------------------------------ steps 2-5

    def _resize(self) -> None:
        """Batch size cap and collect deadline from the latency bound's measurements."""
        self.batch_size = min(self.batch_limit, self.bound.batch_cap())
        self.max_lag = int(self.fixed_lag or self.batch_size)
        self.max_collect_ms = self.bound.deadline_ms()

    def _process(self, x: str) -> None:
        if self.buffers[x].n == 0:
            return
        t_batch = time.perf_counter()
        n_batch = self.buffers[x].n
        rounds = self._rounds
        since = self.buf_since[x]
        self._process_batch(x, since)
        busy = time.perf_counter() - t_batch
        self.stats.batch_s.observe(busy)
        if self.bound is not None:
            # this batch's round (counted, not found by the deque's length: the batch may
            # also have collected older rounds, or its own if it was answered meanwhile)
            f = self._last_round if self._rounds > rounds else None
            if f is not None and not f.answers.done():
                # the workers still probe it: the batch ends when its round is answered
                # (the wire and the workers' time are part of what the bound must hold,
                # but not of the engine's busy time: the next batches go on meanwhile)
                f.timed = (t_batch, n_batch, busy)
            else:
                self._observe(t_batch, n_batch)

    def _observe(self, t_batch: float, n_batch: int, busy: float | None = None) -> None:
        self.bound.observe_batch(n_batch, time.perf_counter() - t_batch, busy)
        self._resize()

    def _process_batch(self, x: str, since: float | None = None) -> None:
        key, ev, seq, ids, opp, pay, key2 = self.buffers[x].take()
        if ids is None:  # seq_ids: the ids are the seqs (the same array: not sent twice)
            ids = seq
        self.buf_since[x] = None
        if self.chooser is not None:  # what --index auto decides from
            fill = 1.0
            if self.window.kind == "count":
                other = "S" if x == "R" else "R"
                fill = min(1.0, self.total[other] / max(1, self.window.size(other)))
            self.chooser.observe_batch(key.shape[0], self.stats.results - self._pairs_seen,
                                       key, fill, x)
            self._pairs_seen = self.stats.results
        self.stats.batches += 1
        y = "S" if x == "R" else "R"
        tscol = opp if self.window.kind == "count" else ev
        # step 2: one sort serves probe and insert (ties in arrival order, see key_order);
        # each column is gathered into key order once, for both. A backend whose
        # workers sort their own rows (key placement) gets the batch in arrival order.
        t0 = time.perf_counter()
        n = seq.shape[0]
        # a stream's arrivals are numbered consecutively, so a batch's seqs are seq[0] + row
        consecutive = n and int(seq[-1]) - int(seq[0]) == n - 1
        if getattr(self.backend, "sorts_on_workers", False):
            order = None
            batch = SortedBatch(self.stats.batches, x, key, tscol, seq, ids, key2, self.pred,
                                self.window, in_key_order=False)
        else:
            order, skey, sts, sids = key_order(key, tscol, ids)
            if ids is seq:
                sseq = sids  # seq_ids: one column, gathered once
            else:
                sseq = seq[0] + order if consecutive else seq[order]
            batch = SortedBatch(self.stats.batches, x, skey, sts, sseq, sids,
                                key2[order] if key2 is not None else None, self.pred,
                                self.window)
        if consecutive:
            batch.known_seqs(int(seq[0]))
        self.stats.preprocess_s += time.perf_counter() - t0
        self._probe(x, y, batch, tscol, pay, order, since)
        self._insert(x, batch, seq, tscol, pay)
        self._expire(y)
        self._expire(x)
        while len(self._inflight) > self.pipeline:
            self._collect_one()

    def _probe(self, x, y, batch: SortedBatch, tscol, pay, order, since=None) -> None:
        ring = self.rings[y]
        if not any(s.count for s in ring):
            return
        wy, wx = self.window.size(y), self.window.size(x)
        # tscol is non-decreasing in arrival order for count windows (opposite arrivals)
        if self.window.kind == "count":
            bo_min, bo_max = int(tscol[0]), int(tscol[-1])
        else:
            bmin, bmax = int(tscol.min()), int(tscol.max())
        targets = []
        for sub in list(ring):
            if sub.count == 0:
                continue
            if self.window.kind == "count":
                smin, smax = sub.seq_start, sub.seq_end - 1
                if smax < bo_min - wy:
                    self.stats.probes_skipped += 1
                    continue
                filtered = not (smax < bo_min and smin >= bo_max - wy)
            else:
                if sub.ts_max <= bmin - wy or sub.ts_min >= bmax + wx:
                    self.stats.probes_skipped += 1
                    continue
                filtered = not (sub.ts_min > bmax - wy and sub.ts_max < bmin + wx)
            if filtered:
                self.stats.probes_filtered += 1
            else:  # wholly inside every probe tuple's window
                self.stats.probes_unfiltered += 1
            targets.append((sub, filtered))
        if not targets:
            return
        # one round of probes over every worker at once (steps 3 and 4 of the paper);
        # its answers are mapped in step 5, once collected
        # each probe sees the subwindow as it is now (seq < seq_end), even if replayed later
        answers = self.backend.probe_many([(sub.sub_id, filtered, sub.seq_end)
                                           for sub, filtered in targets], batch)
        stores = [(sub.seq_start, sub.payloads() if self.with_payload else None)
                  for sub, _ in targets]
        ids = None if getattr(self.backend, "direct", False) else batch.ids
        self._last_round = _InFlight(answers, x, ids, pay, order, stores, since=since)
        self._inflight.append(self._last_round)
        self._rounds += 1

    def _collect_one(self) -> None:
        """Step 5 for the oldest probe round in flight: stored seqs -> ids and payloads."""
        f = self._inflight.popleft()
        answers = f.answers.result()
        self._collected += 1
        while self._expiring and self._expiring[0][1] <= self._collected:
            self.backend.expire(self._expiring.popleft()[0])
        if f.timed is not None and self.bound is not None:
            t_batch, n_batch, busy = f.timed
            busiest = getattr(self.backend, "busiest_worker_s", None)
            if busiest is not None:  # the workers keep up too: their time is busy time
                busy = max(busy, busiest())
            self._observe(t_batch, n_batch, busy)
        t1 = time.perf_counter()
        before = self.stats.results
        for (start, pays), ans in zip(f.stores, answers, strict=True):
            if isinstance(ans, PairsRef):  # sent to the client by the worker: named here
                ans = [ans]
            if isinstance(ans, list):  # references: one, or a key placement's one a worker
                for ref in ans:
                    if ref.pairs:
                        self._results.append(ref)
                        self.stats.results += ref.pairs
                continue
            if isinstance(ans, IdPairs):  # mapped on the worker: passed on as they are
                for r, s in ans.pieces:
                    if r.size:
                        self._results.append((r, s, None, None))
                        self.stats.results += int(r.size)
                continue
            pidx, ys, sseq = ans
            if pidx.size == 0:
                continue
            xs = f.ids.take(pidx)  # take: a third faster than indexing with an array
            xp = yp = None
            if f.payload is not None:
                xp = f.payload.take(pa.array(pidx if f.order is None else f.order[pidx]))
                yp = pays.take(pa.array(sseq - start))
            self._results.append((xs, ys, xp, yp) if f.x == "R" else (ys, xs, yp, xp))
            self.stats.results += int(pidx.size)
        self.stats.map_s += time.perf_counter() - t1
        if f.since is not None and self.stats.results > before:
            self.stats.latency_s.observe(time.monotonic() - f.since,
                                         self.stats.results - before)

    def collect(self) -> None:
        """Collect every probe round in flight (step 5 for all of them)."""
        while self._inflight:
            self._collect_one()

    @property
    def pending_expires(self) -> int:
        """Expired subwindows the workers still hold for probe rounds in flight."""
        return len(self._expiring)

    def settle(self) -> None:
        """Collect the probe rounds already answered (their pairs wait for
        :meth:`take_results`): the expires they held back go out."""
        while self._inflight and self._inflight[0].answers.done():
            self._collect_one()

    def _insert(self, x, batch: SortedBatch, seq, tscol, pay) -> None:
        ring = self.rings[x]
        n = len(batch)
        a = 0
        while a < n:
            sub = ring.newest
            if sub is None or sub.room <= 0:
                pred = sub.sub_id if sub is not None else None
                sub = ring.new_subwindow(self._next_sub)
                self._next_sub += 1
                sub.index, parts = self._index_for(sub)
                self.backend.create(CreateSpec(
                    sub.sub_id, x, sub.index, self.nsub, str(self.key_dtype), parts,
                    predecessor=pred, opts=self.index_opts, worker=sub.worker))
            b = min(n, a + sub.room)
            # split by arrival, so each subwindow keeps a contiguous seq range (seq is in
            # arrival order here); each part keeps the batch's key order
            self.backend.insert(sub.sub_id, batch, int(seq[a]), int(seq[b - 1]) + 1)
            sub.add(seq[a:b], tscol[a:b], pay.slice(a, b - a) if pay is not None else None,
                    ts_sorted=self.window.kind == "count")
            a = b

    def _index_for(self, sub) -> tuple[str, int]:
        """The index kind and P of a new subwindow: the join's, or auto's choice now."""
        if self.chooser is None:
            kind = self.index
        else:
            c = self.chooser.choose(self.batch_size)
            if self._choice is None or c.kind != self._choice.kind:
                log.info("index auto: subwindow %d (%s) on: %s, as %s", sub.sub_id,
                         sub.stream, c.kind, c.why)
                self._choice = c
            kind = c.kind
        self.stats.index_by[kind] += 1
        if kind == self.index or self.partitions_given:
            return kind, self.partitions
        return kind, int(default_partitions(self.nsub, kind))

    def _expire(self, y: str) -> None:
        """Expire oldest subwindows of ``y`` that no buffered or future tuple can reach."""
        ring = self.rings[y]
        x = "S" if y == "R" else "R"
        buf = self.buffers[x]
        wy = self.window.size(y)
        while ring.oldest is not None:
            sub = ring.oldest
            if self.window.kind == "count":
                reach = (buf.first_opp if buf.n else self.total[y]) - wy
                dead = sub.seq_end <= reach
            else:
                if self.client_wm is not None:  # no tuple below W - L is to come
                    low = self.client_wm - self.window.lateness
                elif self.seen_maxts is None:
                    return
                else:
                    low = self.seen_maxts - self.window.lateness
                if buf.n:
                    low = min(low, buf.min_ts)
                dead = sub.ts_max <= low - wy and sub.count > 0
            if not dead:
                return
            # probes in flight may still need the subwindow: it expires once the rounds
            # sent so far are collected. Answers already there are collected now (in
            # process, all of them: the subwindow goes at once); the workers' answers
            # are not waited for, so their pipeline does not drain at every expiry
            self.settle()
            if self._inflight:
                self._expiring.append((sub.sub_id, self._rounds))
            else:
                self.backend.expire(sub.sub_id)
            ring.pop_oldest()

    # ------------------------------------------------------------------ results and status

    def take_results(self, payloads: bool = False, wait: bool = True):
        """The (r_id, s_id) pairs produced since the last call; with ``payloads=True``
        (r_id, s_id, r_payload, s_payload), the payloads as Arrow arrays (large_string
        when strings were pushed, else large_binary; None when the join has none).
        ``wait=False`` takes only the probe rounds already answered and leaves the
        rest in flight, so the workers stay busy while the caller ships the results."""
        res = self.take_result_pieces(payloads, wait)
        if any(isinstance(t, PairsRef) for t in res):
            raise RuntimeError("this join's pairs went to its client (results past the "
                               "manager): take_result_pieces has their references")
        r = np.concatenate([t[0] for t in res]) if res else np.zeros(0, _I64)
        s = np.concatenate([t[1] for t in res]) if res else np.zeros(0, _I64)
        if not payloads:
            return r, s
        if not self.with_payload:
            return r, s, None, None
        rp = pa.concat_arrays([t[2] for t in res]) if res else self._no_payloads()
        sp = pa.concat_arrays([t[3] for t in res]) if res else self._no_payloads()
        return r, s, rp, sp

    def take_result_pieces(self, payloads: bool = False, wait: bool = True) -> list[tuple]:
        """:meth:`take_results` as the pieces the probes answered, ``[(r_id, s_id,
        r_payload, s_payload)]`` (payloads None without ``payloads`` or without payloads
        in the join), not joined into one array: a caller that ships them in messages of
        its own size copies each pair once (a band join's millions of pairs in one fresh
        array cost more in page faults than in copying). A join whose backend sends the
        pairs to the client (``GrpcBackend(direct=True)``) has :class:`PairsRef` pieces
        instead, in order."""
        if wait:
            self.collect()
        else:
            self.settle()
        res, self._results = self._results, []
        if not (payloads and self.with_payload):
            return [t if isinstance(t, PairsRef) else (t[0], t[1], None, None) for t in res]
        if self.payload_text:
            return [(r, s, rp.cast(pa.large_string()), sp.cast(pa.large_string()))
                    for r, s, rp, sp in res]
        return res

    def _no_payloads(self) -> pa.Array:
        return pa.array([], pa.large_string() if self.payload_text else PAYLOAD_TYPE)

    def take_late(self) -> dict[str, np.ndarray]:
        out = {k: (np.concatenate(v) if v else np.zeros(0, _I64)) for k, v in self.late_ids.items()}
        self.late_ids = {s: [] for s in STREAM_NAMES}
        return out

    def window_tuples(self) -> dict[str, int]:
        return {s: self.rings[s].tuples() for s in STREAM_NAMES}

    def memory_bytes(self) -> int:
        """Bytes held by the subwindow stores (indexes and ids) plus the payloads kept here."""
        pays = sum(sub.payload_bytes for ring in self.rings.values() for sub in ring)
        return int(self.backend.nbytes() + pays)

    def status(self) -> dict:
        return {
            "tuples_in": self.stats.tuples_in,
            "late": self.stats.late,
            "batches": self.stats.batches,
            "results": self.stats.results,
            "subwindows": {s: len(self.rings[s]) for s in STREAM_NAMES},
            "window_tuples": self.window_tuples(),
            "buffered": {s: self.buffers[s].n for s in STREAM_NAMES},
            "probes_in_flight": len(self._inflight),
        }


def warm_up_manager() -> None:
    """The manager's own kernels (step 1's split, step 2's sort and gathers, for int and
    float keys, count and time windows) loaded before its first join: loaded there, a
    fresh manager's first join paid for them (0.3 s of a 4.9 s join at a quarter core,
    ``benchmarks/scale_out.py``). Over a :class:`~panjoin.backend.NullBackend`, so no
    index kernel is loaded that only workers need."""
    from panjoin import codec
    from panjoin.backend import NullBackend
    from panjoin.generate import warm_up_events
    from panjoin.manager.key_placement import route_batch

    events = warm_up_events(4_000, 1 << 12, rate=1000)
    fkeys = events.key.astype(np.float64) + 0.5
    for window, seq_ids in (("count:1K,1K", False), ("count:1K,1K", True),
                            ("time:500,500", False)):
        for keys in (events.key, fkeys):
            eng = JoinEngine(window, "band:3", index="nested", batch_size=512,
                             subwindow_size=256, backend=NullBackend(), seq_ids=seq_ids)
            eng.push_arrays(events.stream, None if seq_ids else events.id, keys, events.ts)
            eng.flush()
            eng.take_results()
    # key placement's routing and its workers' rows (panjoin.manager.key_placement)
    for keys in (events.key, fkeys):
        for pred in ("eq", "band:3"):
            p = parse_predicate(pred)
            rows, _ = route_batch(keys, keys[:1].copy(), p, "R")
            batch = SortedBatch(1, "R", keys, events.ts, np.arange(keys.size), events.id,
                                None, p, parse_window("time:500,500"), in_key_order=False)
            codec.encode_rows(batch, rows[0])


def warm_up(index: str = DEFAULT_INDEX, backend=None, n_workers: int = 1) -> None:
    """A small join (in this process, or over ``backend``'s workers), so that the index
    kernels are compiled, or loaded from Numba's disk cache, before anything is timed;
    in this process once with one thread and once with the default, as a probe on one
    thread runs other kernels than a parallel one (BI-Sort's ``probe_pairs``)."""
    from panjoin.generate import warm_up_events

    events = warm_up_events(20_000, 1 << 20)
    # auto picks hash or BI-Sort per subwindow: load both
    for k, kind in enumerate(("bisort", "hash") if index == "auto" else (index,)):
        for threads in ((None,) if backend is not None else sorted({1, default_threads()})):
            # BI-Sort merges big runs on threads (merge_plan, merge_piece) from 64K rows
            # on: merge even this small join's runs so, or the first big merge loads them
            # mid-join
            opts = {"par_merge_min": 2} if kind == "bisort" else None
            eng = JoinEngine("count:4096,4096", "eq" if kind == "hash" else "band:10",
                             index=kind, batch_size=1024, subwindow_size=2048,
                             backend=backend, n_workers=n_workers, threads=threads,
                             index_opts=opts)
            # joins over one backend share its sessions: their subwindow ids must differ
            eng._next_sub = k << 20
            eng.push(events)
            eng.flush()
            eng.take_results()
