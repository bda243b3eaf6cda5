"""Exact float64 band bounds, one pass over the keys.

A band ``a <= stored - probe <= b`` on float64 keys must hold for the real difference,
not for a rounded one. For a probe key ``k`` the least stored value that passes is the
least float64 ``c`` with ``c - k >= a`` exactly: it starts from ``k + a`` (rounded), steps
up one ulp (``nextafter``) while ``c - k >= a`` fails. The difference is decided
exactly by TwoSum: ``d = c - k`` rounded plus its error term ``err``, so ``c - k >= a``
holds iff ``d > a`` or ``d == a`` and ``err >= 0``. The greatest value with
``c - k <= b`` mirrors it. A band empty for a key (``lo > hi``) comes out as
``lo = inf, hi = -inf``. numpy took some twenty array passes a step for this (100-230
ns a key: the residual of a 2-D band join, a tenth of its join); the kernel takes 6-18.

Example, band:0.2 probing from R (``a = -0.2, b = 0.2``) with ``k = 0.1``: ``0.1 + 0.2``
rounds to ``0.30000000000000004``, whose real difference from ``0.1`` exceeds the
float64 ``0.2``; one ulp down, ``0.3`` passes (``0.3 - 0.1`` is just below ``0.2`` in
reals), so ``hi = 0.3``::

    >>> import numpy as np
    >>> lo, hi = np.empty(1), np.empty(1)
    >>> float_bounds(np.array([0.1]), -0.2, 0.2, lo, hi)
    >>> float(lo[0]), float(hi[0])
    (-0.1, 0.3)
"""

import math

import numpy as np

from panjoin.config import NJIT
from panjoin.jit import njit


@njit(inline="always", **NJIT)
def _ge(c, k, a):
    """``c - k >= a`` exactly (TwoSum's error-free difference)."""
    d = c - k
    bb = d - c
    err = (c - (d - bb)) + (-k - bb)
    return d > a or (d == a and err >= 0)


@njit(inline="always", **NJIT)
def _le(c, k, b):
    """``c - k <= b`` exactly."""
    d = c - k
    bb = d - c
    err = (c - (d - bb)) + (-k - bb)
    return d < b or (d == b and err <= 0)


@njit(**NJIT)
def float_bounds(keys, a, b, lo, hi):
    """For each key ``k``: ``lo`` the least float64 ``c`` with ``c - k >= a`` exactly
    (``-inf`` for ``a = -inf``), ``hi`` the greatest with ``c - k <= b`` (``inf`` for
    ``b = inf``); ``lo = inf, hi = -inf`` where none passes both. Rounded to nearest,
    ``k + a`` is one of the two floats around the exact sum: the upper one is the
    answer, the lower one is one ulp step below it (the loop allows four). No step
    ever goes back down: a float below the upper one is below the exact sum."""
    for i in range(keys.shape[0]):
        k = keys[i]
        if a == -math.inf:
            c = -math.inf
        else:
            c = k + a
            for _ in range(4):
                if _ge(c, k, a) or not math.isfinite(c):
                    break
                c = np.nextafter(c, math.inf)
        if b == math.inf:
            h = math.inf
        else:
            h = k + b
            for _ in range(4):
                if _le(h, k, b) or not math.isfinite(h):
                    break
                h = np.nextafter(h, -math.inf)
        if c > h:
            c = math.inf
            h = -math.inf
        lo[i] = c
        hi[i] = h
