"""The in-memory event sequence: :class:`EventTable`.

Numpy columns (``stream`` as uint8, 0 = R, 1 = S; ``id``, ``ts`` int64; ``key``
int64 or float64; optional ``key2`` float64) plus the payload as a pyarrow array,
so that ten million rows cost four flat arrays and no Python objects. Row i is
the i-th tuple to arrive. Construction only coerces dtypes and checks lengths;
:meth:`EventTable.from_arrow` and :meth:`EventTable.validate` run the value checks
of :mod:`.validate`.

    >>> import numpy as np
    >>> t = EventTable(np.array([0, 1, 0], np.uint8), np.array([0, 0, 1]),
    ...                np.array([5, 7, 5]), np.array([10, 11, 12]))
    >>> t.counts()
    (2, 1)
    >>> t.to_arrow().column("stream").to_pylist()
    ['R', 'S', 'R']
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

# pyarrow.compute is imported in the functions that use it: its import is 20 ms of
# every start, and reading a Parquet file needs none of it
from panjoin.events.arrays import _arrow, _combine, _first
from panjoin.events.errors import _fail
from panjoin.events.validate import (
    COLUMNS,
    TAG_ARRAY,
    _check_columns,
    _check_nulls,
    _check_unique_ids,
    _int_column,
    _key2_column,
    _key_column,
    _payload_column,
    _stream_codes,
)
from panjoin.semantics import I64_MAX


def _as_int64(name: str, a) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 1:
        raise ValueError(f"EventTable.{name} must be 1-D, got shape {a.shape}")
    if a.dtype == np.int64:
        return a
    if a.dtype.kind == "u" and a.size and a.max() > I64_MAX:
        raise ValueError(f"EventTable.{name} has values above the int64 range")
    if a.dtype.kind in "iu":
        return a.astype(np.int64)
    if a.size == 0:
        return a.astype(np.int64)
    raise TypeError(f"EventTable.{name} must hold integers, got dtype {a.dtype}")


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
        import pyarrow.compute as pc
        tags = pc.take(TAG_ARRAY, _arrow(self.stream))
        cols = {
            "stream": tags,
            "id": _arrow(self.id),
            "key": _arrow(self.key),
            "ts": _arrow(self.ts),
        }
        if self.payload is not None:
            cols["payload"] = self.payload
        if self.key2 is not None:
            cols["key2"] = _arrow(self.key2)
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
