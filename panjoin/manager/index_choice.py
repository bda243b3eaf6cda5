"""``--index auto``: the index each new subwindow gets, from what the engine observes.

The paper's rule (section V-A4): BI-Sort when batches are large or the selectivity is
high; otherwise RaP-Table if the key distribution is stable and keys do not increase,
else WiB+-Tree. This project's measurements refine it (benchmarks/RESULTS.md, issues
20, 27 and 31; ``benchmarks/index_auto.py``):

- BI-Sort was at least as fast as RaP-Table and WiB+-Tree on every workload measured
  here, small batches and increasing keys included (increasing keys make its merges
  appends), so it takes both their places;
- a hash table answers an equi join with one lookup a probe tuple and never merges:
  2.4-2.9x BI-Sort at 4K-16K-tuple batches over subwindows of 512K-1M tuples (twelfth
  session: the lookups in passes over a frontier), a p99 2-4x lower under a latency
  bound; but BI-Sort wins
  - from 32K-128K tuples a batch on, the more the smaller the subwindows (its
    sequential merge-probe; at 64K 1.1-1.2x over NSub 128K-256K while hash still wins
    1.1-1.3x over 512K-1M; at 256K 1.25x over 1M),
  - over subwindows that fit the caches (NSub 16K-64K: its searches stay in cache),
  - with many pairs a probe tuple (zipf keys, 11 pairs a tuple at W 1M: a hash chain
    reads one row per pair at random, BI-Sort one contiguous range; 2.2x),
  - on increasing keys (1.3x: BI-Sort's probes and appends stay at the end),
  - on bands, even of a few integer keys (one lookup a key: 2-3x BI-Sort's one range).

So: ``hash`` while the predicate is equality (``eq``, with any residual), subwindows
hold at least :data:`HASH_MIN_NSUB` tuples, :data:`WARM_BATCHES` batches were seen,
the batches average at most
:data:`HASH_MAX_BATCH` tuples, probe tuples average at most :data:`HASH_MAX_PAIRS`
pairs (scaled up while the window still fills), and keys do not arrive increasing;
``bisort`` otherwise. Under a latency bound (``bounded``) the batch size does not
count: the bound wants small batches, and a BI-Sort subwindow's fixed cost a probe
(1.5-4 ms a batch at NSub 512K) makes every batch of its lifetime large, which makes
the next subwindows BI-Sort too; hash at large batches costs at most 1.3x BI-Sort's
(a backlog, an overload). The averages are running
ones (the newest batch weighs :data:`EWMA`): under ``--max-latency`` the engine sizes
batches to the load, so a join that speeds up moves its new subwindows to BI-Sort and
back. A subwindow keeps its index for life; new ones follow the stream::

    >>> c = IndexChooser(parse_predicate("eq"), nsub=512 * 1024)
    >>> for _ in range(8): c.observe_batch(1024, pairs=900, keys=np.array([5, 1, 9, 2]))
    >>> c.choose()
    Choice(kind='hash', why='eq, batches of ~1,024 tuples, ~0.9 pairs a tuple: lookups')
    >>> for _ in range(20): c.observe_batch(131072, pairs=120000)
    >>> c.choose().kind
    'bisort'
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from panjoin.semantics import Predicate, parse_predicate  # noqa: F401 (the doctest's)

#: batches of at most this many tuples (on average) may go to hash subwindows (none
#: counts under a latency bound)
HASH_MAX_BATCH = 16384
#: subwindows of fewer tuples stay BI-Sort (their searches run in cache)
HASH_MIN_NSUB = 1 << 17
#: more pairs a probe tuple than this (on average): BI-Sort's contiguous ranges
HASH_MAX_PAIRS = 2.0
#: keys count as increasing when this share of batches has a higher median key than
#: the batch before (stationary keys: about half)
INCREASING = 0.8
#: batches to see before a subwindow goes to hash (BI-Sort, the general one, until then)
WARM_BATCHES = 8
#: weight of the newest batch in the running averages
EWMA = 0.2
#: weight of the newest batch in the share of rising medians: a coin flip a batch for
#: keys that do not increase, so a heavier weight (0.2: a standard deviation of 0.17)
#: crossed :data:`INCREASING` by chance every few hundred batches under a latency
#: bound, and put a subwindow of uniform keys on BI-Sort; 0.05: 0.08
ORDER_EWMA = 0.05
#: keys of a batch whose median is taken (its first ones, in arrival order)
ORDER_SAMPLE = 512


@dataclass(frozen=True)
class Choice:
    kind: str
    why: str


def _avg(old: float | None, new: float, weight: float = EWMA) -> float:
    return new if old is None else (1 - weight) * old + weight * new


class IndexChooser:
    """Picks the index of each new subwindow of one join (see the module docstring)."""

    def __init__(self, pred: Predicate, nsub: int = HASH_MIN_NSUB, bounded: bool = False):
        self.pred = pred
        self.nsub = int(nsub)
        self.bounded = bounded
        self.mean_batch: float | None = None
        # pairs a probe tuple: running averages of the pairs (scaled by the fill) and of
        # the batch sizes, divided; pairs are seen a batch late (the batch before may be
        # of the other stream and 10x larger), so their ratio a batch spikes
        self._pairs: float | None = None
        self._probed: float | None = None
        self.order = 0.5  # share of batches whose key median rose (unknown: half)
        self._median: dict[str, float] = {}  # the last batch's median key per stream
        self.batches = 0

    def observe_batch(self, n: int, pairs: int | None = None, keys=None,
                      fill: float = 1.0, stream: str = "R") -> None:
        """A batch of ``n`` tuples was cut; ``pairs``: pairs found since the last one
        (the answers of earlier batches may arrive later: an average evens it out);
        ``keys``: the batch's keys in arrival order (of ``stream``: each stream's
        medians are compared with its own); ``fill``: the share of the other stream's
        window that holds tuples (a window still filling finds fewer pairs than it
        will)."""
        self.mean_batch = _avg(self.mean_batch, float(n))
        self.batches += 1
        if pairs is not None and n:
            self._pairs = _avg(self._pairs, pairs / max(fill, 1e-3))
            self._probed = _avg(self._probed, float(n))
        if keys is not None and keys.shape[0]:
            # a drifting key range shows in the batches' medians: each one above the last
            # (stationary keys: half of them)
            med = float(np.median(keys[:ORDER_SAMPLE]))
            if stream in self._median:
                self.order = _avg(self.order, float(med > self._median[stream]), ORDER_EWMA)
            self._median[stream] = med

    @property
    def pairs(self) -> float | None:
        """Pairs a probe tuple (None before any was counted)."""
        return None if self._pairs is None else self._pairs / max(self._probed, 1.0)

    def choose(self, batch_size: int | None = None) -> Choice:
        """The index for a new subwindow; ``batch_size``: the engine's batch cap now (used
        until a batch was seen)."""
        p = self.pred
        if p.negated or any(a != b for a, b in p.bands):
            return Choice("bisort", f"{p} is a band, not lookups: sorted ranges")
        if self.nsub < HASH_MIN_NSUB:
            return Choice("bisort", f"subwindows of {self.nsub:,} tuples (< "
                                    f"{HASH_MIN_NSUB:,}): searches in cache")
        nb = self.mean_batch if self.mean_batch is not None else batch_size
        if not self.bounded and (nb is None or nb > HASH_MAX_BATCH):
            size = "unknown" if nb is None else f"~{nb:,.0f}"
            return Choice("bisort", f"{p}, batches of {size} tuples (> {HASH_MAX_BATCH:,}): "
                                    "merge-probe")
        if self.batches < WARM_BATCHES:
            return Choice("bisort", f"{p}, {self.batches} batches seen (< {WARM_BATCHES}): "
                                    "the general index until the stream is known")
        if self.pairs is not None and self.pairs > HASH_MAX_PAIRS:
            return Choice("bisort", f"{p}, ~{self.pairs:.1f} pairs a tuple (> "
                                    f"{HASH_MAX_PAIRS:g}): contiguous ranges")
        if self.order >= INCREASING:
            return Choice("bisort", f"{p}, keys increasing (the median rose in "
                                    f"{self.order:.0%} of the batches): appends")
        pairs = "" if self.pairs is None else f", ~{self.pairs:.1f} pairs a tuple"
        size = "a latency bound" if self.bounded else f"batches of ~{nb:,.0f} tuples"
        return Choice("hash", f"{p}, {size}{pairs}: lookups")
