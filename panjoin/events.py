"""Event files: the recorded, arrival-ordered input of a join (DESIGN section 2).

An event file is Parquet (``.parquet``/``.pq``) or CSV (``.csv``) with one row
per tuple, in ARRIVAL order, and these columns::

    stream   'R' or 'S' (case-sensitive)          which input stream the tuple belongs to
    id       int64, unique within its stream      what the result pairs name
    key      int64 or float64, finite             the join field
    ts       int64, milliseconds                  event time (time windows, lateness)
    payload  string or bytes, optional, nullable  opaque; the join never looks at it
    key2     float64, optional, finite            second attribute, for a residual condition
                                                  (e.g. predicate 'band:10&band2:10')

Other columns are ignored. In memory the same sequence is an :class:`EventTable`:
numpy columns (``stream`` as uint8, 0 = R, 1 = S) plus the payload as a pyarrow
array, so that ten million rows cost four flat arrays and no Python objects.

Reading validates everything and either returns a whole table or raises one
:class:`EventError` that names the file, the 1-based data row (the header is not
counted) and the problem, and says how to fix it. Each check is one vectorised
pass; the first offending row is found with numpy (``argmax`` of a mask), never
a Python loop over rows::

    file ──► suffix ──► pyarrow reader ──► column types ──► values ──► EventTable
             .parquet    (CSV: explicit    nulls, bool,     tags R/S,
             .pq .csv     types, never     strings, int     finite keys,
                          inferred; key    range, integral  unique ids
                          read as text)    floats           per stream

CSV columns get explicit types, never pyarrow's inference, which would silently
turn an int64 beyond 2**53 into a rounded double. ``id`` and ``ts`` are first
read as int64 by arrow's parallel reader (exact from -2**63 to 2**63 - 1, and
it rejects rather than rounds); if any of them is not a plain integer, every
column is read as text and parsed by us, which accepts integral floats
(``3.0``, ``1e3``, converted exactly), blanks and a leading ``+``, and finds
the first bad row. ``key`` is always read as text: int64 if every value is a
plain integer, float64 if any value has a decimal point, an exponent or a
nan/inf word. Numbers are cast in growing blocks, so a float column costs one
small failed int64 attempt, not a whole one. Writing CSV does the reverse:
float keys always carry a ``.`` or an exponent (``5.0``, not ``5``), so they
come back as float64, and the shortest round-trip digits keep every double
bit-exact.

Worked trace, a dozen rows of a CSV file with two mistakes (``r`` at data row 4,
and id 2 of R repeated at data row 9)::

    data row  stream id key   ts               data row  stream id key   ts
       1      R      0  17    1700000000000       7      S      3  -3    1700000000003
       2      S      0  17.5  1700000000000       8      R      3  9     1700000000004
       3      R      1  4     1700000000001       9      R      2  12    1700000000004
       4      r      2  8     1700000000001      10      S      4  1e3   1700000000005
       5      S      1  nan   1700000000002      11      R      4  6     1700000000005
       6      S      2  0     1700000000003      12      S      5  6     1700000000006

* types: ``id`` and ``ts`` cast to int64 at once. ``key`` does not: the first
  value int64 rejects is ``17.5`` (data row 2), which has a decimal point, so
  the column is float64 (``nan`` and ``1e3`` parse as floats too).
* stream tags: ``(stream == 'R') | (stream == 'S')`` is False at index 3 only, so
  the error is ``events.csv, data row 4: column 'stream' has 'r'; only 'R' and 'S'
  are allowed (tags are case-sensitive: write upper case); ...``. After fixing it:
* keys: ``isfinite(key)`` is False first at index 4: ``data row 5: column 'key'
  is NaN; keys must be finite numbers; ...``. After fixing that:
* ids: the R ids in arrival order are 0 1 2 3 2 4 (data rows 1 3 4 8 9 11), not
  increasing, so they are sorted (stable) and equal neighbours looked for: id 2
  at rows 4 and 9, so ``data row 9: id 2 of stream R repeats data row 4; ids
  must be unique within a stream; ...``. The S ids 0..5 rise: no sort needed.

Writes are atomic: the file is written to a temporary name in the same
directory and moved into place with ``os.replace``, so a reader sees either the
old file or the whole new one, and a failed write leaves nothing behind.

    >>> import numpy as np
    >>> t = EventTable(np.array([0, 1, 0], np.uint8), np.array([0, 0, 1]),
    ...                np.array([5, 7, 5]), np.array([10, 11, 12]))
    >>> t.counts()
    (2, 1)
    >>> t.to_arrow().column("stream").to_pylist()
    ['R', 'S', 'R']
"""

from __future__ import annotations

import contextlib
import csv
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

REQUIRED = ("stream", "id", "key", "ts")
COLUMNS = REQUIRED + ("payload", "key2")
STREAM_TAGS = ("R", "S")
PARQUET_SUFFIXES = (".parquet", ".pq")
CSV_SUFFIXES = (".csv",)

_I64_MIN = np.iinfo(np.int64).min
_I64_MAX = np.iinfo(np.int64).max
# 2**63 as a double: every finite float in [-2**63, 2**63) converts to int64 exactly
_TWO63 = 9223372036854775808.0
# characters that make a CSV number a float: a decimal point, an exponent, nan/inf words
_FLOATY = "[.eEnNiI]"

_COLUMN_HELP = "an event file needs columns stream, id, key, ts (and optionally payload)"
_EMPTY_FIX = "every event needs stream, id, key and ts; fill it in or drop the row"


