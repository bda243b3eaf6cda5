"""Batch sizing that holds a latency bound (issue 27): ``JoinEngine(max_latency_ms=L)``.

A pair waits for its batch to be cut (at most the collect deadline D after the batch's
oldest tuple arrived) and then for the batch to be processed (probe, insert). Each
stream's batch holds about ``lam * D`` tuples at an input rate ``lam`` per stream, and
processing one costs about ``a + b n`` seconds (a fixed cost per batch: one probe call
per subwindow, the insert, Python; b per tuple) until its pairs are out, of which
``a' + b' n`` keep the engine busy. In process the two are the same time; on workers
the rest is the wire and the workers' time, while the engine already cuts the next
batches (its probe rounds are pipelined). So, with both streams' batches cut in one
tick (one batch may wait for the engine to finish the other's):

- the bound holds when ``D + (a + b lam D) + (a' + b' lam D) <= L``, that is
  ``D <= D_lat = (L - a - a') / (1 + (b + b') lam)``;
- the engine keeps up when it is busy at most a share U of the time,
  ``2 (a' + b' lam D) <= U D``, that is ``D >= D_keep = 2a' / (U - 2 b' lam)``.

The deadline is ``D_keep`` (the smallest batches that keep up: small when the input is
slow), at least ``D_MIN`` and at most ``L``; it stays below ``D_lat`` whenever the bound
can be held at all. The batch size cap is the largest batch processed within half the bound, or the
batch that keeps up if that is larger, so a backlog pushed at once is cut into
batches that still hold the bound. When the input outruns what the bound allows
(``D_keep > D_lat``, or no batch size keeps up), latency is lost to the backlog
anyway, and the engine keeps up first: the cap grows to what keeps up, the deadline
to ``L`` (:attr:`LatencyBound.overloaded` says so), and a busy engine's backlog makes
its batches larger still. This is Flink's buffer timeout, sized from
measurements instead of by hand. (Until the cluster's sixth session the round trip
counted as busy time too: a round trip past L/2 made the bound "overloaded" at any
rate, and every batch waited the whole bound L.)

``a``, ``b`` (and ``a'``, ``b'``) are least-squares fits of the batches' measured times
against their sizes, with exponential forgetting (the window fills, subwindows expire,
the machine gets busy), a batch counted at most ``STALL`` times what the fit predicts
for it (one stall is not a cost of every batch); the rate is measured from the pushes.
Example, L = 5 ms, measured a = a' = 100 us, b = b' = 0.4 us, lam = 500K tuples/s per
stream (1M tuples/s in all)::

    D_lat  = (5 - 0.2) / (1 + 0.4) = 3.43 ms
    D_keep = 0.2 / (0.85 - 0.4)    = 0.44 ms   -> D = 0.44 ms, batches of ~220 tuples

    >>> b = LatencyBound(5.0)
    >>> for n in (300, 600, 1200, 300, 600, 1200):
    ...     b.observe_batch(n, 100e-6 + 0.4e-6 * n)
    >>> b.observe_input(0, 0.0), b.observe_input(100_000, 0.1)  # (True: after a pause)
    (False, False)
    >>> round(b.deadline_ms(), 2), b.batch_cap()
    (0.44, 6000)

On workers whose round trip takes 2 ms more than the engine's own 100 us + 0.4 us a
tuple, the bound still holds with the same batches: D_lat = (5 - 2.1 - 0.1) / 1.4 =
2 ms::

    >>> c = LatencyBound(5.0)
    >>> for n in (300, 600, 1200, 300, 600, 1200):
    ...     c.observe_batch(n, 2.1e-3 + 0.4e-6 * n, busy=100e-6 + 0.4e-6 * n)
    >>> c.observe_input(0, 0.0), c.observe_input(100_000, 0.1)  # (True: after a pause)
    (False, False)
    >>> round(c.deadline_ms(), 2), c.overloaded
    (0.44, False)
"""

from __future__ import annotations

