"""Where the manager's commands run: the paper's create / insert / probe / expire.

The manager (:class:`panjoin.manager.engine.JoinEngine`) only generates
commands; a *backend* carries them out. :class:`LocalBackend` holds the
subwindow indexes in this process (the in-process engine, the tests' and
benchmarks' baseline); the cluster's gRPC backend sends the same commands to
worker processes. Both answer a probe with ``(probe_index, stored_seq)`` pairs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from panjoin.subwindow import Residual, SubwindowIndex, WindowFilter, make_index


@dataclass
class CreateSpec:
    """Everything a worker needs to create a subwindow."""

    sub_id: int
    stream: str
    kind: str
    capacity: int
    key_dtype: str
    partitions: int
    predecessor: int | None = None  # sub_id of the previous subwindow of the same stream
    opts: dict = field(default_factory=dict)
    worker: int = 0  # which worker holds it (round-robin over the ring); local: ignored


@dataclass
class BackendStats:
    creates: int = 0
    inserts: int = 0
    probes: int = 0
    expires: int = 0
    insert_s: float = 0.0
    probe_s: float = 0.0


class LocalBackend:
    """Subwindow indexes held in this process, keyed by subwindow id."""

    def __init__(self, threads: int = 1):
        self.threads = threads
        self.subs: dict[int, SubwindowIndex] = {}
        self.streams: dict[int, str] = {}  # sub_id -> "R" / "S"
        self.stats = BackendStats()

    def create(self, spec: CreateSpec) -> None:
        if spec.sub_id in self.subs:
            raise ValueError(f"subwindow {spec.sub_id} exists already")
        pred = self.subs.get(spec.predecessor) if spec.predecessor is not None else None
        self.subs[spec.sub_id] = make_index(
            spec.kind, spec.capacity, key_dtype=spec.key_dtype, partitions=spec.partitions,
            threads=self.threads, predecessor=pred, **spec.opts,
        )
        self.streams[spec.sub_id] = spec.stream
        self.stats.creates += 1

    def _get(self, sub_id: int) -> SubwindowIndex:
        try:
            return self.subs[sub_id]
        except KeyError:
            raise KeyError(f"unknown subwindow {sub_id}") from None

    def insert(self, sub_id: int, keys: np.ndarray, ts: np.ndarray, seq: np.ndarray,
               key2: np.ndarray | None = None) -> None:
        t0 = time.perf_counter()
        self._get(sub_id).insert(keys, ts, seq, key2)
        self.stats.insert_s += time.perf_counter() - t0
        self.stats.inserts += 1

    def probe(self, sub_id: int, lo: np.ndarray, hi: np.ndarray, flt: WindowFilter,
              res: Residual | None = None) -> tuple[np.ndarray, np.ndarray]:
        t0 = time.perf_counter()
        out = self._get(sub_id).probe(lo, hi, flt, res)
        self.stats.probe_s += time.perf_counter() - t0
        self.stats.probes += 1
        return out

    def probe_many(self, targets, lo, hi, res: Residual | None = None
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Probe several subwindows with one batch: ``targets`` = [(sub_id, filter), ...];
        ``res``: the batch's residual intervals on key2, if the predicate has one."""
        return [self.probe(sub_id, lo, hi, flt, res) for sub_id, flt in targets]

    def expire(self, sub_id: int) -> None:
        self.subs.pop(sub_id, None)
        self.streams.pop(sub_id, None)
        self.stats.expires += 1

    def index(self, sub_id: int) -> SubwindowIndex:
        return self._get(sub_id)

    def nbytes(self) -> int:
        return sum(ix.nbytes for ix in self.subs.values())

    def close(self) -> None:
        self.subs.clear()
