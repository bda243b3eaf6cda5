"""Key placement: every subwindow cut by key over all the workers (``--placement key``).

The ring places whole subwindows on workers (time placement): a batch probes every
subwindow of the other stream, so it goes to every worker that holds one (2-4 of
them at 4 workers), and while the window fills only the workers that hold its first
subwindows work. Key placement cuts each subwindow into one *piece* per worker by key,
as the paper's partitions cut a subwindow by splitters: worker k holds the keys in
``[b_k-1, b_k)`` of every subwindow (``b`` the quantiles of the first batch's keys, as
:func:`panjoin.sharding.boundaries` draws them for a sharded join, kept distinct:
:func:`piece_boundaries`). A batch, in arrival order (the manager does not sort
it), is routed by the same keys in kernel passes (:func:`route_batch`): worker k gets
its rows once, in arrival order, sorts them by key itself, inserts those of its key
range and probes its pieces of every subwindow of the other stream with those whose
key interval meets its range (a band reaches over the edges:
:func:`panjoin.semantics.probe_bounds`). A pair ``(r, s)`` is found on the one worker
holding the stored tuple's key, so none is lost or found twice, and a tuple crosses
the wire about once, whatever the number of workers::

    boundaries [5] (worker 0: keys < 5), band:1, a batch of keys [6, 1, 9, 4]
    inserts: worker 0 the rows of keys [1, 4], worker 1 those of [6, 9]
    probes:  worker 0 [1, 4], worker 1 [6, 9, 4] (4 probes [3, 5], which reaches 5)

The manager's step 2 is then a routing pass and a gather a worker (no sort, no gather
into key order), and the workers sort a batch's pieces side by side.

Subwindows keep their seq ranges and life cycle (the engine cannot tell); a piece's
seqs have gaps (:class:`panjoin.subwindow.store.SubwindowStore`, ``piece``). The
placement keeps one copy (a lost worker ends the join), a fixed set of workers (no
AddWorker / RemoveWorker) and answers with pairs (not BI-Sort ranges); a worker
reserves memory for a piece as for its whole subwindow (with skewed keys one piece
may hold all of it), so a worker's --memory-limit admits fewer subwindows. Boundaries
from the first batch suit keys whose distribution does not drift; keys that grow
steadily end up on the last worker (still exact, no longer parallel).

    >>> import numpy as np
    >>> from panjoin.semantics import parse_predicate
    >>> rows, own = route_batch(np.array([6, 1, 9, 4]), np.array([5]),
    ...                         parse_predicate("band:1"), "S")
    >>> [r.tolist() for r in rows], own  # worker 1 sorts [6, 9, 4]: inserts [4, 6, 9][1:3]
    ([[1, 3], [0, 2, 3]], [(0, 2), (1, 3)])
"""

from __future__ import annotations

import numpy as np

from panjoin import codec
from panjoin.backend import CreateSpec, IdPairs, PairsRef, SortedBatch
from panjoin.manager.grpc_backend import (
    GrpcBackend,
    ProbeRound,
    WorkerError,
    _check,
    _Down,
)
from panjoin.proto.panjoin.v1 import worker_pb2
from panjoin.semantics import Predicate, probe_bounds, stored_bands
from panjoin.sharding import SAMPLE, boundaries

PLACEMENTS = ("time", "key")


