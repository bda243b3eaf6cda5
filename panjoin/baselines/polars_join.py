"""Polars' offline join of a whole event file: a DataFrame library's time for the same result.

The plan, in Polars expressions on one DataFrame of the events in arrival order
(DESIGN section 2; the same semantics as the SQL of
:mod:`panjoin.baselines.duckdb_join`):

1. *live tuples*. Count windows number each stream's arrivals with one cumulative
   sum, ``ns = cum_sum(stream == 1)`` (S arrivals up to and including the tuple):
   an S tuple has ``seq = ns - 1`` and ``opp = pos + 1 - ns``, an R tuple
   ``seq = pos - ns`` and ``opp = ns`` (``opp``: arrivals of the other stream before
   it). Time windows drop the late tuples: ``prev = cum_max(ts)`` shifted by one,
   kept iff ``prev`` is null or ``ts >= prev - L``.
2. *candidates by the key*, R on the left, S on the right:

   - ``eq``: a hash join on the key;
   - bands, ``plan="bucket"`` (the default; int keys): DuckDB's hand rewrite into an
     equi join: keys fall into buckets of width w = the widest band + 1, each R tuple
     lists the one or two buckets its bands reach (``int_ranges`` + ``explode``), a
     hash join on the bucket;
   - bands, ``plan="iejoin"`` (float keys and infinite bands always): ``join_where`` on
     ``lo <= s.key <= hi`` (Polars' IEJoin), one join per band, concatenated, with the
     window's and the residual's conditions inside the join (see :func:`_iejoin`);
   - ``ne``: the window itself as a range of S (S in arrival order for count windows,
     sorted by ts for time windows; two ``search_sorted`` per R tuple), expanded with
     ``int_ranges`` + ``explode`` + a gather of S, the key filter after.

   At W = 256K on uniform keys (one thread, best of 5 on the shared 2-core machine),
   bucket took 0.10 s for S = 1 and IEJoin 0.24 s; for S = 64, IEJoin 1.4 s and
   bucket 2.0-2.6 s (its candidates are about twice the band's matches). Bucket is the
   default (faster at S = 1, and DuckDB's plan); ``plan="iejoin"`` for wide bands.

3. *filter* (inside the join for ``iejoin``): the exact band (where the candidates are
   a superset), the window (``s.seq >= r.opp - WS AND r.seq >= s.opp - WR``, or
   ``r.ts - TS < s.ts < r.ts + TR``) and the residual band on an extra column
   (``residual={"y": (A, B)}``).

Exactness. Int keys: a band's bounds ``r.key + A`` are summed in int128 (Polars'
int64 would wrap): a lower bound below int64 is no bound, one above it empties the
band for that tuple (null), an upper bound the reverse; fractional edges become
``ceil(A)`` and ``floor(B)``. Float keys: ``r.key + A`` in float arithmetic finds a
superset (rounding is monotone), then each candidate's ``d = s.key - r.key`` is
tested exactly with its rounding error ``err`` (Knuth's TwoSum): ``d > A or (d == A
and err >= 0)``; keys are normalised by ``+ 0.0`` first, so -0.0 and 0.0 sort and
hash as one value.

Threads: Polars sizes its thread pool once, from ``POLARS_MAX_THREADS`` at import;
``threads=`` only checks that the pool has that size and raises otherwise
(``panjoin bench peers`` sets the variable before polars is imported).

Example: R(key 5), S(key 6), R(key 9) in that order, ``count:1,1``, bands [-3, -3] and
[1, 1]. Step 1 gives ``ns = 0, 1, 1``, so r0 has (seq, opp) = (0, 0), s0 (0, 1) and r1
(1, 1); the window holds (r0, s0) (``0 >= 0 - 1`` and ``0 >= 1 - 1``) and (r1, s0)
(``0 >= 1 - 1`` and ``1 >= 1 - 1``); s.key - r.key is 1 and -3, one in each band::

    >>> from panjoin.events import EventTable
    >>> ev = EventTable(np.array([0, 1, 0], np.uint8), np.array([0, 0, 1]),
    ...                 np.array([5, 6, 9]), np.array([0, 1, 2]))
    >>> polars_join(ev, "count:1,1", "bands:-3,-3;1,1", pairs=True).pairs.tolist()
    [[0, 0], [1, 0]]
"""

from __future__ import annotations

import math
import time

