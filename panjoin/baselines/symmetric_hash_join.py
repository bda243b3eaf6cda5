"""Symmetric hash join with build-side pruning: the design of DataFusion's SymmetricHashJoinExec.

The peer a SQL streaming engine would run for ``R JOIN S ON <equi keys> AND
<filter>`` (``../shared/papers/symmetric-hash-join-pruning.txt``). Each side
keeps a buffer of its rows and, when the join has an equi key, a hash table
over it. A batch of one side probes the other side's buffer (then joins its
own buffer), and after each chunk of input each buffer is *pruned*: interval
arithmetic on the join filter tells which buffered rows no future row can
match (:mod:`panjoin.baselines.intervals`), and those rows leave.

The DESIGN section 2 windows as join filters over integer columns:

- time windows ``time:TR,TS``: ``s.ts > r.ts - TS AND s.ts < r.ts + TR``.
  Late tuples (ts below the running maximum minus the allowed lateness L) are
  dropped before the join, as a watermark would; every future row therefore
  has ``ts >= maxts - L``, which is the probe side's interval (DataFusion uses
  the newest value of a sorted column: the same thing with L = 0).
- count windows ``count:WR,WS``, with ``seq`` = the tuple's arrival number in
  its stream and ``opp`` = opposite-stream arrivals before it (both sorted):
  ``s.seq >= r.opp - WS AND r.seq >= s.opp - WR``. If s came first the second
  term always holds and the first says "s is among the last WS S-tuples before
  r" (and symmetrically), so the conjunction is the exact count window.
- predicates: ``eq`` is the equi key (hash table); ``band``, ``bands`` and
  ``ne`` have NO equi key, so the join is filter-only: every live buffered row
  is a candidate and the key bands are part of the filter. That is all an SHJ
  can do for a band join: its buffers are pruned by the window, but inside the
  window it is a nested loop (DataFusion would plan a NestedLoopJoinExec).

Example, time:10,10, eq: r(key 5, ts 0) then s(key 5, ts 4) -> pair; then a
tuple with ts 30 arrives, so future rows have ts >= 30; ``r.ts > s.ts - 10``
with s.ts in [30, inf] narrows r.ts to [21, inf], and r (ts 0) is pruned; likewise
``s.ts > r.ts - 10`` with r.ts in [30, inf] prunes s (ts 4), and s (ts 30) stays.

    >>> import numpy as np
    >>> from panjoin.events import EventTable
    >>> j = SymmetricHashJoin("time:10,10", "eq")
    >>> j.push(EventTable(np.array([0, 1, 1], np.uint8), np.array([0, 0, 1]),
    ...                   np.array([5, 5, 6]), np.array([0, 4, 30])))
    >>> [p.tolist() for p in j.take_results()], j.buffered()
    ([[0], [0]], {'R': 0, 'S': 1})
"""

from __future__ import annotations

import math

import numpy as np

from panjoin.baselines import shj_kernels as K
from panjoin.baselines.intervals import (
    INF,
    And,
    Cmp,
    Col,
    Const,
    Interval,
    Sub,
    columns,
    linear_form,
    propagate,
)
from panjoin.semantics import (
    Predicate,
    Window,
    other,
    parse_predicate,
    parse_window,
    probe_bounds,
)
from panjoin.subwindow.kernels.primitives import I64_MAX, I64_MIN

STREAMS = ("R", "S")


def window_filter(window: Window, build: str, residual: dict | None = None) -> And:
    """The window condition as a join filter, with ``build`` the buffered stream; plus
    ``residual`` bands on extra integer columns: ``{"y": (A, B)}`` adds
    ``s.y >= r.y + A AND s.y <= r.y + B`` (e.g. the second band of a 2-D band join)."""

    def col(stream, name):
        return Col("build" if stream == build else "probe", name)

    if window.kind == "time":
        r, s = col("R", "ts"), col("S", "ts")
        terms = [Cmp(">", s, Sub(r, Const(window.s))), Cmp("<", s, Sub(r, Const(-window.r)))]
    else:
        terms = [Cmp(">=", col("S", "seq"), Sub(col("R", "opp"), Const(window.s))),
                 Cmp(">=", col("R", "seq"), Sub(col("S", "opp"), Const(window.r)))]
    for name, (a, b) in (residual or {}).items():
        r, s = col("R", name), col("S", name)
        terms += [Cmp(">=", s, Sub(r, Const(-int(a)))), Cmp("<=", s, Sub(r, Const(-int(b))))]
    return And(*terms)


