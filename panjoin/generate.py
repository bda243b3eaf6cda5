"""Synthetic input streams for tests and benchmarks (PanJoin paper, section V-A).

:func:`generate` draws ``n`` tuples of two interleaved streams R and S as one
arrival-ordered :class:`~panjoin.events.EventTable`, in three independent parts,
each from its own child of the seed (so switching the key distribution leaves
the stream tags and timestamps unchanged)::

    seed ─┬─► tags    R with probability r_fraction     ──► id = rank within its stream
          ├─► ts      EPOCH_MS + floor(i * 1000 / rate)  ──► minus a delay in [0, disorder_ms]
          │                                                  for a fraction of the tuples
          └─► keys    a point u in [0, 1] per tuple, by distribution,
                      mapped onto [key_min, key_max]

Key distributions (``u`` is the position within the range, 0 = key_min):

* ``uniform``    u uniform; int keys are drawn exactly, any range;
* ``zipf``       rank-size, like the YouTube view counts of the paper: each
                 tuple is one of n "videos" picked uniformly, the video of rank
                 k has key ``key_min + range / k**zipf_a``, so rank 1 sits at
                 key_max and almost everything piles up, with many duplicates,
                 at the low end (99% of the keys in ~1% of the range for large n);
* ``increasing`` u = (i + 0.5) / n plus a noise of at most INCREASING_NOISE:
                 keys rise with arrival across the whole range;
* ``normal``     ``modes`` normal peaks evenly spaced across the range, each with
                 a standard deviation of NORMAL_SIGMA times the spacing;
* ``equal``      every key is key_min (the worst case for partitioning).

Integer keys are mapped with unsigned 64-bit arithmetic, ``key = key_min +
floor(u * (range + 1))`` with the offset clipped to the range, so even
key_min = -2**63, key_max = 2**63 - 1 never overflows. Float keys are
``key_min + u * (key_max - key_min)``, non-integral in any normal range.

Timestamps: tuple i arrives at ``floor(i * 1000 / rate)`` ms after EPOCH_MS, so
ts never decreases. With ``disorder_ms > 0`` a fraction ``disorder_fraction`` of
the tuples gets ``ts -= delay``, delay uniform in [0, disorder_ms]: out of
order, but never by more than disorder_ms, so no tuple is late under an allowed
lateness L >= disorder_ms.

Worked trace, n = 12, uniform keys in [0, 99], rate 4000 tuples/s (4 per ms),
seed 0::

    >>> t = generate(12, key_max=99, rate=4000)
    >>> "".join("RS"[s] for s in t.stream)
    'SRSRRSRSRSSR'
    >>> t.id.tolist()        # the rank within its own stream
    [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    >>> (t.ts - EPOCH_MS).tolist()   # 4 arrivals per millisecond
    [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    >>> t.key.tolist()
    [65, 83, 46, 8, 99, 61, 24, 70, 50, 24, 98, 48]

The same tags and ts with other keys. Zipf ranks 1..12 give keys 99, 43, 26,
18, 14, 11, 9, 8, 7, 6, 5, 5; twelve draws among twelve ranks repeat some, and
ranks 11 and 12 share a key, so 5, 8, 11 and 26 each come up more than once::

    >>> generate(12, "increasing", key_max=99, rate=4000).key.tolist()
    [4, 12, 20, 29, 37, 45, 54, 62, 70, 79, 87, 95]
    >>> generate(12, "zipf", key_max=99, rate=4000).key.tolist()
    [8, 5, 11, 43, 5, 8, 26, 7, 9, 26, 5, 11]
    >>> generate(12, "normal", modes=4, key_max=99, rate=4000).key.tolist()
    [63, 88, 32, 11, 87, 66, 14, 66, 67, 13, 89, 38]

For a band join on uniform keys, :func:`band_for_selectivity` gives the band
half-width E that makes a probe tuple match about S tuples of a window: a
window of W keys spread over a range D holds W / D keys per unit, and the band
[k - E, k + E] covers 2E units, so E = S * D / (2 W) (the paper's selectivity S,
"matching tuples in a full subwindow per probing tuple").
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

# pyarrow.compute is imported in the functions that use it: its import is 20 ms of
# every start, and reading a Parquet file needs none of it
from panjoin.events import EventTable
from panjoin.semantics import I64_MAX, I64_MIN

DISTRIBUTIONS = ("uniform", "zipf", "increasing", "normal", "equal")

#: the ts of the first tuple (14 Nov 2023, in ms): realistic, and far from int64's ends
EPOCH_MS = 1_700_000_000_000
#: share of the tuples that are delayed when disorder_ms > 0
DISORDER_FRACTION = 0.1
#: increasing keys stray from their place by at most this fraction of the range
INCREASING_NOISE = 0.001
#: standard deviation of each normal peak, as a fraction of the spacing between peaks
NORMAL_SIGMA = 0.1

# the largest double below 2**64: u * 2**64 rounded may reach 2**64, which uint64 can't hold
_U64_FMAX = float(2**64 - 2048)


def _int_bounds(key_min, key_max) -> tuple[int, int]:
    lo, hi = key_min, key_max
    for name, v in (("key_min", lo), ("key_max", hi)):
        if isinstance(v, float | np.floating) and not float(v).is_integer():
            raise ValueError(f"{name}={v!r}: integer keys need integer bounds (or float_keys=True)")
    lo, hi = int(lo), int(hi)
    if not (I64_MIN <= lo <= hi <= I64_MAX):
        raise ValueError(f"key range [{lo}, {hi}]: need -2**63 <= key_min <= key_max <= 2**63 - 1")
    return lo, hi


def _unit_to_int(u: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Map u in [0, 1] onto [lo, hi] as int64 via uint64 offsets (no overflow)."""
    span = hi - lo  # Python int, up to 2**64 - 1
    return _offset_to_int(np.floor(u * (float(span) + 1.0)), lo, span)


