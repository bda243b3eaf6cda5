"""Join semantics of DESIGN section 2: window specs, predicates, and the probe bounds.

One parser for every spec the CLI, config files and the gRPC API accept::

    >>> parse_window("count:1000,1000")
    Window(kind='count', r=1000, s=1000, lateness=0)
    >>> parse_window("time:5000,5000", lateness=200).s
    5000
    >>> parse_predicate("band:10").bands
    ((-10, 10),)
    >>> parse_predicate("bands:-5,5;20,35").bands
    ((-5, 5), (20, 35))
    >>> parse_predicate("band:10&band2:10").residual.bands
    ((-10, 10),)

A predicate is a union of closed *bands* on ``s.key - r.key``: ``eq`` is the
band [0, 0], ``band:E`` is [-E, E], ``bands:A,B;C,D`` is [A, B] or [C, D]
(overlapping bands are merged so that every pair is produced once), and ``ne``
is everything except [0, 0]. A probe tuple with key ``k`` therefore looks for
stored keys inside ``k + [A, B]`` (probing from R) or ``k - [B, A]`` (from S).
:func:`probe_bounds` turns a sorted probe batch into those per-tuple closed
intervals, exactly: int64 sums that overflow are detected rather than wrapped,
and float64 bounds are nudged by one ulp until ``stored - probe`` compares
exactly with the band edge, so both probe directions agree pair for pair.

:func:`window_bounds` gives the per-probe-tuple window bounds the indexes filter
with (:mod:`panjoin.subwindow.kernels.window`), all of them closed and saturated
at the ends of int64 (:func:`saturating_add`), so a ts of ``2**63 - 1`` joins as
one in the middle of the range does::

    >>> c0, c1, _ = window_bounds(parse_window("time:5,7"), "R",
    ...                           np.array([100, I64_MAX]), np.array([0, 1]))
    >>> c0.tolist(), c1.tolist()   # 100 - 7 < s.ts < 100 + 5; I64_MAX + 4 clamped
    ([94, 9223372036854775801], [104, 9223372036854775807])

A predicate may carry a *residual* condition on a second attribute, ``key2``
(float64, :attr:`panjoin.events.EventTable.key2`): the same band forms with a
``2`` appended, joined to the key condition by ``&``, e.g. ``band:10&band2:10``
(|r.key - s.key| <= 10 and |r.key2 - s.key2| <= 10, the handshake paper's 2-D
band join), ``eq&bands2:0,5`` or ``band:3&eq2``. The key condition picks the
candidates through an index; the residual is checked on each candidate where
the pairs are produced, so pairs failing it are never materialised.
:func:`probe_bounds` on ``pred.residual`` gives its per-probe-tuple intervals
on ``stored.key2``, exactly like the key's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

I64_MIN = np.iinfo(np.int64).min
I64_MAX = np.iinfo(np.int64).max

STREAMS = ("R", "S")


class SpecError(ValueError):
    """A window, predicate or other spec that cannot be parsed; the message says how to fix it."""


def other(stream: str) -> str:
    """The opposite stream: ``other('R') == 'S'``."""
    return "S" if stream == "R" else "R"


# --------------------------------------------------------------------------- windows


@dataclass(frozen=True)
class Window:
    """A sliding window over both streams.

    ``kind == 'count'``: ``r`` = WR and ``s`` = WS tuples. ``kind == 'time'``:
    ``r`` = TR and ``s`` = TS milliseconds of event time, and a pair (r, s)
    qualifies iff ``r.ts - TS < s.ts < r.ts + TR``. ``lateness`` is the allowed
    lateness L (ms) of time windows.
    """

    kind: str
    r: int
    s: int
    lateness: int = 0

    def size(self, stream: str) -> int:
        return self.r if stream == "R" else self.s

    def __str__(self) -> str:
        return f"{self.kind}:{self.r},{self.s}"


def _parse_int(text: str, what: str) -> int:
    t = text.strip().replace("_", "")
    mult = 1
    if t and t[-1] in "kKmMgG":
        mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[t[-1].lower()]
        t = t[:-1]
    try:
        value = int(t) * mult
    except ValueError:
        raise SpecError(f"{what}: {text!r} is not an integer (K/M/G suffixes allowed)") from None
    return value


def parse_size(text: str | int) -> int:
    """Parse a count like ``8M`` or ``64K`` (powers of two) or ``1000``."""
    if isinstance(text, int):
        return text
    return _parse_int(str(text), "size")


def parse_window(spec: str | Window, lateness: int = 0) -> Window:
    """Parse ``count:WR,WS`` or ``time:TR,TS`` (one number applies to both streams)."""
    if isinstance(spec, Window):
        return spec
    text = str(spec).strip()
    kind, sep, rest = text.partition(":")
    kind = kind.strip().lower()
    if not sep or kind not in ("count", "time"):
        raise SpecError(
            f"window {text!r}: expected 'count:WR,WS' (tuples) or 'time:TR,TS' (ms), "
            "e.g. 'count:1000000,1000000' or 'time:5000,5000'"
        )
    parts = [p for p in rest.split(",")]
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2:
        raise SpecError(f"window {text!r}: give two sizes, WR and WS, separated by a comma")
    r, s = (_parse_int(p, f"window {text!r}") for p in parts)
    if r <= 0 or s <= 0:
        raise SpecError(f"window {text!r}: sizes must be positive, got {r} and {s}")
    if lateness < 0:
        raise SpecError(f"allowed lateness must be >= 0 ms, got {lateness}")
    if kind == "count" and lateness:
        raise SpecError("allowed lateness applies to time windows only; drop --allowed-lateness")
    return Window(kind, r, s, int(lateness))


# --------------------------------------------------------------------------- predicates


@dataclass(frozen=True)
class Predicate:
    """A join condition on the key: a union of closed bands on ``s.key - r.key``.

    ``kind`` is ``eq``, ``band``, ``bands`` or ``ne``; ``bands`` holds sorted,
    disjoint ``(A, B)`` pairs (``ne`` keeps ``((0, 0),)`` and negates it).
    """

    kind: str
    bands: tuple[tuple[float, float], ...]
    #: condition on ``s.key2 - r.key2`` (a Predicate of kind eq/band/bands), or None
    residual: Predicate | None = None

    @property
    def negated(self) -> bool:
        return self.kind == "ne"

    @property
    def n_bands(self) -> int:
        """How many closed intervals one probe tuple looks up."""
        return 2 if self.negated else len(self.bands)

    def __str__(self) -> str:
        if self.kind in ("eq", "ne"):
            text = self.kind
        elif self.kind == "band":
            text = f"band:{_fmt(self.bands[0][1])}"
        else:
            text = "bands:" + ";".join(f"{_fmt(a)},{_fmt(b)}" for a, b in self.bands)
        if self.residual is not None:
            kind2, _, rest2 = str(self.residual).partition(":")
            text += f"&{kind2}2" + (f":{rest2}" if rest2 else "")
        return text

    @property
    def primary(self) -> Predicate:
        """The key condition alone (what the indexes look up)."""
        if self.residual is None:
            return self
        return Predicate(self.kind, self.bands)

    def max_width(self) -> float:
        """Widest band, used to estimate selectivity."""
        if self.negated:
            return math.inf
        return max(b - a for a, b in self.bands)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _parse_num(text: str, what: str) -> float:
    t = text.strip()
    if t.lstrip("+-").isdigit():
        return int(t)  # exact, also beyond 2**53
    try:
        value = float(t)
    except ValueError:
        raise SpecError(f"{what}: {text!r} is not a number") from None
    if math.isnan(value):
        raise SpecError(f"{what}: NaN is not a band edge")
    return value


RESIDUAL_HINT = ("a residual on key2 is 'eq2', 'band2:E' or 'bands2:A,B;C,D' after '&', "
                 "e.g. 'band:10&band2:10'")


def parse_predicate(spec: str | Predicate) -> Predicate:
    """Parse ``eq``, ``ne``, ``band:E`` or ``bands:A,B;C,D`` (s.key - r.key in [A,B] or [C,D]),
    optionally followed by ``&`` and a residual on key2: ``eq2``, ``band2:E``, ``bands2:...``."""
    if isinstance(spec, Predicate):
        return spec
    text = str(spec).strip()
    if "&" in text:
        first, _, second = text.partition("&")
        if "&" in second:
            raise SpecError(f"predicate {text!r}: at most one residual condition; "
                            + RESIDUAL_HINT)
        kind2, colon, rest2 = second.strip().partition(":")
        kind2 = kind2.strip().lower()
        if kind2 not in ("eq2", "band2", "bands2"):
            raise SpecError(f"predicate {text!r}: {second.strip()!r} is no residual; "
                            + RESIDUAL_HINT)
        try:
            res = _parse_one(kind2[:-1] + colon + rest2)
        except SpecError as e:
            raise SpecError(f"predicate {text!r}: residual: {e}; {RESIDUAL_HINT}") from None
        prim = _parse_one(first)
        return Predicate(prim.kind, prim.bands, res)
    return _parse_one(text)


def _parse_one(text: str) -> Predicate:
    text = text.strip()
    kind, _, rest = text.partition(":")
    kind = kind.strip().lower()
    hint = "expected 'eq', 'ne', 'band:E' or 'bands:A,B;C,D', e.g. 'band:10' or 'bands:-5,5;20,35'"
    if kind in ("eq", "ne"):
        if rest.strip():
            raise SpecError(f"predicate {text!r}: '{kind}' takes no argument")
        return Predicate(kind, ((0.0, 0.0),))
    if kind == "band":
        if not rest.strip():
            raise SpecError(f"predicate {text!r}: band:E needs E >= 0 (|r.key - s.key| <= E)")
        e = _parse_num(rest, f"predicate {text!r}")
        if e < 0:
            raise SpecError(f"predicate {text!r}: band:E needs E >= 0 (|r.key - s.key| <= E)")
        return Predicate("band", ((-e, e),))
    if kind == "bands":
        bands = []
        for part in rest.split(";"):
            if not part.strip():
                continue
            ab = part.split(",")
            if len(ab) != 2:
                raise SpecError(f"predicate {text!r}: each band is 'A,B'; {hint}")
            a, b = (_parse_num(x, f"predicate {text!r}") for x in ab)
            if a > b:
                raise SpecError(f"predicate {text!r}: band {part!r} has A > B")
            bands.append((a, b))
        if not bands:
            raise SpecError(f"predicate {text!r}: no bands given; {hint}")
        bands.sort()
        merged = [bands[0]]
        for a, b in bands[1:]:
            if a <= merged[-1][1]:  # overlapping bands would report a pair twice
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return Predicate("bands", tuple(merged))
    raise SpecError(f"predicate {text!r}: {hint}")


# --------------------------------------------------------------------------- probe bounds


def _int_band(a: float, b: float) -> tuple[int | None, int | None]:
    """Integer edges of a band over int64 keys: [ceil(a), floor(b)], None for unbounded."""
    lo = None if a == -math.inf else math.ceil(a)
    hi = None if b == math.inf else math.floor(b)
    return lo, hi


def _add_int(keys: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """keys + c in int64, with masks of the entries that overflowed up or down."""
    if not (I64_MIN <= c <= I64_MAX):
        # a band edge beyond int64 itself: exact in Python integers (rare, so slow is fine)
        exact = keys.astype(object) + c
        up = np.array([v > I64_MAX for v in exact], dtype=bool)
        down = np.array([v < I64_MIN for v in exact], dtype=bool)
        out = np.array([min(max(v, I64_MIN), I64_MAX) for v in exact], dtype=np.int64)
        return out, up, down
    with np.errstate(over="ignore"):
        out = keys + np.int64(c)
    if c > 0:
        up = out < keys
        return out, up, np.zeros_like(up)
    if c < 0:
        down = out > keys
        return out, np.zeros_like(down), down
    z = np.zeros(keys.shape, dtype=bool)
    return out, z, z


def saturating_add(a: np.ndarray, c: int) -> np.ndarray:
    """``a + c`` in int64, clamped to [I64_MIN, I64_MAX] instead of wrapped; ``c`` is any
    Python integer. A *closed* bound so clamped stays exact: nothing lies beyond the
    int64 range, so ``ts >= I64_MIN`` holds for every ts as ``ts >= ts0 - W`` did.
    (An open bound would not: ``ts > I64_MIN`` drops ts = I64_MIN.)

        >>> saturating_add(np.array([I64_MAX - 1, 5]), 3).tolist()
        [9223372036854775807, 8]
    """
    a = np.asarray(a, dtype=np.int64)
    c = int(c)
    # the common case, far from both ends: one pass to check, one to add
    if a.size and ((c >= 0 and c <= I64_MAX and int(a.max()) <= I64_MAX - c)
                   or (c < 0 and c >= I64_MIN and int(a.min()) >= I64_MIN - c)):
        return a + np.int64(c)
    out, up, down = _add_int(a, c)
    out[up] = I64_MAX
    out[down] = I64_MIN
    return out


def late_mask(ts: np.ndarray, maxts: int | None, lateness: int) -> tuple[np.ndarray, int | None]:
    """Which tuples of an arrival-ordered chunk are late (``ts`` below the largest ts of
    all earlier arrivals, ``maxts`` before the chunk, minus ``lateness``), and the
    largest ts after it. Example, L = 2: ts [5, 9, 6, 7] -> late [F, F, T, F]. The
    rule as it is written down (the sharded client routes by it); the engine runs it as
    one kernel pass, :func:`panjoin.manager.kernels.late_rows`, tested against this."""
    ts = np.asarray(ts, dtype=np.int64)
    if ts.size == 0:
        return np.zeros(0, dtype=bool), maxts
    run = np.maximum.accumulate(ts)
    prev = np.empty_like(ts)
    prev[1:] = run[:-1]
    prev[0] = I64_MIN if maxts is None else maxts
    if maxts is not None:
        np.maximum(prev, maxts, out=prev)
    has_prev = np.ones(ts.size, dtype=bool)
    has_prev[0] = maxts is not None
    # clamped, not wrapped: near I64_MIN, prev - L would wrap to a large ts
    late = has_prev & (ts < saturating_add(prev, -lateness))
    top = int(run[-1])
    return late, top if maxts is None else max(maxts, top)


def stored_bands(pred: Predicate, probe_stream: str) -> list[tuple[float, float]]:
    """Bands on ``stored.key - probe.key`` when ``probe_stream`` probes the other stream."""
    if probe_stream == "R":
        return list(pred.bands)
    return sorted((-b, -a) for a, b in pred.bands)


def probe_bounds(
    pred: Predicate, probe_stream: str, keys: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per probe tuple, the closed key intervals a stored tuple must fall into.

    Returns ``lo`` and ``hi`` of shape ``(n_bands, len(keys))`` and the keys'
    dtype; an empty interval has ``lo > hi`` (``lo = max``, ``hi = min`` of the
    dtype). For sorted ``keys`` the non-empty rows are sorted too, which the
    rebounding binary search relies on. Example, probing from R with band:2::

        keys [3, 10]  ->  lo [[1, 8]], hi [[5, 12]]
    """
    keys = np.asarray(keys)
    n = keys.shape[0]
    nb = pred.n_bands
    if keys.dtype == np.float64:
        with np.errstate(over="ignore", invalid="ignore"):  # steps past the largest double
            return _float_bounds(pred, probe_stream, keys, nb, n)
    return _int_bounds(pred, probe_stream, keys, nb, n)


