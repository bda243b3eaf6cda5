"""A worker compiles its kernels before it says it is ready.

A worker's index kernels are Numba functions compiled at their first call, one
version per argument types. On a cold cache, under load, the first join's first
commands would wait minutes for the compiler, and the manager would take the worker
for dead. So the worker process starts listening with its health status NOT_SERVING,
runs :func:`warm_up` -- every index it may hold (``rap``, ``wib``, ``bisort``,
``nested``), int64 and float64 keys, ``eq`` and ``band`` predicates, with and without
a residual, count and time windows, through the same subwindow stores a session uses
(:class:`panjoin.backend.LocalBackend`, via a tiny in-process join) -- and only then
reports SERVING, which :func:`panjoin.launch.wait_healthy` waits for. A handshake
node does the same for its segment scans (:func:`warm_up_handshake`: both segment
indexes, through an in-process chain).

With a warm cache (Numba's ``cache=True`` files next to the modules) this loads
the compiled versions in a few seconds; cold it compiles them::

    >>> warm_up(threads=1)                  # doctest: +SKIP
    (40, 3.4)                               # joins run, seconds taken
"""

from __future__ import annotations

import logging
import time

import numpy as np

log = logging.getLogger("panjoin.worker")

#: what a ring worker may be asked to hold and probe with (the OpenCL backend and the
#: sortedlist peer compile nothing of Numba's)
INDEXES = ("rap", "wib", "bisort", "hash", "nested")
KEY_DTYPES = ("int64", "float64")
#: eq and band probes, each without and with a residual on key2
PREDICATES = ("eq", "band:1", "eq&band2:1", "band:1&band2:1")
WINDOWS = ("count:48,48", "time:48,48")


def _events(n: int, key_dtype: str):
    from panjoin.generate import generate

    ev = generate(n, "uniform", key_min=0, key_max=16, rate=1000, seed=7,
                  float_keys=key_dtype == "float64")
    ev.key2 = (ev.id % 5).astype(np.float64)  # a residual's column
    return ev


def warm_up(threads: int = 1) -> tuple[int, float]:
    """Run a tiny join per index x key dtype x predicate x window in this process, with
    ``threads`` probe threads (a session's); returns (joins run, seconds)."""
    from panjoin.manager.engine import JoinEngine

    t0 = time.perf_counter()
    n = 0
    for key_dtype in KEY_DTYPES:
        ev = _events(200, key_dtype)
        for index in INDEXES:
            for pred in PREDICATES:
                if index == "hash" and key_dtype == "float64" and not pred.startswith("eq"):
                    continue  # a float band on hash is the nested loop's scan (warmed)
                # a time window runs the same kernels, told apart by an argument
                for window in WINDOWS if pred == "band:1" else WINDOWS[:1]:
                    # subwindows of 16 and batches of 8: creates, inserts, probes and
                    # expires all happen, several times, in 200 tuples
                    eng = JoinEngine(window, pred, index=index, key_dtype=key_dtype,
                                     subwindow_size=16, partitions=4, batch_size=8,
                                     threads=threads)
                    eng.push(ev)
                    eng.flush()
                    eng.take_results()
                    n += 1
        log.info("warm-up: %s keys done after %.1f s", key_dtype, time.perf_counter() - t0)
    _warm_pieces()
    return n, time.perf_counter() - t0


def _warm_pieces() -> None:
    """A key piece's id kernels (key placement; the index kernels are a subwindow's)."""
    from panjoin.subwindow.piece_ids import PieceIds

    p = PieceIds(256)
    p.insert(np.array([9, 2, 70]), np.array([90, 20, 700]))
    assert p.ids_of(np.array([70, 2])).tolist() == [700, 20]


def warm_up_handshake() -> tuple[int, float]:
    """The handshake node's scans: both segment indexes x key dtype x predicate x
    window, through a two-node chain in this process; returns (chains run, seconds)."""
    from panjoin.handshake.simulate import Simulation
    from panjoin.semantics import parse_predicate, parse_window

    t0 = time.perf_counter()
    n = 0
    for key_dtype in KEY_DTYPES:
        ev = _events(200, key_dtype)
        for index in ("nested", "sorted"):
            for pred in PREDICATES:
                for window in WINDOWS if pred == "band:1" else WINDOWS[:1]:
                    sim = Simulation(2, parse_window(window), parse_predicate(pred),
                                     key_dtype=np.dtype(key_dtype), index=index,
                                     feed_chunk=16, max_batch=16)
                    sim.run(ev.stream, ev.id, ev.key, ev.ts, ev.key2)
                    n += 1
    return n, time.perf_counter() - t0


if __name__ == "__main__":
    # `python -m workers.warm_up`: fill Numba's disk cache once, before many workers
    # start at the same time and would each compile the same kernels (make test)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    n, s = warm_up()
    print(f"warm-up: {n} ring joins in {s:.1f} s")
    n, s = warm_up_handshake()
    print(f"warm-up: {n} handshake chains in {s:.1f} s")
