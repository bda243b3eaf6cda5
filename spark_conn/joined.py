"""The pipeline's joined output records, written by Numba kernels in one copy.

Each pair (r, s) becomes one JSON record holding both ids and both input records
as they came::

    {"r_id":7,"s_id":-3,"r":{"id": 7, "key": 5, "ts": 1},"s":{"id": -3, "key": 5, "ts": 2}}

:func:`frame` sizes every output record from the two records' lengths, writes the
fixed parts and the ids, and says where each input record goes; :func:`copy_spans`
then copies the input records into place, one call per source buffer (a micro-batch's
records: the window spans several). The records are copied once, straight from
the buffers the job keeps (:class:`spark_conn.record_window.RecordWindow`).

    >>> out, offs, dr, ds = frame(np.array([7]), np.array([-3]), np.array([2]),
    ...                           np.array([3]))
    >>> recs = np.frombuffer(b"{}[1]", np.uint8)
    >>> copy_spans(out, dr, recs, np.array([0]), np.array([2]))
    >>> copy_spans(out, ds, recs, np.array([2]), np.array([3]))
    >>> out.tobytes()
    b'{"r_id":7,"s_id":-3,"r":{},"s":[1]}'
"""

from __future__ import annotations

import numpy as np

from panjoin.config import NJIT
from panjoin.jit import njit

_HEAD = np.frombuffer(b'{"r_id":', np.uint8)
_MID = np.frombuffer(b',"s_id":', np.uint8)
_R = np.frombuffer(b',"r":', np.uint8)
_S = np.frombuffer(b',"s":', np.uint8)


@njit(**NJIT)
def _digits(v):
    """Characters of int64 ``v`` in decimal, its sign included."""
    n = 1
    m = np.uint64(-(v + 1)) + np.uint64(1) if v < 0 else np.uint64(v)
    while m >= np.uint64(10):
        m //= np.uint64(10)
        n += 1
    return n + (1 if v < 0 else 0)


@njit(**NJIT)
def _put_int(out, q, v, n):
    """Write int64 ``v`` (``n`` characters, from :func:`_digits`) at ``out[q:q+n]``."""
    if v < 0:
        out[q] = 45
    m = np.uint64(-(v + 1)) + np.uint64(1) if v < 0 else np.uint64(v)  # reaches -2**63
    p = q + n - 1
    while True:
        out[p] = 48 + np.uint8(m % np.uint64(10))
        m //= np.uint64(10)
        p -= 1
        if m == np.uint64(0):
            break


@njit(**NJIT)
def _put(out, q, part):
    out[q:q + len(part)] = part
    return q + len(part)


@njit(**NJIT)
def frame(r, s, rlen, slen):
    """Output records for pairs ``(r[i], s[i])`` whose records are ``rlen[i]`` and
    ``slen[i]`` bytes long: ``(data, offsets, r_at, s_at)`` with the fixed parts and
    the ids written, and ``data[r_at[i]:r_at[i]+rlen[i]]`` (likewise s) left for the
    records. O(output bytes)."""
    n = len(r)
    offs = np.empty(n + 1, np.int64)
    dr = np.empty(n, np.int64)
    ds = np.empty(n, np.int64)
    offs[0] = 0
    fixed = len(_HEAD) + len(_MID) + len(_R) + len(_S) + 1
    for i in range(n):
        offs[i + 1] = offs[i] + fixed + _digits(r[i]) + _digits(s[i]) + rlen[i] + slen[i]
    out = np.empty(offs[n], np.uint8)
    for i in range(n):
        q = _put(out, offs[i], _HEAD)
        k = _digits(r[i])
        _put_int(out, q, r[i], k)
        q = _put(out, q + k, _MID)
        k = _digits(s[i])
        _put_int(out, q, s[i], k)
        q = _put(out, q + k, _R)
        dr[i] = q
        q = _put(out, q + rlen[i], _S)
        ds[i] = q
        out[q + slen[i]] = 125  # }
    return out, offs, dr, ds


@njit(**NJIT)
def copy_spans(out, at, data, start, length):
    """``out[at[i]:at[i]+length[i]] = data[start[i]:start[i]+length[i]]`` for every i."""
    for i in range(len(at)):
        out[at[i]:at[i] + length[i]] = data[start[i]:start[i] + length[i]]