def _float_bounds(pred, probe_stream, keys, nb, n):
    """probe_bounds for float64 keys."""
    lo = np.empty((nb, n), np.float64)
    hi = np.empty((nb, n), np.float64)
    if not pred.negated:  # exact, empty bands marked: one kernel pass a band
        from panjoin.bounds_kernels import float_bounds

        keys = np.ascontiguousarray(keys)
        for j, (a, b) in enumerate(stored_bands(pred, probe_stream)):
            float_bounds(keys, float(a), float(b), lo[j], hi[j])
        return lo, hi
    lo[0] = -np.inf
    hi[0] = np.nextafter(keys, -np.inf)
    lo[1] = np.nextafter(keys, np.inf)
    hi[1] = np.inf
    empty = lo > hi
    lo[empty] = np.inf
    hi[empty] = -np.inf
    return lo, hi


def _int_bounds(pred, probe_stream, keys, nb, n):
    """probe_bounds for int64 keys: overflow detected, not wrapped."""
    if keys.dtype != np.int64:
        raise TypeError(f"keys must be int64 or float64, got {keys.dtype}")
    if not pred.negated and stored_bands(pred, probe_stream) == [(0, 0)]:
        # the equi join: both bounds are the keys themselves (views, not copies)
        return keys[None, :], keys[None, :]
    lo = np.empty((nb, n), np.int64)
    hi = np.empty((nb, n), np.int64)
    empty = np.zeros((nb, n), dtype=bool)
    if pred.negated:
        lo[0] = I64_MIN
        hi[0], _, empty[0] = _add_int(keys, -1)
        lo[1], empty[1], _ = _add_int(keys, 1)
        hi[1] = I64_MAX
    else:
        for j, (a, b) in enumerate(stored_bands(pred, probe_stream)):
            ia, ib = _int_band(a, b)
            if ia is not None and ib is not None and ia > ib:
                empty[j] = True  # e.g. band [0.2, 0.8] holds no integer
                lo[j] = 0
                hi[j] = 0
                continue
            if ia is None:
                lo[j] = I64_MIN
            elif ia == 0:  # the key itself (every equi join): nothing to add or check
                lo[j] = keys
            else:
                lo[j], up, down = _add_int(keys, ia)
                empty[j] |= up  # k + A above the int64 range: nothing can match
                lo[j][down] = I64_MIN
            if ib is None:
                hi[j] = I64_MAX
            elif ib == 0:
                hi[j] = keys
            else:
                hi[j], up, down = _add_int(keys, ib)
                empty[j] |= down
                hi[j][up] = I64_MAX
    if empty.any():
        lo[empty] = I64_MAX
        hi[empty] = I64_MIN
    return lo, hi