import numpy as np

from panjoin.baselines.duckdb_join import OfflineResult, fetch_pairs
from panjoin.semantics import I64_MAX, I64_MIN, Predicate, Window, parse_predicate, parse_window

PLANS = ("bucket", "iejoin")
_BATCH = 1 << 20  # rows per batch of fetched pairs


def check_threads(threads: int | None) -> None:
    """Raise unless Polars' thread pool has ``threads`` threads (None: no check)."""
    import polars as pl

    if threads is not None and pl.thread_pool_size() != threads:
        raise RuntimeError(
            f"Polars runs {pl.thread_pool_size()} threads, {threads} were asked for: Polars "
            f"reads POLARS_MAX_THREADS once, when it is imported; set POLARS_MAX_THREADS="
            f"{threads} before polars is first imported (panjoin bench peers does)")


def _int_edges(a: float, b: float) -> tuple[int | None, int | None]:
    """A band's edges on int keys: ``ceil(A)``, ``floor(B)``; None for an infinite edge."""
    return (None if math.isinf(a) else math.ceil(a)), (None if math.isinf(b) else math.floor(b))


def _plus(pl, col: str, c: int | None, lower: bool):
    """The bound ``col + c`` of a band's lower (``lower``) or upper edge on int64 ``col``,
    exact (in int128, where Polars' int64 would wrap): a sum beyond int64 is no bound
    (int64's extreme) on the side the edge opens to, and null (the band is empty for
    that tuple) on the other. ``c`` None: an infinite edge, no bound."""
    none = pl.lit(None, pl.Int64)
    edge = pl.lit(I64_MIN if lower else I64_MAX, pl.Int64)
    under, over = (edge, none) if lower else (none, edge)  # a sum below / above int64
    if c is None:
        return edge
    if abs(c) >= 1 << 64:  # every sum is beyond int64, on c's side
        return under if c < 0 else over
    v = pl.col(col).cast(pl.Int128) + pl.lit(c, pl.Int128)
    return pl.when(v < I64_MIN).then(under).when(v > I64_MAX).then(over) \
        .otherwise(v.cast(pl.Int64, strict=False))  # the branches are evaluated on every row


def _exact_edge(pl, xs: str, xr: str, edge: float, lower: bool):
    """``xs - xr >= edge`` (``lower``) or ``<= edge`` for float64 columns, exactly: the
    rounded difference d and its rounding error (TwoSum) decide a tie with the edge."""
    if math.isinf(edge):
        return pl.lit((edge < 0) == lower)
    a, b = pl.col(xs), -pl.col(xr)
    d = a + b
    bv = d - a
    err = (a - (d - bv)) + (b - bv)
    if lower:
        return (d > edge) | ((d == edge) & (err >= 0))
    return (d < edge) | ((d == edge) & (err <= 0))


class _Bands:
    """One band condition ``s.c - r.c in [A, B] or ...`` on column ``c`` (R's ``c``,
    S's ``c_s``): the per-R-tuple bounds ``c_lo{i}``, ``c_hi{i}`` (int: exact, see
    :func:`_plus`; float: the float sums, a superset) and the exact test of a pair."""

    def __init__(self, pl, col: str, bands, is_float: bool):
        self.pl, self.col, self.is_float = pl, col, is_float
        self.bands = [(a, b) if is_float else _int_edges(a, b) for a, b in bands]
        if not is_float:  # a band with no integer in it joins nothing
            self.bands = [(a, b) for a, b in self.bands if a is None or b is None or a <= b]

    def names(self, i: int) -> tuple[str, str]:
        return f"{self.col}_lo{i}", f"{self.col}_hi{i}"

    def bounds(self) -> list:
        pl, c, out = self.pl, self.col, []
        for i, (a, b) in enumerate(self.bands):
            lo, hi = self.names(i)
            if self.is_float:
                out += [(pl.col(c) + a).alias(lo), (pl.col(c) + b).alias(hi)]
            else:
                out += [_plus(pl, c, a, True).alias(lo), _plus(pl, c, b, False).alias(hi)]
        return out

    def test(self):
        """The exact condition on a pair: float, from the two columns (TwoSum); int,
        from the bounds columns."""
        pl, c, cs = self.pl, self.col, f"{self.col}_s"
        if not self.bands:
            return pl.lit(False)
        if self.is_float:
            terms = [_exact_edge(pl, cs, c, a, True) & _exact_edge(pl, cs, c, b, False)
                     for a, b in self.bands]
        else:
            terms = [(pl.col(cs) >= pl.col(lo)) & (pl.col(cs) <= pl.col(hi))
                     for lo, hi in map(self.names, range(len(self.bands)))]
        return pl.any_horizontal(terms) if len(terms) > 1 else terms[0]


