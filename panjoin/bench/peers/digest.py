"""The fingerprint of a result's pair set: :class:`PairDigest`, and its Numba kernel.

A large peer run finds billions of (r_id, s_id) pairs, too many to keep and sort,
so every peer folds its pairs into a digest chunk by chunk as it emits them and
drops them: the count and ``sum(h(r, s)) mod 2**64`` with ``h(r, s) =
mix(mix(r) ^ s)`` (``mix``: splitmix64's finaliser, a bijection of 64-bit words in
which every input bit flips about half the output bits). A sum does not depend on
the order or the chunking of the pairs; a missing, extra, duplicated or changed
pair moves it by a difference of hashes, zero only by a 64-bit coincidence.

Worked trace: three pairs folded in two chunks, then in another order at once,
then with one s_id wrong (3 -> 4), the count unchanged::

    >>> a = PairDigest()
    >>> a.add(np.array([0, 2]), np.array([1, 3])).add(np.array([5]), np.array([4])).hex()
    '50014612403a705d'
    >>> pair_digest(np.array([[5, 4], [0, 1], [2, 3]])).hex()
    '50014612403a705d'
    >>> b = pair_digest(np.array([[5, 4], [0, 1], [2, 4]]))
    >>> b.count, b.hex()
    (3, '2c36d67ef6ae2f95')
"""

from __future__ import annotations

import time

import numpy as np

from panjoin.config import NJIT
from panjoin.jit import njit

_MASK = (1 << 64) - 1


@njit(inline="always", **NJIT)
def _mix(x):
    """splitmix64's finaliser of one uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(**NJIT)
def _fold(r_ids, s_ids):
    """``sum(mix(mix(r) ^ s)) mod 2**64`` over the pairs (r_ids[i], s_ids[i]) (arrays of
    equal length, any integer type; ids are taken as their 64-bit words)."""
    acc = np.uint64(0)
    for i in range(r_ids.size):
        acc += _mix(_mix(np.uint64(r_ids[i])) ^ np.uint64(s_ids[i]))
    return acc


class PairDigest:
    """Order-free fingerprint of a multiset of (r_id, s_id) pairs: :attr:`count` and
    :meth:`hex` (see the module's docstring). Folding costs under a nanosecond per pair,
    kept in :attr:`seconds` so that a timer can take it off the peer's time (the peer's
    join is measured, not the check)."""

    def __init__(self):
        self.count = 0
        self.sum = 0
        self.seconds = 0.0  # spent folding

    def add(self, r_ids, s_ids) -> PairDigest:
        """Fold in the pairs (r_ids[i], s_ids[i]); returns self."""
        t0 = time.perf_counter()
        r, s = np.ascontiguousarray(r_ids), np.ascontiguousarray(s_ids)
        if r.shape != s.shape or r.ndim != 1:
            raise ValueError(f"r_ids {r.shape} and s_ids {s.shape}: want two equal 1-D arrays")
        if r.size:
            self.sum = (self.sum + int(_fold(r, s))) & _MASK
            self.count += int(r.size)
        self.seconds += time.perf_counter() - t0
        return self

    def hex(self) -> str:
        """The fingerprint as 16 hex digits (with :attr:`count`, the result's identity)."""
        return f"{self.sum:016x}"


def pair_digest(pairs: np.ndarray) -> PairDigest:
    """The digest of an (n, 2) array of (r_id, s_id) pairs, e.g. the reference's."""
    pairs = np.asarray(pairs).reshape(-1, 2)
    return PairDigest().add(pairs[:, 0], pairs[:, 1])
