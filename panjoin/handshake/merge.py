"""Result merging network and admission control (Oge et al., handshake join on FPGA, IV-B..D).

Every node writes its result pairs into its own bounded FIFO. A perfect binary
tree of two-in-one-out *mergers* collects them: each merger owns one bounded
FIFO and, in turn, moves pairs from its first and then its second input port
(the FIFO below it) into that FIFO (the paper's STATE2 / STATE3). The root's
FIFO is drained by the manager. For 4 nodes::

                 merger 1 ──► manager
               /          \\
        merger 2          merger 3
        /      \\          /      \\
    node 0  node 1    node 2  node 3        (node FIFOs)

A merger never takes more than its FIFO has room for, so nothing is dropped;
a full FIFO disables the ports below it, and that back-pressure reaches the
nodes, which stall until their FIFO has room. *Admission control*: while any
FIFO is full, the driver pauses the input (the FPGA design discards input; we
must not, so it waits, and the client or the Spark job waits with it). Each
time the input is held back counts as one pause, reported in status.

FIFOs count pairs. ``FIFO`` is usable from one thread (the simulator steps it)
and from many (the process version blocks on it).
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np


class FIFO:
    """A bounded FIFO of (r_id, s_id) pairs, stored as array chunks."""

    def __init__(self, capacity: int, name: str = "fifo"):
        if capacity < 1:
            raise ValueError(f"{name}: FIFO capacity must be >= 1 pair, got {capacity}")
        self.capacity = int(capacity)
        self.name = name
        self._chunks: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self.n = 0
        self.cond = threading.Condition()
        self.closed = False
        self.high_water = 0
        self.total_in = 0

    def __len__(self) -> int:
        return self.n

    @property
    def room(self) -> int:
        return self.capacity - self.n

    def full(self) -> bool:
        return self.n >= self.capacity

    def offer(self, r: np.ndarray, s: np.ndarray) -> int:
        """Put as many pairs as fit (from the front); returns how many were taken."""
        with self.cond:
            k = min(self.room, r.shape[0])
            if k > 0:
                self._chunks.append((r[:k], s[:k]))
                self.n += k
                self.total_in += k
                self.high_water = max(self.high_water, self.n)
                self.cond.notify_all()
            return k

    def take(self, most: int) -> tuple[np.ndarray, np.ndarray]:
        """Remove up to ``most`` pairs from the front."""
        with self.cond:
            rs, ss, got = [], [], 0
            while self._chunks and got < most:
                r, s = self._chunks[0]
                k = min(most - got, r.shape[0])
                rs.append(r[:k])
                ss.append(s[:k])
                if k == r.shape[0]:
                    self._chunks.popleft()
                else:
                    self._chunks[0] = (r[k:], s[k:])
                got += k
            self.n -= got
            if got:
                self.cond.notify_all()
        if not rs:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(rs), np.concatenate(ss)

    # blocking use (threads of the process version)

    def put(self, r: np.ndarray, s: np.ndarray, stop: threading.Event | None = None) -> None:
        """Put every pair, waiting for room (never drops)."""
        pos = 0
        while pos < r.shape[0]:
            k = self.offer(r[pos:], s[pos:])
            pos += k
            if k == 0:
                with self.cond:
                    if stop is not None and stop.is_set():
                        raise InterruptedError(f"{self.name}: stopped")
                    if self.full():
                        self.cond.wait(0.05)

    def get(self, most: int, timeout: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
        with self.cond:
            if self.n == 0:
                self.cond.wait(timeout)
        return self.take(most)


class Merger:
    """Two-in-one-out merger with its own FIFO; ``step()`` serves port 1, then port 2."""

    def __init__(self, left: FIFO, right: FIFO, capacity: int, name: str):
        self.ports = (left, right)
        self.out = FIFO(capacity, name)

    def step(self) -> int:
        moved = 0
        for port in self.ports:
            k = min(len(port), self.out.room)
            if k:
                r, s = port.take(k)
                self.out.offer(r, s)
                moved += k
        return moved


class MergingNetwork:
    """Node FIFOs at the leaves, a perfect binary tree of mergers above them."""

    def __init__(self, n_nodes: int, node_fifo: int = 8, merger_fifo: int = 4):
        self.leaves = [FIFO(node_fifo, f"node {i}") for i in range(n_nodes)]
        width = 2
        while width < n_nodes:
            width *= 2
        level = self.leaves + [FIFO(1, f"absent {i}") for i in range(n_nodes, width)]
        self.mergers: list[Merger] = []  # bottom-up; the last one is the root
        k = 0
        while len(level) > 1:
            nxt = []
            for a, b in zip(level[0::2], level[1::2], strict=True):
                m = Merger(a, b, merger_fifo, f"merger {k}")
                k += 1
                self.mergers.append(m)
                nxt.append(m.out)
            level = nxt
        self.root = self.mergers[-1].out

    def fifos(self) -> list[FIFO]:
        return self.leaves + [m.out for m in self.mergers]

    def any_full(self) -> bool:
        return any(f.full() for f in self.fifos())

    def pairs_inside(self) -> int:
        return sum(len(f) for f in self.fifos())

    def step(self) -> int:
        """Every merger once, top-down so that room made above is used below in the same step."""
        return sum(m.step() for m in reversed(self.mergers))


class AdmissionControl:
    """Pauses the input while any FIFO of the network (or a stalled node) is full."""

    def __init__(self, network: MergingNetwork):
        self.network = network
        self.pauses = 0  # times the input was held back
        self.paused = False

    def admit(self, stalled: bool = False) -> bool:
        """May the driver feed the next input now? Counts a pause when it may not."""
        if stalled or self.network.any_full():
            self.pauses += 1
            self.paused = True
            return False
        self.paused = False
        return True
