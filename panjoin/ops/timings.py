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
"""

from __future__ import annotations

from bisect import bisect_left

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

    def add(self, other: Timings) -> None:
        """Fold ``other``'s observations into these."""
        for i, c in enumerate(other.counts):
            self.counts[i] += c
        self.sum += other.sum

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
