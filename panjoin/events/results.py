"""Result files: the join's pairs and per-stream id lists.

:func:`write_pairs` / :func:`read_pairs`: int64 columns ``r_id``, ``s_id`` (and,
with payloads, ``r_payload``, ``s_payload``). :func:`write_ids` /
:func:`read_ids`: columns ``stream`` ('R'/'S') and ``id``, e.g. the late tuples.
CSV if the name ends in ``.csv``, else Parquet; written atomically like event
files (:mod:`.files`).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

# pyarrow.compute is imported in the functions that use it: its import is 20 ms of
# every start, and reading a Parquet file needs none of it
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from panjoin.events.arrays import _arrow, _combine, _first, _np
from panjoin.events.errors import _fail
from panjoin.events.files import (
    CSV_SUFFIXES,
    _check_readable,
    _write_table,
    atomic_file,
    atomic_write,
)
from panjoin.events.table import _as_int64
from panjoin.events.validate import STREAM_TAGS, TAG_ARRAY, _int_column, _stream_codes


def _pairs_format(path) -> str:
    return "csv" if Path(path).suffix.lower() in CSV_SUFFIXES else "parquet"


#: rows per Parquet row group of a pairs file: few, large groups (pyarrow's default is
#: 1M rows), still small enough for a reader to take them apart in parallel
PAIRS_ROW_GROUP = 1 << 22


def _pairs_parquet(names) -> dict:
    """How a pairs file's id columns are written: delta-encoded (ids of nearby pairs
    differ by little), uncompressed and without a dictionary (every id is new, so
    pyarrow's dictionary fills up and falls back to plain after its first page, work
    spent for nothing). For 1.8M pairs of an equi join: 8 MiB written in 0.5 s, where
    the defaults (dictionary, snappy) took 1.7 s for 15 MiB, measured side by side
    under load (benchmarks/RESULTS.md, issue 31 item 4, sixth session). Payloads keep
    pyarrow's defaults."""
    ids = [n for n in names if n in ("r_id", "s_id")]
    return dict(use_dictionary=[n for n in names if n not in ids],
                compression={n: "none" if n in ids else "snappy" for n in names},
                column_encoding=dict.fromkeys(ids, "DELTA_BINARY_PACKED"),
                row_group_size=PAIRS_ROW_GROUP)


def write_pairs(path, r_id: np.ndarray, s_id: np.ndarray, r_payload=None,
                s_payload=None) -> None:
    """Result pairs as int64 columns ``r_id``, ``s_id`` (CSV if named .csv, else
    Parquet, written as :func:`_pairs_parquet` says), atomically; with payloads (Arrow
    arrays, one per pair) also columns ``r_payload``, ``s_payload``. All at once: a
    join that makes its pairs over time writes them with :class:`PairsWriter`."""
    with PairsWriter(path) as out:
        out.write(r_id, s_id, r_payload, s_payload)


