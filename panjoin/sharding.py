"""The router of a join sharded by key over K managers (README, "Beyond one manager").

Shard j owns the keys in ``[b_j, b_{j+1})`` (``b_0 = -inf``, ``b_K = +inf``); the
boundaries are quantiles of a sample of the keys (:func:`boundaries`), so each shard
gets about a K-th of the tuples. Every shard is an ordinary join on its own manager.
A pair ``(r, s)`` qualifies only if ``s.key - r.key`` lies in a band ``[A, B]`` of the
predicate, i.e. ``r.key`` lies in ``[s.key - B, s.key - A]``; so the router sends

- an R tuple to the one shard that owns its key (:func:`shard_of`), and
- an S tuple to every shard whose range meets one of its intervals
  ``[s.key - B, s.key - A]`` (:func:`s_targets`, on the exact intervals of
  :func:`panjoin.semantics.probe_bounds`: int64 overflow and float64 rounding are
  handled there once).

A qualifying pair is then found in ``shard_of(r.key)`` and nowhere else: r is stored
only there, and s is there whenever the pair can qualify. Example, K = 2, boundary
``[10]`` (shard 0 holds keys < 10), ``band:2``::

    r.key 9   -> shard 0                 s.key 11 -> r.key in [9, 13]  -> shards 0, 1
    r.key 12  -> shard 1                 s.key 5  -> r.key in [3, 7]   -> shard 0
    pairs: (9, 11) in shard 0 only; (12, 11) in shard 1 only

    >>> import numpy as np
    >>> from panjoin.semantics import parse_predicate
    >>> b = np.array([10])
    >>> shard_of(b, np.array([9, 12])).tolist()
    [0, 1]
    >>> s_targets(b, parse_predicate("band:2"), np.array([11, 5])).tolist()
    [[True, True], [True, False]]

Only time windows shard (a count window is the last W arrivals of all keys together:
a shard would need the global arrival numbers, which JoinInput does not carry).
Lateness is decided once, here, in arrival order by the rule of DESIGN section 2 (a
tuple is late iff ``ts < (largest ts of the earlier arrivals) - L``), and each shard
gets, with every chunk, the global watermark W = the largest ts before the chunk: no
tuple the router keeps is below ``W - L``, so no shard drops one, and every shard
expires its subwindows at the same W (``push_arrays(watermark=W)``). All of it is
vectorised: a chunk costs a sort-free pass per band and per shard, no Python per tuple.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from panjoin.semantics import (
    I64_MIN,
    STREAMS,
    Predicate,
    SpecError,
    Window,
    parse_predicate,
    parse_window,
    probe_bounds,
)

#: keys a router samples for its boundaries (evenly spaced over what it is given)
SAMPLE = 1 << 16
#: shards a router routes to (its kernel keeps a row's shards as the bits of one word)
MAX_SHARDS = 64

COUNT_REFUSED = ("count windows do not shard over several managers: a count window is the "
                 "last W arrivals of all keys together, so every shard would need the global "
                 "arrival numbers (JoinInput carries none yet); use a time window "
                 "('time:TR,TS'), or one manager")


def boundaries(keys: np.ndarray, k: int, sample: int = SAMPLE) -> np.ndarray:
    """The ``k - 1`` shard boundaries: the k-quantiles of an evenly spaced sample of
    ``keys``, as keys of their dtype (exact, also for int64 beyond 2**53). A key that
    fills more than a shard's share repeats a boundary, which leaves a shard empty.

        >>> boundaries(np.arange(100), 4).tolist()
        [25, 50, 75]
    """
    keys = np.asarray(keys)
    if k < 1:
        raise ValueError(f"{k} shards: give at least one manager")
    if keys.dtype not in (np.int64, np.float64):
        raise TypeError(f"keys must be int64 or float64, got {keys.dtype}")
    if keys.size == 0:
        return np.zeros(k - 1, dtype=keys.dtype)
    step = max(1, keys.size // sample)
    s = np.sort(keys[::step])
    return s[(np.arange(1, k) * s.size) // k]


def shard_of(bounds: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The shard that owns each key: how many boundaries are <= it."""
    return np.searchsorted(bounds, keys, side="right")


