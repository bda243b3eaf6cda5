"""The manager's kernels: a pushed chunk split into its two streams in one pass, and
lateness in one pass.

Step 1 of the PanJoin manager numbers every arrival: a tuple of stream x at chunk
row i, the j-th of x in the chunk, gets ``seq = total_x + j`` (its arrival number in
x) and ``opp = total_y + i - j`` (arrivals of the other stream before it), and the
chunk's columns are written per stream, straight into that stream's collect buffer
after the rows it holds (``split_into_buffers``), in one pass where numpy took a dozen
(masks, cumulative sums, nonzero, gathers), and with no copy when a batch is cut.

Example: streams ``[0, 1, 0]`` after 5 R and 7 S arrivals: the R rows get seq 5, 6
and opp 7, 8; the S row gets seq 7 and opp 6; the arrivals of R up to each row are
``[1, 1, 2]``.

Lateness (time windows without a client's watermark) is one pass too: a tuple is late
iff its ts is below the largest ts of all earlier arrivals minus L (``late_rows``; the
rule is :func:`panjoin.semantics.late_mask`'s, which took a running maximum, a shifted
copy and a saturating subtraction, each a whole chunk's temporary).

Step 2's sort is :mod:`panjoin.key_sort_kernels`' (the workers of key placement sort
too). Under key placement a worker's rows of a batch go out gathered and narrowed in
one pass (``gather_offsets``): each column as uint32 offsets from the batch's least
value, where numpy took a gather, a least and a largest value, a subtraction and a cast
per column. Rows ``[1, 3]`` of keys ``[7, 5, 9, 6]`` (base 5) go as ``[0, 1]``.
(Routing and narrowing an equi join's batch in one scatter pass, each row written into
its worker's part, was slower: 4.7-5.7 ms a 256K-row batch against 3.8-4.4 for the
routing and the gathers, its 17 write streams the limit.)
"""

import numpy as np

from panjoin.config import NJIT
from panjoin.jit import njit


def split_into_buffers(stream, keys, ts, ids, total_r, total_s, r_cols, s_cols, off_r, off_s):
    """Number a pushed chunk's rows and write each into its stream's collect buffer:
    ``r_cols`` and ``s_cols`` are ``(key, ts, seq, id, opp)`` arrays (ts None for a
    count window, id None where ids are seqs: neither read nor written), written from
    ``off_r`` and ``off_s`` on. Returns ``(n_r, n_s, c_r)``: the rows of each stream, and
    the R arrivals up to and including each chunk row."""
    c_r = np.empty(stream.shape[0], dtype=np.int64)
    kr, tr, qr, ir, pr = r_cols
    ks, tsx, qs, isx, ps = s_cols
    with_ts, with_ids = ts is not None, ids is not None
    nr, ns = split_into(stream, keys, ts if with_ts else _NO, ids if with_ids else _NO,
                        with_ts, with_ids, total_r, total_s, off_r, off_s, kr, ks,
                        tr if with_ts else _NO, tsx if with_ts else _NO, qr, qs,
                        ir if with_ids else _NO, isx if with_ids else _NO, pr, ps, c_r)
    return nr, ns, c_r


#: what split_into is given for a column it neither reads nor writes
_NO = np.zeros(1, dtype=np.int64)


@njit(**NJIT)
def split_into(stream, keys, ts, ids, with_ts, with_ids, total_r, total_s, off_r, off_s,
               kr, ks, tr, tsx, qr, qs, ir, isx, pr, ps, c_r):
    """:func:`split_into_buffers`' pass: row i of stream R is the ``nr``-th R row of the
    chunk, written at ``off_r + nr`` of R's columns (key, ts, seq = ``total_r + nr``,
    id, opp = ``total_s + ns``), and likewise for S; returns ``n_r, n_s``."""
    nr = 0
    ns = 0
    for i in range(stream.shape[0]):
        if stream[i]:
            j = off_s + ns
            ks[j] = keys[i]
            qs[j] = total_s + ns
            ps[j] = total_r + nr
            if with_ts:
                tsx[j] = ts[i]
            if with_ids:
                isx[j] = ids[i]
            ns += 1
        else:
            j = off_r + nr
            kr[j] = keys[i]
            qr[j] = total_r + nr
            pr[j] = total_s + ns
            if with_ts:
                tr[j] = ts[i]
            if with_ids:
                ir[j] = ids[i]
            nr += 1
        c_r[i] = nr
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


@njit(**NJIT)
def gather_offsets(key, ts, ids, rows, key_base, ts_base, ids_base, with_ids, out):
    """Rows ``rows`` (ascending) of a batch as uint32 offsets, into ``out`` ((4, m), or
    (3, m) without ids): ``key - key_base``, ``ts - ts_base``, the row's offset from
    ``rows[0]`` (its seq's, a stream's seqs being consecutive) and, ``with_ids``,
    ``id - ids_base``. The caller has checked that each column's span over the batch is
    below 2^32."""
    first = rows[0] if rows.shape[0] else 0
    for i in range(rows.shape[0]):
        r = rows[i]
        out[0, i] = np.uint32(key[r] - key_base)
        out[1, i] = np.uint32(ts[r] - ts_base)
        out[2, i] = np.uint32(r - first)
    if with_ids:
        for i in range(rows.shape[0]):
            out[3, i] = np.uint32(ids[rows[i]] - ids_base)
