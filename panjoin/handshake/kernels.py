"""Numba kernel of a node's immediate scan: each entering tuple against the whole opposite segment.

Single-threaded on purpose: in handshake join every node is one core, and the
chain's parallelism comes from its nodes (a ``parallel=True`` kernel per node
would oversubscribe the cores the other nodes run on). Window condition as in
:mod:`panjoin.subwindow.kernels.window`. With a residual (``has_res``), each pair
passing the key condition must also have ``lo2[b, i] <= key2[p] <= hi2[b, i]``
for some residual band b: both conditions are evaluated in the scan, as the
paper's nested loop evaluates its predicate.

The scan is the paper's SIMD nested loop in spirit: the segment is read in blocks
of ``BLOCK`` keys, and a branch-free (vectorised) pass over a block counts its
key-condition candidates; only a block holding one is scanned again with the
full condition (key, residual, window). At the section 5.2 selectivity (21 in
10,000 keys per band) most blocks are skipped after the branch-free pass. Two
passes over the probe batch, count then fill, so the output is written once at
prefix-sum offsets.

Example, band [5, 7] for probe 0 over stored keys [5, 9, 6], no window filter:
probe_idx [0, 0], pos [0, 2].
"""

import numpy as np
from numba import njit

from panjoin.config import NJIT
from panjoin.subwindow.kernels.residual import res_ok
from panjoin.subwindow.kernels.window import in_window

#: keys per block of the branch-free candidate pass
BLOCK = 32


@njit(inline="always", **NJIT)
def _scan_probe(keys, ts, seq, lo, hi, mode, c0, c1, c2, key2, lo2, hi2, has_res, i,
                out_i, out_p, k):
    """Matches of probe tuple i: counted (out_i empty) or written from out_i[k] on.
    Returns the count, or the new k."""
    n = keys.shape[0]
    write = out_i.shape[0] > 0
    c = 0
    for b in range(lo.shape[0]):
        l = lo[b, i]
        h = hi[b, i]
        if l > h:
            continue
        for a in range(0, n, BLOCK):
            e = min(n, a + BLOCK)
            cand = 0
            for p in range(a, e):  # branch-free: vectorised
                x = keys[p]
                cand += (x >= l) & (x <= h)
            if cand == 0:
                continue
            for p in range(a, e):
                x = keys[p]
                if x >= l and x <= h and (not has_res or res_ok(lo2, hi2, i, key2[p])) \
                        and in_window(mode, c0[i], c1[i], c2[i], seq[p], ts[p]):
                    if write:
                        out_i[k] = i
                        out_p[k] = p
                        k += 1
                    else:
                        c += 1
    return k if write else c


@njit(**NJIT)
def scan_segment(keys, ts, seq, lo, hi, mode, c0, c1, c2, key2, lo2, hi2, has_res):
    """Pairs (probe index i, stored position p) with lo[b, i] <= keys[p] <= hi[b, i] for some
    band b, the residual (if ``has_res``) and the window condition true; positions index
    the segment's columns."""
    m = lo.shape[1]
    counts = np.zeros(m + 1, dtype=np.int64)
    empty = np.empty(0, dtype=np.int64)
    for i in range(m):
        counts[i + 1] = _scan_probe(keys, ts, seq, lo, hi, mode, c0, c1, c2, key2, lo2, hi2,
                                    has_res, i, empty, empty, 0)
    offs = np.cumsum(counts)
    out_i = np.empty(offs[m], dtype=np.int64)
    out_p = np.empty(offs[m], dtype=np.int64)
    for i in range(m):
        if counts[i + 1]:
            _scan_probe(keys, ts, seq, lo, hi, mode, c0, c1, c2, key2, lo2, hi2, has_res, i,
                        out_i, out_p, offs[i])
    return out_i, out_p
