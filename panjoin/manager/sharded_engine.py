"""A time-window join sharded by key over K engines on K threads, in one process.

The in-process form of "Beyond one manager" (README; :mod:`panjoin.sharding`): shard j
is an ordinary :class:`~panjoin.manager.engine.JoinEngine` that owns the keys in
``[b_j, b_{j+1})``. The calling thread routes each piece of the input
(:class:`panjoin.sharding.Router`: an R tuple to the shard that owns its key, an S
tuple to every shard it can pair in, late tuples dropped once, by the rule of DESIGN
section 2) and hands every shard its rows with the global watermark W (the largest ts
before the piece); each shard joins on a thread of its own (the kernels let go of the
GIL), while the caller routes the next piece. A pair is found in exactly one shard, so
the result is the union of the shards' pairs.

Only time windows shard: a count window is the last W arrivals of all keys together,
which no shard sees. Example, two shards over keys 0..99 (boundary 50)::

    >>> import numpy as np
    >>> eng = ShardedEngine("time:100,100", "eq", np.array([50]), index="nested")
    >>> eng.push_arrays(np.array([0, 1, 0, 1], np.uint8), np.arange(4),
    ...                 np.array([7, 7, 60, 60]), np.arange(4))
    >>> eng.flush(); sorted(p[0].tolist() for p in eng.take_result_pieces())
    [[0], [2]]
    >>> eng.close()
"""

from __future__ import annotations

import functools
import logging
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from panjoin.events import EventTable
from panjoin.manager.engine import JoinEngine, default_subwindow_size
from panjoin.semantics import STREAMS, Predicate, Window, parse_predicate, parse_window
from panjoin.sharding import Router, boundaries

log = logging.getLogger("panjoin")

#: rows routed at a time: each piece is pushed with the watermark at its start, so a
#: shard expires its subwindows at most a piece later than one engine would
ROUTE_ROWS = 1 << 18
#: pieces a shard may have waiting: the router runs at most this far ahead
DEPTH = 2
#: shard only when the busiest shard gets at most this many times a fair share of the
#: keys, and an S tuple goes to at most this many shards on average (a wide band
#: copies S tuples to every shard it can pair in)
MAX_SKEW = 1.5
MAX_FANOUT = 1.5


def kernels_run_side_by_side() -> tuple[bool, str]:
    """Whether two threads may run Numba's parallel kernels at once, and why not. The
    tbb and omp threading layers allow it; workqueue, Numba's fallback where neither
    library is installed (a slim container without libgomp), aborts the process when
    they do, and some kernels are parallel ones whatever a shard's thread count (the
    residual probe, RaP-Table's, the WiB+-tree's). The layer is picked at the first
    parallel kernel: tbb, else omp, else workqueue, unless NUMBA_THREADING_LAYER
    says."""
    from panjoin import jit

    if jit.loaded():
        numba = jit.numba()
        try:
            layer = numba.threading_layer()  # the one in use, once a kernel chose it
        except ValueError:
            layer = numba.config.THREADING_LAYER
    else:  # Numba's own default, without loading Numba for it
        layer = os.environ.get("NUMBA_THREADING_LAYER", "default").lower()
    if layer in ("tbb", "omp", "threadsafe", "safe"):
        return True, ""
    if layer in ("default", "forksafe") and any(_pool_loads(p) for p in ("tbbpool", "omppool")):
        return True, ""
    return False, ("Numba's threading layer here is workqueue, which aborts when two "
                   "threads run parallel kernels at once: install libgomp (Debian: apt "
                   "install libgomp1) or tbb (pip install tbb) to shard")


@functools.cache  # asked by the plan and again by the engine
def _pool_loads(pool: str) -> bool:
    """Numba's threading-layer library ``pool`` loads here (its own library, libgomp or
    tbb, found), checked without importing Numba: the layer a first parallel kernel
    would pick."""
    import ctypes
    import glob
    import importlib.util

    spec = importlib.util.find_spec("numba")
    if spec is None or not spec.submodule_search_locations:
        return False
    for path in glob.glob(os.path.join(spec.submodule_search_locations[0], "np", "ufunc",
                                       f"{pool}*.so")):
        try:
            ctypes.CDLL(path)
            return True
        except OSError:
            pass
    return False


