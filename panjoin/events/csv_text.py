"""CSV event files: parsing them into an :class:`.EventTable` (``_read_csv``) and
the CSV-specific conversions, both ways.

CSV columns get explicit types, never pyarrow's inference, which would silently
turn an int64 beyond 2**53 into a rounded double. ``id`` and ``ts`` are first
read as int64 by arrow's parallel reader (exact from -2**63 to 2**63 - 1, and
it rejects rather than rounds); if any of them is not a plain integer, every
column is read as text and parsed by us, which accepts integral floats
(``3.0``, ``1e3``, converted exactly), blanks and a leading ``+``, and finds
the first bad row. ``key`` is always read as text: int64 if every value is a
plain integer, float64 if any value has a decimal point, an exponent or a
nan/inf word. Numbers are cast in growing blocks, so a float column costs one
small failed int64 attempt, not a whole one. Writing CSV does the reverse
(``_csv_text_key``, used by :func:`.write_events`): float keys always carry a
``.`` or an exponent (``5.0``, not ``5``), so they come back as float64, and the
shortest round-trip digits keep every double bit-exact.

    >>> import pyarrow as pa

# pyarrow.compute is imported in the functions that use it: its import is 20 ms of
# every start, and reading a Parquet file needs none of it
    >>> _csv_key(pa.array(["17", "17.5", "1e3"]), "events.csv").to_pylist()
    [17.0, 17.5, 1000.0]
    >>> _csv_text_key(pa.array([5.0, 0.1])).to_pylist()
    ['5.0', '0.1']
"""

from __future__ import annotations

import csv

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from panjoin.events.arrays import _np
from panjoin.events.errors import EventError, _fail, _show
from panjoin.events.table import EventTable
from panjoin.events.validate import (
    _COLUMN_HELP,
    _EMPTY_FIX,
    COLUMNS,
    _check_columns,
    _floats_to_int64,
)

# characters that make a CSV number a float: a decimal point, an exponent, nan/inf words
_FLOATY = "[.eEnNiI]"


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
    import pyarrow.compute as pc
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
    import pyarrow.compute as pc
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
    import pyarrow.compute as pc
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
    import pyarrow.compute as pc
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


def _csv_text_key(key: pa.Array) -> pa.Array:
    """Float keys as text that reads back as the same float64: shortest
    round-trip digits, and '.0' added where arrow writes a bare integer."""
    import pyarrow.compute as pc
    text = pc.cast(key, pa.string())
    needs_dot = pc.invert(pc.match_substring_regex(text, _FLOATY))
    return pc.if_else(needs_dot, pc.binary_join_element_wise(text, ".0", ""), text)
