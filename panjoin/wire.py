"""numpy arrays on the wire: the one conversion between ``panjoin.v1.Array`` and numpy.

An Array is the packed little-endian bytes of a C-contiguous array plus its
dtype string and shape, never repeated scalar fields::

    >>> a = to_array(np.array([3, 1, 2], dtype=np.int64))
    >>> a.dtype, len(a.data)
    ('<i8', 24)
    >>> from_array(a).tolist()
    [3, 1, 2]
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from panjoin.proto.panjoin.v1 import common_pb2

PAYLOAD_TYPE = pa.large_binary()

ALLOWED = {"<i8": np.int64, "<f8": np.float64, "|u1": np.uint8, "<u8": np.uint64,
           "|b1": np.bool_}


class WireError(ValueError):
    """An Array that cannot be decoded (bad dtype, size or shape); goes out as INVALID_ARGUMENT."""


def to_array(a: np.ndarray) -> common_pb2.Array:
    a = np.asarray(a)
    le = a.astype(a.dtype.newbyteorder("<"), copy=False)
    le = np.ascontiguousarray(le)
    shape = list(le.shape) if le.ndim != 1 else []
    return common_pb2.Array(dtype=le.dtype.str, shape=shape, data=le.tobytes())


def from_array(msg: common_pb2.Array, want: str | None = None, name: str = "array") -> np.ndarray:
    """Decode an Array; ``want`` ('<i8', '<f8', ...) checks its dtype. Empty message -> []."""
    if not msg.dtype and not msg.data:
        return np.zeros(0, dtype=ALLOWED[want] if want else np.int64)
    if msg.dtype not in ALLOWED:
        raise WireError(f"{name}: dtype {msg.dtype!r} is not one of {sorted(ALLOWED)}")
    if want is not None and msg.dtype != want:
        raise WireError(f"{name}: expected dtype {want}, got {msg.dtype}")
    dt = np.dtype(msg.dtype)
    if len(msg.data) % dt.itemsize:
        raise WireError(f"{name}: {len(msg.data)} bytes is not a whole number of {msg.dtype}")
    out = np.frombuffer(msg.data, dtype=dt)
    if msg.shape:
        if int(np.prod(msg.shape)) != out.size:
            raise WireError(f"{name}: shape {list(msg.shape)} does not hold {out.size} items")
        out = out.reshape(tuple(msg.shape))
    return out


def to_payloads(arr: pa.Array | None, msg) -> None:
    """Fill a ``panjoin.v1.Payloads`` message from a binary/string Arrow array (Arrow's
    own offsets and bytes, no per-row work); None leaves it empty."""
    if arr is None:
        return
    arr = arr.cast(PAYLOAD_TYPE)
    if arr.null_count:
        arr = arr.fill_null(b"")
    _, offsets, data = arr.buffers()
    offs = np.frombuffer(offsets, dtype=np.int64)[arr.offset:arr.offset + len(arr) + 1]
    start, end = int(offs[0]), int(offs[-1])
    msg.offsets.CopyFrom(to_array(offs - start))
    msg.data = data[start:end].to_pybytes() if data is not None else b""


def from_payloads(msg, n: int, name: str = "payload") -> pa.Array | None:
    """A ``panjoin.v1.Payloads`` message as a large_binary Arrow array of ``n`` rows; an
    empty message is None (no payloads)."""
    if not msg.offsets.data and not msg.data:
        return None
    offs = from_array(msg.offsets, "<i8", f"{name}.offsets")
    if offs.shape != (n + 1,):
        raise WireError(f"{name}: {offs.size} offsets for {n} rows; need n + 1")
    if offs[0] != 0 or offs[-1] != len(msg.data) or np.any(np.diff(offs) < 0):
        raise WireError(f"{name}: offsets must start at 0, never decrease and end at "
                        f"len(data) = {len(msg.data)}")
    return pa.Array.from_buffers(PAYLOAD_TYPE, n, [None, pa.py_buffer(offs.tobytes()),
                                                   pa.py_buffer(msg.data)])