def residual_bounds(pred: Predicate, probe_stream: str,
                    key2) -> tuple[np.ndarray, np.ndarray] | None:
    """Per probe tuple, the closed intervals on ``stored.key2`` of ``pred``'s residual
    (``probe_bounds`` of the residual over the probe tuples' float64 key2), or None when
    the predicate has none. Example, band:10&band2:1 probing from R with key2 [2.5]:
    ``lo [[1.5]], hi [[3.5]]``."""
    if pred.residual is None:
        return None
    if key2 is None:
        raise SpecError(f"predicate {pred} has a residual on key2, but the tuples carry no "
                        "key2: give the events a key2 column (EventTable.key2)")
    return probe_bounds(pred.residual, probe_stream, np.asarray(key2, dtype=np.float64))


def window_bounds(window: Window, probe_stream: str, ts: np.ndarray,
                  seq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per probe tuple, the window bounds ``c0, c1, c2`` on the stored tuples of the
    other stream, as :mod:`panjoin.subwindow.kernels.window` reads them; every bound is
    closed and saturated (:func:`saturating_add`), never wrapped.

    time (``ts``: the probe tuples' event time): a stored ts in ``[c0, c1]``, the
    integers of ``x.ts - W_Y < y.ts < x.ts + W_X``; count (``ts``: the probe tuples'
    opposite arrivals before them, ``seq``: their own seqs): ``c0 = opp - W_Y``,
    ``c1 = opp``, ``c2 = seq + W_X``. Example, time:5,7 probing from R at ts 100:
    S's window (7) reaches back, R's (5) forward, so stored ts 94..104 qualify.
    """
    ts = np.asarray(ts, dtype=np.int64)
    wx = window.size(probe_stream)
    wy = window.size(other(probe_stream))
    if window.kind == "count":
        return saturating_add(ts, -wy), ts, saturating_add(seq, wx)
    return saturating_add(ts, 1 - wy), saturating_add(ts, wx - 1), np.zeros_like(ts)
