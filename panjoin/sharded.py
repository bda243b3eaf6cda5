"""A time-window join sharded by key over K manager endpoints (README, "Beyond one manager").

Each manager runs one ordinary join on its key range; the client routes the events
(:class:`panjoin.sharding.Router`: R to the shard that owns its key, S to every shard
it can pair in, late tuples dropped once, here) and streams each shard its rows with
the global watermark, all K shards at once, one thread each. The result is the union
of the shards' pairs: each pair is found in exactly one shard. The shards stream
while the rest of the input is routed, each from a queue of at most ``DEPTH`` routed
chunks (a slow shard holds the router back instead of queueing the input), and a
shard whose join fails stops the routing at once. The managers may share
their workers (every manager opens its own sessions on them)::

    >>> res = sharded_join(["127.0.0.1:50050", "127.0.0.1:50060"], events,   # doctest: +SKIP
    ...                    "time:5000,5000", "band:10", allowed_lateness=200)
    >>> res.r_id, res.s_id, res.late                                           # doctest: +SKIP

Example: K = 2, keys 0..99 sampled -> boundary 50; an R tuple with key 7 goes to
manager 0, an S tuple with key 50 under ``band:10`` to both (an r with key 40..49 on
manager 0, or 50..60 on manager 1, may pair with it).
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from panjoin.client import Client, Result, answer_writer, rows_of, with_payloads
from panjoin.config import DEFAULT_INDEX
from panjoin.security import Security
from panjoin.semantics import STREAMS, parse_predicate, parse_window
from panjoin.sharding import Router, boundaries

log = logging.getLogger("panjoin")

#: routed chunks a shard may have waiting: the client holds O(K x DEPTH) chunks
DEPTH = 4


def sharded_join(addresses: list[str], events, window: str, predicate: str,
                 index: str = DEFAULT_INDEX, chunk: int = 1 << 18,
                 security: Security | None = None, bounds: np.ndarray | None = None,
                 out=None, **settings) -> Result:
    """Join an event table over the managers at ``addresses`` (one shard each) and
    return the union of their pairs as :meth:`Client.join` does; ``bounds``: the shard
    boundaries (default: quantiles of the events' keys, :func:`boundaries`); ``out``:
    as :meth:`Client.join`'s, written by one shard at a time; ``settings``:
    OpenRequest fields for every shard (``allowed_lateness`` too)."""
    if not addresses:
        raise ValueError("no manager addresses given")
    win = parse_window(window, settings.get("allowed_lateness", 0))
    pred = parse_predicate(predicate)
    keys = np.asarray(events.key)
    router = Router(boundaries(keys, len(addresses)) if bounds is None else bounds, win, pred)
    if router.shards != len(addresses):
        raise ValueError(f"{router.shards} shards for {len(addresses)} managers")
    clients = [Client(a, security) for a in addresses]
    queues = [queue.Queue(DEPTH) for _ in addresses]  # shard -> its routed chunks, then None
    late = {name: [] for name in STREAMS}

    def feed(j: int):
        while (ch := queues[j].get()) is not None:
            yield ch

    each = None if out is None else answer_writer(events, out, threading.Lock())

    def run(j: int):
        c = clients[j]
        join_id = c.open(str(win), str(pred), index, **settings)
        return c.run_join(join_id, feed(j), each)

    try:
        # the shards stream while the rest is routed (the client's CPU overlaps the
        # managers'), each from its queue
        with ThreadPoolExecutor(len(addresses), thread_name_prefix="shard") as pool:
            futures = [pool.submit(run, j) for j in range(len(addresses))]
            sent = [0] * len(addresses)

            def put(j: int, item, check: bool = True) -> None:
                """Queue ``item`` for shard j, waiting while its queue is full. With
                ``check``, the first failed shard's error is raised (routing stops);
                without, a shard that ended takes nothing more."""
                while True:
                    if check:
                        for f in futures:
                            if f.done() and f.exception() is not None:
                                raise f.exception()
                    if futures[j].done():
                        if check:
                            raise RuntimeError(f"shard {j} ({addresses[j]}) ended its join "
                                               "before its input did")
                        return
                    try:
                        queues[j].put(item, timeout=0.05)
                        return
                    except queue.Full:
                        pass

            try:
                step = min(c.chunk_rows(chunk) for c in clients)
                n = len(events)
                for a in range(0, n, step):
                    b = min(n, a + step)
                    routed = router.route(events.stream[a:b], keys[a:b], events.ts[a:b])
                    for j, rows in enumerate(routed.rows):
                        if rows.size:
                            ch = rows_of(events, rows + a)
                            ch.watermark = routed.watermark
                            put(j, ch)
                            sent[j] += rows.size
                    for name, rows in routed.late.items():
                        late[name].append(events.id[rows + a])
                for j in range(len(addresses)):
                    if not sent[j]:  # a shard with nothing still opens and flushes
                        put(j, rows_of(events, np.zeros(0, np.int64)))
            finally:
                for j in range(len(addresses)):
                    put(j, None, check=False)
            log.info("sharded over %d managers (boundaries %s): %s tuples each",
                     len(addresses), router.bounds.tolist(), sent)
            outs = [o for f in futures for o in f.result()]
    finally:
        for c in clients:
            c.close()
    # the shards drop nothing (no kept tuple is below W - L); theirs would show here
    ls = np.concatenate([np.zeros(0, np.uint8)] + [o.late_stream for o in outs])
    li = np.concatenate([np.zeros(0, np.int64)] + [o.late_id for o in outs])
    for x, name in enumerate(STREAMS):
        late[name].append(li[ls == x])
    r = np.concatenate([np.zeros(0, np.int64)] + [o.r_id for o in outs])
    s = np.concatenate([np.zeros(0, np.int64)] + [o.s_id for o in outs])
    late = {name: np.concatenate(v) if v else np.zeros(0, np.int64) for name, v in late.items()}
    return Result(r, s, late) if out is not None else with_payloads(events, r, s, late)
