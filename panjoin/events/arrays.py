"""numpy/pyarrow helpers shared by the column checks (:mod:`.validate`), the table
(:mod:`.table`), CSV parsing (:mod:`.csv_text`) and result files (:mod:`.results`):
the first True of a mask in one vectorised pass (``_first``, ``argmax``, never a
Python loop over rows), a null-free Arrow column as numpy with at most one copy
(``_np``), a numpy column as Arrow without a copy (``_arrow``), chunks combined into one
array (``_combine``), and the int64 bounds.

``_np`` and ``_arrow`` go through the arrays' buffers, not ``to_numpy`` or
``pa.array``: pyarrow's first conversion either way imports pandas (about half a
second of a replay's start) even where pandas has nothing to do. Numbers and bools
only; anything else (strings, nulls) takes pyarrow's own conversion. A bool mask is
bit-packed in Arrow, one byte per value in numpy::

    Arrow bits 0b00000110 (offset 1, length 3)  ->  unpack (little-endian bit order)
    [F T T F F F F F][1:4]  ->  numpy [True, True, False]

    >>> import numpy as np
    >>> _first(np.array([False, False, True, True])), _first(np.zeros(3, bool))
    (2, None)
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

#: payloads as the engine keeps them and the wire carries them (strings are cast back)
PAYLOAD_TYPE = pa.large_binary()


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
            parts = [_chunk_np(c) for c in arr.chunks]
            if not parts:
                return np.zeros(0, dtype=arr.type.to_pandas_dtype())
            return np.concatenate(parts)
        arr = arr.chunk(0)
    return _chunk_np(arr)


def _chunk_np(arr: pa.Array) -> np.ndarray:
    """One chunk as numpy: numbers as a read-only view of the data buffer, bools
    unpacked; anything else through pyarrow (see the module docstring)."""
    t = arr.type
    if arr.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)):
        dt = np.dtype(t.to_pandas_dtype())
        if len(arr) == 0:
            return np.zeros(0, dtype=dt)
        return np.frombuffer(arr.buffers()[1], dtype=dt, count=len(arr),
                             offset=arr.offset * dt.itemsize)
    if arr.null_count == 0 and pa.types.is_boolean(t):
        if len(arr) == 0:
            return np.zeros(0, dtype=bool)
        bits = np.frombuffer(arr.buffers()[1], dtype=np.uint8)
        return np.unpackbits(bits, count=arr.offset + len(arr),
                             bitorder="little")[arr.offset:].view(bool)
    return arr.to_numpy(zero_copy_only=False)


def _arrow(values: np.ndarray) -> pa.Array:
    """A 1-D numpy array of numbers as an Arrow array over the same memory (no
    nulls); anything else through ``pa.array``."""
    if values.ndim == 1 and values.dtype.kind in "iuf" and values.dtype.isnative:
        values = np.ascontiguousarray(values)
        return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values),
                                     [None, pa.py_buffer(values)])
    return pa.array(values)


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
