"""numpy/pyarrow helpers shared by the column checks (:mod:`.validate`), the table
(:mod:`.table`), CSV parsing (:mod:`.csv_text`) and result files (:mod:`.results`):
the first True of a mask in one vectorised pass (``_first``, ``argmax``, never a
Python loop over rows), a null-free Arrow column as numpy with at most one copy
(``_np``), chunks combined into one array (``_combine``), and the int64 bounds.

    >>> import numpy as np
    >>> _first(np.array([False, False, True, True])), _first(np.zeros(3, bool))
    (2, None)
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


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