from collections import deque

#: the shortest collect deadline (ms): below it a batch is mostly fixed cost
D_MIN_MS = 0.2
#: the share of the time the engine may be busy processing at the chosen deadline, in
#: process: its busy time is all the join costs. At 0.7 a hash join at 3M tuples/s a
#: stream (b' 100-120 ns a tuple, 0.6-0.72 busy) read as overloaded, its batches grew
#: to 100K and their cost a tuple with them (a hash probe's frontier leaves the
#: caches), so it stayed overloaded: p99 60 ms at 6M tuples/s, while fixed 16K batches
#: held 7M at 10 ms. 0.85: 7M at p99 24 ms, 1M at 3.5 ms (benchmarks/RESULTS.md, issue
#: 27, twelfth session)
UTILIZATION = 0.85
#: the same on workers, whose busy time leaves out the wire, the codecs and the client
#: on the same hosts: 0.85 there gave smaller batches and more rounds, and a p99 at 500K
#: tuples/s 1.5x higher (2 workers, replicas 2, 7 alternated pairs)
UTILIZATION_REMOTE = 0.7
#: weight of the past in the fits (per batch, per input observation)
FORGET = 0.97
#: the input rate is measured over this much of the recent past (s)
RATE_WINDOW_S = 0.2
#: in the fit a batch counts with at most this many times the time the model predicts
#: for it: one stall (page faults, the machine's other load; a batch of 8K tuples took
#: 72 ms once at 1M tuples/s) would otherwise become the fixed cost a of every later
#: batch, and the deadline ``2a / (U - 2 b lam)`` with it, for hundreds of batches;
#: a lasting change still moves the fit, by up to this factor a batch
STALL = 3.0
#: smallest and largest batch size cap
CAP_MIN = 256
CAP_MAX = 1 << 20