def _live(pl, lf, window: Window):
    """Lazy R and S frames of the live tuples (S's columns suffixed ``_s``)."""
    is_s = pl.col("stream") == 1
    if window.kind == "count":
        pos = pl.int_range(pl.len(), dtype=pl.Int64)
        ns = is_s.cast(pl.Int64).cum_sum()
        lf = lf.with_columns(seq=pl.when(is_s).then(ns - 1).otherwise(pos - ns),
                             opp=pl.when(is_s).then(pos + 1 - ns).otherwise(ns)).drop("ts")
    else:
        prev = pl.col("ts").cum_max().shift(1)
        lf = lf.filter(prev.is_null() | (pl.col("ts") >= prev - window.lateness))
    r = lf.filter(~is_s).drop("stream")
    s = lf.filter(is_s).drop("stream")
    return r, s.rename(lambda c: f"{c}_s")


def _window(pl, window: Window) -> list:
    """The window's two conditions on a pair."""
    if window.kind == "count":
        return [pl.col("seq_s") >= pl.col("opp") - window.s,
                pl.col("seq") >= pl.col("opp_s") - window.r]
    return [pl.col("ts_s") > pl.col("ts") - window.s, pl.col("ts_s") < pl.col("ts") + window.r]


def _expand(pl, r, s, start, end):
    """Every (R row, S row) pair with the S row's position in R's range ``[start, end)``
    (Series, one value per R row), as one DataFrame."""
    x = r.with_columns(_i=pl.int_ranges(start, end, dtype=pl.get_index_type())).explode("_i")
    return pl.concat([x.drop("_i"), s[x.get_column("_i")]], how="horizontal")


def _window_range(pl, r, s, window: Window):
    """``ne``'s candidates: each R tuple with the S tuples of its window (a range of S in
    arrival order, or sorted by ts)."""
    if window.kind == "count":
        # s.seq >= r.opp - WS; s.opp <= r.seq + WR, and s.opp grows with s.seq
        end = s.get_column("opp_s").search_sorted(r.get_column("seq") + window.r, "right")
        start = (r.get_column("opp") - window.s).clip(0, len(s))
        return _expand(pl, r, s, start, end.clip(start))
    s = s.sort("ts_s")
    ts = s.get_column("ts_s")
    start = ts.search_sorted(r.get_column("ts") - window.s, "right")
    end = ts.search_sorted(r.get_column("ts") + window.r, "left")
    return _expand(pl, r, s, start, end.clip(start))