def plan_shards(keys: np.ndarray, stream: np.ndarray, window: Window, pred: Predicate,
                cpus: int, threads: int = 1) -> tuple[np.ndarray | None, str]:
    """The shard boundaries for a file's join on ``cpus`` CPUs with ``threads`` kernel
    threads a shard, and why; None: one engine (a count window, one CPU, keys that put
    most tuples in one shard: increasing or few distinct keys, a band so wide that S
    tuples would be copied to most shards, or Numba's workqueue threading layer,
    :func:`kernels_run_side_by_side`).

        >>> from panjoin.semantics import parse_predicate, parse_window
        >>> k = np.arange(1000); s = (k % 2).astype(np.uint8)
        >>> b, why = plan_shards(k, s, parse_window("time:9,9"), parse_predicate("eq"), 2)
        >>> b.tolist()
        [500]
        >>> plan_shards(np.zeros(1000, np.int64), s, parse_window("time:9,9"),
        ...             parse_predicate("eq"), 2)[0] is None
        True
    """
    if window.kind != "time":
        return None, "a count window does not shard (its W arrivals are of all keys)"
    k = max(1, cpus // max(1, threads))
    if k < 2:
        return None, f"{cpus} CPU{'s' if cpus != 1 else ''} for {threads} kernel thread(s)"
    ok, why = kernels_run_side_by_side()
    if not ok:
        return None, why
    keys = np.asarray(keys)
    if keys.size < 2:
        return None, "too few tuples"
    bounds = boundaries(keys, k)
    step = max(1, keys.size // (1 << 16))
    sample, sample_stream = keys[::step], np.asarray(stream)[::step]
    share = np.bincount(np.searchsorted(bounds, sample, side="right"), minlength=k)
    skew = share.max() * k / sample.size
    if skew > MAX_SKEW:
        return None, (f"the keys do not spread over {k} shards (the busiest would get "
                      f"{skew:.1f}x its share)")
    router = Router(bounds, "time:1,1", pred)
    routed = router.route(sample_stream, sample, np.zeros(sample.size, np.int64))
    n_s = max(1, int(np.count_nonzero(sample_stream)))
    fanout = (sum(int(r.size) for r in routed.rows) - (sample.size - n_s)) / n_s
    if fanout > MAX_FANOUT:
        return None, f"the band copies an S tuple to {fanout:.1f} of {k} shards on average"
    return bounds, (f"{k} shards by key (boundaries {bounds.tolist()}), {threads} kernel "
                    f"thread{'s' if threads != 1 else ''} each, of {cpus} CPUs")


class ShardedEngine:
    """K :class:`JoinEngine` shards of a time-window join, one thread each; the
    engine's interface as :func:`panjoin.cli.replay._replay_engine` drives it (push,
    flush, take_result_pieces, take_late, memory_bytes, window_tuples). ``bounds``: the
    K - 1 shard boundaries; ``threads``: kernel threads a shard; ``subwindow_size``: the
    join's NSub (default: one engine's), of which a shard's subwindows hold a K-th, so
    that a shard, which stores about a K-th of the window, expires as finely and the
    shards together hold what one engine would; ``engine_kw``: the shards'
    :class:`JoinEngine` settings (``window_tuples``, for the memory check, is the whole
    join's: each shard is checked as if it held all of it)."""

    def __init__(self, window: Window | str, predicate: Predicate | str, bounds: np.ndarray,
                 threads: int | None = 1, subwindow_size: int | None = None, **engine_kw):
        threads = max(1, int(threads or 1))
        ok, why = kernels_run_side_by_side()
        if not ok and np.asarray(bounds).size:
            raise ValueError(f"{np.asarray(bounds).size + 1} shards: {why}, or join on "
                             "one engine (--shards 1)")
        self.window = parse_window(window) if isinstance(window, str) else window
        self.pred = parse_predicate(predicate)
        self.router = Router(bounds, self.window, self.pred)
        self.nsub = int(subwindow_size or default_subwindow_size(self.window))
        k = self.router.shards
        self.engines = [JoinEngine(self.window, self.pred, threads=threads,
                                   subwindow_size=max(1, -(-self.nsub // k)), **engine_kw)
                        for _ in range(k)]
        first = self.engines[0]
        self.shard_nsub, self.partitions, self.batch_size = \
            first.nsub, first.partitions, first.batch_size
        self.threads = threads
        # one thread a shard, so a shard's pieces run in order
        self._pools = [ThreadPoolExecutor(1, thread_name_prefix=f"panjoin-shard{j}",
                                          initializer=_kernel_threads, initargs=(threads,))
                       for j in range(self.router.shards)]
        self._pending: list[deque[Future]] = [deque() for _ in self.engines]
        self._pieces: list[tuple] = []
        self._memory = [0] * len(self.engines)
        self._late: dict[str, list[np.ndarray]] = {name: [] for name in STREAMS}
        self.tuples_routed = [0] * len(self.engines)

    @property
    def shards(self) -> int:
        return len(self.engines)

    def push(self, events) -> None:
        """Push an arrival-ordered :class:`EventTable` (as :meth:`JoinEngine.push`)."""
        if not isinstance(events, EventTable):
            events = EventTable(events.stream, events.id, events.key, events.ts,
                                getattr(events, "payload", None), getattr(events, "key2", None))
        for a in range(0, len(events), ROUTE_ROWS):
            piece = events.slice(a, min(len(events), a + ROUTE_ROWS))
            routed = self.router.route(piece.stream, piece.key, piece.ts)
            for name, rows in routed.late.items():
                if rows.size:
                    self._late[name].append(piece.id[rows])
            for j, rows in enumerate(routed.rows):
                if rows.size:
                    self.tuples_routed[j] += int(rows.size)
                    self._submit(j, _push, self.engines[j], piece, rows, routed.watermark)

    def push_arrays(self, stream, ids, keys, ts, payload=None, key2=None) -> None:
        """Push arrays in arrival order (as :meth:`JoinEngine.push_arrays`)."""
        self.push(EventTable(np.asarray(stream, np.uint8), np.asarray(ids, np.int64),
                             np.asarray(keys), np.asarray(ts, np.int64), payload, key2))

    def _submit(self, j: int, fn, *args) -> None:
        """Run ``fn(*args)`` on shard j's thread after its earlier pieces, waiting
        while it has :data:`DEPTH` pieces queued (the first error is raised here)."""
        pending = self._pending[j]
        while len(pending) >= DEPTH:
            self._done(j, pending.popleft())
        self._collect()
        pending.append(self._pools[j].submit(fn, *args))

    def _done(self, j: int, future: Future) -> None:
        pieces, self._memory[j] = future.result()
        self._pieces.extend(pieces)

    def _collect(self) -> None:
        """The pairs of every piece a shard has finished (without waiting)."""
        for j, pending in enumerate(self._pending):
            while pending and pending[0].done():
                self._done(j, pending.popleft())

    def _settle(self) -> None:
        for j, pending in enumerate(self._pending):
            while pending:
                self._done(j, pending.popleft())

    def flush(self) -> None:
        """Join what every shard holds buffered (end of input), and wait for it."""
        for j, eng in enumerate(self.engines):
            self._submit(j, _flush, eng)
        self._settle()

    def take_result_pieces(self, payloads: bool = False, wait: bool = True) -> list[tuple]:
        """The pairs found so far, as :meth:`JoinEngine.take_result_pieces` pieces
        (shards' pairs in no particular order between shards); ``wait`` is ignored: a
        shard's pairs are taken as its pieces finish."""
        self._collect()
        out, self._pieces = self._pieces, []
        return out

    def take_late(self) -> dict[str, np.ndarray]:
        """Ids of the late tuples by stream (the router's; a shard drops none)."""
        self._settle()
        for eng in self.engines:
            for name, ids in eng.take_late().items():
                self._late[name].append(ids)
        out = {name: np.concatenate(v) if v else np.zeros(0, np.int64)
               for name, v in self._late.items()}
        self._late = {name: [] for name in STREAMS}
        return out

    def memory_bytes(self) -> int:
        """The shards' windows, as they last reported (each after its latest piece)."""
        return sum(self._memory)

    def window_tuples(self) -> dict[str, int]:
        self._settle()
        held = [eng.window_tuples() for eng in self.engines]
        return {name: sum(h[name] for h in held) for name in STREAMS}

    def close(self) -> None:
        """Wait for the shards' threads and end them (pieces still queued are dropped)."""
        for pending in self._pending:
            for f in pending:
                f.cancel()
        for pool in self._pools:
            pool.shutdown(wait=True)

    def __enter__(self) -> ShardedEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _kernel_threads(threads: int) -> None:
    from panjoin import jit

    jit.set_threads(threads)


def _push(eng: JoinEngine, piece: EventTable, rows: np.ndarray, watermark: int):
    """On the shard's thread: gather its rows (numpy lets go of the GIL) and push them."""
    eng.push_arrays(piece.stream.take(rows), piece.id.take(rows), piece.key.take(rows),
                    piece.ts.take(rows),
                    None if piece.payload is None else piece.payload.take(rows),
                    None if piece.key2 is None else piece.key2[rows], watermark=watermark)
    return eng.take_result_pieces(payloads=True, wait=False), eng.memory_bytes()


def _flush(eng: JoinEngine):
    eng.flush()
    return eng.take_result_pieces(payloads=True), eng.memory_bytes()
