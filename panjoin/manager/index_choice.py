"""``--index auto``: the index each new subwindow gets, from what the engine observes.

The paper's rule (section V-A4): BI-Sort when batches are large or the selectivity is
high; otherwise RaP-Table if the key distribution is stable and keys do not increase,
else WiB+-Tree. This project's measurements refine it (benchmarks/RESULTS.md):

- BI-Sort beat RaP-Table and WiB+-Tree on every workload measured here, small batches
  included (issue 20; at NBat 1K, W 256K: 706K against 378K and 284K tuples/s), and
  increasing keys make its merges appends, so it takes their place;
- a hash table answers an equi join (or a band of a few integer keys) with one lookup
  a probe tuple and never merges: 1.26x BI-Sort at NBat 1K, even at 4K, and a p99 2-4x
  lower under a latency bound; from 32K tuples a batch on, BI-Sort's sequential
  merge-probe is faster (1.4x at 256K; issue 27).

- but only for point lookups: a band of a few integer keys (``band:3``, S about 1 on zipf
  keys) costs the hash table one lookup a key, 2-3x BI-Sort's one range;
- and only over subwindows too large for the caches: at NSub 16K (W 64K, NBat 1K) BI-Sort's
  searches stay in cache and beat the lookups 1.17x (benchmarks/index_auto.py).

So: ``hash`` while the predicate is equality (its bands are points: ``eq``, with any
residual), subwindows hold at least :data:`HASH_MIN_NSUB` tuples and the batches
the engine cuts are at most :data:`HASH_MAX_BATCH` tuples (an average over the last
batches: under ``--max-latency`` the engine sizes them to the load, so a join that
speeds up moves its new subwindows to BI-Sort and back); ``bisort`` otherwise. A
subwindow keeps its index for life; new ones follow the stream::

    >>> c = IndexChooser(parse_predicate("eq"), nsub=512 * 1024)
    >>> c.observe_batch(1024); c.choose()
    Choice(kind='hash', why='eq over batches of ~1,024 tuples (<= 4,096): lookups')
    >>> for _ in range(20): c.observe_batch(65536)
    >>> c.choose().kind
    'bisort'
"""

from __future__ import annotations

from dataclasses import dataclass

from panjoin.semantics import Predicate, parse_predicate  # noqa: F401 (the doctest's)

#: batches of at most this many tuples (on average) go to hash subwindows
HASH_MAX_BATCH = 4096
#: subwindows of fewer tuples stay BI-Sort (their searches run in cache)
HASH_MIN_NSUB = 1 << 17
#: weight of the newest batch in the running average of batch sizes
EWMA = 0.2


@dataclass(frozen=True)
class Choice:
    kind: str
    why: str


class IndexChooser:
    """Picks the index of each new subwindow of one join (see the module docstring)."""

    def __init__(self, pred: Predicate, nsub: int = HASH_MIN_NSUB):
        self.pred = pred
        self.nsub = int(nsub)
        self.mean_batch: float | None = None

    def observe_batch(self, n: int) -> None:
        self.mean_batch = float(n) if self.mean_batch is None else \
            (1 - EWMA) * self.mean_batch + EWMA * n

    def choose(self, batch_size: int | None = None) -> Choice:
        """The index for a new subwindow; ``batch_size``: the engine's batch cap now (used
        until a batch was seen)."""
        if self.pred.negated or any(a != b for a, b in self.pred.bands):
            return Choice("bisort", f"{self.pred} is a band, not lookups: sorted ranges")
        if self.nsub < HASH_MIN_NSUB:
            return Choice("bisort", f"subwindows of {self.nsub:,} tuples (< "
                                    f"{HASH_MIN_NSUB:,}): searches in cache")
        nb = self.mean_batch if self.mean_batch is not None else batch_size
        if nb is not None and nb <= HASH_MAX_BATCH:
            return Choice("hash", f"{self.pred} over batches of ~{nb:,.0f} tuples "
                                  f"(<= {HASH_MAX_BATCH:,}): lookups")
        size = "unknown" if nb is None else f"~{nb:,.0f}"
        return Choice("bisort", f"{self.pred} over batches of {size} tuples (> "
                                f"{HASH_MAX_BATCH:,}): merge-probe")
