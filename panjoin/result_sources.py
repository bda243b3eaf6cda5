"""Results past the manager, the client's half: the pairs taken from the workers.

A join opened with ``direct_results`` (and granted it: ``OpenReply.direct_results``)
has each worker send its probes' pairs straight to the client, on a ``Worker.Results``
stream per worker session (a *source*); the manager's outputs carry references
instead of pairs, ``(source, command, pairs)`` in order: the output's pairs are
``pairs`` pairs of that probe command's, taken from that source's stream where the
last reference to the command stopped. So each pair crosses the wire once, and the
manager, whose CPU a result-heavy join spent on relaying pairs, sees only counts
(issue 28; the worker's half is :mod:`workers.results`).

:class:`ResultSources` subscribes to the sources (a reader thread each keeps their
pieces by command) and :meth:`ResultSources.take` resolves an output's references::

    rs = ResultSources(security)
    rs.add(reply.sources)                 # before any input: the workers hold the pairs
    r_id, s_id = rs.take(src, cmd, n)     # one output's references -> its pairs
    rs.close()

A source whose stream ends before the pairs a reference names arrived (its worker
lost) fails the take with :class:`ResultsLost`: those pairs cannot come another way.
A reader :data:`READ_AHEAD_BYTES` ahead of the references waits while references are
taken (so a client slower than its workers does not hold gigabytes) and reads on once
none is taken for :data:`HOLD_S` (the references may wait for a probe round that waits
for this worker's pairs).
"""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np

from panjoin.wire import int_column

#: seconds a reference's pairs may take to arrive (they are on their way when the
#: manager names them: the worker answered the probe once it had queued them)
TAKE_TIMEOUT_S = 300.0
#: seconds a worker has to accept a subscription
SUBSCRIBE_TIMEOUT_S = 30.0
#: bytes of pairs read ahead of the manager's references, a source: past them its
#: reader waits (gRPC's flow control then holds the worker, whose channel holds its
#: probes), unless a reference waits for its pairs; without a bound a client slower
#: than its workers held gigabytes (band S = 64: 3.4 GB at four quarter-core workers)
READ_AHEAD_BYTES = 256 << 20
#: seconds a reader held back at :data:`READ_AHEAD_BYTES` waits with no reference taken
#: before it reads on (:meth:`ResultSources._hold`)
HOLD_S = 1.0


class ResultsLost(RuntimeError):
    """A source ended (its worker lost, or the stream refused) before the pairs a
    reference names came: the join cannot be exact any more."""


class _Source:
    def __init__(self, address: str):
        self.address = address
        self.channel = None
        self.call = None
        self.pieces: dict[int, deque] = {}  # command id -> [(r_id, s_id)] in order
        self.nbytes = 0  # of the pieces held
        self.wanted = False  # a reference waits for pairs of this source
        self.read_on = -1  # ResultSources._taken when it last gave up being held back
        self.ended = False
        self.why = ""
        self.reader: threading.Thread | None = None