def s_targets(bounds: np.ndarray, pred: Predicate, keys: np.ndarray) -> np.ndarray:
    """Boolean ``(K, len(keys))``: the shards an S tuple with each key goes to, those
    whose key range meets one of the tuple's intervals of ``r.key``. The residual (key2)
    does not route: it only thins the pairs a shard finds."""
    keys = np.asarray(keys)
    lo, hi = probe_bounds(pred.primary, "S", keys)  # (bands, n): r.key in [lo, hi]
    out = np.zeros((bounds.size + 1, keys.size), dtype=bool)
    for lo_b, hi_b in zip(lo, hi, strict=True):
        live = lo_b <= hi_b  # an empty interval has lo > hi
        first, last = shard_of(bounds, lo_b), shard_of(bounds, hi_b)
        for j in range(out.shape[0]):
            out[j] |= live & (first <= j) & (last >= j)
    return out


@dataclass
class Routed:
    """One chunk, routed: ``rows[j]`` are the chunk's rows for shard j (arrival order,
    late tuples left out), ``late`` the rows of the late tuples by stream (arrival
    order), ``watermark`` the W to push them with (``I64_MIN``: no arrival yet)."""

    rows: list[np.ndarray]
    late: dict[str, np.ndarray]
    watermark: int


class Router:
    """Routes arrival-ordered chunks of a time-window join to ``len(bounds) + 1`` shards,
    deciding lateness on the way (it keeps the largest ts seen so far)."""

    def __init__(self, bounds: np.ndarray, window: Window | str, pred: Predicate | str):
        self.window = parse_window(window)
        if self.window.kind != "time":
            raise SpecError(COUNT_REFUSED)
        self.pred = parse_predicate(pred)
        self.bounds = np.ascontiguousarray(bounds)
        if self.bounds.size and np.any(self.bounds[1:] < self.bounds[:-1]):
            raise ValueError("shard boundaries must be sorted")
        if self.bounds.size + 1 > MAX_SHARDS:
            raise ValueError(f"{self.bounds.size + 1} shards: a router routes to at most "
                             f"{MAX_SHARDS}")
        self.maxts: int | None = None

    @property
    def shards(self) -> int:
        return self.bounds.size + 1

    def route(self, stream, keys, ts) -> Routed:
        """Route one chunk (``stream`` 0 = R, 1 = S; rows in arrival order): lateness and
        the shards in kernel passes (:mod:`panjoin.sharding_kernels`; the rule is
        :func:`shard_of`'s and :func:`s_targets`')."""
        from panjoin.manager.kernels import late_tuples
        from panjoin.sharding_kernels import route_eq_rows, route_rows

        # contiguous, as the warm-up's: a strided column (a sample) would load another
        # compiled version of the kernel inside the join
        stream = np.ascontiguousarray(stream, dtype=np.uint8)
        keys = np.ascontiguousarray(keys)
        ts = np.ascontiguousarray(ts, dtype=np.int64)
        if keys.dtype != self.bounds.dtype:
            raise TypeError(f"keys are {keys.dtype} but the shard boundaries are "
                            f"{self.bounds.dtype}: sample the boundaries from this join's keys")
        watermark = I64_MIN if self.maxts is None else self.maxts
        late, n_late, self.maxts = late_tuples(ts, self.maxts, self.window.lateness)
        primary = self.pred.primary
        if not primary.negated and primary.bands == ((0, 0),):  # eq: r.key in [key, key]
            rows = list(route_eq_rows(stream, keys, late, self.bounds))
        else:
            lo, hi = probe_bounds(primary, "S", keys)
            rows = list(route_rows(stream, keys, late, self.bounds, lo, hi))
        none = np.zeros(0, dtype=np.int64)
        return Routed(rows, {name: np.flatnonzero(late & (stream == x)) if n_late else none
                             for x, name in enumerate(STREAMS)}, watermark)


def warm_up_router(key_dtype, pred: Predicate | str = "eq") -> None:
    """Load (or compile) the router's kernels for keys of ``key_dtype`` and ``pred``'s
    kind of intervals, before a join's first chunk: in a client that loads no other
    kernel, the first one also sets up Numba's typing (0.1-0.3 s, which a host under a
    quarter-core quota took four times over, inside the timed join)."""
    dt = np.dtype(key_dtype)
    router = Router(np.zeros(1, dt), "time:1,1", pred)
    router.route(np.array([0, 1], np.uint8), np.zeros(2, dt), np.zeros(2, np.int64))
