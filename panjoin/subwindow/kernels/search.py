"""Rebounding binary search (PanJoin paper, section III-E, Figure 6).

A sorted batch probes a sorted array: the answer for the next batch tuple is
never left of the answer for the current one, so each search starts where the
previous one ended. Forward phase: step 1, 2, 4, ... until an element is not
below the target; backward phase: halve the step and binary-search the last
bracket. Cost O(log d) for a jump of d, instead of O(log n).

    arr = [1, 3, 3, 5, 8, 13, 21]
    gallop_left(arr, 5, 1)  -> 3     (first index >= 1 with arr[i] >= 5)
    gallop_right(arr, 5, 3) -> 4     (first index >= 3 with arr[i] > 5)
"""

import numpy as np

from panjoin.config import NJIT
from panjoin.jit import njit


@njit(**NJIT)
def gallop_left_range(arr, target, start, end):
    """Smallest i in [start, end] with arr[i] >= target (end if none): forward phase doubling
    the step while arr[hi] < target, backward phase halving it (binary search)."""
    if start >= end or arr[start] >= target:
        return start
    lo = start
    step = 1
    hi = lo + step
    while hi < end and arr[hi] < target:
        lo = hi
        step <<= 1
        hi = lo + step
    if hi > end:
        hi = end
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if arr[mid] < target:
            lo = mid
        else:
            hi = mid
    return hi


@njit(**NJIT)
def gallop_right_range(arr, target, start, end):
    """Smallest i in [start, end] with arr[i] > target (end if none)."""
    if start >= end or arr[start] > target:
        return start
    lo = start
    step = 1
    hi = lo + step
    while hi < end and arr[hi] <= target:
        lo = hi
        step <<= 1
        hi = lo + step
    if hi > end:
        hi = end
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if arr[mid] <= target:
            lo = mid
        else:
            hi = mid
    return hi


@njit(**NJIT)
def gallop_left(arr, target, start):
    """Smallest i >= start with arr[i] >= target (len(arr) if none); arr sorted."""
    return gallop_left_range(arr, target, start, arr.shape[0])


@njit(**NJIT)
def gallop_right(arr, target, start):
    """Smallest i >= start with arr[i] > target (len(arr) if none); arr sorted."""
    return gallop_right_range(arr, target, start, arr.shape[0])


@njit(**NJIT)
def chunk_bounds(n, parts):
    """Split range(n) into `parts` contiguous chunks; returns parts+1 offsets."""
    out = np.empty(parts + 1, dtype=np.int64)
    for t in range(parts + 1):
        out[t] = (n * t) // parts
    return out
