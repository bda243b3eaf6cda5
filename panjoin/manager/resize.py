"""Workers added and removed while joins run (the manager's AddWorker and RemoveWorker).

PanJoin places whole subwindows, so a resize needs no data to move:

- **add** W: the manager checks W (its health service must serve ``panjoin.v1.Worker``),
  then, join by join under the join's lock (no batch half sent), opens a session on W
  and widens the join's round-robin rings. The next subwindow created goes to W in its
  turn, with its backup on the worker after it. Joins opened later get W too.
- **remove** W: join by join under its lock, W is marked *retiring*: no new subwindow
  (primary or backup) goes there; its subwindows stay, get their inserts while they
  fill and answer probes until the window expires them; then the join ends its
  session on W, which frees it there. Every subwindow keeps the copies it had (with
  replicas 2, the two); new ones get their two on the remaining workers, so once W's
  last subwindow expired, every subwindow again has two copies without W. Nothing is
  copied: a failure meanwhile fails over as always (W's copies included).

Example, replicas 2, workers A B, then add C, remove A::

    #0 A(+B)  #1 B(+A)  | add C |  #2 C(+A)  #3 A(+B) | remove A | #4 B(+C)  #5 C(+B)
    ... #0, #1, #3 expire: the join's session on A ends; A holds nothing of it.

Refused: removing the manager's last worker, or one a join cannot go on without
(FAILED_PRECONDITION); an address twice (ALREADY_EXISTS) or not in the list
(NOT_FOUND); a worker that is unreachable, not a PanJoin worker, or refuses a session
(UNAVAILABLE, RESOURCE_EXHAUSTED: nothing changed); the handshake topology, whose
chain of nodes is fixed when a join opens (UNIMPLEMENTED).
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from panjoin.manager.grpc_backend import HEARTBEAT_S, WorkerError
from panjoin.proto.panjoin.v1 import worker_pb2
from panjoin.security import channel

log = logging.getLogger("panjoin.manager")

WORKER_SERVICE = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name


class ResizeError(Exception):
    """A refused resize: ``code`` (a grpc.StatusCode) and the reason, nothing changed."""

    def __init__(self, code: grpc.StatusCode, msg: str):
        super().__init__(msg)
        self.code = code


def check_worker(address: str, timeout: float = HEARTBEAT_S) -> None:
    """Raise ResizeError unless ``address`` is a serving PanJoin worker."""
    try:
        with channel(address, peer=True) as ch:
            r = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=WORKER_SERVICE), timeout=timeout)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.NOT_FOUND:
            raise ResizeError(grpc.StatusCode.FAILED_PRECONDITION,
                              f"{address} is not a PanJoin worker (it does not serve "
                              f"{WORKER_SERVICE}); start one with 'panjoin worker'") from None
        raise ResizeError(grpc.StatusCode.UNAVAILABLE,
                          f"worker {address} is unreachable ({e.code().name}: {e.details()}); "
                          "check the address, that it runs, and its TLS settings") from None
    if r.status != health_pb2.HealthCheckResponse.SERVING:
        raise ResizeError(grpc.StatusCode.UNAVAILABLE,
                          f"worker {address} is not serving yet "
                          f"({health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)}); "
                          "try again once it is")


def add_worker(workers: list[str], joins, address: str, timeout: float) -> int:
    """Add ``address`` to the manager's ``workers`` and to every open ring join of
    ``joins`` (``[(join_id, _Join)]``); returns how many joins changed. All or nothing:
    a join whose session is refused undoes the others."""
    if not address:
        raise ResizeError(grpc.StatusCode.INVALID_ARGUMENT, "give a worker address HOST:PORT")
    if address in workers:
        raise ResizeError(grpc.StatusCode.ALREADY_EXISTS,
                          f"worker {address} is in the list already: {', '.join(workers)}")
    check_worker(address)
    _fixed(joins)
    done = []
    for jid, j in joins:
        with j.lock:  # between batches: none is half sent
            if j.closed:
                continue
            try:
                j.backend.add_worker(address, timeout)
            except WorkerError as e:
                _undo(done, address)
                code = getattr(grpc.StatusCode, e.code, grpc.StatusCode.UNAVAILABLE)
                raise ResizeError(code, f"worker {address} refused a session for join {jid} "
                                        f"({e}); nothing was changed") from None
            for ring in j.engine.rings.values():  # its turn in the round robin
                ring.n_workers = j.backend.n_workers
            done.append(j)
    workers.append(address)
    log.info("worker %s added (%d open joins)", address, len(done))
    return len(done)


def _fixed(joins) -> None:
    """Refuse a resize while a join keeps a fixed set of workers (key placement)."""
    for jid, j in joins:
        why = getattr(j.backend, "fixed_workers", None)
        if why and not j.closed:
            raise ResizeError(grpc.StatusCode.FAILED_PRECONDITION,
                              f"join {jid}: {why}; close it first, nothing was changed")


def _undo(done, address: str) -> None:
    for j in done:
        with j.lock:
            j.backend.remove_worker(address)


def remove_worker(workers: list[str], joins, address: str) -> int:
    """Retire ``address`` in every open ring join (see the module docstring) and take it
    off the manager's ``workers``; returns how many joins had it."""
    if address not in workers:
        raise ResizeError(grpc.StatusCode.NOT_FOUND,
                          f"worker {address} is not in the list: {', '.join(workers)}")
    if len(workers) == 1:
        raise ResizeError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"{address} is the manager's last worker; add another first "
                          "(panjoin ctl add-worker) or close the joins")
    _fixed(joins)
    for jid, j in joins:
        with j.lock:
            if not j.closed and not j.backend.can_remove(address):
                raise ResizeError(grpc.StatusCode.FAILED_PRECONDITION,
                                  f"join {jid} has no other live worker than {address}; "
                                  "add one first (panjoin ctl add-worker)")
    n = 0
    for _, j in joins:
        with j.lock:
            if not j.closed and j.backend.remove_worker(address):
                n += 1
    workers.remove(address)
    log.info("worker %s removed: no new subwindows there; %d open joins release it as "
             "its subwindows expire", address, n)
    return n


class ResizeGate:
    """Opens and resizes exclude each other (a reader-writer lock): a join opened while
    the worker list changes would miss the change. Opens run side by side; a resize
    waits for the Opens in progress, and new Opens wait for it."""

    def __init__(self):
        self._cond = threading.Condition()
        self._opening = 0
        self._resizing = False

    @contextmanager
    def opening(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._resizing)
            self._opening += 1
        try:
            yield
        finally:
            with self._cond:
                self._opening -= 1
                self._cond.notify_all()

    @contextmanager
    def resizing(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._resizing)
            self._resizing = True  # from now on no Open starts
            self._cond.wait_for(lambda: self._opening == 0)
        try:
            yield
        finally:
            with self._cond:
                self._resizing = False
                self._cond.notify_all()
