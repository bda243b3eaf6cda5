"""Handshake join's chain protocol: one node's logic and the driver at both ends.

Teubner and Mueller, "How Soccer Players Would do Stream Joins", sections 3-4.
Nodes 0..N-1 form a chain. R tuples enter at node 0 (the left end) and flow
right; S tuples enter at node N-1 and flow left::

    driver ─R,ack(S)─►  [node 0] ⇄ [node 1] ⇄ ... ⇄ [node N-1]  ◄─S,ack(R)─ driver
           ◄─arrived(S)─                                 ─arrived(R)─►

Every node holds a segment of both windows and joins each tuple that enters it
with the opposite segment (immediate scan, Figure 6; :mod:`.segment`).

Two-phase forwarding (Figures 8 and 9): a node sends its oldest S tuple to its
left neighbour but keeps it, marked *forwarded*, until the neighbour's
acknowledgement comes back on the same FIFO channel; R tuples are removed as
soon as they are sent. Two tuples in flight toward each other therefore meet
on the right node, and an R tuple sent after the acknowledgement has already
seen the S tuple on the left node: every pair is evaluated exactly once.
Example, nodes k and k+1, r5 sent right while s4 is sent left::

    k+1 keeps s4 (forwarded) ─► r5 arrives at k+1, scans s4: pair (r5, s4)
    k receives s4, its R window no longer holds r5: no second pair
    k acks s4, then sends r6 ─► k+1 drops s4 before r6 arrives: r6 saw s4 on k

Autonomic load balancing (Figure 11): a node forwards S to the left while its S
segment is larger than its estimate of the left neighbour's (R likewise to the
right). The estimate is the neighbour's last reported size plus the tuples sent
to it that it had not received at the time of the report, so it never
underestimates; hence after every step ``size(k-1) <= size(k) + 1`` for S (the
balancing invariant the tests check), and when nothing moves ``size(k-1) >=
size(k)``. Every message between nodes carries such a report.

The ends (Figures 12 and 13): the driver feeds R into node 0 and S into node
N-1 (the entry nodes acknowledge what they processed, as Figure 9 does for S,
which gives the driver a credit of unprocessed input) and removes tuples by
sending acknowledgements to the *far* ends (an ack arriving at node 0 from the
left removes the oldest S tuple; at node N-1 from the right, the oldest R).
The end nodes treat the driver as a neighbour of size 0: they tell it which
tuples have reached them (``arrived``), so that the driver only ever
acknowledges tuples that are there.

Exact semantics (DESIGN section 2): nodes check the window condition per pair
(:func:`.segment.window_filter`), so the driver may expire late but never
early. It drops late tuples before they enter the chain, numbers the rest
(``seq``, ``opp``), and acknowledges a tuple once no tuple still to be fed can
pair with it: for count windows an S tuple with ``seq < S_fed - WS``; for time
windows one with ``ts + TS <= maxts - L`` (every later non-late R tuple has
``ts >= maxts - L``). R symmetrically.

Fast forwarding (``fast_forward=True``; Roy, Teubner and Gemulla, "Low-Latency
Handshake Join", VLDB 2014): in the plain protocol a pair comes out when its two
tuples cross, which for an old tuple at the far end of the chain is long after the
new one arrived (up to a window's worth of arrivals). With fast forwarding the entry
node sends every arriving run on at once as an *express* message (``EXPRESS``), which
each node scans against its opposite segment and passes on, and the far end drops;
the stored copies move and balance as before but no longer scan. A pair is then
found by the express copy of its later tuple (the scan keeps stored tuples with
``seq < opp`` only), exactly once:

- an express R run moves right like a stored R tuple that is removed as soon as it is
  sent, and stored S is two-phase (kept until acked), so the crossing argument above
  holds: express r and stored s meet on exactly one node;
- for express S moving left, stored R must be two-phase too: a node keeps the R
  tuples it sent right until the neighbour acknowledges them, and the neighbour
  acknowledges on receipt, ahead of any express run it sends back;
- an earlier tuple may still be on its way into the chain (the two ends are fed on
  different channels) when the express copy reaches the far end, where that tuple
  enters: the far end keeps the express run and scans each run of the other stream
  that enters there against it, until that stream's input has caught up with the
  run's largest ``opp`` (``entered``);
- the driver expires a tuple only at its far end, after the express copies of every
  tuple fed before the expiry have passed it.

Example, N = 2, s0 fed, then r0 (opp 1)::

    node 0: R input r0 -> stored; express r0 scans node 0's S (empty) -> to node 1
    node 1: express r0 scans S (s0 not in yet: nothing) and is kept (opp 1 > 0 entered)
    node 1: S input s0 enters: it meets the kept r0: pair (r0, s0); r0 is dropped

Pairs are evaluated when tuples cross, so at the end of input the driver sends
``drain`` markers: each node passes all its R right (and S left) and then the
marker; once both markers have reached their ends every pair has crossed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from panjoin.handshake.segment import Segment, Tuples, scan
from panjoin.semantics import I64_MIN, Predicate, Window, saturating_add

LEFT, RIGHT = "left", "right"

# message kinds
TUPLES = "tuples"  # a run of tuples entering the receiver
ACK = "ack"  # remove the n oldest tuples of the stream flowing toward the sender
DRAIN = "drain"  # pass every tuple of `stream` on, then this marker
REPORT = "report"  # balancing report only
ARRIVED = "arrived"  # end node -> driver: n more tuples of `stream` have reached the end
DRAINED = "drained"  # end node -> driver: the drain marker of `stream` has reached the end
EXPRESS = "express"  # fast forwarding: a fed run that the receiver scans and passes on


@dataclass
class Msg:
    kind: str
    stream: str = ""
    tuples: Tuples | None = None
    n: int = 0
    #: balancing report (-1: none): the sender's segment size of the stream the receiver
    #: forwards to it, and how many tuples of that stream the sender has received from it
    size: int = -1
    received: int = 0

    def __repr__(self) -> str:  # short, for traces
        extra = f" n={len(self.tuples)}" if self.tuples is not None else f" n={self.n}"
        return f"<{self.kind} {self.stream}{extra} size={self.size} recv={self.received}>"


@dataclass
class NodeStats:
    tuples_in: int = 0
    scanned_pairs: int = 0  # comparisons (probe tuples x segment size)
    results: int = 0
    forwarded: int = 0
    messages: int = 0


@dataclass
class _Neighbour:
    """What a node knows about the neighbour it forwards one stream to."""

    size: int = 0  # last reported size of that stream on the neighbour
    received: int = 0  # tuples of that stream the neighbour had received from us then
    sent: int = 0  # tuples of that stream we have sent it

    def estimate(self) -> int:
        return self.size + (self.sent - self.received)


@dataclass
class Node:
    """One core of the chain (Figure 9; Figure 13 at the right end, symmetric at the left).

    ``process(side, msg)`` handles a message from the left or right channel and
    ``forward()`` runs ``forward_tuples()``; both return ``[(side, Msg)]`` to send.
    Results accumulate in ``results`` until the caller takes them.
    """

    pos: int
    n_nodes: int
    window: Window
    pred: Predicate
    key_dtype: object = np.int64
    max_batch: int = 4096
    #: False only in tests: remove S at once when sent left, as a naive protocol would
    #: (Figure 7's missed-join pair problem must then show up)
    two_phase: bool = True
    #: "nested" (the paper's scan) or "sorted" (a sorted key index per segment)
    index: str = "nested"
    #: low-latency handshake join: every fed run is sent along the chain at once
    fast_forward: bool = False
    R: Segment = field(init=False)
    S: Segment = field(init=False)

    def __post_init__(self):
        self.R = Segment(self.key_dtype, index=self.index)
        self.S = Segment(self.key_dtype, index=self.index)
        self.leftmost = self.pos == 0
        self.rightmost = self.pos == self.n_nodes - 1
        self.s_forwarded = 0  # oldest S tuples sent left, kept until acked (two-phase)
        # fast forwarding makes R two-phase too: oldest R sent right, kept until acked
        self._two_phase_r = self.fast_forward and self.two_phase
        self.r_forwarded = 0
        # fast forwarding: express runs at their far end that tuples of the other stream
        # still to enter here must meet, and the next seq of the input stream each end
        # has received from the driver (see the module docstring)
        self.held: dict[str, list[Tuples]] = {"R": [], "S": []}
        self.entered = {"R": 0, "S": 0}
        self.s_announced = 0  # leftmost: oldest S tuples announced to the driver
        self.r_announced = 0  # rightmost: oldest R tuples announced to the driver
        self.left = _Neighbour()  # its S size: we forward S to it
        self.right = _Neighbour()  # its R size: we forward R to it
        self.recv_r = 0  # R tuples received from the left
        self.recv_s = 0  # S tuples received from the right
        self.told = {LEFT: None, RIGHT: None}  # last report sent each way
        self.drain = {"R": False, "S": False}
        self.results: list[tuple[np.ndarray, np.ndarray]] = []
        self.stats = NodeStats()

    # -------------------------------------------------------------- sizes

    def size(self, stream: str) -> int:
        """Tuples of ``stream`` this node owns (balancing load): S tuples in flight to the
        left neighbour are no longer counted; tuples announced to the driver still are."""
        if stream == "R":
            return len(self.R) - self.r_forwarded
        return len(self.S) - self.s_forwarded

    def _report(self, side: str) -> tuple[int, int]:
        # the left neighbour forwards R to us, the right one S
        return (self.size("R"), self.recv_r) if side == LEFT else (self.size("S"), self.recv_s)

    def _to_node(self, side: str) -> bool:
        return not (self.leftmost if side == LEFT else self.rightmost)

    def _send(self, out: list, side: str, msg: Msg) -> None:
        if self._to_node(side):
            msg.size, msg.received = self._report(side)
            self.told[side] = (msg.size, msg.received)
        out.append((side, msg))

    # -------------------------------------------------------------- process_left / right

    def process(self, side: str, msg: Msg) -> list[tuple[str, Msg]]:
        out: list[tuple[str, Msg]] = []
        self.stats.messages += 1
        if msg.kind == EXPRESS and not self.fast_forward:
            raise ValueError(f"node {self.pos}: an express run, but fast forwarding is off")
        if msg.size >= 0:
            nb = self.left if side == LEFT else self.right
            nb.size, nb.received = msg.size, msg.received
        if side == LEFT:
            self._process_left(msg, out)
        else:
            self._process_right(msg, out)
        return out

    def _process_left(self, msg: Msg, out: list) -> None:
        if msg.kind == TUPLES:  # a new R tuple run: scan S, insert into R (Figure 9, 11-14)
            t = msg.tuples
            if not self.fast_forward:
                self._join(t, "R", self.S)
            self.R.append(t)
            self.recv_r += len(t)
            if self.leftmost:  # the driver is our left neighbour: it counts entry credits
                out.append((LEFT, Msg(ACK, "R", n=len(t))))
                if self.fast_forward and len(t):
                    self._entered("R", t)
                    self._express("R", t, out)
            elif self._two_phase_r:  # the sender keeps it until this ack
                self._send(out, LEFT, Msg(ACK, "R", n=len(t)))
        elif msg.kind == EXPRESS:
            self._express("R", msg.tuples, out)
        elif msg.kind == ACK:  # remove the oldest S (Figure 9, line 17)
            if self.leftmost:
                if msg.n > self.s_announced:
                    raise AssertionError(f"node 0: driver acked {msg.n} S, only "
                                         f"{self.s_announced} announced")
                self.s_announced -= msg.n
            elif not self.two_phase:
                return
            else:
                if msg.n > self.s_forwarded:
                    raise AssertionError(f"node {self.pos}: ack for {msg.n} S, only "
                                         f"{self.s_forwarded} forwarded")
                self.s_forwarded -= msg.n
            self.S.pop_oldest(msg.n)
        elif msg.kind == DRAIN:
            self.drain["R"] = True
        elif msg.kind != REPORT:
            raise ValueError(f"node {self.pos}: unexpected {msg!r} from the left")

    def _process_right(self, msg: Msg, out: list) -> None:
        if msg.kind == TUPLES:  # a new S tuple run: scan R, insert into S, acknowledge
            t = msg.tuples
            if not self.fast_forward:
                self._join(t, "S", self.R)
            self.S.append(t)
            self.recv_s += len(t)
            # Figure 9, line 25; at the right end the ack goes to the driver (entry credit)
            self._send(out, RIGHT, Msg(ACK, "S", n=len(t)))
            if self.rightmost and self.fast_forward and len(t):
                self._entered("S", t)
                self._express("S", t, out)
        elif msg.kind == EXPRESS:
            self._express("S", msg.tuples, out)
        elif msg.kind == ACK and not self.rightmost and self._two_phase_r:
            if msg.n > self.r_forwarded:
                raise AssertionError(f"node {self.pos}: ack for {msg.n} R, only "
                                     f"{self.r_forwarded} forwarded")
            self.r_forwarded -= msg.n
            self.R.pop_oldest(msg.n)
        elif msg.kind == ACK:  # only the driver acks R, at the right end (Figure 13, 25a)
            if not self.rightmost or msg.n > self.r_announced:
                raise AssertionError(f"node {self.pos}: ack for {msg.n} R, only "
                                     f"{self.r_announced} announced")
            self.r_announced -= msg.n
            self.R.pop_oldest(msg.n)
        elif msg.kind == DRAIN:
            self.drain["S"] = True
        elif msg.kind != REPORT:
            raise ValueError(f"node {self.pos}: unexpected {msg!r} from the right")

    # -------------------------------------------------------------- fast forwarding

    def _far_end(self, stream: str) -> bool:
        return self.rightmost if stream == "R" else self.leftmost

    def _express(self, stream: str, t: Tuples, out: list) -> None:
        """An express run of ``stream``: scan the opposite segment, then pass it on toward
        the far end. The far end keeps it while tuples of the other stream that arrived
        before it are still on their way in (:meth:`_entered`)."""
        y = "S" if stream == "R" else "R"
        self._join(t, stream, self.S if stream == "R" else self.R, earlier_only=True)
        if not self._far_end(stream):
            self._send(out, RIGHT if stream == "R" else LEFT, Msg(EXPRESS, stream, tuples=t))
        elif int(t.opp[-1]) > self.entered[y]:
            self.held[stream].append(t)

    def _entered(self, y: str, t: Tuples) -> None:
        """A run of ``y`` entered the chain here (its far end for the other stream): the
        held express runs meet it now, and those it completes are dropped."""
        self.entered[y] = int(t.seq[-1]) + 1
        x = "R" if y == "S" else "S"
        if not self.held[x]:
            return
        seg = Segment(self.key_dtype, index=self.index)
        seg.append(t)
        keep = []
        for h in self.held[x]:
            self._join(h, x, seg, earlier_only=True)
            if int(h.opp[-1]) > self.entered[y]:
                keep.append(h)
        self.held[x] = keep

    def _join(self, t: Tuples, stream: str, other: Segment, earlier_only: bool = False) -> None:
        self.stats.tuples_in += len(t)
        self.stats.scanned_pairs += len(t) * len(other)
        a, b = scan(t, stream, other, self.window, self.pred, earlier_only)
        if a.size:
            self.results.append((a, b) if stream == "R" else (b, a))
            self.stats.results += int(a.size)

    # -------------------------------------------------------------- forward_tuples

    def forward(self) -> list[tuple[str, Msg]]:
        """Figure 9, forward_tuples(), batched: forwarding k tuples at once is what k
        single-tuple iterations would do (each one moves one tuple while own size >
        neighbour's estimate, so k = ceil(difference / 2))."""
        out: list[tuple[str, Msg]] = []
        # S toward the left
        if self.leftmost:
            new = len(self.S) - self.s_announced
            if new > 0:
                self.s_announced += new
                out.append((LEFT, Msg(ARRIVED, "S", n=new)))
            if self.drain["S"] and not self.held["S"]:  # every express S run scanned
                self.drain["S"] = False
                out.append((LEFT, Msg(DRAINED, "S")))
        else:
            own = self.size("S")
            k = own if self.drain["S"] else (own - self.left.estimate() + 1) // 2
            k = min(k, own)
            while k > 0:
                m = min(k, self.max_batch)
                if self.two_phase:
                    t = self.S.view(self.s_forwarded, self.s_forwarded + m)
                    self.s_forwarded += m
                else:
                    t = self.S.pop_oldest(m)
                self.left.sent += m
                self.stats.forwarded += m
                self._send(out, LEFT, Msg(TUPLES, "S", tuples=t))
                k -= m
            if self.drain["S"]:
                self.drain["S"] = False
                self._send(out, LEFT, Msg(DRAIN, "S"))
        # R toward the right
        if self.rightmost:
            new = len(self.R) - self.r_announced
            if new > 0:
                self.r_announced += new
                out.append((RIGHT, Msg(ARRIVED, "R", n=new)))
            if self.drain["R"] and not self.held["R"]:
                self.drain["R"] = False
                out.append((RIGHT, Msg(DRAINED, "R")))
        else:
            own = self.size("R")
            k = own if self.drain["R"] else (own - self.right.estimate() + 1) // 2
            k = min(k, own)
            while k > 0:
                m = min(k, self.max_batch)
                if self._two_phase_r:  # as S: express S must meet it
                    t = self.R.view(self.r_forwarded, self.r_forwarded + m)
                    self.r_forwarded += m
                else:
                    t = self.R.pop_oldest(m)  # removed at once (Figure 9, line 34)
                self.right.sent += m
                self.stats.forwarded += m
                self._send(out, RIGHT, Msg(TUPLES, "R", tuples=t))
                k -= m
            if self.drain["R"]:
                self.drain["R"] = False
                self._send(out, RIGHT, Msg(DRAIN, "R"))
        # a report to a neighbour whose view of us is out of date (keeps balancing live)
        for side in (LEFT, RIGHT):
            if self._to_node(side) and self.told[side] != self._report(side) and \
                    not any(s == side for s, _ in out):
                self._send(out, side, Msg(REPORT))
        return out

    def load(self, r: Tuples, s: Tuples, left_s: int, right_r: int, fed_r: int = 0,
             fed_s: int = 0) -> list[tuple[str, Msg]]:
        """Bulk fill before any input: tuples straight into the segments, unscanned, as if
        they had arrived and been balanced (R oldest at node N-1, S oldest at node 0;
        ``left_s`` / ``right_r``: what the neighbours got; ``fed_r`` / ``fed_s``: how many
        the whole chain got, the input the ends have seen). Returns ``forward()``'s
        messages (the end nodes announce what they hold to the driver)."""
        # (a neighbour, loaded first, may have sent a balancing report already)
        if self.stats.tuples_in or self.recv_r or self.recv_s or len(self.R) or len(self.S):
            raise ValueError(f"node {self.pos}: load only into an empty chain, before any input")
        self.R.append(r)
        self.S.append(s)
        self.entered = {"R": int(fed_r), "S": int(fed_s)}
        self.left.size, self.right.size = int(left_s), int(right_r)
        self.told = {LEFT: self._report(LEFT), RIGHT: self._report(RIGHT)}
        return self.forward()

    def take_results(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.results:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        r = np.concatenate([a for a, _ in self.results])
        s = np.concatenate([b for _, b in self.results])
        self.results = []
        return r, s

    def check(self) -> None:
        """Invariants of one node (called by the tests after every step)."""
        assert 0 <= self.s_forwarded <= len(self.S), "forwarded S beyond the segment"
        assert 0 <= self.r_forwarded <= len(self.R), "forwarded R beyond the segment"
        assert self._two_phase_r or self.r_forwarded == 0, "two-phase R without fast forwarding"
        assert self.leftmost or self.s_announced == 0, "only node 0 announces S"
        assert self.rightmost or self.r_announced == 0, "only node N-1 announces R"
        assert self.s_announced <= len(self.S) and self.r_announced <= len(self.R)
        for seg, name in ((self.R, "R"), (self.S, "S")):
            seq = seg.col("seq")
            # FIFO channels and oldest-first forwarding keep each segment a run of seqs
            assert np.all(np.diff(seq) == 1), f"node {self.pos}: {name} seqs not consecutive"
        assert self.left.estimate() >= 0 and self.right.estimate() >= 0
        for seg in (self.R, self.S):
            if seg.index == "sorted":
                assert seg.skey.shape[0] == len(seg), "sorted index out of step with the segment"
                assert np.all(np.diff(seg.skey) >= 0), "sorted index not sorted"


# ------------------------------------------------------------------ the driver


class _Fed:
    """Seq and ts of the tuples of one stream fed into the chain and not yet acked."""

    def __init__(self):
        self.ts = np.zeros(64, np.int64)
        self.head = 0
        self.tail = 0
        self.announced = 0  # how many have reached the far end (from its ARRIVED messages)
        self.acked = 0  # how many the driver has acknowledged (expired)

    def add(self, ts: np.ndarray) -> None:
        m = ts.shape[0]
        if self.tail + m > self.ts.shape[0]:
            n = self.tail - self.head
            new = np.zeros(max(64, 2 * (n + m)), np.int64)
            new[:n] = self.ts[self.head:self.tail]
            self.ts, self.head, self.tail = new, 0, n
        self.ts[self.tail:self.tail + m] = ts
        self.tail += m


class Driver:
    """The driver process (section 4.4): numbers, feeds and expires; no network.

    ``feed(stream, ids, keys, ts)`` takes arrival-ordered input and returns the
    messages to send, as ``[(end, Msg)]`` with ``end`` LEFT (into node 0) or
    RIGHT (into node N-1); ``receive(end, msg)`` takes what an end node sends
    back and returns more messages (acknowledgements that expire tuples).
    """

    def __init__(self, window: Window, pred: Predicate):
        self.window = window
        self.pred = pred
        self.total = {"R": 0, "S": 0}  # tuples numbered (= fed) per stream
        self.maxts: int | None = None
        self.fed = {"R": _Fed(), "S": _Fed()}
        self.late: dict[str, list[np.ndarray]] = {"R": [], "S": []}
        self.n_late = 0
        self.drained = {"R": True, "S": True}
        self.key_dtype = None
        # entry credit: tuples fed into the entry node and acknowledged by it (processed)
        self.entered = {"R": 0, "S": 0}

    def feed(self, stream, ids, keys, ts, key2=None) -> list[tuple[str, Msg]]:
        """``key2`` (float64 per tuple) is needed iff the predicate has a residual."""
        if self.pred.residual is not None:
            if key2 is None:
                raise ValueError(f"predicate {self.pred} has a residual on key2: feed key2 "
                                 "(EventTable.key2, a float64 per tuple)")
            key2 = np.asarray(key2, np.float64)
            if key2.shape != np.shape(stream) or not np.isfinite(key2).all():
                raise ValueError("key2 must hold one finite number per tuple")
        else:
            key2 = None  # no residual: tuples travel with zeros
        stream = np.asarray(stream, np.uint8)
        ids = np.asarray(ids, np.int64)
        keys = np.asarray(keys)
        ts = np.asarray(ts, np.int64)
        n = stream.shape[0]
        if not (ids.shape == keys.shape == ts.shape == (n,)):
            raise ValueError("stream, id, key and ts must be 1-d arrays of one length")
        if n == 0:
            return []
        if keys.dtype not in (np.int64, np.float64):
            raise TypeError(f"keys must be int64 or float64, got {keys.dtype}")
        if self.key_dtype is None:
            self.key_dtype = keys.dtype
        elif keys.dtype != self.key_dtype:
            raise TypeError(f"keys are {keys.dtype} but this join's keys are {self.key_dtype}")
        if np.any(stream > 1):
            raise ValueError("stream must be 0 (R) or 1 (S)")
        if self.window.kind == "time":
            # late iff ts < (largest ts of all earlier arrivals) - L, per tuple (DESIGN 2)
            run = np.maximum.accumulate(ts)
            prev = np.empty(n, np.int64)
            prev[1:] = run[:-1]
            prev[0] = self.maxts if self.maxts is not None else np.iinfo(np.int64).min
            if self.maxts is not None:
                np.maximum(prev, self.maxts, out=prev)
            # clamped, not wrapped: near I64_MIN, prev - L would wrap to a large ts
            late = saturating_add(prev, -self.window.lateness) > ts
            if self.maxts is None:
                late[0] = False
            self.maxts = int(run[-1]) if self.maxts is None else max(self.maxts, int(run[-1]))
            if late.any():
                for x, name in enumerate(("R", "S")):
                    lm = late & (stream == x)
                    if lm.any():
                        self.late[name].append(ids[lm])
                        self.n_late += int(lm.sum())
                keep = ~late
                stream, ids, keys, ts = stream[keep], ids[keep], keys[keep], ts[keep]
                if key2 is not None:
                    key2 = key2[keep]
                n = stream.shape[0]
        if n == 0:
            return []
        is_r = stream == 0
        cr = np.cumsum(is_r, dtype=np.int64)
        cs = np.cumsum(~is_r, dtype=np.int64)
        seq = np.where(is_r, self.total["R"] + cr - 1, self.total["S"] + cs - 1)
        opp = np.where(is_r, self.total["S"] + cs, self.total["R"] + cr)
        self.total["R"] += int(cr[-1])
        self.total["S"] += int(cs[-1])
        out: list[tuple[str, Msg]] = []
        # one message per stream: R and S enter at different ends, so only the order
        # within a stream matters (the nodes check the window per pair)
        for x, m in (("R", is_r), ("S", ~is_r)):
            if m.any():
                t = Tuples(ids[m], keys[m], ts[m], seq[m], opp[m],
                           key2[m] if key2 is not None else None)
                self.fed[x].add(t.ts)
                out.append((LEFT if x == "R" else RIGHT, Msg(TUPLES, x, tuples=t)))
        out += self.expire()
        return out

    def preload(self, stream, ids, keys, ts, key2, n_nodes: int) -> list[tuple[Tuples, Tuples]]:
        """Bulk fill (count windows, before any input): number the tuples as ``feed`` does
        and cut each stream into ``n_nodes`` runs, ``[(R run, S run)]`` per node: node k
        gets the k-th newest R run and the k-th oldest S run, as balancing would leave them.
        The nodes take them with :meth:`Node.load`; the driver counts them as entered."""
        if self.window.kind != "count":
            raise ValueError("bulk fill is for count windows; feed time windows normally")
        if any(self.total.values()):
            raise ValueError("bulk fill only into an empty chain, before any input")
        stream = np.asarray(stream, np.uint8)
        ids, ts = np.asarray(ids, np.int64), np.asarray(ts, np.int64)
        keys = np.asarray(keys)
        if self.key_dtype is None:
            self.key_dtype = keys.dtype
        if self.pred.residual is not None and key2 is None:
            raise ValueError(f"predicate {self.pred} has a residual on key2: load key2")
        k2 = np.asarray(key2, np.float64) if key2 is not None else np.zeros(len(stream))
        is_r = stream == 0
        cr, cs = np.cumsum(is_r, dtype=np.int64), np.cumsum(~is_r, dtype=np.int64)
        seq = np.where(is_r, cr - 1, cs - 1)
        opp = np.where(is_r, cs, cr)
        runs = {}
        for x, m in (("R", is_r), ("S", ~is_r)):
            t = Tuples(ids[m], keys[m], ts[m], seq[m], opp[m], k2[m])
            self.total[x] = self.entered[x] = len(t)
            self.fed[x].add(t.ts)
            # run sizes differ by at most one, the larger ones on the side a stream flows
            # to (S: left, R: right), so that no node finds itself above its neighbour
            # and forwarding starts only with the input
            q, rem = divmod(len(t), n_nodes)
            sizes = [q + (i < rem) for i in range(n_nodes)]  # oldest run first
            cuts = np.concatenate([[0], np.cumsum(sizes)])
            parts = [t.take(slice(cuts[i], cuts[i + 1])) for i in range(n_nodes)]
            runs[x] = parts[::-1] if x == "R" else parts  # oldest R at node N-1
        return list(zip(runs["R"], runs["S"], strict=True))

    def receive(self, end: str, msg: Msg) -> list[tuple[str, Msg]]:
        if msg.kind == ARRIVED:
            self.fed[msg.stream].announced += msg.n
            return self.expire()
        if msg.kind == ACK:  # the entry node has processed n fed tuples
            self.entered[msg.stream] += msg.n
            return []
        if msg.kind == DRAINED:
            self.drained[msg.stream] = True
            return []
        raise ValueError(f"driver: unexpected {msg!r} from the {end} end")

    def dead(self, stream: str) -> int:
        """How many of the oldest fed tuples of ``stream`` no tuple still to come can pair with."""
        f = self.fed[stream]
        if self.window.kind == "count":
            w = self.window.size(stream)
            return max(0, self.total[stream] - w)  # seq < fed - W
        if self.maxts is None:
            return f.acked
        low = self.maxts - self.window.lateness  # every later non-late tuple has ts >= low
        w = self.window.size(stream)
        ts = f.ts[f.head:f.tail]
        # dead prefix in arrival order: ts + W <= low (not necessarily sorted by ts); in
        # Python integers, as ts + W may pass I64_MAX: alive iff ts >= low - W + 1
        alive = np.flatnonzero(ts >= max(low - w + 1, I64_MIN))
        k = int(alive[0]) if alive.size else ts.shape[0]
        return f.acked + k

    def expire(self) -> list[tuple[str, Msg]]:
        """Acknowledgements to the far ends (Figure 12): S is removed at node 0, R at N-1."""
        out = []
        for x, end in (("S", LEFT), ("R", RIGHT)):
            f = self.fed[x]
            n = min(self.dead(x), f.announced) - f.acked
            if n > 0:
                f.acked += n
                f.head += n
                out.append((end, Msg(ACK, x, n=n)))
        return out

    def drain(self) -> list[tuple[str, Msg]]:
        """Markers that push every fed tuple to its far end (end of input)."""
        self.drained = {"R": False, "S": False}
        return [(LEFT, Msg(DRAIN, "R")), (RIGHT, Msg(DRAIN, "S"))]

    def take_late(self) -> dict[str, np.ndarray]:
        out = {k: (np.concatenate(v) if v else np.zeros(0, np.int64))
               for k, v in self.late.items()}
        self.late = {"R": [], "S": []}
        return out

    def window_tuples(self) -> dict[str, int]:
        return {x: self.total[x] - self.fed[x].acked for x in ("R", "S")}

    def in_flight(self) -> int:
        """Fed tuples their entry node has not yet processed (the driver's credit in use)."""
        return sum(self.total[x] - self.entered[x] for x in ("R", "S"))