class _Filter:
    """A side's filter (as the build side), its columns and its lowered form."""

    def __init__(self, window: Window, build: str, residual: dict | None = None):
        self.expr = window_filter(window, build, residual)
        cols = columns(self.expr)
        self.build_cols = [c for c in cols if c.side == "build"]
        self.probe_cols = [c for c in cols if c.side == "probe"]
        rows = linear_form(self.expr)
        self.coef_b = np.array([[r.get(c, 0) for c in self.build_cols] for r, _ in rows], np.int64)
        self.coef_p = np.array([[r.get(c, 0) for c in self.probe_cols] for r, _ in rows], np.int64)
        self.const = np.array([c for _, c in rows], np.int64)

    def pconst(self, probe_cols: dict[str, np.ndarray], m: int) -> np.ndarray:
        out = np.repeat(self.const[:, None], m, axis=1)
        for p, c in enumerate(self.probe_cols):
            out += self.coef_p[:, p : p + 1] * probe_cols[c.name][None, :]
        return out


class _Side:
    """One side's buffer: rows ``head .. n-1`` live, in arrival order."""

    def __init__(self, names: list[str], key_dtype, equi: bool):
        self.names = names
        self.cap = 1024
        self.keys = np.empty(self.cap, key_dtype)
        self.bits = np.empty(self.cap, np.int64) if equi else None
        self.nxt = np.empty(self.cap, np.int64) if equi else None
        self.cols = np.empty((len(names), self.cap), np.int64)
        self.ids = np.empty(self.cap, np.int64)
        self.head = 0
        self.n = 0
        self.equi = equi
        self.tkey = self.thead = None
        if equi:
            self._new_table(1024)

    def __len__(self):
        return self.n - self.head

    def _new_table(self, slots: int) -> None:
        self.tkey = np.zeros(slots, np.int64)
        self.thead = np.full(slots, -1, np.int64)
        K.ht_insert(self.tkey, self.thead, self.nxt, self.bits, self.head, self.n)

    def _compact(self, extra: int) -> None:
        """Drop pruned rows (shift live rows to 0) and grow to fit ``extra`` more."""
        live = self.n - self.head
        cap = max(self.cap, 1024)
        while cap < 2 * (live + extra):
            cap *= 2
        sl = slice(self.head, self.n)
        keys = np.empty(cap, self.keys.dtype)
        keys[:live] = self.keys[sl]
        cols = np.empty((len(self.names), cap), np.int64)
        cols[:, :live] = self.cols[:, sl]
        ids = np.empty(cap, np.int64)
        ids[:live] = self.ids[sl]
        self.keys, self.cols, self.ids, self.cap = keys, cols, ids, cap
        if self.equi:
            bits = np.empty(cap, np.int64)
            bits[:live] = self.bits[sl]
            self.bits, self.nxt = bits, np.empty(cap, np.int64)
        self.head, self.n = 0, live
        if self.equi:  # chains hold absolute row numbers: rebuild (O(live), amortised)
            slots = 1024
            while slots < 2 * cap:
                slots *= 2
            self._new_table(slots)

    def append(self, keys, cols: dict[str, np.ndarray], ids) -> None:
        m = keys.shape[0]
        if self.n + m > self.cap or (self.head > self.cap // 2):
            self._compact(m)
        a, b = self.n, self.n + m
        self.keys[a:b] = keys
        for c, name in enumerate(self.names):
            self.cols[c, a:b] = cols[name]
        self.ids[a:b] = ids
        self.n = b
        if self.equi:
            self.bits[a:b] = _key_bits(keys)
            K.ht_insert(self.tkey, self.thead, self.nxt, self.bits, a, b)

    @property
    def nbytes(self) -> int:
        nb = self.keys.nbytes + self.cols.nbytes + self.ids.nbytes
        if self.equi:
            nb += self.bits.nbytes + self.nxt.nbytes + self.tkey.nbytes + self.thead.nbytes
        return nb


def _key_bits(keys: np.ndarray) -> np.ndarray:
    """64-bit hash keys: int64 as is; float64 with -0.0 folded onto 0.0 (they join)."""
    if keys.dtype == np.float64:
        return (keys + 0.0).view(np.int64)
    return keys


class SymmetricHashJoin:
    """The SHJ operator over one arrival-ordered input; :meth:`push` chunks in order.

    ``residual={"y": (A, B)}`` adds ``s.y - r.y in [A, B]`` on an extra int64 column
    to the join filter; each :meth:`push` then passes ``extra={"y": array}`` (one value
    per tuple of the chunk)."""

    def __init__(self, window: str | Window, predicate: str | Predicate, *,
                 allowed_lateness: int = 0, prune: bool = True, residual: dict | None = None):
        self.window = parse_window(window, allowed_lateness)
        self.pred = parse_predicate(predicate)
        if self.pred.residual is not None:
            raise ValueError(f"the symmetric hash join baseline has no residual (key2) "
                             f"condition: {self.pred}; use the engine, or drop the '&...2' part")
        self.equi = self.pred.kind == "eq"
        self.prune_enabled = prune
        self.residual = dict(residual or {})
        clash = set(self.residual) & {"ts", "seq", "opp"}
        if clash:
            raise ValueError(f"residual columns {sorted(clash)} clash with the window's "
                             "columns ts/seq/opp; rename them")
        self.names = (["ts"] if self.window.kind == "time" else ["seq", "opp"]) + \
            list(self.residual)
        self.filters = {b: _Filter(self.window, b, self.residual) for b in STREAMS}
        self.sides: dict[str, _Side] | None = None
        self.total = {s: 0 for s in STREAMS}  # arrivals so far (count windows: next seq)
        self.maxts: int | None = None
        self._r: list[np.ndarray] = []
        self._s: list[np.ndarray] = []
        self._late: dict[str, list[np.ndarray]] = {s: [] for s in STREAMS}
        self.pruned = 0
        self.peak_rows = 0
        self.peak_bytes = 0
        self.visited = 0  # candidate rows looked at (equi chains) - the join's work

    # -------------------------------------------------------------------- input
    def push(self, events, extra: dict | None = None) -> None:
        stream = np.asarray(events.stream)
        n = stream.shape[0]
        if n == 0:
            return
        extra = extra or {}
        if set(extra) != set(self.residual):
            raise ValueError(f"push(extra=...) needs exactly the residual columns "
                             f"{sorted(self.residual)}, got {sorted(extra)}")
        keys, ids, ts = np.asarray(events.key), np.asarray(events.id), np.asarray(events.ts)
        if self.sides is None:
            self.sides = {s: _Side(self.names, keys.dtype, self.equi) for s in STREAMS}
        elif keys.dtype != self.sides["R"].keys.dtype:
            raise TypeError(f"keys are {keys.dtype}, but the join started with "
                            f"{self.sides['R'].keys.dtype}; push one key type")
        is_s = stream.astype(bool)
        keep = np.ones(n, bool)
        cols: dict[str, np.ndarray] = {}
        if self.window.kind == "time":
            keep = ~self._late_mask(ts)
            for x, code in (("R", 0), ("S", 1)):
                self._late[x].append(ids[(stream == code) & ~keep])
            cols["ts"] = ts
        else:
            s_before = np.cumsum(is_s) - is_s  # S arrivals in this chunk before each tuple
            r_before = np.arange(n) - s_before
            seq = np.where(is_s, self.total["S"] + s_before, self.total["R"] + r_before)
            opp = np.where(is_s, self.total["R"] + r_before, self.total["S"] + s_before)
            cols["seq"], cols["opp"] = seq, opp
        for name, v in extra.items():
            v = np.asarray(v)
            if v.shape != (n,) or v.dtype != np.int64:
                raise ValueError(f"extra column {name!r}: need {n} int64 values, got "
                                 f"{v.shape} {v.dtype}")
            cols[name] = v
        self.total["S"] += int(is_s.sum())
        self.total["R"] += n - int(is_s.sum())
        # R part probes S's buffer and joins it; then S probes R's (now with this chunk's R):
        # every pair is found exactly once, by its later-processed tuple
        for x, code in (("R", 0), ("S", 1)):
            sel = np.flatnonzero((stream == code) & keep)
            if sel.size == 0:
                continue
            xk, xi = keys[sel], ids[sel]
            xc = {c: v[sel] for c, v in cols.items()}
            self._probe(x, xk, xc, xi)
            self.sides[x].append(xk, xc, xi)
        live = sum(len(s) for s in self.sides.values())
        self.peak_rows = max(self.peak_rows, live)
        self.peak_bytes = max(self.peak_bytes, self.nbytes)
        if self.prune_enabled:
            for y in STREAMS:
                self._prune(y)

    def _late_mask(self, ts: np.ndarray) -> np.ndarray:
        """Late iff ts < (largest ts before it) - L, per tuple in arrival order."""
        run = np.maximum.accumulate(ts)
        prev = np.empty_like(ts)
        prev[1:] = run[:-1]
        first = self.maxts
        prev[0] = ts[0] if first is None else first
        if first is not None:
            np.maximum(prev, first, out=prev)
        self.maxts = int(max(run[-1], ts[0] if first is None else first))
        gap = (prev - ts).view(np.uint64)  # exact: prev > ts where it matters
        return (prev > ts) & (gap > np.uint64(self.window.lateness))

    # -------------------------------------------------------------------- probe
    def _probe(self, x: str, keys, cols, ids) -> None:
        y = other(x)
        side = self.sides[y]
        if len(side) == 0:
            return
        f = self.filters[y]
        pconst = f.pconst(cols, keys.shape[0])
        bcols = side.cols[[self.names.index(c.name) for c in f.build_cols]]
        if self.equi:
            p, b, v = K.ht_probe(side.tkey, side.thead, side.nxt, side.head, _key_bits(keys),
                                 bcols, f.coef_b, pconst)
            self.visited += int(v)
        else:
            lo, hi = probe_bounds(self.pred, x, keys)
            p, b = K.scan_probe(side.keys, side.head, side.n, lo, hi, bcols, f.coef_b, pconst)
            self.visited += keys.shape[0] * len(side)
        mine, theirs = ids[p], side.ids[b]
        self._r.append(mine if x == "R" else theirs)
        self._s.append(theirs if x == "R" else mine)

    # -------------------------------------------------------------------- prune
    def probe_intervals(self, y: str) -> dict[Col, Interval]:
        """Intervals of every column a future probe tuple (of the other stream) can have."""
        x = other(y)
        if self.window.kind == "time":
            if self.maxts is None:
                return {}
            return {Col("probe", "ts"): Interval(self.maxts - self.window.lateness, INF)}
        return {Col("probe", "seq"): Interval(self.total[x], INF),
                Col("probe", "opp"): Interval(self.total[y], INF)}

    def prune_bounds(self, y: str) -> np.ndarray:
        """Per build column of ``y`` (in ``self.names`` order), the smallest value a
        buffered row needs to match any future probe row (I64_MAX + 1 = prune all)."""
        f = self.filters[y]
        b = propagate(f.expr, self.probe_intervals(y))
        lows = np.full(len(self.names), I64_MIN, np.int64)
        if any(iv.empty for iv in b.values()):
            lows[:] = I64_MAX  # nothing can match any more
            return lows
        for c in f.build_cols:
            lo = b[c].lo
            if lo != -INF:
                lows[self.names.index(c.name)] = min(I64_MAX, max(I64_MIN, math.ceil(lo)))
        return lows

    def _prune(self, y: str) -> None:
        side = self.sides[y]
        if len(side) == 0:
            return
        lows = self.prune_bounds(y)
        new = K.prune_prefix(side.cols, side.head, side.n, lows)
        self.pruned += new - side.head
        side.head = new

    # -------------------------------------------------------------------- output
    def take_results(self) -> tuple[np.ndarray, np.ndarray]:
        r = np.concatenate(self._r) if self._r else np.zeros(0, np.int64)
        s = np.concatenate(self._s) if self._s else np.zeros(0, np.int64)
        self._r, self._s = [], []
        return r, s

    def take_late(self) -> dict[str, np.ndarray]:
        out = {k: (np.concatenate(v) if v else np.zeros(0, np.int64))
               for k, v in self._late.items()}
        self._late = {s: [] for s in STREAMS}
        return out

    def buffered(self) -> dict[str, int]:
        return {s: (len(self.sides[s]) if self.sides else 0) for s in STREAMS}

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.sides.values()) if self.sides else 0


def shj_join(events, window, predicate, *, allowed_lateness=0, chunk=4096, prune=True):
    """Run the whole event table through an SHJ in chunks; returns (pairs (n, 2), late)."""
    j = SymmetricHashJoin(window, predicate, allowed_lateness=allowed_lateness, prune=prune)
    rs, ss = [], []
    for a in range(0, len(events), chunk):
        j.push(events.slice(a, a + chunk))
        r, s = j.take_results()
        rs.append(r)
        ss.append(s)
    r = np.concatenate(rs) if rs else np.zeros(0, np.int64)
    s = np.concatenate(ss) if ss else np.zeros(0, np.int64)
    return np.stack([r, s], axis=1), j.take_late()
