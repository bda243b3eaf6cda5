"""The manager's kernels: a pushed chunk split into its two streams in one pass, and
lateness in one pass.

Step 1 of the PanJoin manager numbers every arrival: a tuple of stream x at chunk
row i, the j-th of x in the chunk, gets ``seq = total_x + j`` (its arrival number in
x) and ``opp = total_y + i - j`` (arrivals of the other stream before it), and the
chunk's columns are gathered per stream. ``split_streams`` does it in one branch-free
pass (the stream bit picks the output row), where numpy took a dozen passes (masks,
cumulative sums, nonzero, gathers): 8 of the engine's 57 ns per tuple at W = 256K.

Example: streams ``[0, 1, 0]`` after 5 R and 7 S arrivals: the R rows get seq 5, 6
and opp 7, 8; the S row gets seq 7 and opp 6; the arrivals of R up to each row are
``[1, 1, 2]``.

Lateness (time windows without a client's watermark) is one pass too: a tuple is late
iff its ts is below the largest ts of all earlier arrivals minus L (``late_rows``; the
rule is :func:`panjoin.semantics.late_mask`'s, which took a running maximum, a shifted
copy and a saturating subtraction, each a whole chunk's temporary).

Step 2's sort is :mod:`panjoin.key_sort_kernels`' (the workers of key placement sort
too); key placement's routing and its workers' rows are :mod:`panjoin.sharding_kernels`'.
"""

import numpy as np

from panjoin.config import NJIT
from panjoin.jit import njit


def split_streams(stream, keys, ts, ids, total_r, total_s):
    """``(key, ts, seq, id, opp)`` as (2, n) arrays (row 0: R in arrival order, row 1: S;
    ``n_r`` and ``n_s`` of them used), the per-stream counts ``n_r, n_s``, and ``c_r``,
    the R arrivals up to and including each chunk row. ``ts`` None (a count window,
    which never reads it) leaves the ts rows undefined; ``ids`` None too (ids are
    seqs) gives None for both and skips them (16 bytes a row fewer written).

    The outputs (88 bytes a chunk row) are numpy's: it advises arrays of 4 MiB and more
    for transparent huge pages, where the kernel's own allocation took 4 KiB page
    faults on every chunk (a 1M-row chunk: 44 ms, against 5 ms gathered)."""
    n = stream.shape[0]
    c_r = np.empty(n, dtype=np.int64)
    if ids is None:  # a count window whose tuples' ids are their seqs: key, seq, opp
        ok, oseq, oopp = (np.empty((2, n), dtype=keys.dtype),
                          np.empty((2, n), dtype=np.int64), np.empty((2, n), dtype=np.int64))
        nr, ns = split_keys_into(stream, keys, total_r, total_s, ok, oseq, oopp, c_r)
        return ok, None, oseq, None, oopp, nr, ns, c_r
    out = (np.empty((2, n), dtype=keys.dtype),) + tuple(
        np.empty((2, n), dtype=np.int64) for _ in range(4))
    # count windows never read ts: any int64 column of the chunk's length stands in
    nr, ns = split_into(stream, keys, ids if ts is None else ts, ids, total_r, total_s,
                        *out, c_r)
    return (*out, nr, ns, c_r)


@njit(inline="always", **NJIT)
def _number(stream, keys, i, nr, ns, total_r, total_s, ok, oseq, oopp, c_r):
    """Row ``i`` after ``nr`` R and ``ns`` S rows of its chunk: its key, seq and opp in
    its stream's output row, the R arrivals up to it; returns ``(stream, rank)``."""
    s = np.int64(stream[i])
    j = nr + (ns - nr) * s  # the tuple's rank in its stream
    ok[s, j] = keys[i]
    # seq: total of its own stream + j; opp: the other's total + the other's rank
    oseq[s, j] = total_r + (total_s - total_r) * s + j
    oopp[s, j] = total_s + (total_r - total_s) * s + (ns + (nr - ns) * s)
    c_r[i] = nr + 1 - s
    return s, j


@njit(**NJIT)
def split_keys_into(stream, keys, total_r, total_s, ok, oseq, oopp, c_r):
    """:func:`split_into` without ts and ids (a count window whose ids are seqs)."""
    nr = 0
    ns = 0
    for i in range(stream.shape[0]):
        s, _ = _number(stream, keys, i, nr, ns, total_r, total_s, ok, oseq, oopp, c_r)
        nr += 1 - s
        ns += s
    return nr, ns


@njit(**NJIT)
def split_into(stream, keys, ts, ids, total_r, total_s, ok, ot, oseq, oid, oopp, c_r):
    """:func:`split_streams`' pass, into its outputs; returns ``n_r, n_s``."""
    nr = 0
    ns = 0
    for i in range(stream.shape[0]):
        s, j = _number(stream, keys, i, nr, ns, total_r, total_s, ok, oseq, oopp, c_r)
        ot[s, j] = ts[i]
        oid[s, j] = ids[i]
        nr += 1 - s
        ns += s
    return nr, ns


def late_tuples(ts: np.ndarray, maxts: int | None, lateness: int):
    """``(late mask, how many, largest ts so far)`` of an arrival-ordered chunk after
    ``maxts`` (None: nothing arrived before it): :func:`late_rows` for the engine and the
    sharded client's router."""
    late = np.empty(ts.shape[0], dtype=bool)
    if ts.shape[0] == 0:
        return late, 0, maxts
    n_late, top = late_rows(ts, 0 if maxts is None else maxts, maxts is not None,
                            lateness, late)
    return late, int(n_late), int(top)


@njit(**NJIT)
def late_rows(ts, maxts, has_max, lateness, late):
    """:func:`panjoin.semantics.late_mask` in one pass: ``late[i]`` iff ``ts[i]`` is below
    the largest ts before it (``maxts`` before the chunk, if ``has_max``) minus
    ``lateness`` (>= 0; a bound below int64's least value makes nothing late). Returns
    ``(late rows, largest ts after the chunk)``."""
    n = ts.shape[0]
    lowest = np.iinfo(np.int64).min
    top = maxts
    bound = lowest
    if has_max and top >= lowest + lateness:
        bound = top - lateness
    n_late = 0
    for i in range(n):
        t = ts[i]
        is_late = has_max and t < bound
        late[i] = is_late
        if is_late:
            n_late += 1
        if not has_max or t > top:
            top = t
            has_max = True
            bound = top - lateness if top >= lowest + lateness else lowest
    return n_late, top