def piece_boundaries(keys: np.ndarray, k: int) -> np.ndarray:
    """The ``k - 1`` workers' boundaries: the k-quantiles of the keys
    (:func:`panjoin.sharding.boundaries`), moved up to the next distinct key where a
    hot key repeats one, so no worker's range is empty while distinct keys are left.

        >>> piece_boundaries(np.array([0] * 90 + [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), 3).tolist()
        [1, 2]
    """
    b = boundaries(keys, k)
    # distinct keys of the same sample the quantiles come from (a unique pass over a
    # whole first batch of 256K keys cost 25-50 ms of the manager's time), by a sort:
    # numpy 2.4's np.unique imported numpy.ma at its first call (50 ms more)
    distinct = np.sort(keys[::max(1, keys.size // SAMPLE)])
    if distinct.size:
        distinct = distinct[np.concatenate(([True], distinct[1:] != distinct[:-1]))]
    at = np.searchsorted(distinct, b, side="left")
    for j in range(1, at.size):  # strictly increasing, past the least key
        at[j] = max(at[j], at[j - 1] + 1)
    if at.size:
        at = np.maximum(at, np.arange(1, at.size + 1))
    return distinct[np.minimum(at, distinct.size - 1)] if distinct.size else b


def route_batch(keys: np.ndarray, bounds: np.ndarray, pred: Predicate, stream: str):
    """``(rows, own)`` of a batch in arrival order: per worker the positions of its rows
    (ascending: still in arrival order), and the range of them it inserts once it has
    sorted them by key (``(below, upto)``: its rows below its key range, which only
    probe, come first). A row goes to the worker that owns its key and to every worker
    its probe intervals reach, in kernel passes (:mod:`panjoin.sharding_kernels`); an
    equi join's rows to their owner alone."""
    from panjoin.sharding_kernels import route_eq_rows, route_rows

    keys = np.ascontiguousarray(keys)
    n = keys.shape[0]
    pred = pred.primary
    keep = np.zeros(n, bool)  # no late rows here: the engine dropped them in step 1
    if not pred.negated and stored_bands(pred, stream) == [(0, 0)]:
        # (its stream argument is not read: both streams route alike)
        rows = list(route_eq_rows(np.zeros(n, np.uint8), keys, keep, bounds))
        return rows, [(0, int(r.size)) for r in rows]
    lo, hi = probe_bounds(pred, stream, keys)
    # the owner's own key as one more interval: it inserts the row even where no band
    # holds the key itself (bands:2,5 probes keys 2-5 away only)
    lo, hi = np.vstack([lo, keys[None, :]]), np.vstack([hi, keys[None, :]])
    rows = list(route_rows(np.ones(n, np.uint8), keys, keep, bounds, lo, hi))
    own = []
    for w, r in enumerate(rows):
        k = keys.take(r)
        below = int(np.count_nonzero(k < bounds[w - 1])) if w else 0
        upto = int(np.count_nonzero(k < bounds[w])) if w < bounds.size else int(k.size)
        own.append((below, upto))
    return rows, own


class KeyRound(ProbeRound):
    """A probe round over key pieces: every worker's answer to every target, merged per
    target (a worker's probe indexes, of its rows as sent, mapped to the batch's). With
    the pairs sent to the client by the workers it keeps nothing of the batch (there is
    no failover to send it again): its columns are let go once sent, and the heap
    serves their memory to the next batches (eight rounds in flight held 64 MB)."""

    def __init__(self, backend, targets, batch: SortedBatch, parts):
        super().__init__(backend, targets, None if backend.direct else batch, parts)

    def result(self):
        if self._out is None:
            merged: list = [[] for _ in self.targets]
            for idxs, call, rows in self.parts:
                try:
                    fb = _check(call)
                except _Down as e:
                    raise self.backend.lost(e) from None
                except WorkerError as e:
                    raise self.backend.first_error(e) from None
                results = iter(fb.results)
                for i in idxs:
                    r = next(results)
                    if self.backend.direct:
                        merged[i].append(PairsRef(call.session.source, fb.command_id, r.pairs))
                    else:
                        merged[i].append((rows, self.backend._answer(
                            r, self.targets[i][1], self.batch, results)))
            self._out = [self._merge(m) for m in merged]
            self.backend.rounds_in_flight -= 1
        return self._out

    def _merge(self, answers: list):
        if self.backend.direct:
            return answers  # references, one per worker (the engine names each)
        if answers and isinstance(answers[0][1], IdPairs):
            return IdPairs([p for _, a in answers for p in a.pieces])
        if not answers:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        # a worker's probe indexes count its rows as sent: ``rows`` holds their places
        pidx = np.concatenate([rows.take(a[0]) for rows, a in answers])
        seqs = [a[2] for _, a in answers]  # None: not asked for, or no pair there
        seq = None if all(q is None for q in seqs) else np.concatenate(
            [np.zeros(0, np.int64) if q is None else q for q in seqs])
        return pidx, np.concatenate([a[1] for _, a in answers]), seq

    def done(self) -> bool:
        if self._out is None:
            self.backend.flush()
        return self._out is not None or all(c.done.is_set() for _, c, _ in self.parts)


class KeyPlacedBackend(GrpcBackend):
    """Subwindows cut by key over ``addresses`` (see the module doc): one piece of each
    on every worker, one copy."""

    def __init__(self, addresses: list[str], deadline: float = 60.0,
                 result_format: str = "pairs", replicas: int = 1, direct: bool = False):
        if result_format != "pairs":
            raise ValueError("key placement answers with pairs: BI-Sort ranges need the "
                             "whole subwindow on one worker (drop --result-format ranges)")
        if replicas != 1:
            raise ValueError("key placement keeps one copy of each piece: give --replicas 1 "
                             "(or --placement time for primary/backup failover)")
        super().__init__(addresses, deadline, "pairs", 1, direct)
        self.bounds: np.ndarray | None = None  # the workers' key boundaries (first batch)
        self.capacity: dict[int, int] = {}  # sub_id -> its NSub
        self._first: dict[int, int] = {}  # sub_id -> its first seq (its first insert's)
        self._last_cut: tuple[SortedBatch, tuple] | None = None

    #: the engine hands this backend its batches in arrival order: each worker sorts
    #: its own rows (the manager neither sorts nor gathers a batch in key order)
    sorts_on_workers = True

    def _cut(self, batch: SortedBatch) -> tuple[list, list]:
        """:func:`route_batch` of the batch (once: its insert and probe share it)."""
        if batch.in_key_order:
            raise ValueError("key placement routes a batch in arrival order: its workers "
                             "sort their rows (the engine sends it so: sorts_on_workers)")
        if self._last_cut is None or self._last_cut[0] is not batch:
            if self.bounds is None:
                self.bounds = piece_boundaries(batch.key, self.n_workers)
            self._last_cut = (batch, route_batch(batch.key, self.bounds, batch.predicate,
                                                 batch.stream))
        return self._last_cut[1]

    def lost(self, e: Exception) -> WorkerError:
        return WorkerError(f"{e}: under key placement every worker holds a piece of every "
                           "subwindow and there is no other copy, so the join cannot go on "
                           "exactly; restart it (from the source), or run it with "
                           "--placement time --replicas 2 to survive a worker's loss",
                           "DATA_LOSS")

    def _failover(self, dead: int) -> None:
        if self.closed:
            raise WorkerError("the join was closed", "CANCELLED")
        s = self.sessions[dead]
        s.down(s.why or "declared dead")
        raise self.lost(RuntimeError(f"worker {s.address}: {s.why}"))

    #: why AddWorker and RemoveWorker refuse while such a join is open (manager.resize)
    fixed_workers = ("under key placement it keeps the workers it started with (each holds "
                     "a key range of every subwindow)")

    def add_worker(self, address: str, timeout: float) -> None:
        raise WorkerError(f"a join {self.fixed_workers}", "FAILED_PRECONDITION")

    def can_remove(self, address: str) -> bool:
        return False

    def remove_worker(self, address: str) -> bool:
        raise WorkerError(f"a join {self.fixed_workers}", "FAILED_PRECONDITION")

    def _every(self, sub_id: int, kind: str, msg) -> None:
        order = next(self.order)
        for w, s in enumerate(self.sessions):
            try:
                self.unchecked.append((sub_id, s.send(order, kind, msg)))
            except _Down:
                self._failover(w)

    def create(self, spec: CreateSpec) -> None:
        # each worker's RaP-Table piece takes its partition table from its own
        # predecessor piece (the worker holds both); none crosses the wire
        spec.splitters = None
        spec.piece = True
        self.capacity[spec.sub_id] = spec.capacity
        self.where[spec.sub_id] = 0
        self.kinds[spec.sub_id] = spec.kind
        self._every(spec.sub_id, "create", codec.encode_create(spec))
        self.stats.creates += 1

    def _send_rows(self, w: int, batch: SortedBatch, rows: np.ndarray, order: int) -> None:
        """Worker ``w``'s ``rows`` of ``batch``, once (its insert and probe name them)."""
        s = self.sessions[w]
        if s.batch_id == batch.batch_id:
            return
        msg = codec.encode_rows(batch, rows).message(
            worker_pb2.Batch(release_below=batch.batch_id))
        try:
            self.unchecked.append((-1, s.send(order, "batch", msg)))
        except _Down:
            self._failover(w)
        s.batch_id = batch.batch_id

    def insert(self, sub_id: int, batch: SortedBatch, seq_from: int, seq_to: int) -> None:
        order = next(self.order)
        rows, own = self._cut(batch)
        # the insert that completes the subwindow seals every piece (a piece's count
        # never reaches the capacity that makes a whole BI-Sort subwindow merge its
        # insertion buffer, which every later probe would search)
        first = self._first.setdefault(sub_id, seq_from)
        seal = seq_to - first >= self.capacity[sub_id]
        for w, (a, b) in enumerate(own):
            if a == b:
                if seal:
                    self._send_insert(w, worker_pb2.Insert(sub_id=sub_id, seal=True), order)
                continue
            self._send_rows(w, batch, rows[w], order)
            self._send_insert(w, worker_pb2.Insert(
                sub_id=sub_id, batch_id=batch.batch_id, seq_from=seq_from, seq_to=seq_to,
                row_from=a, row_to=b, seal=seal), order)
        self.flush()
        self._collect()
        self.stats.inserts += 1

    def _send_insert(self, w: int, msg, order: int) -> None:
        try:
            self.unchecked.append((msg.sub_id, self.sessions[w].send(order, "insert", msg)))
        except _Down:
            self._failover(w)

    def probe_many(self, targets, batch: SortedBatch) -> KeyRound:
        self._collect()
        order = next(self.order)
        rows_of, _ = self._cut(batch)
        idxs = list(range(len(targets)))
        parts: list = []
        fmt = (worker_pb2.RESULT_FORMAT_DIRECT if self.direct else
               worker_pb2.RESULT_FORMAT_PAIRS if self.want_seq else
               worker_pb2.RESULT_FORMAT_ID_PAIRS)
        for w, rows in enumerate(rows_of):
            if not targets or rows.size == 0:
                continue
            self._send_rows(w, batch, rows, order)
            msg = worker_pb2.Probe(batch_id=batch.batch_id, want_seq=self.want_seq,
                                   sub_ids=[t[0] for t in targets],
                                   filtered=[bool(t[1]) for t in targets],
                                   seq_limit=[int(t[2]) for t in targets], format=fmt)
            try:
                parts.append((idxs, self.sessions[w].send(order, "probe", msg), rows))
            except _Down:
                self._failover(w)
        self.stats.probes += len(targets)
        self.rounds_in_flight += 1
        return KeyRound(self, targets, batch, parts)

    def expire(self, sub_id: int) -> None:
        if sub_id in self.where:
            self._every(sub_id, "expire", worker_pb2.Expire(sub_id=sub_id))
        for d in (self.where, self.kinds, self.sizes, self.capacity, self._first):
            d.pop(sub_id, None)
        self.stats.expires += 1
