"""Nested-loop probe kernel: every probe tuple scans every stored tuple.

The baseline of handshake join, SplitJoin and ScaleJoin inside a subwindow.
Two passes over chunks of the probe batch, in parallel: count the matches of
each probe tuple, then write them at prefix-sum offsets, so that threads never
share an output slot.
"""

import numpy as np
from numba import njit, prange

from panjoin.config import NJIT, NJIT_PAR
from panjoin.subwindow.kernels.window import in_window


@njit(**NJIT)
def _scan_one(keys, ts, seq, n, lo, hi, mode, c0, c1, c2, i, out_seq, pos):
    """Matches of probe tuple i; written from out_seq[pos] on when out_seq is non-empty."""
    count = 0
    write = out_seq.shape[0] > 0
    for b in range(lo.shape[0]):
        l = lo[b, i]
        h = hi[b, i]
        if l > h:
            continue
        for p in range(n):
            k = keys[p]
            if k >= l and k <= h and in_window(mode, c0[i], c1[i], c2[i], seq[p], ts[p]):
                if write:
                    out_seq[pos + count] = seq[p]
                count += 1
    return count


@njit(**NJIT_PAR)
def nested_probe(keys, ts, seq, n, lo, hi, mode, c0, c1, c2):
    m = lo.shape[1]
    counts = np.zeros(m + 1, dtype=np.int64)
    empty = np.empty(0, dtype=np.int64)
    for i in prange(m):
        counts[i + 1] = _scan_one(keys, ts, seq, n, lo, hi, mode, c0, c1, c2, i, empty, 0)
    offs = np.cumsum(counts)
    total = offs[m]
    out_probe = np.empty(total, dtype=np.int64)
    out_seq = np.empty(total, dtype=np.int64)
    for i in prange(m):
        start = offs[i]
        got = _scan_one(keys, ts, seq, n, lo, hi, mode, c0, c1, c2, i, out_seq[start:], 0)
        for j in range(got):
            out_probe[start + j] = i
    return out_probe, out_seq
