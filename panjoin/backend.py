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
    >>> from panjoin.subwindow import WindowFilter
    >>> b = LocalBackend()
    >>> b.create(CreateSpec(0, "R", "nested", 4, "int64", 1))
    >>> b.insert(0, np.array([3]), np.array([0]), np.array([0]), np.array([42]))
    >>> [ids.tolist() for _, ids, _ in b.probe_many(
    ...     [(0, WindowFilter.none(1), 1)], np.array([[3]]), np.array([[3]])).result()]
    [[42]]
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from panjoin.subwindow import Residual, WindowFilter
from panjoin.subwindow.store import SubwindowStore

#: one answer per probed subwindow: (probe_index, stored_id, stored_seq)
Answer = tuple[np.ndarray, np.ndarray, np.ndarray]


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

    def insert(self, sub_id: int, keys: np.ndarray, ts: np.ndarray, seq: np.ndarray,
               ids: np.ndarray, key2: np.ndarray | None = None) -> None: ...

    def probe_many(self, targets: list[tuple[int, WindowFilter, int]], lo: np.ndarray,
                   hi: np.ndarray, res: Residual | None = None) -> Answers: ...

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

    def create(self, spec: CreateSpec) -> None:
        if spec.sub_id in self.subs:
            raise ValueError(f"subwindow {spec.sub_id} exists already")
        pred = self.subs.get(spec.predecessor) if spec.predecessor is not None else None
        opts = dict(spec.opts)
        if spec.splitters is not None:
            opts["splitters"] = spec.splitters
        self.subs[spec.sub_id] = SubwindowStore(
            spec.kind, spec.capacity, spec.key_dtype, spec.partitions, threads=self.threads,
            opts=opts, predecessor=pred.index if pred is not None else None,
            backup=spec.backup)
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

    def insert(self, sub_id, keys, ts, seq, ids, key2=None) -> None:
        t0 = time.perf_counter()
        self.store(sub_id).insert(keys, ts, seq, ids, key2)
        self.stats.insert_s += time.perf_counter() - t0
        self.stats.inserts += 1

    def probe(self, sub_id: int, lo, hi, flt: WindowFilter, res: Residual | None = None,
              seq_limit: int | None = None) -> Answer:
        t0 = time.perf_counter()
        out = self.store(sub_id).probe(lo, hi, flt, res, seq_limit)
        self.stats.probe_s += time.perf_counter() - t0
        self.stats.probes += 1
        return out

    def probe_many(self, targets, lo, hi, res: Residual | None = None) -> Done:
        """Probe several subwindows with one batch: ``targets`` = [(sub_id, filter,
        seq_limit), ...]; ``res``: the batch's residual intervals on key2, if any."""
        return Done([self.probe(sub_id, lo, hi, flt, res, limit)
                     for sub_id, flt, limit in targets])

    def promote(self, sub_id: int) -> None:
        self.store(sub_id).promote()

    def expire(self, sub_id: int) -> None:
        for d in (self.subs, self.streams, self.dtypes):
            d.pop(sub_id, None)
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

    def insert(self, sub_id, keys, ts, seq, ids, key2=None) -> None:
        self.store(sub_id).count += int(keys.size)
        self.stats.inserts += 1

    def probe(self, sub_id, lo, hi, flt, res=None, seq_limit=None) -> Answer:
        self.store(sub_id)
        self.stats.probes += 1
        return self._EMPTY, self._EMPTY, self._EMPTY

    def promote(self, sub_id: int) -> None:
        self.store(sub_id)
