"""Numba kernel of a node's immediate scan: each entering tuple against the whole opposite segment.

Single-threaded on purpose: in handshake join every node is one core, and the
chain's parallelism comes from its nodes (a ``parallel=True`` kernel per node
would oversubscribe the cores the other nodes run on). One pass, output grown
by doubling. Window condition as in :mod:`panjoin.subwindow.kernels.window`.
With a residual (``has_res``), each pair passing the key condition must also have
``lo2[b, i] <= key2[p] <= hi2[b, i]`` for some residual band b: both conditions
are evaluated in the scan, as the paper's nested loop evaluates its predicate.

Example, band [5, 7] for probe 0 over stored keys [5, 9, 6], no window filter:
probe_idx [0, 0], pos [0, 2].
"""

import numpy as np
from numba import njit

from panjoin.config import NJIT
from panjoin.subwindow.kernels.residual import res_ok
from panjoin.subwindow.kernels.window import in_window


@njit(**NJIT)
def scan_segment(keys, ts, seq, lo, hi, mode, c0, c1, c2, key2, lo2, hi2, has_res):
    """Pairs (probe index i, stored position p) with lo[b, i] <= keys[p] <= hi[b, i] for some
    band b and the window condition true; positions index the segment's columns."""
    n = keys.shape[0]
    m = lo.shape[1]
    cap = 64
    out_i = np.empty(cap, dtype=np.int64)
    out_p = np.empty(cap, dtype=np.int64)
    k = 0
    for i in range(m):
        for b in range(lo.shape[0]):
            l = lo[b, i]
            h = hi[b, i]
            if l > h:
                continue
            for p in range(n):
                x = keys[p]
                if x >= l and x <= h and (not has_res or res_ok(lo2, hi2, i, key2[p])) \
                        and in_window(mode, c0[i], c1[i], c2[i], seq[p], ts[p]):
                    if k == cap:
                        cap *= 2
                        ni = np.empty(cap, dtype=np.int64)
                        np_ = np.empty(cap, dtype=np.int64)
                        ni[:k] = out_i[:k]
                        np_[:k] = out_p[:k]
                        out_i = ni
                        out_p = np_
                    out_i[k] = i
                    out_p[k] = p
                    k += 1
    return out_i[:k], out_p[:k]
