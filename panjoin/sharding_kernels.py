"""The router's kernel (:mod:`panjoin.sharding`): one chunk routed to its shards in
passes without a branch, where numpy took a binary search per key and interval
(``searchsorted``), a boolean matrix of shards by rows and a ``nonzero`` per shard:
25 ns a tuple on an equi join over two shards.

The first pass gives every row a bitmask of its shards: an R tuple the one that owns its
key (the boundaries at or below it, :func:`panjoin.sharding.shard_of`), an S tuple every
shard whose key range meets one of its intervals of ``r.key``
(:func:`panjoin.sharding.s_targets`, from :func:`panjoin.semantics.probe_bounds`), a
late tuple none; and counts them. A pass per shard then writes its rows, in arrival
order. Example, boundary ``[10]``, ``band:2``: R key 9 -> shard 0 (mask 1), S key 11 ->
``r.key`` in [9, 13] -> shards 0 and 1 (mask 3), S key 5 -> [3, 7] -> shard 0 (mask
1); rows ``[0, 1, 2]`` and ``[1]``. An equi join's S tuple has one shard, as an R
tuple has: :func:`route_eq_rows` makes its mask from its key alone (a fifth of the
time over two shards).

Key placement (:mod:`panjoin.manager.key_placement`) routes a batch so, then sends each
worker its rows gathered and narrowed in one pass (:func:`gather_offsets`): each column
as uint32 offsets from the batch's least value, where numpy took a gather, a least and
a largest value, a subtraction and a cast per column. Rows ``[1, 3]`` of keys
``[7, 5, 9, 6]`` (base 5) go as ``[0, 1]``. (Routing and narrowing an equi join's batch
in one scatter pass, each row written into its worker's part, was slower: 4.7-5.7 ms a
256K-row batch against 3.8-4.4 for the routing and the gathers, its 17 write streams
the limit.)
"""

import numpy as np

from panjoin.config import NJIT
from panjoin.jit import njit


@njit(**NJIT)
def _shard(bounds, x):
    """How many boundaries are <= x: the shard that owns key x (a count, not a search:
    a handful of boundaries, and no branch for a random key to mispredict)."""
    s = 0
    for b in range(bounds.shape[0]):
        s += bounds[b] <= x
    return s


@njit(**NJIT)
def _span(f, last):
    """The bits of shards f..last (none when last < f)."""
    one = np.uint64(1)
    top = one << np.uint64(last)  # bits 0..last without a shift by 64
    return (top | (top - one)) & ~((one << np.uint64(f)) - one)


@njit(**NJIT)
def route_rows(stream, keys, late, bounds, s_lo, s_hi):
    """``rows``: shard j's rows in arrival order (at most 64 shards: a row's are the
    bits of one word). ``s_lo``, ``s_hi``: ``(bands, n)``, each row's intervals of
    ``r.key`` (read for S rows only; an empty one has lo > hi). Branch-free: a random
    stream and key order would mispredict every test."""
    n = stream.shape[0]
    k = bounds.shape[0] + 1
    one = np.uint64(1)
    masks = np.empty(n, np.uint64)
    counts = np.zeros(k, np.int64)
    for i in range(n):
        m_r = one << np.uint64(_shard(bounds, keys[i]))
        m_s = np.uint64(0)
        for b in range(s_lo.shape[0]):
            lo = s_lo[b, i]
            hi = s_hi[b, i]
            live = np.uint64(0) - np.uint64(lo <= hi)  # all ones, or none
            m_s |= _span(_shard(bounds, lo), _shard(bounds, hi)) & live
        is_s = np.uint64(0) - np.uint64(stream[i] != 0)
        m = ((m_r & ~is_s) | (m_s & is_s)) & (np.uint64(late[i]) - one)
        masks[i] = m
        for j in range(k):
            counts[j] += np.int64((m >> np.uint64(j)) & one)
    return _rows_of(masks, counts, k)


@njit(**NJIT)
def _rows_of(masks, counts, k):
    """Shard j's rows (those whose mask has bit j, ``counts[j]`` of them), in order: a
    pass a shard, each row written and kept by moving the end past it (no branch)."""
    one = np.uint64(1)
    rows = []
    for j in range(k):
        out = np.empty(counts[j] + 1, np.int64)  # + 1: the last row's write, not kept
        p = 0
        for i in range(masks.shape[0]):
            out[p] = i
            p += np.int64((masks[i] >> np.uint64(j)) & one)
        rows.append(out[:counts[j]])
    return rows


@njit(**NJIT)
def route_eq_rows(stream, keys, late, bounds):
    """``route_rows`` for an equi join, where an S tuple goes, as an R tuple does, to
    the one shard that owns its key: a row's mask is the one bit of that shard (none
    for a late row), counted as it is made, without intervals or a loop over the shards
    (3.5 against 17 ns a tuple over two shards). ``stream`` is not read: both streams
    route alike."""
    n = keys.shape[0]
    k = bounds.shape[0] + 1
    masks = np.empty(n, np.uint64)
    counts = np.zeros(k, np.int64)
    for i in range(n):
        s = _shard(bounds, keys[i])
        live = np.uint64(late[i]) - np.uint64(1)  # all ones, or none for a late row
        masks[i] = (np.uint64(1) << np.uint64(s)) & live
        counts[s] += np.int64(live & np.uint64(1))
    return _rows_of(masks, counts, k)


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
