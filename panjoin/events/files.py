"""Event files on disk: :func:`read_events` and :func:`write_events`.

The format goes by the suffix: Parquet (``.parquet``/``.pq``) or CSV (``.csv``,
parsed by :mod:`.csv_text`); a missing, unreadable or directory path is an
:class:`.EventError` before any parsing. Reading validates everything; writing
validates first, so no file is written that :func:`read_events` would reject.

Writes are atomic (``atomic_write``, also used by :mod:`.results` and
:mod:`panjoin.kafka.io`): the file is written to a temporary name in the same
directory and moved into place with ``os.replace``, so a reader sees either the
old file or the whole new one, and a failed write leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from panjoin.events.arrays import _combine
from panjoin.events.csv_text import _csv_text_key, _read_csv
from panjoin.events.errors import _fail
from panjoin.events.table import EventTable
from panjoin.events.validate import COLUMNS, _check_columns

PARQUET_SUFFIXES = (".parquet", ".pq")
CSV_SUFFIXES = (".csv",)


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


def _not_parquet(path, e) -> Exception:
    return _fail(path, f"is not a readable Parquet file ({e})",
                 "check that it is Parquet; a CSV file must be named .csv")


def read_events(path, timings: dict | None = None) -> EventTable:
    """Read and validate an event file (Parquet or CSV, by suffix). ``timings``, if given,
    gets the seconds spent on ``read`` (the file into Arrow) and ``validate`` (Arrow to
    checked numpy columns; a CSV file's checks run as it is parsed, so all of it is read)."""
    path = os.fspath(path)
    t0 = time.perf_counter()
    fmt = _format(path)
    _check_readable(path)
    if fmt == "csv":
        out = _read_csv(path, path)
        if timings is not None:
            timings["read"] = time.perf_counter() - t0
        return out
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as e:
        raise _not_parquet(path, e) from e
    names = schema.names
    _check_columns(names, path)
    stream_type = schema.field("stream").type
    is_text = pa.types.is_string(stream_type) or pa.types.is_large_string(stream_type)
    try:
        # only our columns (extra ones are ignored anyway); stream as a dictionary of
        # its few tags, which is how Parquet stores it and much faster to check
        # ParquetFile, not read_table: read_table goes through pyarrow.dataset, whose
        # import pulls in pandas (about half a second of a replay's start)
        table = pq.ParquetFile(
            path, read_dictionary=["stream"] if is_text else None,
        ).read(columns=[c for c in COLUMNS if c in names])
    except (pa.ArrowException, OSError) as e:
        raise _not_parquet(path, e) from e
    t1 = time.perf_counter()
    out = EventTable.from_arrow(table, path)
    if timings is not None:
        timings["read"], timings["validate"] = t1 - t0, time.perf_counter() - t1
    return out


def atomic_write(path, write) -> None:
    """``write(tmp_path)`` into a fresh file beside ``path``, fsync, then
    ``os.replace``: readers see the old file or the whole new one, never a part."""
    with atomic_file(path) as tmp:
        write(tmp)


@contextlib.contextmanager
def atomic_file(path):
    """A fresh temporary path beside ``path`` to write into; when the block ends the
    file is fsynced and moved onto ``path`` (``os.replace``), and when it raises the
    temporary file is removed and an I/O error says how to fix it. For writers that
    fill a file in several steps (:class:`panjoin.events.results.PairsWriter`)."""
    path = Path(os.fspath(path))
    parent = path.parent
    if not parent.is_dir():
        raise _fail(path, f"directory {str(parent)!r} does not exist", "create it first")
    tmp = parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        # O_EXCL: never reuse someone else's file; mode 0o666 so the umask applies
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        yield str(tmp)
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


def _write_table(table: pa.Table, tmp: str, fmt: str, **parquet) -> None:
    """``table`` as CSV or Parquet (``parquet``: :func:`pyarrow.parquet.write_table`'s
    options)."""
    if fmt == "csv":
        pcsv.write_csv(table, tmp, write_options=pcsv.WriteOptions(quoting_style="needed"))
    else:
        pq.write_table(table, tmp, **parquet)


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
    atomic_write(path, lambda tmp: _write_table(at, tmp, fmt))