def _offset_to_int(off: np.ndarray, lo: int, span: int) -> np.ndarray:
    """lo + off as int64, with the float offsets ``off`` (>= 0) clipped to ``span``."""
    # float(span) may round up past span, and a double >= 2**64 has no uint64 value:
    # everything from the smaller of the two limits on is the top of the range
    top = off >= min(float(span), _U64_FMAX)
    off = np.where(top, np.uint64(span), np.minimum(off, _U64_FMAX).astype(np.uint64))
    # uint64 addition wraps modulo 2**64, which is exactly int64 arithmetic on the bits
    return (np.uint64(lo % 2**64) + off).view(np.int64)


def _unit_to_float(u: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Map u in [0, 1] onto [lo, hi] as float64."""
    d = hi - lo
    x = lo + u * d if math.isfinite(d) else lo * (1.0 - u) + hi * u
    return np.clip(x, lo, hi)


def _keys(rng, n: int, dist: str, lo, hi, float_keys: bool, zipf_a: float, modes: int):
    if dist == "equal":
        return np.full(n, lo, dtype=np.float64 if float_keys else np.int64)
    if dist == "uniform":
        if not float_keys:  # exact over any range, also the full int64 one
            return rng.integers(lo, hi, size=n, dtype=np.int64, endpoint=True)
        u = rng.random(n)
    elif dist == "zipf":
        rank = rng.integers(1, max(n, 1), size=n, endpoint=True).astype(np.float64)
        u = rank ** (-zipf_a)  # rank 1 -> 1 (key_max); the long tail -> ~0 (key_min)
        if not float_keys:
            # floor(u * range) rather than the +1 bins of _unit_to_int: only rank 1
            # reaches key_max, and the tail collapses onto key_min
            return _offset_to_int(np.floor(u * float(hi - lo)), lo, hi - lo)
    elif dist == "increasing":
        u = (np.arange(n) + 0.5) / max(n, 1)
        u += rng.uniform(-INCREASING_NOISE, INCREASING_NOISE, size=n)
        u = np.clip(u, 0.0, 1.0)
    elif dist == "normal":
        peak = rng.integers(0, modes, size=n)
        u = (peak + 0.5) / modes + rng.normal(0.0, NORMAL_SIGMA / modes, size=n)
        u = np.clip(u, 0.0, 1.0)
    else:  # pragma: no cover - checked by generate()
        raise AssertionError(dist)
    if float_keys:
        return _unit_to_float(u, float(lo), float(hi))
    return _unit_to_int(u, lo, hi)


def generate(
    n: int,
    dist: str = "uniform",
    *,
    key_min=0,
    key_max=1_000_000,
    float_keys=False,
    rate: float = 1_000_000.0,
    disorder_ms: int = 0,
    r_fraction: float = 0.5,
    zipf_a: float = 1.2,
    modes: int = 4,
    seed: int = 0,
    payload: bool = False,
    disorder_fraction: float = DISORDER_FRACTION,
    key2_max: float | None = None,
) -> EventTable:
    """``n`` arrival-ordered tuples of R and S; see the module docstring.

    Deterministic per ``seed``; vectorised (10M tuples take about a second).
    ``payload=True`` adds a string payload ``'R17'`` / ``'S4'`` (stream and id).
    ``key2_max`` adds a second attribute ``key2``, uniform floats in [0, key2_max), for
    residual conditions (``band:10&band2:10``).
    """
    n = int(n)
    if n < 0:
        raise ValueError(f"n={n}: the number of tuples must be >= 0")
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {dist!r}; choose one of {', '.join(DISTRIBUTIONS)}")
    if not (0.0 <= r_fraction <= 1.0):
        raise ValueError(f"r_fraction={r_fraction}: must lie in [0, 1]")
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate={rate}: tuples per second must be positive")
    if disorder_ms < 0:
        raise ValueError(f"disorder_ms={disorder_ms}: must be >= 0")
    if not (0.0 <= disorder_fraction <= 1.0):
        raise ValueError(f"disorder_fraction={disorder_fraction}: must lie in [0, 1]")
    if modes < 1:
        raise ValueError(f"modes={modes}: need at least one peak")
    if not zipf_a > 0:
        raise ValueError(f"zipf_a={zipf_a}: the rank-size exponent must be > 0")
    if key2_max is not None and not (math.isfinite(key2_max) and key2_max > 0):
        raise ValueError(f"key2_max={key2_max}: must be a positive finite number")
    if float_keys:
        lo, hi = float(key_min), float(key_max)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise ValueError(f"key range [{key_min}, {key_max}]: need finite key_min <= key_max")
    else:
        lo, hi = _int_bounds(key_min, key_max)

    # child i of a seed is the same whatever the count, so key2 leaves the rest unchanged
    tags_rng, ts_rng, key_rng, key2_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
    )

    is_s = tags_rng.random(n) >= r_fraction
    stream = is_s.view(np.uint8)
    ids, ts = _ids_and_ts(is_s, rate)
    if disorder_ms > 0:
        delayed = ts_rng.random(n) < disorder_fraction
        delay = ts_rng.integers(0, int(disorder_ms), size=n, endpoint=True, dtype=np.int64)
        ts -= np.where(delayed, delay, 0)

    key = _keys(key_rng, n, dist, lo, hi, float_keys, float(zipf_a), int(modes))

    pl = None
    if payload:
        import pyarrow.compute as pc

        tags = pc.take(pa.array(["R", "S"]), pa.array(stream))
        pl = pc.binary_join_element_wise(tags, pc.cast(pa.array(ids), pa.string()), "")
    key2 = None if key2_max is None else key2_rng.random(n) * float(key2_max)
    return EventTable(stream, ids, key, ts, pl, key2)


def _ids_and_ts(is_s: np.ndarray, rate: float) -> tuple[np.ndarray, np.ndarray]:
    """Each tuple's rank within its stream, and its arrival time (module docstring)."""
    n = is_s.shape[0]
    s_so_far = np.cumsum(is_s, dtype=np.int64)  # S tuples up to and including i
    pos = np.arange(n, dtype=np.int64)
    ids = np.where(is_s, s_so_far - 1, pos - s_so_far)
    if float(rate).is_integer():
        ts = pos * 1000 // int(rate)
    else:  # i * 1000 is exact in a double, and floor division of exact doubles is exact
        ts = np.floor_divide(pos * 1000.0, float(rate)).astype(np.int64)
    ts += EPOCH_MS
    return ids, ts


#: Weyl's step for :func:`warm_up_events` (2^64 / the golden ratio, odd)
_WEYL = np.uint64(0x9E3779B97F4A7C15)


def warm_up_events(n: int, key_max: int, *, float_keys: bool = False,
                   key2_max: float | None = None, rate: float = 1_000_000.0) -> EventTable:
    """``n`` tuples for a throwaway join that loads kernels before a timed one: no
    random generator (numpy.random's import alone is 15-25 ms of a replay's start).
    Tuple i's hash ``h = i * 0x9E3779B97F4A7C15 mod 2^64`` (Weyl's sequence: spread
    evenly) gives its stream (h's top bit: R and S interleaved, about half each), its
    key (``(h >> 11) mod (key_max + 1)``: below 2^53 whatever key_max; float keys the
    same values as floats) and its key2 (``(h mod 2^11) / 2^11 * key2_max``); ids and
    ts as :func:`generate`'s.

        >>> e = warm_up_events(6, 99)
        >>> "".join("RS"[s] for s in e.stream), e.key.tolist()
        ('RSRSRR', [0, 55, 19, 74, 38, 1])
    """
    h = np.arange(n, dtype=np.uint64) * _WEYL  # wraps: mod 2^64
    is_s = (h >> np.uint64(63)).astype(bool)
    ids, ts = _ids_and_ts(is_s, rate)
    key = ((h >> np.uint64(11)) % np.uint64(key_max + 1)).astype(np.int64)
    key2 = None if key2_max is None else (
        (h & np.uint64(2047)).astype(np.float64) * (float(key2_max) / 2048.0))
    return EventTable(is_s.view(np.uint8), ids, key.astype(np.float64) if float_keys
                      else key, ts, None, key2)


def band_for_selectivity(selectivity: float, window: int, key_min, key_max) -> float:
    """Band half-width E such that a probe tuple matches about ``selectivity``
    tuples of a window of ``window`` uniform keys in [key_min, key_max]:
    E = S * (key_max - key_min) / (2 * window), at least 0.

    >>> band_for_selectivity(4, 1000, 0, 1_000_000)
    2000.0
    """
    if window <= 0:
        raise ValueError(f"window={window}: must be positive")
    if math.isnan(selectivity):
        raise ValueError("selectivity is NaN")
    if isinstance(key_min, int | np.integer) and isinstance(key_max, int | np.integer):
        span = float(int(key_max) - int(key_min))  # exact difference, then rounded once
    else:
        span = float(key_max) - float(key_min)
    if span < 0:
        raise ValueError(f"key range [{key_min}, {key_max}]: key_min > key_max")
    return max(0.0, selectivity * span / (2.0 * window))
