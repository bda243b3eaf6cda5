"""numpy arrays on the wire: the one conversion between ``panjoin.v1.Array`` and numpy.

An Array is the packed little-endian bytes of a C-contiguous array plus its
dtype string and shape, never repeated scalar fields::

    >>> a = to_array(np.array([3, 1, 2], dtype=np.int64))
    >>> a.dtype, len(a.data)
    ('<i8', 24)
    >>> from_array(a).tolist()
    [3, 1, 2]

The bulk command (a batch's keys, ts, seq and ids) is written
straight into protobuf's wire format by :class:`Encoded`: the framing bytes
plus the arrays' own memory, joined once when the commands go out, where
building ``Array`` messages and nesting them copies each array four times
(``tobytes``, into the Array, into the Command, serialising). The field numbers
come from the generated descriptors, and the generated classes parse the result::

    >>> from panjoin.proto.panjoin.v1 import worker_pb2
    >>> enc = Encoded(worker_pb2.Batch).scalar("batch_id", 7).array("ids", np.array([5, 6]))
    >>> msg = worker_pb2.Batch.FromString(enc.tobytes())
    >>> msg.batch_id, from_array(msg.ids).tolist()
    (7, [5, 6])
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from panjoin.events.arrays import PAYLOAD_TYPE
from panjoin.proto.panjoin.v1 import common_pb2

ALLOWED = {"<i8": np.int64, "<f8": np.float64, "|u1": np.uint8, "<u8": np.uint64,
           "|b1": np.bool_}
#: decoded only where a field asks for it by name (a Batch's narrowed columns): a field
#: that takes any dtype (a pushed key) must not get these
NAMED_ONLY = {"<u4": np.uint32}


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
    # each read of a bytes field copies it (protobuf's upb): read once (three reads of a
    # 1M-row column cost 0.5 ms where one costs 0.25)
    dtype, data = msg.dtype, msg.data
    if not dtype and not data:
        return np.zeros(0, dtype=np.dtype(want) if want else np.int64)
    if dtype not in ALLOWED and not (dtype == want and want in NAMED_ONLY):
        raise WireError(f"{name}: dtype {dtype!r} is not one of {sorted(ALLOWED)}")
    if want is not None and dtype != want:
        raise WireError(f"{name}: expected dtype {want}, got {dtype}")
    dt = np.dtype(dtype)
    if len(data) % dt.itemsize:
        raise WireError(f"{name}: {len(data)} bytes is not a whole number of {dtype}")
    out = np.frombuffer(data, dtype=dt)
    if msg.shape:
        if int(np.prod(msg.shape)) != out.size:
            raise WireError(f"{name}: shape {list(msg.shape)} does not hold {out.size} items")
        out = out.reshape(tuple(msg.shape))
    return out


#: a column whose span (max - min) is below this goes as uint32 offsets from its min
NARROW_SPAN = 1 << 32
_I64_MAX = int(np.iinfo(np.int64).max)


def narrow(col: np.ndarray, lo: int | None = None, hi: int | None = None):
    """``(column to send, base)``: an int64 column of span < 2^32 as uint32 offsets from
    its min (half the bytes), else itself and base 0. ``lo``/``hi``: its min and max
    when the caller knows them (a sorted column's ends), else they are computed.

        >>> a, base = narrow(np.array([1000007, 1000009, 1000008]))
        >>> a.dtype.str, a.tolist(), base
        ('<u4', [0, 2, 1], 1000007)
    """
    if col.dtype != np.int64 or col.size == 0:
        return col, 0
    if lo is None:
        lo, hi = int(col.min()), int(col.max())
    if hi - lo >= NARROW_SPAN:
        return col, 0
    out = np.empty(col.shape[0], np.uint32)
    np.subtract(col, np.int64(lo), out=out, casting="unsafe")  # in [0, 2^32): exact
    return out, lo


def widen(a: np.ndarray, base: int, name: str) -> np.ndarray:
    """The int64 column of a (possibly :func:`narrow`-ed) column."""
    if a.dtype != np.uint32:
        return a
    if base > _I64_MAX - (NARROW_SPAN - 1) and a.size and base + int(a.max()) > _I64_MAX:
        raise WireError(f"{name}: base {base} plus its offsets overflows int64")
    return np.add(a, np.int64(base), dtype=np.int64)


def int_column(a: common_pb2.Array, base: int, name: str) -> np.ndarray:
    """An int64 column sent as "<i8", or narrowed to "<u4" offsets from ``base``."""
    if a.dtype == "<u4":
        return widen(from_array(a, "<u4", name), base, name)
    if base:
        raise WireError(f"{name}: a base ({base}) goes with uint32 offsets, not {a.dtype!r}")
    return from_array(a, "<i8", name)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


_LEN = 2  # protobuf wire type of strings, bytes, packed repeated and nested messages
_ARRAY_FIELDS = common_pb2.Array.DESCRIPTOR.fields_by_name


def _len_header(number: int, length: int) -> bytes:
    return _varint(number << 3 | _LEN) + _varint(length)


class Encoded:
    """A protobuf message of type ``cls`` written field by field as a list of buffers.

    Arrays go in as views of their own memory, nesting (:meth:`wrap`) and
    concatenating (:meth:`extend`) share them, and :meth:`tobytes` copies every
    byte once.
    Concatenated encodings of one type parse as their merge (protobuf's rule), so
    a part shared by several messages is encoded once and each message appends
    its own fields."""

    __slots__ = ("fields", "parts", "nbytes")

    def __init__(self, cls):
        self.fields = cls.DESCRIPTOR.fields_by_name
        self.parts: list = []
        self.nbytes = 0  # a memoryview part keeps its array alive

    def _add(self, part) -> None:
        self.parts.append(part)
        self.nbytes += len(part)

    def scalar(self, name: str, value: int) -> Encoded:
        """A non-negative integer or bool field (varint); zero is left out, as protobuf does."""
        if value:
            self._add(_varint(self.fields[name].number << 3) + _varint(int(value)))
        return self

    def array(self, name: str, a) -> Encoded:
        """An ``Array`` field holding ``a`` (the same message :func:`to_array` builds)."""
        a = np.asarray(a)
        a = np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<"), copy=False))
        dt = a.dtype.str.encode()
        head = _varint(_ARRAY_FIELDS["dtype"].number << 3 | _LEN) + _varint(len(dt)) + dt
        if a.ndim != 1:
            packed = b"".join(_varint(d) for d in a.shape)
            head += _len_header(_ARRAY_FIELDS["shape"].number, len(packed)) + packed
        data = memoryview(a).cast("B") if a.size else b""
        head += _len_header(_ARRAY_FIELDS["data"].number, len(data))
        self._add(_len_header(self.fields[name].number, len(head) + len(data)) + head)
        self._add(data)
        return self

    def message(self, msg) -> Encoded:
        """Append a generated message of the same type (its fields merge into these)."""
        self._add(msg.SerializeToString())
        return self

    def copy(self) -> Encoded:
        """Another message starting with these fields (the buffers are shared, not copied)."""
        out = Encoded.__new__(Encoded)
        out.fields, out.parts, out.nbytes = self.fields, list(self.parts), self.nbytes
        return out

    def tobytes(self) -> bytes:
        return b"".join(self.parts)

    def wrap(self, outer, name: str, prefix: bytes = b"") -> Encoded:
        """This message as the field ``name`` of an ``outer`` message, after ``prefix``
        (the outer message's other fields, serialised); the buffers are shared."""
        out = Encoded(outer)
        if prefix:
            out._add(prefix)
        out._add(_len_header(out.fields[name].number, self.nbytes))
        out.extend(self)
        return out

    def extend(self, other: Encoded) -> Encoded:
        """Append ``other``'s fields (the same type: a repeated field grows)."""
        self.parts.extend(other.parts)
        self.nbytes += other.nbytes
        return self


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
    data = msg.data  # (each read copies it)
    offs = from_array(msg.offsets, "<i8", f"{name}.offsets")
    if offs.size == 0 and not data:
        return None
    if offs.shape != (n + 1,):
        raise WireError(f"{name}: {offs.size} offsets for {n} rows; need n + 1")
    if offs[0] != 0 or offs[-1] != len(data) or np.any(np.diff(offs) < 0):
        raise WireError(f"{name}: offsets must start at 0, never decrease and end at "
                        f"len(data) = {len(data)}")
    return pa.Array.from_buffers(PAYLOAD_TYPE, n, [None, pa.py_buffer(offs.tobytes()),
                                                   pa.py_buffer(data)])