class EventError(ValueError):
    """A bad event file or table. The message names the file, the 1-based data row
    (header not counted) and the problem, and says how to fix it; ``source``,
    ``row`` and ``column`` hold the same facts for programs (None where they do not
    apply, e.g. a missing file)."""

    def __init__(self, message: str, *, source=None, row=None, column=None):
        super().__init__(message)
        self.source = source
        self.row = row
        self.column = column


def _fail(source, problem: str, fix: str = "", *, row=None, column=None) -> EventError:
    where = f"{source}" if row is None else f"{source}, data row {row}"
    msg = f"{where}: {problem}"
    if fix:
        msg += f"; {fix}"
    return EventError(msg, source=str(source), row=row, column=column)


def _show(value) -> str:
    """A value as it appears in a message: repr, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _first(mask: np.ndarray) -> int | None:
    """Index of the first True in a bool mask, or None: one vectorised pass."""
    if mask.size == 0:
        return None
    i = int(np.argmax(mask))
    return i if mask[i] else None


def _np(arr) -> np.ndarray:
    """A null-free pyarrow (chunked) array as numpy: a read-only view of a single
    chunk, or one concatenating copy of many (never combine, then copy again)."""
    if isinstance(arr, pa.ChunkedArray):
        if arr.num_chunks != 1:
            parts = [c.to_numpy(zero_copy_only=False) for c in arr.chunks]
            if not parts:
                return np.zeros(0, dtype=arr.type.to_pandas_dtype())
            return np.concatenate(parts)
        arr = arr.chunk(0)
    return arr.to_numpy(zero_copy_only=False)


def _combine(arr) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        if arr.num_chunks == 1:
            return arr.chunk(0)
        if arr.num_chunks == 0:
            return pa.array([], type=arr.type)
        try:
            return arr.combine_chunks()
        except pa.ArrowInvalid:  # > 2 GiB of strings: 32-bit offsets overflow
            big = pa.large_binary() if pa.types.is_binary(arr.type) else pa.large_string()
            return arr.cast(big).combine_chunks()
    return arr


def _as_int64(name: str, a) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 1:
        raise ValueError(f"EventTable.{name} must be 1-D, got shape {a.shape}")
    if a.dtype == np.int64:
        return a
    if a.dtype.kind == "u" and a.size and a.max() > _I64_MAX:
        raise ValueError(f"EventTable.{name} has values above the int64 range")
    if a.dtype.kind in "iu":
        return a.astype(np.int64)
    if a.size == 0:
        return a.astype(np.int64)
    raise TypeError(f"EventTable.{name} must hold integers, got dtype {a.dtype}")


# --------------------------------------------------------------------------- the table


@dataclass(eq=False)
class EventTable:
    """An arrival-ordered event sequence: row i is the i-th tuple to arrive.

    Construction is cheap (dtype coercion and a length check only);
    :meth:`validate` runs the value checks, and :meth:`from_arrow` /
    :func:`read_events` always do.
    """

    stream: np.ndarray  # uint8, 0 = R, 1 = S
    id: np.ndarray  # int64
    key: np.ndarray  # int64 or float64
    ts: np.ndarray  # int64, ms
    payload: pa.Array | None = None  # string/binary, or None
    #: float64 second attribute for a residual condition (``band:10&band2:10``), or None
    key2: np.ndarray | None = None

    def __post_init__(self):
        s = np.asarray(self.stream)
        if s.ndim != 1:
            raise ValueError(f"EventTable.stream must be 1-D, got shape {s.shape}")
        if s.dtype != np.uint8:
            if s.dtype.kind not in "biu" and s.size:
                raise TypeError(f"EventTable.stream must hold 0 (R) / 1 (S), got dtype {s.dtype}")
            s = s.astype(np.uint8)
        self.stream = s
        self.id = _as_int64("id", self.id)
        self.ts = _as_int64("ts", self.ts)
        k = np.asarray(self.key)
        if k.ndim != 1:
            raise ValueError(f"EventTable.key must be 1-D, got shape {k.shape}")
        if k.dtype.kind == "f":
            k = k.astype(np.float64, copy=False)
        elif k.dtype.kind in "iu" or k.size == 0:
            k = _as_int64("key", k)
        else:
            raise TypeError(f"EventTable.key must be int64 or float64, got dtype {k.dtype}")
        self.key = k
        if self.key2 is not None:
            k2 = np.asarray(self.key2)
            if k2.ndim != 1:
                raise ValueError(f"EventTable.key2 must be 1-D, got shape {k2.shape}")
            if k2.dtype.kind not in "fiu" and k2.size:
                raise TypeError(f"EventTable.key2 must hold numbers, got dtype {k2.dtype}")
            self.key2 = k2.astype(np.float64, copy=False)
        if self.payload is not None:
            p = self.payload
            if isinstance(p, pa.ChunkedArray):
                p = _combine(p)
            elif not isinstance(p, pa.Array):
                p = pa.array(p)
            self.payload = p
        n = len(self.stream)
        lengths = {
            "stream": n,
            "id": len(self.id),
            "key": len(self.key),
            "ts": len(self.ts),
        }
        if self.payload is not None:
            lengths["payload"] = len(self.payload)
        if self.key2 is not None:
            lengths["key2"] = len(self.key2)
        if len(set(lengths.values())) != 1:
            raise ValueError(f"EventTable columns differ in length: {lengths}")

    def __len__(self) -> int:
        return len(self.stream)

    @property
    def key_dtype(self) -> np.dtype:
        return self.key.dtype

    def slice(self, start: int, stop: int) -> EventTable:
        """Rows ``start:stop`` (Python slice rules), as views: O(1)."""
        start, stop, _ = slice(start, stop).indices(len(self))
        stop = max(start, stop)
        payload = None if self.payload is None else self.payload.slice(start, stop - start)
        return EventTable(
            self.stream[start:stop],
            self.id[start:stop],
            self.key[start:stop],
            self.ts[start:stop],
            payload,
            None if self.key2 is None else self.key2[start:stop],
        )

    def take(self, idx: np.ndarray) -> EventTable:
        """Rows at the positions ``idx`` (or where a bool mask is True), in that order."""
        idx = np.asarray(idx)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        idx = idx.astype(np.int64, copy=False)
        payload = None if self.payload is None else self.payload.take(pa.array(idx))
        return EventTable(self.stream[idx], self.id[idx], self.key[idx], self.ts[idx], payload,
                          None if self.key2 is None else self.key2[idx])

    def counts(self) -> tuple[int, int]:
        """``(#R, #S)``."""
        s = int(np.count_nonzero(self.stream))
        return len(self) - s, s

    @classmethod
    def concat(cls, tables: list[EventTable]) -> EventTable:
        """Tables one after the other (arrival order kept); payloads all or none."""
        if not tables:
            raise ValueError("EventTable.concat needs at least one table")
        with_payload = [t.payload is not None for t in tables]
        if any(with_payload) and not all(with_payload):
            raise ValueError("EventTable.concat: some tables have a payload and some do not")
        payload = None
        if all(with_payload):
            payload = _combine(pa.chunked_array([t.payload for t in tables]))
        with_key2 = [t.key2 is not None for t in tables]
        if any(with_key2) and not all(with_key2):
            raise ValueError("EventTable.concat: some tables have a key2 and some do not")
        return cls(
            np.concatenate([t.stream for t in tables]),
            np.concatenate([t.id for t in tables]),
            np.concatenate([t.key for t in tables]),
            np.concatenate([t.ts for t in tables]),
            payload,
            np.concatenate([t.key2 for t in tables]) if all(with_key2) else None,
        )

    def equals(self, other: EventTable) -> bool:
        """Same rows, same dtypes, same payload (float keys compared bit for bit)."""
        if len(self) != len(other) or self.key.dtype != other.key.dtype:
            return False
        same = (
            np.array_equal(self.stream, other.stream)
            and np.array_equal(self.id, other.id)
            and np.array_equal(self.ts, other.ts)
            and np.array_equal(self.key.view(np.int64), other.key.view(np.int64))
        )
        if not same or (self.payload is None) != (other.payload is None):
            return False
        if (self.key2 is None) != (other.key2 is None) or (
                self.key2 is not None
                and not np.array_equal(self.key2.view(np.int64), other.key2.view(np.int64))):
            return False
        return self.payload is None or self.payload.equals(other.payload)

    def to_arrow(self) -> pa.Table:
        """Columns stream ('R'/'S' strings), id, key, ts[, payload]."""
        tags = pc.take(pa.array(STREAM_TAGS), pa.array(self.stream))
        cols = {
            "stream": tags,
            "id": pa.array(self.id),
            "key": pa.array(self.key),
            "ts": pa.array(self.ts),
        }
        if self.payload is not None:
            cols["payload"] = self.payload
        if self.key2 is not None:
            cols["key2"] = pa.array(self.key2)
        return pa.table(cols)

    @classmethod
    def from_arrow(cls, table: pa.Table, source: str = "<table>") -> EventTable:
        """Convert and validate an Arrow table; raises :class:`EventError`."""
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if not isinstance(table, pa.Table):
            raise TypeError(f"from_arrow needs a pyarrow Table, got {type(table).__name__}")
        names = table.column_names
        _check_columns(names, source)
        # numbers stay chunked until numpy (one copy); stream too, as each chunk
        # may carry its own dictionary
        cols = {c: table.column(c) for c in COLUMNS if c in names}
        _check_nulls(cols, source)
        stream = _stream_codes(cols["stream"], source)
        ids = _int_column(cols["id"], "id", source)
        key = _key_column(cols["key"], source)
        ts = _int_column(cols["ts"], "ts", source)
        payload = None
        if "payload" in cols:
            payload = _payload_column(cols["payload"], source)
        key2 = None
        if "key2" in cols:
            key2 = np.require(_key2_column(cols["key2"], source), requirements="W")
        # arrow hands out read-only views; callers may sort or edit in place
        ids, key, ts = (np.require(a, requirements="W") for a in (ids, key, ts))
        out = cls(stream, ids, key, ts, payload, key2)
        out.validate(source)
        return out

    def validate(self, source: str = "<table>") -> None:
        """Value checks on the numpy columns: stream codes 0/1, finite keys, ids
        unique per stream. Raises :class:`EventError` naming the first bad row."""
        bad = _first(self.stream > 1)
        if bad is not None:
            raise _fail(
                source,
                f"stream code {int(self.stream[bad])}; codes are 0 (R) and 1 (S)",
                "use 0 for R and 1 for S",
                row=bad + 1,
                column="stream",
            )
        if self.key.dtype.kind == "f":
            bad = _first(~np.isfinite(self.key))
            if bad is not None:
                v = self.key[bad]
                what = "NaN" if np.isnan(v) else ("+inf" if v > 0 else "-inf")
                raise _fail(
                    source,
                    f"column 'key' is {what}",
                    "keys must be finite numbers; fix or drop the row",
                    row=bad + 1,
                    column="key",
                )
        if self.key2 is not None:
            bad = _first(~np.isfinite(self.key2))
            if bad is not None:
                raise _fail(source, f"column 'key2' is {self.key2[bad]}",
                            "key2 values must be finite numbers; fix or drop the row",
                            row=bad + 1, column="key2")
        _check_unique_ids(self.stream, self.id, source)


# --------------------------------------------------------------------------- column checks


def _check_columns(names: list[str], source) -> None:
    """Every required column present, none of ours twice."""
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        raise _fail(
            source,
            f"missing column{'s' if len(missing) > 1 else ''} "
            + ", ".join(repr(c) for c in missing),
            f"{_COLUMN_HELP}; found {', '.join(repr(c) for c in names) or 'no columns'}",
            column=missing[0],
        )
    dup = sorted({c for c in names if c in COLUMNS and names.count(c) > 1})
    if dup:
        raise _fail(
            source, f"column {dup[0]!r} appears more than once", "keep one of them", column=dup[0]
        )


def _check_nulls(cols: dict, source) -> None:
    """The earliest null in any required column."""
    best = None
    for c in REQUIRED:
        arr = cols[c]
        if arr.null_count:
            i = _first(_np(pc.is_null(arr)))
            if best is None or i < best[0]:
                best = (i, c)
    if best is not None:
        i, c = best
        raise _fail(
            source,
            f"column {c!r} is empty (null)",
            _EMPTY_FIX,
            row=i + 1,
            column=c,
        )


def _type_error(arr: pa.Array, name: str, source, want: str) -> EventError:
    """A column of the wrong type; the row is the first one, where it shows first."""
    sample = f" (e.g. {_show(arr[0].as_py())})" if len(arr) else ""
    return _fail(
        source,
        f"column {name!r} has type {arr.type}{sample}, but {name} must be {want}",
        f"write the {name} column as {want}",
        row=1 if len(arr) else None,
        column=name,
    )


def _decode(arr):
    if not pa.types.is_dictionary(arr.type):
        return arr
    if isinstance(arr, pa.ChunkedArray):
        return pa.chunked_array(
            [c.dictionary_decode() for c in arr.chunks], type=arr.type.value_type
        )
    return arr.dictionary_decode()


def _stream_codes(col, source) -> np.ndarray:
    """'R'/'S' tags to 0/1, chunk by chunk; a dictionary-encoded chunk (Parquet and
    our CSV reader give those) is checked on its few distinct values and mapped
    through a lookup table, instead of comparing ten million strings."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    out = np.empty(len(col), dtype=np.uint8)
    base = 0
    for ch in chunks:
        if pa.types.is_dictionary(ch.type):
            d = ch.dictionary
            if not (pa.types.is_string(d.type) or pa.types.is_large_string(d.type)):
                raise _type_error(
                    ch.dictionary_decode(), "stream", source, "the strings 'R' or 'S'"
                )
            lut = np.full(len(d), 2, dtype=np.uint8)  # 2 = neither R nor S
            lut[_np(pc.equal(d, "R"))] = 0
            lut[_np(pc.equal(d, "S"))] = 1
            codes = lut[_np(ch.indices)]
        elif pa.types.is_string(ch.type) or pa.types.is_large_string(ch.type):
            codes = np.where(_np(pc.equal(ch, "R")), 0, 2).astype(np.uint8)
            codes[_np(pc.equal(ch, "S"))] = 1
        else:
            raise _type_error(ch, "stream", source, "the strings 'R' or 'S'")
        bad = _first(codes == 2)
        if bad is not None:
            v = ch[bad].as_py()
            if v.strip() == "":
                raise _fail(
                    source,
                    "column 'stream' is empty (null)",
                    _EMPTY_FIX,
                    row=base + bad + 1,
                    column="stream",
                )
            hint = " (tags are case-sensitive: write upper case)" if v in ("r", "s") else ""
            raise _fail(
                source,
                f"column 'stream' has {_show(v)}; only 'R' and 'S' are allowed{hint}",
                "write R for the first stream and S for the second, or drop the row",
                row=base + bad + 1,
                column="stream",
            )
        out[base : base + len(ch)] = codes
        base += len(ch)
    return out


def _floats_to_int64(f: np.ndarray, name: str, source, rows: np.ndarray | None = None):
    """Integral, in-range doubles to int64 exactly; else the first bad row.
    ``rows`` maps positions in ``f`` to table rows (identity if None)."""
    bad = ~np.isfinite(f) | (f != np.floor(f)) | (f < -_TWO63) | (f >= _TWO63)
    i = _first(bad)
    if i is not None:
        v = float(f[i])
        if not np.isfinite(v):
            why = "is not finite"
        elif v != np.floor(v):
            why = "is not a whole number"
        else:
            why = "is outside the int64 range"
        unit = " of milliseconds" if name == "ts" else ""
        raise _fail(
            source,
            f"column {name!r} has {v!r}, which {why}",
            f"{name} must be an int64 (a whole number{unit})",
            row=(i if rows is None else int(rows[i])) + 1,
            column=name,
        )
    return f.astype(np.int64)


def _unsigned_to_int64(arr: pa.Array, name: str, source) -> np.ndarray:
    v = _np(arr)
    if v.dtype == np.uint64:
        i = _first(v > np.uint64(_I64_MAX))
        if i is not None:
            raise _fail(
                source,
                f"column {name!r} has {int(v[i])}, above the int64 maximum {_I64_MAX}",
                f"{name} must fit in int64",
                row=i + 1,
                column=name,
            )
    return v.astype(np.int64)


def _int_column(arr: pa.Array, name: str, source) -> np.ndarray:
    """id / ts: integers, integral floats, or (ts only) timestamps, to int64."""
    arr = _decode(arr)
    t = arr.type
    want = "int64" + (" (milliseconds)" if name == "ts" else "")
    if pa.types.is_signed_integer(t):
        return _np(arr).astype(np.int64, copy=False)
    if pa.types.is_unsigned_integer(t):
        return _unsigned_to_int64(arr, name, source)
    if pa.types.is_floating(t):
        return _floats_to_int64(_np(arr).astype(np.float64), name, source)
    if name == "ts" and pa.types.is_timestamp(t):
        per_ms = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}[t.unit]
        raw = _np(arr.cast(pa.int64()))
        if per_ms is None:  # seconds
            i = _first(np.abs(raw) > _I64_MAX // 1000)
            if i is not None:
                raise _fail(
                    source,
                    "timestamp out of the int64 millisecond range",
                    "ts must be int64 milliseconds",
                    row=i + 1,
                    column="ts",
                )
            return raw * 1000
        i = _first(raw % per_ms != 0)
        if i is not None:
            raise _fail(
                source,
                f"column 'ts' has {arr[i].as_py()}, which is not a whole millisecond",
                "ts is event time in int64 milliseconds; round it",
                row=i + 1,
                column="ts",
            )
        return raw // per_ms
    raise _type_error(arr, name, source, want)


def _key_column(arr: pa.Array, source) -> np.ndarray:
    arr = _decode(arr)
    t = arr.type
    if pa.types.is_signed_integer(t):
        return _np(arr).astype(np.int64, copy=False)
    if pa.types.is_unsigned_integer(t):
        return _unsigned_to_int64(arr, "key", source)
    if pa.types.is_floating(t):
        return _np(arr).astype(np.float64, copy=False)  # finiteness: validate()
    raise _type_error(arr, "key", source, "int64 or float64")


def _key2_column(arr, source) -> np.ndarray:
    """The optional key2 column as float64 (integers converted); nulls are an error."""
    if arr.null_count:
        i = _first(_np(pc.is_null(arr)))
        raise _fail(source, "column 'key2' is empty (null)",
                    "give every row a key2 or drop the column", row=i + 1, column="key2")
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        try:
            arr = pc.cast(arr, pa.float64())
        except pa.ArrowInvalid:
            raise _fail(source, "column 'key2' holds text that is not a number",
                        "key2 values must be numbers", column="key2") from None
        t = arr.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        raise _type_error(arr, "key2", source, "float64")
    return _np(pc.cast(arr, pa.float64()))


def _payload_column(arr, source) -> pa.Array:
    arr = _combine(_decode(arr))
    t = arr.type
    if any(
        f(t)
        for f in (
            pa.types.is_string,
            pa.types.is_large_string,
            pa.types.is_binary,
            pa.types.is_large_binary,
        )
    ):
        return arr
    raise _type_error(arr, "payload", source, "string or binary")


def _check_unique_ids(stream: np.ndarray, ids: np.ndarray, source) -> None:
    """Duplicate ids within a stream: report the earliest row that repeats an id,
    and the row it repeats."""
    found = None  # (later row, earlier row, stream tag, id)
    for code, tag in enumerate(STREAM_TAGS):
        rows = np.flatnonzero(stream == code)
        v = ids[rows]
        if v.size < 2 or bool(np.all(v[1:] > v[:-1])):
            continue  # the usual case: ids rise with arrival, no sort needed
        sv = np.sort(v)
        if not bool(np.any(sv[1:] == sv[:-1])):
            continue
        order = np.argsort(v, kind="stable")  # equal ids keep arrival order
        sv = v[order]
        dup = np.concatenate(([False], sv[1:] == sv[:-1]))
        starts = np.flatnonzero(~dup)  # first occurrence of each id, in sorted order
        j = np.flatnonzero(dup)
        later = rows[order[j]]
        k = int(np.argmin(later))
        earlier = rows[order[starts[np.searchsorted(starts, j[k], side="right") - 1]]]
        cand = (int(later[k]), int(earlier), tag, int(v[order[j[k]]]))
        if found is None or cand[0] < found[0]:
            found = cand
    if found is not None:
        later, earlier, tag, i = found
        raise _fail(
            source,
            f"id {i} of stream {tag} repeats data row {earlier + 1}",
            "ids must be unique within a stream; renumber one of the two rows",
            row=later + 1,
            column="id",
        )


# --------------------------------------------------------------------------- CSV parsing


def _first_failing(arr: pa.Array, convert) -> int:
    """Index of the first element that ``convert`` rejects, given that it rejects
    the whole array. A failing arrow cast costs as much as a whole one, so gallop
    (windows of 1, 2, 4, ... elements from the start) until a window fails, then
    bisect inside it: O(index of the failure) conversions, not O(len(arr))."""
    n = len(arr)
    lo, step = 0, 1
    while True:
        hi = min(lo + step, n)
        try:
            convert(arr.slice(lo, hi - lo))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            break
        if hi >= n:  # pragma: no cover - the caller saw the whole array fail
            raise AssertionError("no element fails")
        lo, step = hi, step * 2
    # the first failure lies in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            convert(arr.slice(lo, mid - lo))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            hi = mid
        else:
            lo = mid
    return lo


# CSV numbers are cast in growing blocks: an arrow cast that fails costs about 20
# times one that succeeds, over its whole input, so a float column must not be
# tried as int64 in one piece; the first block already shows it.
_BLOCK_MIN, _BLOCK_MAX = 1 << 10, 1 << 20


def _cast_exact(arr, to: pa.DataType) -> tuple[pa.ChunkedArray | None, int | None]:
    """``(arr cast to `to`, None)``, or ``(None, index of the first value it rejects)``.
    ``arr`` may be chunked (the CSV reader's ~1 MB blocks): no copy of the text."""
    chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    out, base, block = [], 0, _BLOCK_MIN
    for ch in chunks:
        start = 0
        while start < len(ch):
            piece = ch.slice(start, block)
            try:
                out.append(pc.cast(piece, to))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return None, base + start + _first_failing(piece, lambda a: pc.cast(a, to))
            start += len(piece)
            block = min(2 * block, _BLOCK_MAX)
        base += len(ch)
    return pa.chunked_array(out, type=to), None


def _tidy(arr: pa.Array) -> pa.Array:
    """Numbers as people write them: surrounding blanks and a leading '+' are fine."""
    arr = pc.utf8_trim_whitespace(arr)
    return pc.replace_substring_regex(arr, r"^\+", "")


def _bad_text(arr: pa.Array, i: int, name: str, source, want: str) -> EventError:
    """Why the text at row i is no number of the right kind."""
    v = arr[i].as_py()
    if v.strip() == "":
        return _fail(source, f"column {name!r} is empty (null)", _EMPTY_FIX, row=i + 1, column=name)
    try:
        int(v)
        why = "outside the int64 range [-9223372036854775808, 9223372036854775807]"
    except ValueError:
        why = "not a number"
    return _fail(
        source, f"column {name!r} has {_show(v)}, which is {why}", want, row=i + 1, column=name
    )


def _has_floaty(text: str) -> bool:
    return any(ch in text for ch in ".eEnNiI")


def _csv_int(arr: pa.Array, name: str, source, tidied: bool = False) -> pa.Array:
    """id / ts text to int64, exactly; integral floats (``3.0``, ``1e3``) allowed."""
    out, first = _cast_exact(arr, pa.int64())  # the usual case: plain integers
    if first is None:
        return out
    if not tidied:
        return _csv_int(_tidy(arr), name, source, tidied=True)
    unit = " of milliseconds" if name == "ts" else ""
    want = f"{name} must be an int64 (a whole number{unit})"
    # every row before `first` is a plain integer
    if not _has_floaty(arr[first].as_py()):
        raise _bad_text(arr, first, name, source, want)
    # integral floats among integers: each kind parsed exactly on its own rows
    floaty = pc.match_substring_regex(arr, _FLOATY)
    rows = np.flatnonzero(_np(floaty))
    errors = []  # (row index, error): the earliest one is reported
    ints, i = _cast_exact(pc.if_else(floaty, "0", arr), pa.int64())
    if i is not None:
        errors.append((i, _bad_text(arr, i, name, source, want)))
    floats, i = _cast_exact(pc.if_else(floaty, arr, "0"), pa.float64())
    if i is not None:
        errors.append((i, _bad_text(arr, i, name, source, want)))
    else:
        try:
            converted = _floats_to_int64(_np(floats)[rows], name, source, rows)
        except EventError as e:
            errors.append((e.row - 1, e))
    if errors:
        raise min(errors, key=lambda x: x[0])[1]
    out = _np(ints).copy()
    out[rows] = converted
    return pa.chunked_array([out])


def _csv_key(arr: pa.Array, source, tidied: bool = False) -> pa.Array:
    """key text to int64 when every value is an integer, else float64.

    The column is float64 iff some value has a decimal point, an exponent or a
    nan/inf word. Usually the first value that int64 rejects shows it; only if
    that one looks like an integer (out of range, or a typo) is the whole column
    searched, so ``9223372036854775808`` followed by ``2.5`` is a float column."""
    out, bad = _cast_exact(arr, pa.int64())
    if bad is None:
        return out
    floaty = _has_floaty(arr[bad].as_py())
    if not floaty:
        floaty = pc.any(pc.match_substring_regex(arr, _FLOATY)).as_py()
    if floaty:
        out, bad = _cast_exact(arr, pa.float64())  # finiteness: validate()
        if bad is None:
            return out
    if not tidied:
        return _csv_key(_tidy(arr), source, tidied=True)
    raise _bad_text(arr, bad, "key", source, "keys must be int64 or float64 numbers")


def _read_csv_header(path: str) -> list[str]:
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as f:
        return next(csv.reader(f), [])


def _read_csv(path: str, source) -> EventTable:
    try:
        header = _read_csv_header(path)
    except (OSError, csv.Error) as e:
        raise _fail(
            source, f"cannot read the CSV header ({e})", "check that the file is a text CSV file"
        ) from e
    if not header:
        raise _fail(source, "the file is empty", f"{_COLUMN_HELP}, header line first")
    _check_columns(header, source)
    wanted = [c for c in COLUMNS if c in header]
    text, tags = pa.string(), pa.dictionary(pa.int32(), pa.string())
    # First try: id and ts as int64 straight from arrow's parallel reader (exact,
    # it rejects rather than rounds out-of-range values), only key as text. If
    # any id or ts is not a plain integer, read everything as text and parse it
    # ourselves, which accepts '3.0' and ' +3' and finds the first bad row.
    fast = {c: pa.int64() if c in ("id", "ts") else text for c in wanted}
    table = _read_csv_as(path, source, wanted, {**fast, "stream": tags}, strict=False)
    if table is None:
        table = _read_csv_as(path, source, wanted, {**dict.fromkeys(wanted, text), "stream": tags})
    cols = {c: table.column(c) for c in wanted}  # chunked: combining text would copy it
    typed = {"stream": cols["stream"], "key": _csv_key(cols["key"], source)}
    for c in ("id", "ts"):
        typed[c] = cols[c] if cols[c].type == pa.int64() else _csv_int(cols[c], c, source)
    if "payload" in cols:
        typed["payload"] = cols["payload"]
    if "key2" in cols:
        typed["key2"] = cols["key2"]  # text: _key2_column parses it
    return EventTable.from_arrow(pa.table(typed), source)


def _read_csv_as(path: str, source, wanted: list[str], types: dict, strict: bool = True):
    """The CSV file with these column types; if not strict, None when arrow
    rejects it; else EventError when it cannot be parsed as CSV at all."""
    try:
        return pcsv.read_csv(
            path,
            parse_options=pcsv.ParseOptions(newlines_in_values=True),
            convert_options=pcsv.ConvertOptions(
                column_types=types,
                include_columns=wanted,
                strings_can_be_null=False,
                null_values=[""],  # an empty id or ts is null: reported as empty
            ),
        )
    except (pa.ArrowInvalid, OSError) as e:
        if not strict and isinstance(e, pa.ArrowInvalid):
            return None  # the all-text read decides whether the file is bad CSV
        raise _fail(
            source,
            f"is not a readable CSV file ({e})",
            "check the delimiter (comma), quoting and column count of each line",
        ) from e


# --------------------------------------------------------------------------- files


def _format(path, what: str = "event file") -> str:
    suffix = Path(path).suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    if suffix in CSV_SUFFIXES:
        return "csv"
    raise _fail(
        path,
        f"unknown {what} suffix {suffix!r}" if suffix else f"{what} has no suffix",
        "name it .parquet (or .pq) for Parquet or .csv for CSV",
    )


def _check_readable(path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except FileNotFoundError:
        raise _fail(path, "file not found", "check the path") from None
    except IsADirectoryError:
        raise _fail(path, "is a directory, not a file", "give the path of a file") from None
    except OSError as e:
        raise _fail(
            path, f"cannot be read ({e.strerror or e})", "check the file's permissions"
        ) from None


def read_events(path) -> EventTable:
    """Read and validate an event file (Parquet or CSV, by suffix)."""
    path = os.fspath(path)
    fmt = _format(path)
    _check_readable(path)
    if fmt == "csv":
        return _read_csv(path, path)
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as e:
        raise _fail(
            path,
            f"is not a readable Parquet file ({e})",
            "check that it is Parquet; a CSV file must be named .csv",
        ) from e
    names = schema.names
    _check_columns(names, path)
    stream_type = schema.field("stream").type
    is_text = pa.types.is_string(stream_type) or pa.types.is_large_string(stream_type)
    try:
        # only our columns (extra ones are ignored anyway); stream as a dictionary of
        # its few tags, which is how Parquet stores it and much faster to check
        table = pq.read_table(
            path,
            columns=[c for c in COLUMNS if c in names],
            read_dictionary=["stream"] if is_text else None,
        )
    except (pa.ArrowException, OSError) as e:
        raise _fail(
            path,
            f"is not a readable Parquet file ({e})",
            "check that it is Parquet; a CSV file must be named .csv",
        ) from e
    return EventTable.from_arrow(table, path)


def _atomic_write(path, write) -> None:
    """``write(tmp_path)`` into a fresh file beside ``path``, fsync, then
    ``os.replace``: readers see the old file or the whole new one, never a part."""
    path = Path(os.fspath(path))
    parent = path.parent
    if not parent.is_dir():
        raise _fail(path, f"directory {str(parent)!r} does not exist", "create it first")
    tmp = parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        # O_EXCL: never reuse someone else's file; mode 0o666 so the umask applies
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        write(str(tmp))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, (OSError, pa.ArrowException)):
            raise _fail(
                path, f"cannot be written ({e})", "check the directory's permissions and free space"
            ) from e
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dfd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _csv_text_key(key: pa.Array) -> pa.Array:
    """Float keys as text that reads back as the same float64: shortest
    round-trip digits, and '.0' added where arrow writes a bare integer."""
    text = pc.cast(key, pa.string())
    needs_dot = pc.invert(pc.match_substring_regex(text, _FLOATY))
    return pc.if_else(needs_dot, pc.binary_join_element_wise(text, ".0", ""), text)


def _write_table(table: pa.Table, tmp: str, fmt: str) -> None:
    if fmt == "csv":
        pcsv.write_csv(table, tmp, write_options=pcsv.WriteOptions(quoting_style="needed"))
    else:
        pq.write_table(table, tmp)


def write_events(table: EventTable, path) -> None:
    """Write an event table (Parquet or CSV, by suffix), atomically.

    The table is validated first, so no file is written that :func:`read_events`
    would reject. CSV keeps null payloads as empty fields (read back as ``''``)
    and needs bytes payloads to be UTF-8 text (they come back as strings).
    """
    path = os.fspath(path)
    fmt = _format(path)
    table.validate(path)
    at = table.to_arrow()
    if fmt == "csv":
        if at.schema.field("key").type == pa.float64():
            at = at.set_column(
                at.column_names.index("key"), "key", _csv_text_key(_combine(at.column("key")))
            )
        if "key2" in at.column_names:  # shortest round-trip digits keep every double exact
            at = at.set_column(at.column_names.index("key2"), "key2",
                               _csv_text_key(_combine(at.column("key2"))))
        if "payload" in at.column_names:
            p = _combine(at.column("payload"))
            if pa.types.is_binary(p.type) or pa.types.is_large_binary(p.type):
                try:
                    p = p.cast(
                        pa.large_string() if pa.types.is_large_binary(p.type) else pa.string()
                    )
                except pa.ArrowInvalid:
                    raise _fail(
                        path,
                        "the payload holds bytes that are not UTF-8 text, which CSV cannot carry",
                        "write .parquet instead",
                    ) from None
                at = at.set_column(at.column_names.index("payload"), "payload", p)
    _atomic_write(path, lambda tmp: _write_table(at, tmp, fmt))


def _pairs_format(path) -> str:
    return "csv" if Path(path).suffix.lower() in CSV_SUFFIXES else "parquet"


def write_pairs(path, r_id: np.ndarray, s_id: np.ndarray, r_payload=None,
                s_payload=None) -> None:
    """Result pairs as int64 columns ``r_id``, ``s_id`` (CSV if named .csv, else
    Parquet), atomically; with payloads (Arrow arrays, one per pair) also columns
    ``r_payload``, ``s_payload``."""
    r = _as_int64("r_id", np.asarray(r_id).ravel())
    s = _as_int64("s_id", np.asarray(s_id).ravel())
    if r.shape != s.shape:
        raise ValueError(f"write_pairs: {r.size} r_ids but {s.size} s_ids")
    path = os.fspath(path)
    cols = {"r_id": pa.array(r), "s_id": pa.array(s)}
    for name, p in (("r_payload", r_payload), ("s_payload", s_payload)):
        if p is not None:
            if len(p) != r.size:
                raise ValueError(f"write_pairs: {len(p)} {name}s for {r.size} pairs")
            cols[name] = p
    table = pa.table(cols)
    fmt = _pairs_format(path)
    _atomic_write(path, lambda tmp: _write_table(table, tmp, fmt))


def _read_any(path, columns: tuple[str, ...], what: str) -> pa.Table:
    path = os.fspath(path)
    _check_readable(path)
    try:
        if _pairs_format(path) == "csv":
            # typed up front: an empty file would otherwise infer the null type
            types = {c: pa.string() if c == "stream" else pa.int64() for c in columns}
            table = pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(column_types=types))
        else:
            table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise _fail(
            path, f"is not a readable {what} file ({e})", "pass a file written by panjoin"
        ) from e
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise _fail(
            path,
            f"missing column {missing[0]!r}",
            f"a {what} file has columns {', '.join(columns)}",
        )
    return table


def read_pairs(path) -> np.ndarray:
    """The pairs of :func:`write_pairs` as an ``(n, 2)`` int64 array."""
    table = _read_any(path, ("r_id", "s_id"), "pairs")
    out = np.empty((table.num_rows, 2), dtype=np.int64)
    for j, c in enumerate(("r_id", "s_id")):
        arr = _combine(table.column(c))
        if arr.null_count:
            i = _first(_np(pc.is_null(arr)))
            raise _fail(path, f"column {c!r} is null", "pairs need both ids", row=i + 1, column=c)
        out[:, j] = _int_column(arr, c, path)
    return out


def write_ids(path, stream_ids: dict) -> None:
    """Ids per stream (e.g. the late tuples) as columns ``stream``, ``id``: R's
    first, then S's, each in the given order. Keys are 'R'/'S' (or 0/1)."""
    parts_tag, parts_id = [], []
    for k in stream_ids:
        if k not in ("R", "S", 0, 1):
            raise ValueError(f"write_ids: stream {k!r} is neither 'R' nor 'S'")
    for code, tag in enumerate(STREAM_TAGS):
        for k in (tag, code):
            if k in stream_ids:
                ids = _as_int64("id", np.asarray(stream_ids[k]).ravel())
                parts_tag.append(np.full(ids.size, code, dtype=np.uint8))
                parts_id.append(ids)
    codes = np.concatenate(parts_tag) if parts_tag else np.zeros(0, np.uint8)
    ids = np.concatenate(parts_id) if parts_id else np.zeros(0, np.int64)
    table = pa.table(
        {"stream": pc.take(pa.array(STREAM_TAGS), pa.array(codes)), "id": pa.array(ids)}
    )
    path = os.fspath(path)
    fmt = _pairs_format(path)
    _atomic_write(path, lambda tmp: _write_table(table, tmp, fmt))


def read_ids(path) -> dict[str, np.ndarray]:
    """The ids of :func:`write_ids`: ``{'R': int64 array, 'S': int64 array}``."""
    path = os.fspath(path)
    table = _read_any(path, ("stream", "id"), "ids")
    if table.column("stream").null_count or table.column("id").null_count:
        raise _fail(path, "null stream or id", "pass a file written by panjoin")
    codes = _stream_codes(_combine(table.column("stream")), path)
    ids = _int_column(_combine(table.column("id")), "id", path)
    return {tag: ids[codes == code] for code, tag in enumerate(STREAM_TAGS)}
