"""Histogram counts of durations, kept where the work is done and read by the
Prometheus collectors at scrape time (:mod:`panjoin.ops.metrics`).

A :class:`Timings` is a fixed list of bucket counts: ``observe(s, n)`` adds ``n``
observations of ``s`` seconds to the first bucket whose upper bound is at least ``s``
(one bisect and one add: cheap enough for every batch). Prometheus wants cumulative
buckets, which :meth:`Timings.cumulative` gives:

    >>> t = Timings()
    >>> t.observe(0.003); t.observe(0.2, n=2)
    >>> [(le, c) for le, c in t.cumulative() if le in ("0.005", "0.25", "+Inf")]
    [('0.005', 1), ('0.25', 3), ('+Inf', 3)]
    >>> t.count, round(t.sum, 3)
    (3, 0.403)

Many durations at once (one per pair of a batch) go in by :meth:`Timings.observe_many`,
one numpy pass:

    >>> t.observe_many(np.array([0.0001, 40.0])); t.count
    5

The status page (:mod:`panjoin.ops.page`) shows percentiles of the last seconds: the
observations since an earlier copy, and a quantile interpolated inside its bucket as
Prometheus' ``histogram_quantile`` does (0.2 s lies in the bucket (0.1, 0.25]):

    >>> before = t.copy(); t.observe(0.2, n=2)
    >>> d = t.since(before); d.count, round(d.quantile(0.5), 3)
    (2, 0.175)
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

#: upper bounds (s): sub-millisecond batches up to multi-second stalls
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
           5.0, 10.0, 30.0)


class Timings:
    """Counts of observed durations per bucket of :data:`BUCKETS` (plus one above)."""

    __slots__ = ("counts", "sum")

    def __init__(self):
        self.counts = [0] * (len(BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, seconds: float, n: int = 1) -> None:
        """``n`` observations of ``seconds`` each."""
        self.counts[bisect_left(BUCKETS, seconds)] += n
        self.sum += seconds * n

    def observe_many(self, seconds: np.ndarray) -> None:
        """One observation per element of ``seconds`` (bucketed as :meth:`observe`)."""
        if not len(seconds):
            return
        idx = np.searchsorted(BUCKETS, seconds, side="left")
        for i, c in enumerate(np.bincount(idx, minlength=len(self.counts)).tolist()):
            self.counts[i] += c
        self.sum += float(np.sum(seconds))

    def add(self, other: Timings) -> None:
        """Fold ``other``'s observations into these."""
        for i, c in enumerate(other.counts):
            self.counts[i] += c
        self.sum += other.sum

    def copy(self) -> Timings:
        t = Timings()
        t.add(self)
        return t

    def since(self, earlier: Timings) -> Timings:
        """The observations made after ``earlier`` (a copy of these, taken before)."""
        t = Timings()
        t.counts = [a - b for a, b in zip(self.counts, earlier.counts, strict=True)]
        t.sum = self.sum - earlier.sum
        return t

    def quantile(self, q: float) -> float | None:
        """The ``q``-quantile (0..1), linear inside its bucket (the largest bound for
        the bucket above it); None without observations."""
        n = self.count
        if n == 0:
            return None
        rank, run = q * n, 0
        for i, c in enumerate(self.counts):
            if c and run + c >= rank:
                if i == len(BUCKETS):
                    return BUCKETS[-1]
                lo = BUCKETS[i - 1] if i else 0.0
                return lo + (BUCKETS[i] - lo) * (rank - run) / c
            run += c
        return BUCKETS[-1]

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """``[(le, observations <= le)]``, Prometheus' buckets, ending with "+Inf"."""
        out, run = [], 0
        for le, c in zip((*(f"{b:g}" for b in BUCKETS), "+Inf"), self.counts, strict=True):
            run += c
            out.append((le, run))
        return out
