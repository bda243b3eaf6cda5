"""The generated workloads: what each one joins, and the one event file it joins.

A :class:`Workload` names a predicate, a selectivity, a key distribution and a
window (count or time); :func:`events_for` generates its file of ``N = 2W + M``
tuples (plus the y column of the 2-D band join, see :class:`Data`) and
:func:`calibrate` fits the band half-width E to the file when the keys are not
uniform. The constants are the handshake join paper's 2-D workload and the
generator's event rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from panjoin.generate import band_for_selectivity, generate

KEY_MAX = 1 << 40
RATE = 1_000_000  # generated tuples per second of event time (both streams)
PANJOIN_INDEXES = ("rap", "wib", "bisort")
# the handshake join paper's section 5.2: values uniform in 1..10000, bands of +-10
HS_MAX = 10_000
HS_BAND = 10
Y_SCALE = 1024  # y = k / 1024: floats every peer compares exactly as the int64 k
RESIDUAL_2D = {"y": (-HS_BAND * Y_SCALE, HS_BAND * Y_SCALE)}  # s.y - r.y in [A, B]


@dataclass(frozen=True)
class Workload:
    pred: str  # "band", "eq" or "band2d" (the handshake paper's 2-D band join)
    selectivity: float  # band: S; eq: about 1 match per tuple (uniform) or what zipf gives
    dist: str
    window: int
    kind: str = "count"  # count | time (T ms that hold about W tuples per stream)
    band: int | None = None  # E calibrated on the file (non-uniform keys), see calibrate()

    @property
    def name(self) -> str:
        if self.pred == "band2d":
            return "band2d handshake"
        p = f"band S={self.selectivity:g}" if self.pred == "band" else "eq"
        return f"{p} {self.dist}" + (" time" if self.kind == "time" else "")

    def window_spec(self) -> str:
        if self.kind == "time":
            t = max(1, round(self.window * 2 * 1000 / RATE))  # both streams arrive at RATE/2
            return f"time:{t},{t}"
        return f"count:{self.window},{self.window}"

    def predicate(self) -> str:
        if self.pred == "eq":
            return "eq"
        if self.pred == "band2d":
            return f"band:{HS_BAND}"
        if self.band is not None:
            return f"band:{self.band}"
        return f"band:{int(band_for_selectivity(self.selectivity, self.window, 0, KEY_MAX))}"

    def key_range(self) -> tuple[int, int]:
        if self.pred == "band2d":
            return 1, HS_MAX
        # eq on uniform keys: W distinct values give about one match per probe tuple
        return 0, (self.window if (self.pred == "eq" and self.dist == "uniform") else KEY_MAX)

    @property
    def residual(self) -> dict | None:
        return RESIDUAL_2D if self.pred == "band2d" else None


@dataclass
class Data:
    """One workload's event file, and the y column of the 2-D join (None otherwise)."""

    events: object  # EventTable
    y: np.ndarray | None = None  # int64 y * Y_SCALE per event, arrival order

    def __len__(self) -> int:
        return len(self.events)

    def slice(self, a: int, b: int) -> Data:
        return Data(self.events.slice(a, b), None if self.y is None else self.y[a:b])


def events_for(wl: Workload, measure: int, seed: int) -> Data:
    lo, hi = wl.key_range()
    ev = generate(2 * wl.window + measure, wl.dist, key_min=lo, key_max=hi, seed=seed,
                  rate=RATE)
    if wl.pred != "band2d":
        return Data(ev)
    y = np.random.default_rng([seed, 2]).integers(Y_SCALE, HS_MAX * Y_SCALE, len(ev),
                                                 endpoint=True)
    return Data(ev, y.astype(np.int64))


def engine_input(wl: Workload, data: Data):
    """(events, predicate) as PanJoin's engine and ``panjoin replay`` take them: the 2-D
    band join's y band is the engine's residual condition on key2 = y (int64 y below
    2**53: exact as float64), as ``bench peers`` runs it."""
    if wl.pred != "band2d":
        return data.events, wl.predicate()
    from dataclasses import replace

    ((_, (a, b)),) = wl.residual.items()
    return (replace(data.events, key2=data.y.astype(np.float64)),
            f"{wl.predicate()}&bands2:{a},{b}")


