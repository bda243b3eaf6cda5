"""DuckDB's offline join of a whole event file: the batch engine's time for the same result.

The event table is handed to DuckDB as an Arrow table with its arrival
position ``pos``; the DESIGN section 2 window becomes SQL:

- count windows: per-stream arrival numbers ``seq = row_number() OVER
  (PARTITION BY stream ORDER BY pos) - 1`` and ``opp = pos - seq`` (arrivals of
  the other stream before the tuple); a pair qualifies iff
  ``s.seq >= r.opp - WS AND r.seq >= s.opp - WR`` (the same conjunction as the
  symmetric hash join's filter; see :mod:`panjoin.baselines.symmetric_hash_join`);
- time windows: late tuples are removed first, with the running maximum of the
  earlier ts as a window function, then ``s.ts > r.ts - TS AND s.ts < r.ts + TR``;
- predicates: ``eq`` is ``s.key = r.key``; ``band``/``bands`` are ranges
  ``s.key BETWEEN r.key + A AND r.key + B`` (OR-ed for several bands); ``ne`` is
  ``s.key <> r.key``. Bands are written as ``r.key + A`` so DuckDB can plan a
  range join (IEJoin / piecewise merge join): keys plus band edges must stay
  inside int64 (DuckDB raises on overflow), and float keys are compared in
  float arithmetic, which may differ from the exact semantics at a band's edge.

Example::

    >>> import numpy as np
    >>> from panjoin.events import EventTable
    >>> ev = EventTable(np.array([0, 1, 0], np.uint8), np.array([0, 0, 1]),
    ...                 np.array([5, 6, 9]), np.array([0, 1, 2]))
    >>> duckdb_join(ev, "count:1,1", "band:1", pairs=True).pairs.tolist()
    [[0, 0]]
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from panjoin.reference import sort_pairs
from panjoin.semantics import Predicate, Window, parse_predicate, parse_window


@dataclass
class OfflineResult:
    """What an offline join hands back (DuckDB's here, Polars' and DataFusion's too)."""

    count: int
    seconds: float  # the query and the fetch of its result (the table is already registered)
    pairs: np.ndarray | None = None


DuckDBResult = OfflineResult


def fetch_pairs(batches, t0: float, pairs: bool = False, on_pairs=None) -> OfflineResult:
    """Fetch an offline join's result, Arrow batches of (r_id, s_id), and time it from
    ``t0`` (the query's start): each batch goes to ``on_pairs(r_ids, s_ids)`` and is
    dropped after counting, or, with ``pairs=True``, is kept and returned sorted (the
    sort not timed)."""
    n, kept = 0, []
    for b in batches:
        r, s = b.column("r_id").to_numpy(), b.column("s_id").to_numpy()
        n += len(r)
        if on_pairs is not None:
            on_pairs(r, s)
        if pairs:
            kept.append(np.stack([r, s], axis=1))
    dt = time.perf_counter() - t0
    if not pairs:
        return OfflineResult(n, dt)
    got = np.concatenate(kept) if kept else np.zeros((0, 2), np.int64)
    return OfflineResult(n, dt, sort_pairs(got))


def _lit(x) -> str:
    if float(x).is_integer():
        return str(int(x))
    return repr(float(x))


def _bucket(x: str, w: int, div: str = "//") -> str:
    """floor(x / w) in exact integer arithmetic (``%`` keeps the dividend's sign in SQL;
    ``div``: the dialect's integer division, exact here as the dividend is a multiple of w)."""
    return f"(({x}) - ((({x}) % {w}) + {w}) % {w}) {div} {w}"


def _exact_band(c: str, a: float, b: float) -> str:
    """``A <= s.c - r.c <= B`` for float columns, exactly: ``d = s.c - r.c`` rounded and
    its rounding error ``err`` (Knuth's TwoSum on s.c + (-r.c)) decide a tie with an edge:
    ``d > A OR (d = A AND err >= 0)``. (Rounding is monotone, so ``s.c >= r.c + A`` in
    float arithmetic is a superset, and this test drops its extra pairs at the edge.)"""
    d = f"(s.{c} - r.{c})"
    bv = f"({d} - s.{c})"
    err = f"((s.{c} - ({d} - {bv})) + ((-r.{c}) - {bv}))"
    out = []
    if not math.isinf(a):
        out.append(f"({d} > {_lit(a)} OR ({d} = {_lit(a)} AND {err} >= 0))")
    if not math.isinf(b):
        out.append(f"({d} < {_lit(b)} OR ({d} = {_lit(b)} AND {err} <= 0))")
    return "(" + (" AND ".join(out) or "TRUE") + ")"


DIALECTS = {"duckdb": "//", "datafusion": "/"}  # the integer division of each


def join_sql(window: Window, pred: Predicate, pairs: bool, plan: str = "bucket",
             residual: dict | None = None, dialect: str = "duckdb", exact: tuple = ()) -> str:
    """The SQL for a window and predicate over a registered table ``events``.

    ``plan="range"`` states the band as two inequalities and lets DuckDB pick a
    range join; DuckDB 2.0 picks a piecewise merge join that sorts on one
    condition and tests the other three per candidate, about half the cross
    product (O(N^2)). ``plan="bucket"`` (integer keys, band predicates) adds the
    usual hand rewrite of a band join into an equi join: keys fall into buckets
    of the widest band's width w + 1, each R tuple lists the one or two buckets
    its bands reach (``unnest``), and a hash join on the bucket feeds the exact
    band and window conditions.

    ``residual={"y": (A, B)}`` carries the extra column ``y`` of the events table
    and adds ``s.y >= r.y + A AND s.y <= r.y + B`` (a 2-D band join's second band).

    ``dialect``: "duckdb" or "datafusion" (which has no ``//``: its ``/`` divides
    integers). ``exact``: float columns (``"key"``, residual columns) whose bands are
    also tested exactly at their edges (:func:`_exact_band`).
    """
    if plan not in ("range", "bucket"):
        raise ValueError(f"plan {plan!r}: use 'bucket' or 'range'")
    if dialect not in DIALECTS:
        raise ValueError(f"dialect {dialect!r}: use one of {', '.join(DIALECTS)}")
    div = DIALECTS[dialect]
    residual = dict(residual or {})
    xc = "".join(f", {c}" for c in residual)
    if window.kind == "count":
        numbered = (f"SELECT stream, id, key, ts{xc}, row_number() OVER (PARTITION BY stream "
                    "ORDER BY pos) - 1 AS seq, pos FROM events")
        live = f"SELECT stream, id, key{xc}, seq, pos - seq AS opp FROM ({numbered})"
        win = f"s.seq >= r.opp - {window.s} AND r.seq >= s.opp - {window.r}"
    else:
        prev = (f"SELECT stream, id, key, ts{xc}, max(ts) OVER (ORDER BY pos ROWS BETWEEN "
                "UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev FROM events")
        live = (f"SELECT stream, id, key, ts{xc} FROM ({prev}) "
                f"WHERE prev IS NULL OR NOT (ts < prev - {window.lateness})")
        win = f"s.ts > r.ts - {window.s} AND s.ts < r.ts + {window.r}"
    for c, (a, b) in residual.items():
        win += f" AND s.{c} >= r.{c} + {_lit(a)} AND s.{c} <= r.{c} + {_lit(b)}"
        if c in exact:
            win += f" AND {_exact_band(c, a, b)}"
    if "key" in exact and pred.kind not in ("eq", "ne"):
        win += " AND (" + " OR ".join(_exact_band("key", a, b) for a, b in pred.bands) + ")"
    rsrc = "r"
    if pred.kind == "eq":
        on = "s.key = r.key"
    elif pred.kind == "ne":
        on = "s.key <> r.key"
    else:
        on = " OR ".join(f"(s.key >= r.key + {_lit(a)} AND s.key <= r.key + {_lit(b)})"
                         for a, b in pred.bands)
        on = f"({on})" if len(pred.bands) > 1 else on
        if plan == "bucket":
            w = int(max(b - a for a, b in pred.bands)) + 1
            reach = ", ".join(f"range({_bucket(f'key + {_lit(math.ceil(a))}', w, div)}, "
                              f"{_bucket(f'key + {_lit(math.floor(b))}', w, div)} + 1)"
                              for a, b in pred.bands)
            rsrc = (f"(SELECT *, unnest(list_distinct(flatten([{reach}]))) AS bucket "
                    f"FROM r) AS r")
            on = f"{_bucket('s.key', w, div)} = r.bucket AND {on}"
    what = "r.id AS r_id, s.id AS s_id" if pairs else "count(*) AS n"
    return (f"WITH live AS ({live}), r AS (SELECT * FROM live WHERE stream = 0), "
            f"s AS (SELECT * FROM live WHERE stream = 1) "
            f"SELECT {what} FROM {rsrc} JOIN s ON {on} AND {win}")


def duckdb_join(events, window, predicate, *, allowed_lateness: int = 0, pairs: bool = False,
                threads: int | None = None, con=None, plan: str = "bucket",
                residual: dict | None = None, extra: dict | None = None,
                stream_pairs: bool = False, on_pairs=None) -> OfflineResult:
    """Join a whole :class:`~panjoin.events.EventTable` in DuckDB; the count (and the
    pairs with ``pairs=True``) and the query's wall time. Float keys always use the
    range plan (bucketing doubles would need the exact-edge care of probe_bounds).
    ``residual`` (see :func:`join_sql`) names extra columns given in ``extra``
    (one value per event). ``stream_pairs=True`` counts by fetching every (r_id, s_id)
    pair in Arrow batches of 1M rows (each dropped after counting), so the query
    materialises its result as a streaming join does, rather than only count(*);
    ``on_pairs(r_ids, s_ids)`` (implies ``stream_pairs``) is handed each batch, inside
    the timed span."""
    import duckdb

    w = parse_window(window, allowed_lateness)
    p = parse_predicate(predicate)
    if p.residual is not None:
        raise ValueError(f"the DuckDB peer has no residual (key2) condition: {p}; "
                         "use the engine, or drop the '&...2' part")
    own = con is None
    con = duckdb.connect() if own else con
    try:
        if threads:
            con.execute(f"SET threads TO {int(threads)}")
        table = pa.table({"pos": np.arange(len(events), dtype=np.int64),
                          "stream": events.stream.astype(np.int8), "id": events.id,
                          "key": events.key, "ts": events.ts,
                          **{c: np.asarray((extra or {})[c]) for c in (residual or {})}})
        con.register("events", table)
        plan = "range" if events.key.dtype == np.float64 else plan
        if pairs or stream_pairs or on_pairs is not None:
            sql = join_sql(w, p, True, plan, residual)
            t0 = time.perf_counter()
            return fetch_pairs(con.sql(sql).to_arrow_reader(1 << 20), t0, pairs, on_pairs)
        sql = join_sql(w, p, False, plan, residual)
        t0 = time.perf_counter()
        n = con.sql(sql).fetchall()[0][0]
        return OfflineResult(int(n), time.perf_counter() - t0)
    finally:
        con.unregister("events")
        if own:
            con.close()
