"""A streaming join on the manager endpoint: pairs leave as soon as they exist (issue 27).

A join opened with ``max_latency_ms`` (or on a manager started with ``--max-latency``)
is not driven by its client's inputs alone. Its Join handler runs this loop, which
wakes on whichever comes first:

- an input (a reader thread moves the client's JoinInputs into the loop's inbox, so
  the loop never blocks on the client);
- an answer from a worker (``GrpcBackend.set_wake``: the feedback reader wakes the
  loop; on a handshake chain, pairs reaching the merging network's root do);
- the engine's next collect deadline (:meth:`JoinEngine.next_tick`; a handshake
  chain collects its input under a deadline too, :meth:`HandshakeChain.next_tick`).

Each time, under the join's lock (the engine is not thread-safe; Status and Close take
the same lock), it applies the inputs (each answered as before: one JoinOutput with
its batch_id), ticks the engine (cuts buffers whose deadline passed) and takes the
probe rounds already answered (``take_results(wait=False)``); their pairs, with any
late ids, go out at once as a *pushed* JoinOutput (``batch_id = 0``,
``pushed = true``). Nothing is pushed when nothing completed::

    client   in 1 ─────────────────────── in 2 ──────────────────►
    manager  ◄ answer 1 ◄ pushed ◄ pushed ◄ answer 2 ◄ pushed ───
                 (round of in 1 answered)   (deadline cut, answered)

The loop owns no thread but the reader, which ends with the stream: the client
half-closes, disconnects, or the join is closed (the handler then ends the RPC,
which ends the reader's wait). The lock is never held across a yield, so a slow
reader of the output blocks neither Status nor Close.
"""

from __future__ import annotations

import queue
import threading
import time

#: inbox items besides JoinInputs: something may have completed; the client's input ended
_WAKE = object()
_END = object()
#: the loop looks at its stream (closed join, gone client) at least this often (s)
IDLE_S = 0.1
#: while probe rounds are in flight, at most this long between looks (s): a safety net,
#: as an answer wakes the loop itself
IN_FLIGHT_S = 0.002


def _read(requests, inbox: queue.SimpleQueue, gone) -> None:
    """The reader thread: the client's inputs into the inbox, then _END. A stream that
    breaks (the client went away, or the RPC ended under it) calls ``gone()``: the loop
    may be parked at a yield that gRPC never resumes for a cancelled call, so the
    reader, not the loop, releases the join."""
    try:
        for msg in requests:
            inbox.put(msg)
    except Exception:  # grpc.RpcError: cancelled or broken
        gone()
    finally:
        inbox.put(_END)


def _timeout(j) -> float:
    """How long the loop may sleep: until the next collect deadline, a short while when
    probe rounds are in flight, else IDLE_S."""
    wait = IN_FLIGHT_S if getattr(j.backend, "rounds_in_flight", 0) else IDLE_S
    due = j.engine.next_tick()
    if due is not None:
        wait = min(wait, max(0.0, due - time.monotonic()))
    return wait


def stream_join(j, first, requests, context, apply, take, gone):
    """Run the streaming loop of join ``j`` (a ``service._Join``) whose first input is
    ``first`` and the rest come from ``requests``; yields JoinOutputs. ``apply(msg)``
    answers one input (its outputs, the answer last), ``take()`` the pushed outputs of
    what completed (none if nothing), both called under ``j.lock``; ``gone()`` releases
    the join when the client goes away. The loop ends at the end of the client's input,
    when the client goes away, or when the join is closed (``j.closed``)."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    inbox.put(first)
    reader = threading.Thread(target=_read, args=(requests, inbox, gone), daemon=True,
                              name=f"join-input-{first.join_id}")
    j.reader = reader
    j.wake = lambda: inbox.put(_WAKE)
    j.backend.set_wake(j.wake)
    reader.start()
    try:
        end = False
        wait = 0.0
        while not end:
            items = []
            try:
                items.append(inbox.get(timeout=wait))
                while True:  # everything that is here already, in one pass
                    items.append(inbox.get_nowait())
            except queue.Empty:
                pass
            outs = []
            with j.lock:
                if j.closed:
                    return
                for it in items:
                    if it is _END:
                        end = True
                        break
                    if it is not _WAKE:
                        outs.extend(apply(it))
                j.engine.tick()
                pushed = take()
                wait = _timeout(j)
            yield from outs
            yield from pushed
            if not context.is_active():
                return
    finally:
        j.backend.set_wake(None)