def _bucket(pl, r, s, bands: _Bands):
    """The band's candidates by DuckDB's rewrite: buckets of width w (the widest band
    + 1, at least 2 so that the last bucket + 1 stays in int64), a hash join on the
    bucket; a superset."""
    w = max(2, max(hi - lo for lo, hi in bands.bands) + 1)
    reach = []
    for lo, hi in (map(pl.col, bands.names(i)) for i in range(len(bands.bands))):
        empty = lo.is_null() | hi.is_null()  # the band is empty for that tuple
        reach.append(pl.int_ranges(pl.when(empty).then(0).otherwise(lo // w),
                                   pl.when(empty).then(0).otherwise(hi // w + 1)))
    reach = pl.concat_list(reach).list.unique() if len(reach) > 1 else reach[0]
    r = r.with_columns(bands.bounds()).with_columns(_b=reach).explode("_b")
    s = s.with_columns(_b=pl.col("key_s") // w)
    return r.join(s, on="_b").drop("_b")


def _iejoin(pl, r, s, bands: _Bands, conds: list):
    """The band's pairs that pass ``conds`` (the window, the residual), by ``join_where``
    (Polars' IEJoin), one join per band: exactly the pairs with ``lo <= s.key <= hi``
    (int keys) that pass ``conds``.

    Polars 2.1 runs the IEJoin on the *last two* inequalities it is given and filters
    by the others, so the band's come last and every other condition goes into the
    join: a filter after the join would be appended to the join's predicates by the
    optimiser (over time windows the IEJoin then ran on ``ts``, O(N W) candidates: 11 s
    instead of 0.07 at W = 16K)."""
    r = r.with_columns(bands.bounds())
    parts = [r.join_where(s, *conds, pl.col("key_s") >= pl.col(lo), pl.col("key_s") <= pl.col(hi))
             for lo, hi in map(bands.names, range(len(bands.bands)))]
    return pl.concat(parts) if parts else pl.concat([r.head(0), s.head(0)], how="horizontal")


def _plan(bands: _Bands | None, plan: str) -> str:
    """The plan that runs: ``bucket`` needs int keys and finite bands (else ``iejoin``)."""
    if plan not in PLANS:
        raise ValueError(f"plan {plan!r}: use one of {', '.join(PLANS)}")
    if plan == "bucket" and bands is not None and (bands.is_float or not bands.bands or any(
            a is None or b is None or b - a >= 1 << 62 for a, b in bands.bands)):
        return "iejoin"
    return plan


def join_frame(df, window: Window, pred: Predicate, plan: str = "bucket",
               residual: dict | None = None):
    """The (r_id, s_id) pairs of an events DataFrame (stream, id, key, ts and the
    residual columns, in arrival order) as a Polars DataFrame. See the module's
    docstring for the plans."""
    import polars as pl

    lf = df.lazy()
    is_float = df.schema["key"].is_float()
    if is_float:
        lf = lf.with_columns(pl.col("key") + 0.0)  # -0.0 -> 0.0
    r, s = _live(pl, lf, window)
    # the residual bands' bounds once per R tuple, their test on each candidate pair
    res = [_Bands(pl, c, [band], df.schema[c].is_float()) for c, band in (residual or {}).items()]
    r = r.with_columns([e for x in res for e in x.bounds()])
    bands = None if pred.kind in ("eq", "ne") else _Bands(pl, "key", pred.bands, is_float)
    plan = _plan(bands, plan)
    conds = [x.test() for x in res]
    if pred.kind == "eq":
        pairs = r.join(s, left_on="key", right_on="key_s", coalesce=False)
        conds += _window(pl, window)
    elif pred.kind == "ne":
        r, s = pl.collect_all([r, s])  # binary searches of R's values in S: eager
        pairs = _window_range(pl, r, s, window).lazy()
        conds.append(pl.col("key_s") != pl.col("key"))
    elif plan == "bucket":
        pairs = _bucket(pl, r, s, bands)
        conds += [*_window(pl, window), bands.test()]
    else:
        exact = [bands.test()] if is_float else []
        pairs, conds = _iejoin(pl, r, s, bands, conds + exact + _window(pl, window)), []
    if conds:
        pairs = pairs.filter(*conds)
    return pairs.select(r_id="id", s_id="id_s").collect()


def polars_join(events, window, predicate, *, allowed_lateness: int = 0, pairs: bool = False,
                threads: int | None = None, plan: str = "bucket", residual: dict | None = None,
                extra: dict | None = None, on_pairs=None) -> OfflineResult:
    """Join a whole :class:`~panjoin.events.EventTable` in Polars: the count, its seconds
    (the join and the fetch of its pairs; the DataFrame is built before), and the
    sorted pairs with ``pairs=True``. ``on_pairs(r_ids, s_ids)`` is handed every pair,
    in batches of up to 1M, inside the timed span (as a streaming peer materialises
    its result). ``residual={"y": (A, B)}`` adds ``A <= s.y - r.y <= B`` on the column
    ``extra["y"]`` (one value per event). ``threads``: the thread pool's size, checked
    (:func:`check_threads`)."""
    import polars as pl

    check_threads(threads)
    w = parse_window(window, allowed_lateness)
    p = parse_predicate(predicate)
    if p.residual is not None:
        raise ValueError(f"the Polars peer has no residual (key2) condition: {p}; "
                         "pass the column as residual= and extra=")
    df = pl.DataFrame({"stream": events.stream.astype(np.int8), "id": events.id,
                       "key": events.key, "ts": events.ts,
                       **{c: np.asarray((extra or {})[c]) for c in (residual or {})}})
    t0 = time.perf_counter()
    out = join_frame(df, w, p, plan, residual)
    batches = out.to_arrow().to_batches(_BATCH)
    return fetch_pairs(batches, t0, pairs, on_pairs)
