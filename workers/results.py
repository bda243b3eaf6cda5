"""Results past the manager: a session's pairs on their way to the join's client.

A manager that opens a session with a results token (metadata
``panjoin-results-token``) has its probes answered in RESULT_FORMAT_DIRECT: the
worker puts each probe command's ``(r_id, s_id)`` pairs into the session's
:class:`ResultChannel`, tagged with the command's id, and tells the manager only how
many there were. The join's client subscribes to the channel with the same token
(``Worker.Results``) and is told by the manager's outputs which commands' pairs make
up each output, so the pairs cross the wire once, worker to client, and never pass
through the manager (issue 28: a band join's manager spent more CPU relaying pairs
than the whole in-process join).

The channel holds at most ``cap`` bytes of pieces: a probe that finds it full waits
for the client to take some (the manager's next command waits behind it, so a slow
client slows the join instead of filling the worker's memory), up to ``wait_s``
seconds without progress; then, or at once when the subscriber has left, the put
fails with :class:`ChannelError` and the probe fails (FAILED_PRECONDITION), which
fails the join at the manager. When the session ends the subscriber gets the pieces
still queued, then the end of its stream.

A subscriber that keeps its stream open but reads nothing would hold the worker thread
that serves it in gRPC's send for as long as it stays connected: the channel cancels
its call (:meth:`attach`) once it takes nothing for ``wait_s``, both when a probe's put
gives up and when pieces are left after the session ended.

    >>> import numpy as np
    >>> ch = ResultChannel(cap=1 << 20, wait_s=1.0)
    >>> ch.put(7, np.array([1, 2]), np.array([10, 20]))
    >>> ch.subscribe(), ch.take(0.1)[0]
    (True, 7)
    >>> ch.close(); ch.take(0.1) is END
    True
"""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np

#: what :meth:`ResultChannel.take` returns once the session ended and nothing is left
END = object()
#: bytes of pieces a session's channel holds before a probe waits for its client
CHANNEL_BYTES = 64 << 20
#: longest accepted results token (the manager's are 32 characters)
MAX_TOKEN = 128


class ChannelError(Exception):
    """The pairs cannot go to the client: it left, or took none for too long."""


class ResultChannel:
    def __init__(self, cap: int = CHANNEL_BYTES, wait_s: float = 60.0):
        self.cap = cap
        self.wait_s = wait_s
        self._cond = threading.Condition()
        self._pieces: deque = deque()
        self._nbytes = 0
        self._subscribed = False
        self._gone = False  # the subscriber left: nothing more can reach the client
        self._closed = False  # the session ended: no more puts
        self._cancel = None  # ends the subscriber's call (its gRPC context's cancel)
        self._taken = 0  # pieces taken so far: progress, for the watchdog after close

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def subscribe(self) -> bool:
        """Take the channel for one client; False if it has (or had) one already."""
        with self._cond:
            if self._subscribed:
                return False
            self._subscribed = True
            return True

    def attach(self, cancel) -> None:
        """``cancel()`` ends the subscriber's call: called once it takes nothing for
        ``wait_s`` (its thread may be blocked in a send the client never reads)."""
        with self._cond:
            self._cancel = cancel

    def _cut(self) -> None:
        """Cancel the subscriber's call (outside the lock: gRPC may call back)."""
        with self._cond:
            cancel, self._cancel = self._cancel, None
        if cancel is not None:
            cancel()

    def put(self, command_id: int, r_id: np.ndarray, s_id: np.ndarray) -> None:
        """Queue a piece; waits while the channel is full (see the module doc)."""
        try:
            self._put(command_id, r_id, s_id)
        except ChannelError:
            self._cut()
            raise

    def _put(self, command_id: int, r_id: np.ndarray, s_id: np.ndarray) -> None:
        size = int(r_id.nbytes + s_id.nbytes)
        with self._cond:
            last, before = time.monotonic(), self._nbytes
            while not self._gone and self._pieces and self._nbytes + size > self.cap:
                if self._nbytes < before:  # the client takes pieces: keep waiting
                    last, before = time.monotonic(), self._nbytes
                left = last + self.wait_s - time.monotonic()
                if left <= 0:
                    raise ChannelError(
                        f"the join's client took none of this worker's pairs for "
                        f"{self.wait_s:g} s ({self._nbytes >> 20} MiB waiting"
                        f"{'' if self._subscribed else '; it never subscribed to them'}): "
                        "a client that asks for results past the manager must read every "
                        "worker's Results stream")
                self._cond.wait(min(left, 1.0))
            if self._gone:
                raise ChannelError("the join's client left this worker's Results stream: "
                                   "its pairs can no longer reach it")
            self._pieces.append((command_id, r_id, s_id))
            self._nbytes += size
            self._cond.notify_all()

    def take(self, timeout: float):
        """The next piece ``(command_id, r_id, s_id)``; :data:`END` once the session
        ended and every piece was taken; None if none came within ``timeout``."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._pieces or self._closed, timeout):
                return None
            if not self._pieces:
                return END
            piece = self._pieces.popleft()
            self._taken += 1
            self._nbytes -= int(piece[1].nbytes + piece[2].nbytes)
            self._cond.notify_all()
            return piece

    def close(self) -> None:
        """The session ended: the subscriber gets what is queued, then :data:`END`;
        one that takes nothing of it for ``wait_s`` has its call cancelled."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            watch = self._pieces and self._cancel is not None
        if watch:
            threading.Thread(target=self._watch_drain, daemon=True,
                             name="results-drain").start()

    def _watch_drain(self) -> None:
        with self._cond:
            while self._pieces and not self._gone:
                taken = self._taken
                self._cond.wait_for(lambda t=taken: self._taken != t or self._gone,
                                    self.wait_s)
                if self._taken == taken and not self._gone:
                    break  # no progress for wait_s
            else:
                return
        self._cut()

    def leave(self) -> None:
        """The subscriber left: drop what is queued, and fail every later put."""
        with self._cond:
            self._gone = True
            self._pieces.clear()
            self._nbytes = 0
            self._cond.notify_all()