class PairsWriter:
    """Result pairs written as they come, a row group at a time, into a file that
    appears whole when the writer closes (atomically: :func:`.files.atomic_file`), so
    a join's pairs need not all be held until its end (a result-heavy join makes
    gigabytes). A failure, or leaving the ``with`` block by an exception, removes the
    partial file. The columns are :func:`write_pairs`'; whether the pairs carry
    payloads (which) is fixed by the first :meth:`write`.

        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> with PairsWriter(d + "/p.parquet") as out:
        ...     out.write(np.array([1, 2]), np.array([7, 7]))
        ...     out.write(np.array([3]), np.array([9]))
        >>> read_pairs(d + "/p.parquet").tolist()
        [[1, 7], [2, 7], [3, 9]]
    """

    def __init__(self, path, background: bool = False):
        self.path = os.fspath(path)
        #: row groups encoded and written on a thread of their own (Arrow lets go of the
        #: GIL), at most :data:`WRITE_BEHIND` pairs waiting, so the join goes on
        #: meanwhile; its CPU seconds so far are :attr:`thread_cpu`. An error there
        #: comes back from the next call.
        self.background = background
        self.thread_cpu = 0.0
        self._queue: queue.Queue | None = None
        self._behind = threading.Condition()
        self._pending = 0  # pairs handed to the thread, not yet written
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.rows = 0  # pairs written or waiting
        self._fmt = _pairs_format(self.path)
        self._parts: list[tuple] = []  # pairs waiting for a row group
        self._waiting = 0
        self._payloads: tuple[bool, bool] | None = None  # which payload columns
        self._writer = None  # opened by the first row group (its schema is the first write's)
        self._file: contextlib.ExitStack | None = contextlib.ExitStack()
        self._tmp = self._file.enter_context(atomic_file(self.path))  # until close or abort

    def __enter__(self) -> PairsWriter:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()

    def write(self, r_id, s_id, r_payload=None, s_payload=None) -> None:
        if self._file is None:
            raise ValueError(f"write_pairs: {self.path} is closed (or was abandoned)")
        r = _as_int64("r_id", np.asarray(r_id).ravel())
        s = _as_int64("s_id", np.asarray(s_id).ravel())
        if r.shape != s.shape:
            raise ValueError(f"write_pairs: {r.size} r_ids but {s.size} s_ids")
        pays = (r_payload, s_payload)
        for name, p in zip(("r_payload", "s_payload"), pays, strict=True):
            if p is not None and len(p) != r.size:
                raise ValueError(f"write_pairs: {len(p)} {name}s for {r.size} pairs")
        has = tuple(p is not None for p in pays)
        if self._payloads is None:
            self._payloads = has
        if has != self._payloads:
            raise ValueError("write_pairs: the payload columns differ from the first pairs' "
                             "(give the same payloads, or none, with every write)")
        self._parts.append(_pairs_table(r, s, *pays))
        self._waiting += r.size
        self.rows += r.size
        if self._waiting >= PAIRS_ROW_GROUP:
            self._flush()

    def _flush(self, last: bool = False) -> None:
        """Write the waiting pairs in whole row groups (all of them if ``last``)."""
        table = (pa.concat_tables(self._parts) if self._parts else
                 _pairs_table(np.zeros(0, np.int64), np.zeros(0, np.int64)))
        cut = table.num_rows if last else table.num_rows // PAIRS_ROW_GROUP * PAIRS_ROW_GROUP
        self._parts = [table.slice(cut)] if cut < table.num_rows else []
        self._waiting = table.num_rows - cut
        try:
            self._raise_thread_error()
            if self._writer is None:
                if self._fmt == "csv":
                    self._writer = pcsv.CSVWriter(self._tmp, table.schema, write_options=(
                        pcsv.WriteOptions(quoting_style="needed")))
                else:
                    opts = _pairs_parquet(table.column_names)
                    del opts["row_group_size"]
                    self._writer = pq.ParquetWriter(self._tmp, table.schema, **opts)
            if not self.background:
                self._write_rows(table.slice(0, cut))
                return
            if self._thread is None:
                self._queue = queue.Queue()
                self._thread = threading.Thread(target=self._write_behind, daemon=True,
                                                name="panjoin-pairs-writer")
                self._thread.start()
            with self._behind:  # the thread may fail while this one waits
                while self._pending > WRITE_BEHIND and self._error is None:
                    self._behind.wait(0.1)
                self._raise_thread_error()
                self._pending += cut
            self._queue.put(table.slice(0, cut))
        except BaseException as e:
            self._end(e)
            raise

    def _write_rows(self, table: pa.Table) -> None:
        if self._fmt == "csv":
            self._writer.write_table(table)
        else:
            self._writer.write_table(table, row_group_size=PAIRS_ROW_GROUP)

    def _write_behind(self) -> None:
        c0 = time.thread_time()
        fd = os.open(self._tmp, os.O_RDONLY)
        try:
            while (table := self._queue.get()) is not None:
                self._write_rows(table)
                # the disk writes of each group while the join goes on, not all in the
                # fsync at close (600 MB of a band join's pairs: 1.2 s of waiting)
                os.fdatasync(fd)
                self.thread_cpu = time.thread_time() - c0
                with self._behind:
                    self._pending -= table.num_rows
                    self._behind.notify()
        except BaseException as e:  # handed to the caller by its next call
            with self._behind:
                self._error = e
                self._behind.notify()
        finally:
            os.close(fd)
        self.thread_cpu = time.thread_time() - c0

    def _stop_thread(self, drain: bool) -> None:
        """Let the writing thread finish what waits (or, ``drain``, throw it away) and end."""
        if self._thread is None:
            return
        if drain:
            with contextlib.suppress(queue.Empty):
                while True:
                    self._queue.get_nowait()
        self._queue.put(None)
        self._thread.join()
        self._thread = None

    def _raise_thread_error(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Write what waits (a file of no pairs still gets its columns) and move the
        file into place."""
        if self._file is None:
            return
        try:
            if self._parts or self._writer is None:
                self._flush(last=True)
            self._stop_thread(drain=False)
            self._raise_thread_error()
            self._writer.close()
        except BaseException as e:
            self._end(e)
            raise
        file, self._file = self._file, None
        file.close()  # fsync, then the rename

    def abort(self) -> None:
        """Give up: the partial file is removed, nothing is moved into place."""
        self._end(_Abandoned())

    def _end(self, e: BaseException) -> None:
        """Close the writer and remove the temporary file; an I/O error ``e`` comes
        back from :func:`.files.atomic_file` saying how to fix it."""
        self._stop_thread(drain=True)
        writer, self._writer = self._writer, None
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        file, self._file = self._file, None
        if file is not None:
            file.__exit__(type(e), e, e.__traceback__)


#: pairs a background :class:`PairsWriter` lets wait for its thread (1 GiB of ids) before
#: a write waits: a join hands over a chunk's pairs at once (64M on a band join with 64
#: pairs a tuple), and two row groups of room made it wait for most of them
WRITE_BEHIND = 1 << 26


def _pairs_table(r: np.ndarray, s: np.ndarray, r_payload=None, s_payload=None) -> pa.Table:
    """The columns of a pairs file; the ids are never null, and saying so in the schema
    spares the Parquet writer their definition levels (a fifth of its CPU)."""
    fields = [pa.field("r_id", pa.int64(), nullable=False),
              pa.field("s_id", pa.int64(), nullable=False)]
    cols = [_arrow(r), _arrow(s)]
    for name, p in (("r_payload", r_payload), ("s_payload", s_payload)):
        if p is not None:
            fields.append(pa.field(name, p.type))
            cols.append(p)
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


class _Abandoned(Exception):
    """Thrown into :func:`.files.atomic_file` by :meth:`PairsWriter.abort`: not an I/O
    error, so it only removes the file."""
def _read_any(path, columns: tuple[str, ...], what: str) -> pa.Table:
    path = os.fspath(path)
    _check_readable(path)
    try:
        if _pairs_format(path) == "csv":
            # typed up front: an empty file would otherwise infer the null type
            types = {c: pa.string() if c == "stream" else pa.int64() for c in columns}
            table = pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(column_types=types))
        else:
            table = pq.ParquetFile(path).read()  # not read_table: see files.read_events
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
    import pyarrow.compute as pc
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
    import pyarrow.compute as pc
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
        {"stream": pc.take(TAG_ARRAY, _arrow(codes)), "id": _arrow(ids)}
    )
    path = os.fspath(path)
    fmt = _pairs_format(path)
    atomic_write(path, lambda tmp: _write_table(table, tmp, fmt))


def read_ids(path) -> dict[str, np.ndarray]:
    """The ids of :func:`write_ids`: ``{'R': int64 array, 'S': int64 array}``."""
    path = os.fspath(path)
    table = _read_any(path, ("stream", "id"), "ids")
    if table.column("stream").null_count or table.column("id").null_count:
        raise _fail(path, "null stream or id", "pass a file written by panjoin")
    codes = _stream_codes(_combine(table.column("stream")), path)
    ids = _int_column(_combine(table.column("id")), "id", path)
    return {tag: ids[codes == code] for code, tag in enumerate(STREAM_TAGS)}
