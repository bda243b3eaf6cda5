"""DataFusion's offline join of a whole event file: the same SQL as DuckDB's, in DataFusion.

The query is :func:`panjoin.baselines.duckdb_join.join_sql` in its ``datafusion``
dialect (DataFusion has no ``//``; its ``/`` divides integers, exact where the SQL
divides), over the events registered as an Arrow table with their arrival position
``pos``: count windows by per-stream arrival numbers (``row_number()``), time windows
with the late tuples removed by a running maximum, bands as ``s.key BETWEEN r.key + A
AND r.key + B`` (OR-ed), and ``plan="bucket"`` (the default) rewriting a band join on
int keys into a hash join on buckets of the widest band's width. DataFusion has no
range join for a band (its ``plan="range"`` is a nested loop join, O(N^2)); float
keys always take it, as in DuckDB.

Where DataFusion differs from DuckDB, this module makes it exact:

- int64 sums wrap silently in DataFusion (DuckDB raises): :func:`check_int64` raises
  a clear error before the query where a sum in the SQL (``r.key + A``, a bucket's
  floor, ``r.ts + TR``, ``r.y + A``) would leave int64;
- a fractional band edge on int keys (or an int residual column) would be added as a
  float (inexact beyond 2**53): the bands become ``[ceil(A), floor(B)]`` first, the
  same pairs on ints;
- float keys: ``r.key + A`` rounds, so every band's edges are also tested exactly
  (``exact=`` of ``join_sql``: TwoSum), and keys are normalised by ``+ 0.0`` in a view
  (DataFusion's hash join tells -0.0 from 0.0).

Threads: ``SessionConfig.with_target_partitions(threads)``; the result is fetched as
Arrow batches from ``execute_stream``.

Example: a time window, the third tuple late (ts 3 is below the 12 seen before it, and
the allowed lateness is 0): it joins nothing, though its key equals s0's::

    >>> from panjoin.events import EventTable
    >>> ev = EventTable(np.array([0, 1, 0], np.uint8), np.array([0, 0, 1]),
    ...                 np.array([5, 6, 6]), np.array([10, 12, 3]))
    >>> datafusion_join(ev, "time:5,5", "band:1", pairs=True).pairs.tolist()
    [[0, 0]]
"""

from __future__ import annotations

import math
import time

import numpy as np
import pyarrow as pa

from panjoin.baselines.duckdb_join import OfflineResult, fetch_pairs, join_sql
from panjoin.semantics import I64_MAX, I64_MIN, Predicate, Window, parse_predicate, parse_window


def int_bands(pred: Predicate) -> Predicate:
    """The bands of ``pred`` on int keys: ``[ceil(A), floor(B)]``, those holding no
    integer dropped (none left: the empty band [1, 0])."""
    bands = tuple((math.ceil(a), math.floor(b)) for a, b in pred.bands
                  if math.ceil(a) <= math.floor(b))
    return Predicate(pred.kind, bands or ((1, 0),))


def check_int64(events, window: Window, pred: Predicate, plan: str,
                residual: dict | None = None, extra: dict | None = None) -> None:
    """Raise ValueError where a sum in :func:`join_sql` leaves int64 on these events
    (DataFusion would wrap it and join the wrong pairs)."""
    def check(what: str, values, lo_add: int, hi_add: int, w: int | None = None) -> None:
        if len(values) == 0:
            return
        lo, hi = int(values.min()) + lo_add, int(values.max()) + hi_add
        if w is not None and I64_MIN <= lo and hi <= I64_MAX:
            # a bucket's floor, x - ((x % w) + w) % w, and the last bucket + 1
            lo, hi = lo // w * w, max(hi, hi // w + 1)
        if lo < I64_MIN or hi > I64_MAX:
            raise ValueError(f"{what} leave int64 (from {lo} to {hi}): DataFusion would wrap "
                             "them; use smaller keys or bands, or another peer")

    if events.key.dtype != np.float64 and pred.kind not in ("eq", "ne"):
        edges = [e for band in pred.bands for e in band]
        w = max(b - a for a, b in pred.bands) + 1 if plan == "bucket" else None
        check("r.key + the band edges" + (" and their buckets" if w else ""), events.key,
              min(edges), max(edges), w)
        if w is not None:
            check("the buckets of s.key", events.key, 0, 0, w)
    if window.kind == "time":
        check("r.ts - TS, r.ts + TR and ts - L", events.ts, -max(window.s, window.lateness),
              window.r)
    for c, (a, b) in (residual or {}).items():
        v = np.asarray((extra or {})[c])
        if v.dtype.kind in "iu":
            check(f"r.{c} + the band edges", v, math.ceil(a), math.floor(b))


def datafusion_join(events, window, predicate, *, allowed_lateness: int = 0,
                    pairs: bool = False, threads: int | None = None, plan: str = "bucket",
                    residual: dict | None = None, extra: dict | None = None,
                    on_pairs=None) -> OfflineResult:
    """Join a whole :class:`~panjoin.events.EventTable` in DataFusion: the count, its
    seconds (planning, the query and the fetch of its pairs; the table is registered
    before), and the sorted pairs with ``pairs=True``. ``on_pairs(r_ids, s_ids)`` is
    handed every Arrow batch of pairs inside the timed span. ``residual={"y": (A, B)}``
    adds ``A <= s.y - r.y <= B`` on the column ``extra["y"]``. ``threads``: DataFusion's
    target partitions (None: its default, one per core)."""
    from datafusion import SessionConfig, SessionContext

    w = parse_window(window, allowed_lateness)
    p = parse_predicate(predicate)
    if p.residual is not None:
        raise ValueError(f"the DataFusion peer has no residual (key2) condition: {p}; "
                         "pass the column as residual= and extra=")
    residual = dict(residual or {})
    if any(math.isinf(e) for band in [*p.bands, *residual.values()] for e in band):
        raise ValueError(f"{p}: the SQL peers take finite band edges only")
    is_float = events.key.dtype == np.float64
    if not is_float and p.kind not in ("eq", "ne"):
        p = int_bands(p)
    if is_float or any(a > b for a, b in p.bands):  # float keys, or the empty band [1, 0]
        plan = "range"
    cols = {c: np.asarray((extra or {})[c]) for c in residual}
    # an int column's band as int edges, like the key's (a float literal would make the
    # sum a float)
    residual = {c: (band if cols[c].dtype.kind == "f" else (math.ceil(band[0]),
                                                            math.floor(band[1])))
                for c, band in residual.items()}
    check_int64(events, w, p, plan, residual, extra)
    cfg = SessionConfig() if threads is None else \
        SessionConfig().with_target_partitions(int(threads))
    ctx = SessionContext(cfg)
    table = pa.record_batch({"pos": np.arange(len(events), dtype=np.int64),
                             "stream": events.stream.astype(np.int8), "id": events.id,
                             "key": events.key, "ts": events.ts, **cols})
    ctx.register_record_batches("raw" if is_float else "events", [[table]])
    if is_float:  # -0.0 -> 0.0, inside the query (a view)
        names = ", ".join("key + 0.0 AS key" if c == "key" else c for c in table.column_names)
        ctx.register_view("events", ctx.sql(f"SELECT {names} FROM raw"))
    exact = tuple(c for c in ("key", *residual)
                  if (is_float if c == "key" else cols[c].dtype.kind == "f"))
    sql = join_sql(w, p, True, plan, residual, dialect="datafusion", exact=exact)
    t0 = time.perf_counter()
    stream = ctx.sql(sql).execute_stream()
    return fetch_pairs((b.to_pyarrow() for b in stream), t0, pairs, on_pairs)
