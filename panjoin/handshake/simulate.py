"""A deterministic (or seeded, randomly interleaved) simulator of the whole chain, no network.

It owns what the processes own in the real topology: the N :class:`.protocol.Node`
objects, one FIFO channel per direction between neighbours and between the
driver and each end, the :class:`.protocol.Driver`, the result merging network
and admission control. Each *step* does one thing::

    deliver   the oldest message of one channel to its receiver (which then
              runs forward_tuples(), Figure 9's loop body)
    output    a node moves pending result pairs into its bounded FIFO
    merge     every merger moves pairs up one level
    sink      the manager takes up to ``sink_rate`` pairs from the root FIFO
    feed      the driver feeds the next input chunk, unless admission control
              pauses it (a FIFO is full or a node is stalled)

``order="fifo"`` cycles through the actions in a fixed order; ``order="random"``
picks one enabled action at random (seeded), so channels of different nodes are
served in arbitrary interleavings, which is what the two-phase protocol must
survive. A node with result pairs it could not yet put into its FIFO is
*stalled*: it processes no message until they are out (a scan that stopped
mid-way), so the bounded FIFOs are never exceeded and nothing is dropped.

    >>> import numpy as np
    >>> from panjoin.semantics import parse_window, parse_predicate
    >>> sim = Simulation(2, parse_window("count:2,2"), parse_predicate("eq"))
    >>> pairs = sim.run(np.array([0, 1, 0, 1]), np.arange(4), np.full(4, 7), np.arange(4))
    >>> len(pairs)
    4
"""

from __future__ import annotations

import random
from collections import deque

import numpy as np

from panjoin.handshake.merge import AdmissionControl, MergingNetwork
from panjoin.handshake.protocol import LEFT, RIGHT, Driver, Msg, Node
from panjoin.semantics import Predicate, Window

DRIVER = -1