class LatencyBound:
    """The collect deadline and batch size cap that hold ``max_latency_ms``; see the
    module docstring."""

    def __init__(self, max_latency_ms: float, remote: bool = False):
        """``remote``: the batches are probed on workers (:data:`UTILIZATION_REMOTE`)."""
        if not max_latency_ms > 0:
            raise ValueError(f"max latency must be a positive number of ms, got {max_latency_ms}")
        self.bound_s = float(max_latency_ms) / 1000.0
        self.utilization = UTILIZATION_REMOTE if remote else UTILIZATION
        # until its pairs are out: t = a + b n; busy (the engine's own time): a' + b' n
        self._lat = _Fit()
        self._busy = _Fit()
        self.rate = 0.0  # tuples/s per stream (both streams' mean)
        self._arrivals: deque[tuple[float, int]] = deque()  # (time, tuples so far)
        self._count = 0

    # the fits' parameters: a, b until the pairs are out (the bound); the busy ones
    # (keeping up) are the same in process
    a = property(lambda self: self._lat.a)
    b = property(lambda self: self._lat.b)
    busy_a = property(lambda self: self._busy.a)
    busy_b = property(lambda self: self._busy.b)

    def observe_batch(self, n: int, seconds: float, busy: float | None = None) -> None:
        """A batch of ``n`` tuples took ``seconds`` until its pairs were out (probe and
        insert); ``busy``: of which the engine was busy (None: all of it; on workers the
        wire and the workers take the rest, while the engine goes on)."""
        self._lat.observe(n, seconds)
        self._busy.observe(n, seconds if busy is None else busy)

    def observe_input(self, tuples: int, now: float) -> bool:
        """``tuples`` (both streams) arrived at ``now`` (s, a monotonic clock); True when
        they came after a pause (the deadline chosen before it, e.g. under a backlog,
        is then out of date)."""
        q = self._arrivals
        paused = bool(q) and now - q[-1][0] > RATE_WINDOW_S
        if not q:
            q.append((now, 0))
        self._count += tuples
        q.append((now, self._count))
        # the rate since the oldest arrival within the window (the tuples after it over
        # the time since): one observation kept from before the window measured across
        # an idle gap, so after the window's fill and a pause the first 0.2 s of a
        # stream read as 0.005-0.07M tuples/s a stream at 0.25M, and the batches cut
        # from that rate (256 tuples) filled the workers' pipeline (a cluster's p99)
        while len(q) > 2 and q[0][0] < now - RATE_WINDOW_S:
            q.popleft()
        t_old, c_old = q[0]
        if now - t_old > 0.01 * RATE_WINDOW_S:
            self.rate = (self._count - c_old) / (now - t_old) / 2.0
        return paused

    def _deadlines(self) -> tuple[float, float]:
        """``(D_keep, D_lat)`` in s; D_keep is infinite when no batch size keeps up."""
        a, b, lam, L = self.a, self.b, self.rate, self.bound_s
        ab, bb = self.busy_a, self.busy_b
        d_lat = (L - a - ab) / (1.0 + (b + bb) * lam)
        room = self.utilization - 2.0 * bb * lam
        return (2.0 * ab / room if room > 0 else float("inf")), d_lat

    @property
    def overloaded(self) -> bool:
        """The input outruns what the bound allows: no deadline both keeps up and holds it."""
        d_keep, d_lat = self._deadlines()
        return d_keep > max(d_lat, D_MIN_MS / 1000.0)

    def deadline_ms(self) -> float:
        """The collect deadline D, in ms: D_keep, at most the bound L."""
        d_keep, _ = self._deadlines()
        # past L a deadline only makes an idle engine wait: a busy one collects its
        # backlog into larger batches anyway (the cap allows them). D_keep -> infinity
        # as 2 b lam -> U, and a fit's b that a few slow batches raised made it hundreds
        # of ms at 500K tuples/s (p99 0.7-1 s, the engine keeping up at 0.4 us a tuple)
        return 1000.0 * max(D_MIN_MS / 1000.0, min(d_keep, self.bound_s))

    def batch_cap(self) -> int:
        """Most tuples per batch: what is processed within half the bound, or what keeps
        up (twice the batch a deadline of D_keep collects) if that is more."""
        n = (0.5 * self.bound_s - self.a) / max(self.b, 1e-12)
        d_keep, _ = self._deadlines()
        if d_keep == float("inf"):
            return CAP_MAX
        n = max(n, 2.0 * self.rate * d_keep)
        return int(min(CAP_MAX, max(CAP_MIN, n)))


class _Fit:
    """``t = a + b n``: a least-squares fit of measured times against batch sizes, with
    exponential forgetting (:data:`FORGET`)."""

    def __init__(self):
        self._w = self._n = self._nn = self._t = self._nt = 0.0  # weighted sums
        self.a = 50e-6  # until measured: a guess of this machine's order
        self.b = 0.5e-6

    def observe(self, n: float, seconds: float) -> None:
        f = FORGET
        n = float(n)
        if self._w >= 4.0:  # a model to judge a batch by: a stall counts as STALL x
            seconds = min(seconds, STALL * (self.a + self.b * n))
        self._w = f * self._w + 1.0
        self._n = f * self._n + n
        self._nn = f * self._nn + n * n
        self._t = f * self._t + seconds
        self._nt = f * self._nt + n * seconds
        mean_n, mean_t = self._n / self._w, self._t / self._w
        var = self._nn / self._w - mean_n * mean_n
        if var > 0.01 * mean_n * mean_n:  # sizes differ enough to tell a from b
            b = (self._nt / self._w - mean_n * mean_t) / var
            a = mean_t - b * mean_n
            if b > 0 and a >= 0:
                self.a, self.b = a, b
                return
        # one size only (or a fit that makes no sense): the cost per tuple at this size
        self.b = max(mean_t - self.a, 0.0) / max(mean_n, 1.0) or self.b

    @property
    def mean_n(self) -> float:
        """The weighted mean batch size (0 before any batch)."""
        return self._n / self._w if self._w else 0.0
