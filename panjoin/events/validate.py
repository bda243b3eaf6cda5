"""Column checks and conversions: what a valid event column is (``REQUIRED``,
``COLUMNS``, ``STREAM_TAGS``) and how an Arrow column becomes a numpy one. Required
columns present, no nulls, the right types; ``stream`` tags 'R'/'S' to codes 0/1;
``id``/``ts`` (integers, integral floats, timestamps), ``key``, ``key2`` and
``payload`` converted; ids unique within each stream. :meth:`.EventTable.from_arrow`
and :meth:`.EventTable.validate` run them, for every reader.

Each check is one vectorised pass; the first offending row is found with numpy
(``argmax`` of a mask), never a Python loop over rows, and reported as one
:class:`.EventError` naming the file, the 1-based data row and the problem.

Worked trace, a dozen rows of a CSV file with two mistakes (``r`` at data row 4,
and id 2 of R repeated at data row 9)::

    data row  stream id key   ts               data row  stream id key   ts
       1      R      0  17    1700000000000       7      S      3  -3    1700000000003
       2      S      0  17.5  1700000000000       8      R      3  9     1700000000004
       3      R      1  4     1700000000001       9      R      2  12    1700000000004
       4      r      2  8     1700000000001      10      S      4  1e3   1700000000005
       5      S      1  nan   1700000000002      11      R      4  6     1700000000005
       6      S      2  0     1700000000003      12      S      5  6     1700000000006

* types (CSV parsing, :mod:`.csv_text`): ``id`` and ``ts`` cast to int64 at once.
  ``key`` does not: the first value int64 rejects is ``17.5`` (data row 2), which
  has a decimal point, so the column is float64 (``nan`` and ``1e3`` parse as
  floats too).
* stream tags: ``(stream == 'R') | (stream == 'S')`` is False at index 3 only, so
  the error is ``events.csv, data row 4: column 'stream' has 'r'; only 'R' and 'S'
  are allowed (tags are case-sensitive: write upper case); ...``. After fixing it:
* keys: ``isfinite(key)`` is False first at index 4: ``data row 5: column 'key'
  is NaN; keys must be finite numbers; ...``. After fixing that:
* ids: the R ids in arrival order are 0 1 2 3 2 4 (data rows 1 3 4 8 9 11), not
  increasing, so they are sorted (stable) and equal neighbours looked for: id 2
  at rows 4 and 9, so ``data row 9: id 2 of stream R repeats data row 4; ids
  must be unique within a stream; ...``. The S ids 0..5 rise: no sort needed.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

# pyarrow.compute is imported in the functions that use it: its import is 20 ms of
# every start, and reading a Parquet file needs none of it
from panjoin.events.arrays import _combine, _first, _np
from panjoin.events.errors import EventError, _fail, _show
from panjoin.semantics import I64_MAX

REQUIRED = ("stream", "id", "key", "ts")
COLUMNS = REQUIRED + ("payload", "key2")
STREAM_TAGS = ("R", "S")
#: STREAM_TAGS as an Arrow array, built from its buffers (offsets 0 1 2, bytes "RS"):
#: ``pa.array(["R", "S"])`` would import pandas (see :mod:`.arrays`)
TAG_ARRAY = pa.StringArray.from_buffers(
    2, pa.py_buffer(np.array([0, 1, 2], dtype=np.int32)), pa.py_buffer(b"RS"))
_R, _S = TAG_ARRAY[0], TAG_ARRAY[1]
_CODES = {"R": 0, "S": 1}

# 2**63 as a double: every finite float in [-2**63, 2**63) converts to int64 exactly
_TWO63 = 9223372036854775808.0

_COLUMN_HELP = "an event file needs columns stream, id, key, ts (and optionally payload)"
_EMPTY_FIX = "every event needs stream, id, key and ts; fill it in or drop the row"


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
            import pyarrow.compute as pc

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
            # 2 = neither R nor S; to_pylist: to_numpy of strings imports pandas
            lut = np.array([_CODES.get(v, 2) for v in d.to_pylist()], dtype=np.uint8)
            codes = lut[_np(ch.indices)]
        elif pa.types.is_string(ch.type) or pa.types.is_large_string(ch.type):
            import pyarrow.compute as pc

            codes = np.where(_np(pc.equal(ch, _R)), 0, 2).astype(np.uint8)
            codes[_np(pc.equal(ch, _S))] = 1
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
        i = _first(v > np.uint64(I64_MAX))
        if i is not None:
            raise _fail(
                source,
                f"column {name!r} has {int(v[i])}, above the int64 maximum {I64_MAX}",
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
            i = _first(np.abs(raw) > I64_MAX // 1000)
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
    import pyarrow.compute as pc
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


#: rows a chunk of :func:`_ids_rise`: its temporaries (some 5 MiB) come back from the
#: allocator chunk after chunk, where whole-column ones were fresh pages every time (a
#: 12M-row file: 0.02 s against 0.32 s, the kernel zeroing the pages)
RISE_CHUNK = 1 << 18


def _ids_rise(stream: np.ndarray, ids: np.ndarray) -> bool:
    """Do ids rise strictly with arrival within each stream (the usual case, where no id
    can repeat)? Checked a chunk of rows at a time, each chunk's first id of a stream
    against the last one before it."""
    last: list = [None, None]
    for a in range(0, stream.shape[0], RISE_CHUNK):
        s, v = stream[a:a + RISE_CHUNK], ids[a:a + RISE_CHUNK]
        for code in (0, 1):
            w = v[np.flatnonzero(s == code)]
            if w.size == 0:
                continue
            if last[code] is not None and w[0] <= last[code]:
                return False
            if w.size > 1 and not bool(np.all(w[1:] > w[:-1])):
                return False
            last[code] = w[-1]
    return True


def _check_unique_ids(stream: np.ndarray, ids: np.ndarray, source) -> None:
    """Duplicate ids within a stream: report the earliest row that repeats an id,
    and the row it repeats."""
    if _ids_rise(stream, ids):
        return  # the usual case: ids rise with arrival, no sort needed
    found = None  # (later row, earlier row, stream tag, id)
    for code, tag in enumerate(STREAM_TAGS):
        rows = np.flatnonzero(stream == code)
        v = ids[rows]
        if v.size < 2 or bool(np.all(v[1:] > v[:-1])):
            continue
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