class Simulation:
    def __init__(self, n_nodes: int, window: Window, pred: Predicate, *, key_dtype=np.int64,
                 node_fifo: int = 1 << 20, merger_fifo: int = 1 << 20, sink_rate: int = 1 << 30,
                 feed_chunk: int = 64, max_batch: int = 4096, order: str = "fifo",
                 seed: int = 0, check: bool = False, two_phase: bool = True,
                 index: str = "nested", fast_forward: bool = False):
        if n_nodes < 1:
            raise ValueError(f"a chain needs at least 1 node, got {n_nodes}")
        self.n = n_nodes
        self.nodes = [Node(i, n_nodes, window, pred, key_dtype, max_batch, two_phase, index,
                           fast_forward)
                      for i in range(n_nodes)]
        self.driver = Driver(window, pred)
        # channels[(src, dst)]: FIFO of messages; DRIVER is -1
        self.chan: dict[tuple[int, int], deque[Msg]] = {}
        for i in range(n_nodes - 1):
            self.chan[(i, i + 1)] = deque()
            self.chan[(i + 1, i)] = deque()
        self.chan[(DRIVER, 0)] = deque()  # into node 0 from the left
        self.chan[(0, DRIVER)] = deque()
        self.chan[(DRIVER, n_nodes - 1, "r")] = deque()  # into node N-1 from the right
        self.chan[(n_nodes - 1, DRIVER, "r")] = deque()
        self.net = MergingNetwork(n_nodes, node_fifo, merger_fifo)
        self.admission = AdmissionControl(self.net)
        self.pending: list[tuple[np.ndarray, np.ndarray]] = [
            (np.zeros(0, np.int64), np.zeros(0, np.int64)) for _ in range(n_nodes)]
        self.sink_rate = sink_rate
        self.feed_chunk = feed_chunk
        self.order = order
        self.rng = random.Random(seed)
        self.check_each = check
        self.collected: list[tuple[np.ndarray, np.ndarray]] = []
        self.steps = 0
        self.max_imbalance = {"R": 0, "S": 0}
        self.draining = False

    # ------------------------------------------------------------------ wiring

    def _out_channel(self, i: int, side: str):
        if side == LEFT:
            return self.chan[(i, i - 1)] if i > 0 else self.chan[(0, DRIVER)]
        return self.chan[(i, i + 1)] if i < self.n - 1 else self.chan[(i, DRIVER, "r")]

    def _in_channels(self, i: int) -> list[tuple[str, deque]]:
        left = self.chan[(i - 1, i)] if i > 0 else self.chan[(DRIVER, 0)]
        right = self.chan[(i + 1, i)] if i < self.n - 1 else self.chan[(DRIVER, i, "r")]
        return [(LEFT, left), (RIGHT, right)]

    def _send_from_node(self, i: int, msgs) -> None:
        for side, m in msgs:
            self._out_channel(i, side).append(m)

    def _send_from_driver(self, msgs) -> None:
        for end, m in msgs:
            (self.chan[(DRIVER, 0)] if end == LEFT else
             self.chan[(DRIVER, self.n - 1, "r")]).append(m)

    # ------------------------------------------------------------------ actions

    def _actions(self, feeding: bool) -> list:
        acts = []
        for i in range(self.n):
            if self.pending[i][0].size:
                acts.append(("output", i))
                continue  # stalled: no message until its results are out
            for side, q in self._in_channels(i):
                if q:
                    acts.append(("deliver", i, side))
        for key in ((0, DRIVER), (self.n - 1, DRIVER, "r")):
            if self.chan[key]:
                acts.append(("driver", key))
        if self.net.pairs_inside():
            acts.append(("merge",))
            if len(self.net.root):
                acts.append(("sink",))
        if feeding:
            acts.append(("feed",))
        return acts

    def _do(self, act) -> bool:
        """Run one action; False if it could not (feed paused)."""
        kind = act[0]
        if kind == "deliver":
            _, i, side = act
            q = dict(self._in_channels(i))[side]
            node = self.nodes[i]
            self._send_from_node(i, node.process(side, q.popleft()))
            self._send_from_node(i, node.forward())
            r, s = node.take_results()
            if r.size:
                self.pending[i] = (np.concatenate([self.pending[i][0], r]),
                                   np.concatenate([self.pending[i][1], s]))
                self._output(i)
        elif kind == "output":
            self._output(act[1])
        elif kind == "driver":
            key = act[1]
            msg = self.chan[key].popleft()
            self._send_from_driver(self.driver.receive(LEFT if key[0] == 0 and len(key) == 2
                                                       else RIGHT, msg))
        elif kind == "merge":
            self.net.step()
        elif kind == "sink":
            r, s = self.net.root.take(self.sink_rate)
            self.collected.append((r, s))
        elif kind == "feed":
            if not self.admission.admit(stalled=any(p[0].size for p in self.pending)):
                return False
            a = self._pos
            b = min(a + self.feed_chunk, self._input[0].shape[0])
            self._send_from_driver(self.driver.feed(*(x[a:b] for x in self._input)))
            self._pos = b
        self.steps += 1
        if self.check_each:
            self.check()
        return True

    def _output(self, i: int) -> None:
        r, s = self.pending[i]
        k = self.net.leaves[i].offer(r, s)
        self.pending[i] = (r[k:], s[k:])

    # ------------------------------------------------------------------ running

    def _run_until_quiet(self, feeding_done) -> None:
        rr = 0
        while True:
            feeding = not feeding_done()
            acts = self._actions(feeding)
            if not acts:
                return
            if self.order == "random":
                act = self.rng.choice(acts)
            else:
                act = acts[rr % len(acts)]
                rr += 1
            if not self._do(act) and len(acts) == 1:
                raise AssertionError("admission control paused with nothing else to do")
            self._track_balance()
            if self.steps > 50_000_000:
                raise RuntimeError("simulation does not terminate")

    def feed_all(self, stream, ids, keys, ts, key2=None) -> None:
        """Feed the input, running the chain as it goes, until quiescent (no drain);
        ``key2`` for a predicate with a residual condition."""
        self._input = (np.asarray(stream, np.uint8), np.asarray(ids, np.int64),
                       np.asarray(keys), np.asarray(ts, np.int64))
        if key2 is not None:
            self._input += (np.asarray(key2, np.float64),)
        self._pos = 0
        self._run_until_quiet(lambda: self._pos >= self._input[0].shape[0])

    def drain(self) -> None:
        """Push every tuple to its far end so that every pair has met; run until quiet."""
        self.draining = True  # drain moves everything to the ends: no balance any more
        self._send_from_driver(self.driver.drain())
        self._run_until_quiet(lambda: True)
        assert all(self.driver.drained.values()), "drain markers did not reach the ends"
        # more input may follow; the segments now sit piled at the ends, against the
        # balancing invariant, so it is no longer checked (balancing evens them out as
        # the windows slide)

    def run(self, stream, ids, keys, ts, key2=None) -> np.ndarray:
        self.feed_all(stream, ids, keys, ts, key2)
        self.drain()
        return self.take_pairs()

    def take_pairs(self) -> np.ndarray:
        if not self.collected:
            return np.zeros((0, 2), np.int64)
        r = np.concatenate([a for a, _ in self.collected])
        s = np.concatenate([b for _, b in self.collected])
        self.collected = []
        return np.stack([r, s], axis=1)

    # ------------------------------------------------------------------ invariants

    def sizes(self, stream: str) -> list[int]:
        return [nd.size(stream) for nd in self.nodes]

    def _track_balance(self) -> None:
        if self.draining:
            return
        # S flows left: size(k-1) <= size(k) + 1; R flows right: size(k+1) <= size(k) + 1
        s, r = self.sizes("S"), self.sizes("R")
        for k in range(1, self.n):
            self.max_imbalance["S"] = max(self.max_imbalance["S"], s[k - 1] - s[k])
            self.max_imbalance["R"] = max(self.max_imbalance["R"], r[k] - r[k - 1])

    def quiet(self) -> bool:
        return not self._actions(False)

    def check(self) -> None:
        for nd in self.nodes:
            nd.check()
        for f in self.net.fifos():
            assert len(f) <= f.capacity, f"{f.name} holds {len(f)} > {f.capacity}"
        s, r = self.sizes("S"), self.sizes("R")
        for k in range(1 if not self.draining else self.n, self.n):
            assert s[k - 1] <= s[k] + 1, f"S balance broken: sizes {s}"
            assert r[k] <= r[k - 1] + 1, f"R balance broken: sizes {r}"

    def status(self) -> dict:
        return {
            "pauses": self.admission.pauses,
            "sizes": {"R": self.sizes("R"), "S": self.sizes("S")},
            "fifo_high_water": [f.high_water for f in self.net.fifos()],
            "late": self.driver.n_late,
            "steps": self.steps,
        }