#: an all-equal grid cell's window at most: each of its tuples pairs with the whole
#: window, so its fill alone makes W^2 pairs
EQUAL_WINDOW = 4096


def grid_cells(windows, dists, preds, measure: int, equal_pairs: int):
    """The cells of a benchmark grid, ``(workload, M)``: per window, key distribution
    (``equal`` at W <= :data:`EQUAL_WINDOW`, M cut to ``equal_pairs`` over W) and
    predicate (``eq``, ``band S=X``, ``band2d``: the 2-D join, uniform keys only), each
    cell once."""
    done = set()
    for w0 in windows:
        for dist in dists:
            for pred in preds:
                if pred == "band2d" and dist != "uniform":
                    continue  # the handshake paper's workload: uniform x and y
                w = min(w0, EQUAL_WINDOW) if dist == "equal" else w0
                m = min(measure, max(256, equal_pairs // w)) if dist == "equal" else measure
                if (w, dist, pred) in done:
                    continue
                done.add((w, dist, pred))
                kind, sel = (pred, 1.0) if pred in ("eq", "band2d") else (
                    "band", float(pred.split("=")[1]))
                yield Workload(kind, sel, dist, w), m


def add_grid_args(ap, equal_pairs: str) -> None:
    """A grid benchmark's ``--dists`` and ``--preds`` (see :func:`grid_cells`)."""
    ap.add_argument("--dists", default="uniform,zipf,increasing,equal",
                    help=f"key distributions (default: %(default)s; equal: every key the "
                         f"same, at W 4K at most, M cut to {equal_pairs} pairs)")
    ap.add_argument("--preds", default="eq,band S=1,band S=64,band2d",
                    help="predicates (default: %(default)s; band2d: the handshake paper's "
                         "2-D band join, uniform keys only)")


def calibrate(wl: Workload, data: Data, probes: int = 256) -> Workload:
    """The band half-width E that makes a probe tuple match about S tuples of a full
    window on this file (non-uniform keys; uniform keys keep the closed formula):
    the smallest E whose mean match count reaches S for the first ``probes`` R tuples
    after the fill, each against its own window (the last W S-tuples before it;
    increasing keys move a whole band's width in a few hundred arrivals).

    The windows of consecutive probes overlap: one sorted array U holds the S keys
    of all of them, and each probe subtracts, by brute force, the few keys of U
    outside its own window."""
    if wl.pred != "band" or wl.dist == "uniform" or wl.band is not None:
        return wl
    ev = data.events
    fill, w = 2 * wl.window, wl.window
    is_s = ev.stream == 1
    s_before = np.cumsum(is_s) - is_s  # S arrivals before each position
    pos = fill + np.flatnonzero(~is_s[fill:])[:probes]
    if pos.size == 0:
        return wl
    s_keys = ev.key[is_s]
    j = s_before[pos]  # probe i's window: S tuples [j_i - W, j_i)
    lo_j, hi_j = max(0, int(j[0]) - w), int(j[-1])
    union = np.sort(s_keys[lo_j:hi_j])
    keys = ev.key[pos]
    outside = [np.concatenate([s_keys[lo_j:max(lo_j, int(ji) - w)], s_keys[int(ji):hi_j]])
               for ji in j]

    def mean(e: int) -> float:
        n = np.searchsorted(union, keys + e, "right") - np.searchsorted(union, keys - e, "left")
        n -= np.array([np.count_nonzero((o >= k - e) & (o <= k + e))
                       for o, k in zip(outside, keys, strict=True)])
        return float(n.mean())

    lo, hi = 0, KEY_MAX
    while lo < hi:
        mid = (lo + hi) // 2
        if mean(mid) >= wl.selectivity:
            hi = mid
        else:
            lo = mid + 1
    from dataclasses import replace

    return replace(wl, band=lo)
