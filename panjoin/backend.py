"""Where the manager's commands run: the paper's create / insert / probe / expire.

The manager (:class:`panjoin.manager.engine.JoinEngine`) only generates
commands; a *backend* carries them out. Every backend implements
:class:`Backend`: :class:`LocalBackend` holds the subwindows in this process
(the in-process engine, and inside each worker process one per manager
session); :class:`panjoin.manager.grpc_backend.GrpcBackend` sends the same
commands to workers. A probe is answered with ``(probe_index, stored_id,
stored_seq)`` per pair: the subwindow's holder keeps its ids
(:class:`panjoin.subwindow.store.SubwindowStore`), so the manager keeps none.

    >>> import numpy as np
    >>> b = LocalBackend()
    >>> b.create(CreateSpec(0, "R", "nested", 4, "int64", 1))
    >>> r = SortedBatch.of(1, "R", np.array([3]), np.array([0]), np.array([0]), np.array([42]),
    ...                    predicate="eq", window="count:4,4")
    >>> b.insert(0, r, 0, 1)
    >>> s = SortedBatch.of(2, "S", np.array([3]), np.array([1]), np.array([0]), np.array([7]),
    ...                    predicate="eq", window="count:4,4")
    >>> [ids.tolist() for _, ids, _ in b.probe_many([(0, False, 1)], s).result()]
    [[42]]
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple, Protocol

import numpy as np

from panjoin.key_sort_kernels import pack_rows, unpack_rows
from panjoin.semantics import (
    Predicate,
    Window,
    parse_predicate,
    parse_window,
    probe_bounds,
    residual_bounds,
    window_bounds,
)
from panjoin.subwindow import Residual, WindowFilter
from panjoin.subwindow.kernels import window as W
from panjoin.subwindow.store import SubwindowStore


class IdPairs(NamedTuple):
    """An answer already mapped to ids by the worker that probed (the probe batch's ids
    are there too), in pieces ``[(r_id, s_id)]``: the manager passes them on without
    touching them."""

    pieces: list


class PairsRef(NamedTuple):
    """An answer whose pairs went from the worker straight to the client (results past
    the manager, issue 28): ``pairs`` pairs of command ``command_id`` on result source
    ``source`` (the worker's session), which the manager's output names in their place."""

    source: int
    command_id: int
    pairs: int


#: one answer per probed subwindow: (probe_index, stored_id, stored_seq), or the pairs'
#: ids (:class:`IdPairs`) from a worker asked for them, or where they went (:class:`PairsRef`)
Answer = tuple[np.ndarray, np.ndarray, np.ndarray] | IdPairs | PairsRef


def key_order(key: np.ndarray, ts: np.ndarray, ids: np.ndarray):
    """``(order, key, ts, ids)`` in key order, ties in arrival order: ``order`` is the
    permutation that sorts the batch, the columns are gathered by it.

    int64 keys whose span leaves room for the row number below them are sorted as one
    packed int64 each (:func:`panjoin.key_sort_kernels.pack_rows`); other keys (floats,
    spans near int64's) are argsorted (stable)."""
    if key.dtype == np.int64 and key.shape[0] > 1:
        b, lo, packed = pack_rows(key)
        if b:
            packed.sort()
            return unpack_rows(packed, b, lo, ts, ids)
    order = np.argsort(key, kind="stable")
    return order, key[order], ts[order], ids[order]


@dataclass(eq=False)
class SortedBatch:
    """One collect batch of one stream in key order (step 2 of the paper): what its
    probe and its inserts carry, sent once to each worker that needs it.

    ``predicate`` and ``window`` are the join's: from them and the batch's own
    columns a holder derives each probe tuple's key intervals and window bounds
    (:meth:`probe_inputs`), so they never cross the wire. An insert takes the
    tuples of a seq range (:meth:`columns`): a batch that fills one subwindow
    and starts the next is inserted in two parts, each still in key order.

    Under key placement the manager leaves the sort to the workers: its batch is in
    arrival order (``in_key_order`` False), each worker gets its rows so
    (:func:`panjoin.codec.encode_rows`) and sorts them (:meth:`sorted_by_key`), keeping
    where each row was as sent (``sent``)."""

    batch_id: int
    stream: str
    key: np.ndarray
    ts: np.ndarray  # the stored ts column: event time, or opposite arrivals (count windows)
    seq: np.ndarray
    ids: np.ndarray
    key2: np.ndarray | None
    predicate: Predicate
    window: Window
    _inputs: tuple | None = None
    #: False: the rows are in arrival order (a key placement's batch on the manager)
    in_key_order: bool = True
    #: for a batch sorted where it arrived (:meth:`sorted_by_key`): each row's place
    #: in the batch as sent
    sent: np.ndarray | None = None
    #: what other modules derive once a batch, by their own names (the wire's bases of
    #: every worker's offsets: :func:`panjoin.codec.row_bases`)
    memo: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, batch_id: int, stream: str, key, ts, seq, ids, key2=None, *,
           predicate: str | Predicate, window: str | Window) -> SortedBatch:
        return cls(batch_id, stream, np.asarray(key), np.asarray(ts, np.int64),
                   np.asarray(seq, np.int64), np.asarray(ids, np.int64),
                   None if key2 is None else np.asarray(key2, np.float64),
                   parse_predicate(predicate), parse_window(window))

    def __len__(self) -> int:
        return int(self.key.shape[0])

    @property
    def ids_are_seq(self) -> bool:
        """The ids are the seqs, as one array (a join whose client numbers its tuples,
        ``seq_ids``): the wire carries the column once (:mod:`panjoin.codec`)."""
        return self.ids is self.seq

    def columns(self, seq_from: int | None = None, seq_to: int | None = None):
        """(key, ts, seq, ids, key2) of the tuples with ``seq_from <= seq < seq_to``
        (all of them by default), in key order."""
        cols = (self.key, self.ts, self.seq, self.ids, self.key2)
        if seq_from is None or (len(self) and seq_from <= self.seq_min
                                and seq_to > self.seq_max):
            return cols
        m = (self.seq >= seq_from) & (self.seq < seq_to)
        return tuple(c[m] if c is not None else None for c in cols)

    def rows(self, start: int, stop: int) -> SortedBatch:
        """The batch's rows ``[start, stop)`` (a key range: still in key order), views."""
        if start == 0 and stop == len(self):
            return self
        seq = self.seq[start:stop]
        return SortedBatch(self.batch_id, self.stream, self.key[start:stop],
                           self.ts[start:stop], seq,
                           seq if self.ids_are_seq else self.ids[start:stop],
                           None if self.key2 is None else self.key2[start:stop],
                           self.predicate, self.window)

    def sorted_by_key(self) -> SortedBatch:
        """This batch (in arrival order) in key order, ties in arrival order, as the
        manager's step 2 sorts (:func:`key_order`); ``sent`` keeps where each row was."""
        if self.in_key_order:
            return self
        order, key, ts, ids = key_order(self.key, self.ts, self.ids)
        return SortedBatch(self.batch_id, self.stream, key, ts,
                           ids if self.ids_are_seq else self.seq.take(order), ids,
                           None if self.key2 is None else self.key2.take(order),
                           self.predicate, self.window, sent=order)

    def known_seqs(self, first: int) -> SortedBatch:
        """Say the batch's seqs are ``first .. first + len - 1`` (a stream's arrivals are
        numbered consecutively): no pass over them for their range."""
        self.__dict__["seq_min"] = first
        self.__dict__["seq_max"] = first + len(self) - 1
        return self

    @cached_property
    def seq_min(self) -> int:
        return int(self.seq.min())

    @cached_property
    def seq_max(self) -> int:
        return int(self.seq.max())

    def probe_inputs(self) -> tuple[np.ndarray, np.ndarray, WindowFilter, Residual | None]:
        """``(lo, hi, window filter, residual)`` of this batch probing the other stream
        (computed once): the key intervals by the predicate, the window bounds per
        probe tuple (applied to the subwindows that straddle a window edge), and the
        residual's intervals on key2, if the predicate has one."""
        if self._inputs is None:
            x = self.stream
            lo, hi = probe_bounds(self.predicate, x, self.key)
            res = None
            if self.predicate.residual is not None:  # checked by the index while it probes
                res = Residual(*residual_bounds(self.predicate, x, self.key2))
            mode = W.COUNT if self.window.kind == "count" else W.TIME
            full = WindowFilter(mode, *window_bounds(self.window, x, self.ts, self.seq))
            self._inputs = (lo, hi, full, res)
        return self._inputs


@dataclass
class CreateSpec:
    """Everything a holder needs to create a subwindow."""

    sub_id: int
    stream: str
    kind: str
    capacity: int
    key_dtype: str
    partitions: int
    predecessor: int | None = None  # sub_id of the previous subwindow of the same stream
    opts: dict = field(default_factory=dict)
    worker: int = 0  # which worker holds it (round-robin over the ring); local: ignored
    splitters: np.ndarray | None = None  # RaP-Table: the predecessor's Algorithm 1 table
    backup: bool = False  # hold a log of the inserts only, until promoted
    piece: bool = False  # one key range of the subwindow (key placement): seqs with gaps


@dataclass
class BackendStats:
    creates: int = 0
    inserts: int = 0
    probes: int = 0
    expires: int = 0
    insert_s: float = 0.0
    probe_s: float = 0.0


class Answers(Protocol):
    def result(self) -> list[Answer]: ...

    def done(self) -> bool: ...


class Backend(Protocol):
    """The four commands; probes may be answered later (``result()``), the rest are
    applied in the order they are given."""

    stats: BackendStats
    want_seq: bool  # answers must carry stored seqs (the engine keeps payloads by seq)

    def create(self, spec: CreateSpec) -> None: ...

    def insert(self, sub_id: int, batch: SortedBatch, seq_from: int, seq_to: int) -> None:
        """Insert the batch's tuples with ``seq_from <= seq < seq_to``."""

    def probe_many(self, targets: list[tuple[int, bool, int]], batch: SortedBatch
                   ) -> Answers:
        """Probe subwindows of the other stream with the batch: ``targets`` =
        [(sub_id, apply the window filter, seq_limit)]."""

    def expire(self, sub_id: int) -> None: ...

    def nbytes(self) -> int: ...

    def close(self) -> None: ...


class Done:
    """Answers that are already there."""

    __slots__ = ("answers",)

    def __init__(self, answers: list[Answer]):
        self.answers = answers

    def result(self) -> list[Answer]:
        return self.answers

    def done(self) -> bool:
        return True


class LocalBackend:
    """Subwindow stores held in this process, keyed by subwindow id."""

    def __init__(self, threads: int = 1):
        self.threads = threads
        self.subs: dict[int, SubwindowStore] = {}
        self.streams: dict[int, str] = {}  # sub_id -> "R" / "S"
        self.dtypes: dict[int, str] = {}  # sub_id -> "int64" / "float64"
        self.stats = BackendStats()
        self.want_seq = True  # local answers always carry them
        #: bytes the subwindows may hold (None: unchecked); the in-process engine sets it
        #: for a time window whose size in tuples it cannot know in advance
        self.memory_limit: int | None = None

    def create(self, spec: CreateSpec) -> None:
        if spec.sub_id in self.subs:
            raise ValueError(f"subwindow {spec.sub_id} exists already")
        if self.memory_limit is not None:
            from panjoin.limits import check_engine_memory, subwindow_bytes

            check_engine_memory(self.nbytes() + subwindow_bytes(
                spec.kind, spec.capacity, spec.partitions, spec.backup), self.memory_limit,
                f"the window, with its subwindow {spec.sub_id},")
        pred = self.subs.get(spec.predecessor) if spec.predecessor is not None else None
        opts = dict(spec.opts)
        if spec.splitters is not None:
            opts["splitters"] = spec.splitters
        self.subs[spec.sub_id] = SubwindowStore(
            spec.kind, spec.capacity, spec.key_dtype, spec.partitions, threads=self.threads,
            opts=opts, predecessor=pred.index if pred is not None else None,
            backup=spec.backup, piece=spec.piece)
        self.streams[spec.sub_id] = spec.stream
        self.dtypes[spec.sub_id] = spec.key_dtype
        self.stats.creates += 1

    def key_dtype(self, sub_id: int) -> str:
        return self.dtypes[sub_id]

    def store(self, sub_id: int) -> SubwindowStore:
        try:
            return self.subs[sub_id]
        except KeyError:
            raise KeyError(f"unknown subwindow {sub_id}") from None

    def index(self, sub_id: int):
        return self.store(sub_id).index

    def insert(self, sub_id: int, batch: SortedBatch, seq_from: int, seq_to: int) -> None:
        t0 = time.perf_counter()
        lo, hi = max(seq_from, batch.seq_min), min(seq_to, batch.seq_max + 1)
        self.store(sub_id).insert(*batch.columns(seq_from, seq_to), seq_first=lo,
                                  seq_end=hi)
        self.stats.insert_s += time.perf_counter() - t0
        self.stats.inserts += 1

    def probe(self, sub_id: int, lo, hi, flt: WindowFilter, res: Residual | None = None,
              seq_limit: int | None = None) -> Answer:
        t0 = time.perf_counter()
        out = self.store(sub_id).probe(lo, hi, flt, res, seq_limit)
        self.stats.probe_s += time.perf_counter() - t0
        self.stats.probes += 1
        return out

    def probe_many(self, targets, batch: SortedBatch) -> Done:
        """Probe several subwindows with one batch: ``targets`` = [(sub_id, filtered,
        seq_limit), ...]."""
        t0 = time.perf_counter()
        lo, hi, full, res = batch.probe_inputs()
        none = WindowFilter.none(len(batch))
        self.stats.probe_s += time.perf_counter() - t0
        return Done([self.probe(sub_id, lo, hi, full if filtered else none, res, limit)
                     for sub_id, filtered, limit in targets])

    def promote(self, sub_id: int) -> None:
        self.store(sub_id).promote()

    def expire(self, sub_id: int) -> None:
        st = self.subs.pop(sub_id, None)
        for d in (self.streams, self.dtypes):
            d.pop(sub_id, None)
        if st is not None:
            st.release()
        self.stats.expires += 1

    def nbytes(self) -> int:
        return sum(st.nbytes for st in self.subs.values())

    def close(self) -> None:
        self.subs.clear()


class _Counted:
    """A null subwindow: its size, nothing else."""

    __slots__ = ("capacity", "count")
    nbytes = 0
    index = None

    def __init__(self, capacity: int):
        self.capacity, self.count = capacity, 0

    def __len__(self) -> int:
        return self.count

    def release(self) -> None:
        """Expired: holds nothing to give back (a stored subwindow's arrays go to the spares)."""

    @property
    def full(self) -> bool:
        return self.count >= self.capacity

    def successor_splitters(self):
        return None


class NullBackend(LocalBackend):
    """Holds nothing and finds nothing: every command costs its holder ~nothing, so a
    cluster of null workers measures the manager's own ceiling (``panjoin worker
    --null``, ``panjoin bench system --null-workers``)."""

    _EMPTY = np.zeros(0, np.int64)

    def create(self, spec: CreateSpec) -> None:
        if spec.sub_id in self.subs:
            raise ValueError(f"subwindow {spec.sub_id} exists already")
        self.subs[spec.sub_id] = _Counted(spec.capacity)
        self.streams[spec.sub_id] = spec.stream
        self.dtypes[spec.sub_id] = spec.key_dtype
        self.stats.creates += 1

    def insert(self, sub_id, batch, seq_from, seq_to) -> None:
        self.store(sub_id).count += len(batch.columns(seq_from, seq_to)[0])
        self.stats.inserts += 1

    def probe_many(self, targets, batch) -> Done:
        return Done([self.probe(sub_id, None, None, None, None, limit)
                     for sub_id, _, limit in targets])

    def probe(self, sub_id, lo, hi, flt, res=None, seq_limit=None) -> Answer:
        self.store(sub_id)
        self.stats.probes += 1
        return self._EMPTY, self._EMPTY, self._EMPTY

    def promote(self, sub_id: int) -> None:
        self.store(sub_id)