class ResultSources:
    def __init__(self, security=None):
        self.security = security
        self._cond = threading.Condition()
        self._sources: dict[int, _Source] = {}
        self._closed = False
        self._taken = 0  # references resolved: a held-back reader waits while it grows

    def add(self, sources, timeout: float = SUBSCRIBE_TIMEOUT_S) -> None:
        """Subscribe to ``sources`` (``manager_pb2.ResultSource``s) not known yet; raises
        the worker's grpc.RpcError if one refuses (or is unreachable)."""
        import grpc

        from panjoin.proto.panjoin.v1 import worker_pb2, worker_pb2_grpc
        from panjoin.security import channel

        for src in sources:
            if src.source in self._sources:
                continue
            s = _Source(src.address)
            s.channel = channel(src.address, self.security, peer=True)
            s.call = worker_pb2_grpc.WorkerStub(s.channel).Results(
                worker_pb2.ResultsRequest(token=src.token))
            with self._cond:
                self._sources[src.source] = s
            try:
                # the worker accepts at once (its initial metadata) or refuses: the
                # wait has a bound of its own (a worker whose threads are all taken)
                done = threading.Event()
                threading.Thread(target=lambda c=s.call, d=done: (c.initial_metadata(), d.set()),
                                 daemon=True).start()
                if not done.wait(timeout):
                    raise TimeoutError(f"worker {src.address} did not accept the results "
                                       f"subscription within {timeout:g} s")
                if s.call.done() and s.call.code() != grpc.StatusCode.OK:
                    raise s.call  # refused: the RpcError says why
            except BaseException:
                self._end(s, "not subscribed")
                raise
            s.reader = threading.Thread(target=self._read, args=(s,), daemon=True,
                                        name=f"results-{src.address}")
            s.reader.start()

    def _read(self, s: _Source) -> None:
        import grpc

        why = "the worker ended the stream (its session ended)"
        try:
            for piece in s.call:
                r = int_column(piece.r_id, piece.r_base, "r_id")  # maybe narrowed
                x = int_column(piece.s_id, piece.s_base, "s_id")
                with self._cond:
                    s.pieces.setdefault(piece.command_id, deque()).append((r, x))
                    s.nbytes += r.nbytes + x.nbytes
                    self._cond.notify_all()
                    self._hold(s)
        except grpc.RpcError as e:
            why = f"{e.code().name}: {e.details()}"
        self._end(s, why)

    def _hold(self, s: _Source) -> None:
        """Hold ``s``'s reader (the caller holds the lock) while it is
        :data:`READ_AHEAD_BYTES` ahead of the references and they are being taken; once
        none is taken for :data:`HOLD_S` it reads on: the references it waits for may be
        behind a probe round that waits for this very worker's pairs (a round's pairs
        beyond the bound: the manager answers an input once its rounds are in)."""
        taken, since = self._taken, time.monotonic()
        if s.read_on == taken:  # it gave up waiting, and nothing was taken since
            return
        while s.nbytes > READ_AHEAD_BYTES and not s.wanted and not self._closed:
            self._cond.wait(HOLD_S / 4)
            if self._taken != taken:
                taken, since = self._taken, time.monotonic()
            elif time.monotonic() - since > HOLD_S:
                s.read_on = taken  # until a reference is taken again
                return

    def _end(self, s: _Source, why: str) -> None:
        with self._cond:
            if not s.ended:
                s.ended, s.why = True, why
            self._cond.notify_all()

    def take(self, sources, commands, pairs, timeout: float = TAKE_TIMEOUT_S
             ) -> tuple[np.ndarray, np.ndarray]:
        """The pairs that references ``(sources[k], commands[k], pairs[k])`` name, in
        order, as ``(r_id, s_id)``."""
        rs, xs = [], []
        with self._cond:
            for src, cid, n in zip(sources.tolist(), commands.tolist(), pairs.tolist(),
                                   strict=True):
                s = self._sources.get(src)
                if s is None:
                    raise ResultsLost(f"the manager named result source {src}, which it "
                                      "never announced")
                while n > 0:
                    q = s.pieces.get(cid)
                    if q:
                        r, x = q[0]
                        k = min(n, r.size)
                        rs.append(r[:k])
                        xs.append(x[:k])
                        if k == r.size:
                            q.popleft()
                            if not q:
                                del s.pieces[cid]
                        else:
                            q[0] = (r[k:], x[k:])
                        s.nbytes -= 16 * k
                        n -= k
                        continue
                    if s.ended:
                        raise ResultsLost(
                            f"the pairs of worker {s.address} (command {cid}, {n} pairs "
                            f"still to come) cannot arrive: its result stream ended ({s.why})")
                    s.wanted = True  # its reader reads on, whatever it holds
                    self._cond.notify_all()
                    got = self._cond.wait(timeout)
                    s.wanted = False
                    if not got:
                        raise ResultsLost(f"no pairs from worker {s.address} for {timeout:g} "
                                          f"s (command {cid}, {n} pairs still to come)")
            self._taken += 1
            self._cond.notify_all()  # pairs taken: readers held back may read on
        if not rs:
            z = np.zeros(0, np.int64)
            return z, z
        if len(rs) == 1:
            return rs[0], xs[0]
        return np.concatenate(rs), np.concatenate(xs)

    def close(self) -> None:
        """End every subscription (the workers drop what their clients leave)."""
        with self._cond:
            self._closed = True
            srcs = list(self._sources.values())
        for s in srcs:
            if s.call is not None:
                s.call.cancel()
            if s.channel is not None:
                s.channel.close()
        for s in srcs:
            if s.reader is not None:
                s.reader.join(10)
