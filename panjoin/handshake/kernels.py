"""Numba kernel of a node's immediate scan: each entering tuple against the whole opposite segment.

Single-threaded on purpose: in handshake join every node is one core, and the
chain's parallelism comes from its nodes (a ``parallel=True`` kernel per node
would oversubscribe the cores the other nodes run on). Window condition as in
:mod:`panjoin.subwindow.kernels.window`. With a residual (``has_res``), each pair
passing the key condition must also have ``lo2[b, i] <= key2[p] <= hi2[b, i]``
for some residual band b: both conditions are evaluated in the scan, as the
paper's nested loop evaluates its predicate.

The scan is the paper's SIMD nested loop in spirit, and the one every unsorted
scan shares (:func:`panjoin.subwindow.kernels.scan.scan_bands`): the segment is read
in blocks of ``scan.BLOCK`` keys, and a branch-free (vectorised) pass over a block counts
its key-condition candidates; only a block holding one is scanned again with the
full condition (key, residual, window). At the section 5.2 selectivity (21 in
10,000 keys per band) most blocks are skipped after the branch-free pass. Two
passes over the probe batch, count then fill, so the output is written once at
prefix-sum offsets.

Example, band [5, 7] for probe 0 over stored keys [5, 9, 6], no window filter:
probe_idx [0, 0], pos [0, 2].
"""

import numpy as np

from panjoin.config import NJIT
from panjoin.jit import njit
from panjoin.subwindow.kernels.scan import scan_bands  # window bounds closed: see window.py


@njit(inline="always", **NJIT)
def _scan_segment(keys, ts, seq, lo, hi, mode, c0, c1, c2, key2, lo2, hi2, has_res):
    n = keys.shape[0]
    m = lo.shape[1]
    counts = np.zeros(m + 1, dtype=np.int64)
    empty = np.empty(0, dtype=np.int64)
    for i in range(m):
        counts[i + 1] = scan_bands(keys, ts, seq, key2, n, lo, hi, i, mode, c0, c1, c2, lo2, hi2,
                                   has_res, False, empty, 0, 0, True)
    offs = np.cumsum(counts)
    out_i = np.empty(offs[m], dtype=np.int64)
    out_p = np.empty(offs[m], dtype=np.int64)
    for i in range(m):
        if counts[i + 1]:
            scan_bands(keys, ts, seq, key2, n, lo, hi, i, mode, c0, c1, c2, lo2, hi2, has_res,
                       True, out_p, offs[i], offs[i + 1], True)
            out_i[offs[i]:offs[i + 1]] = i
    return out_i, out_p


@njit(**NJIT)
def scan_segment(keys, ts, seq, lo, hi, mode, c0, c1, c2, key2, lo2, hi2, has_res):
    """Pairs (probe index i, stored position p) with lo[b, i] <= keys[p] <= hi[b, i] for some
    band b, the residual (if ``has_res``) and the window condition true; positions index
    the segment's columns. One copy of the scan per value of ``has_res``, a constant in
    each (see :func:`panjoin.subwindow.kernels.scan.scan_band`)."""
    if has_res:
        return _scan_segment(keys, ts, seq, lo, hi, mode, c0, c1, c2, key2, lo2, hi2, True)
    return _scan_segment(keys, ts, seq, lo, hi, mode, c0, c1, c2, key2, lo2, hi2, False)
