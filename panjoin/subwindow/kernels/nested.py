"""Nested-loop probe kernel: every probe tuple scans every stored tuple.

The baseline of handshake join, SplitJoin and ScaleJoin inside a subwindow.
Two passes over chunks of the probe batch, in parallel: count the matches of
each probe tuple, then write them at prefix-sum offsets, so that threads never
share an output slot. The scan itself is the shared unsorted-band scan
(:func:`panjoin.subwindow.kernels.scan.scan_bands`).
"""

import numpy as np

from panjoin.config import NJIT_PAR
from panjoin.jit import njit, prange
from panjoin.subwindow.kernels.scan import scan_bands  # window bounds closed: see window.py


@njit(**NJIT_PAR)
def nested_probe(keys, ts, seq, n, lo, hi, mode, c0, c1, c2):
    m = lo.shape[1]
    counts = np.zeros(m + 1, dtype=np.int64)
    empty = np.empty(0, dtype=np.int64)
    no_k2 = np.empty(0, dtype=np.float64)  # no residual: key2 and its bounds are never read
    no_res = np.empty((0, 0), dtype=np.float64)
    for i in prange(m):
        counts[i + 1] = scan_bands(keys, ts, seq, no_k2, n, lo, hi, i, mode, c0, c1, c2, no_res,
                                   no_res, False, False, empty, 0, 0, False)
    offs = np.cumsum(counts)
    total = offs[m]
    out_probe = np.empty(total, dtype=np.int64)
    out_seq = np.empty(total, dtype=np.int64)
    for i in prange(m):
        start = offs[i]
        stop = offs[i + 1]
        if stop == start:
            continue
        scan_bands(keys, ts, seq, no_k2, n, lo, hi, i, mode, c0, c1, c2, no_res, no_res, False,
                   True, out_seq, start, stop, False)
        for j in range(start, stop):
            out_probe[j] = i
    return out_probe, out_seq
