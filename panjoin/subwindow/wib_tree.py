"""WiB+-Tree: a B+-tree with small sorted internal nodes and wide unsorted leaves.

PanJoin paper, section III-C (batch mode III-E, probes III-F). RaP-Table cuts
the key range by splitters learnt from the previous subwindow; when the keys
drift (a growing timestamp, say) they all land in its last partition. A
B+-tree adapts to any key order, and the WiB+-Tree makes it cheap:

- internal nodes hold at most F = ``config.WIB_FANOUT`` (64) sorted separators
  in flat preallocated arrays (``ikeys``, ``ichild``, ``icnt``), a few hundred
  bytes each, so the whole index part stays in cache;
- leaves are WIDE (W = ceil(NSub / P * sigma) tuples, P ~ the number of leaves
  of a full subwindow) and UNSORTED: a tuple is appended to its leaf, and only
  a leaf that overflows is split, by partitioning it around its median (the
  paper sorts it; a partition is all a split needs, since both halves are
  unsorted leaves again, and it costs O(W) instead of O(W log W));
- there are no duplicate separators: equal keys always share a leaf. A leaf
  whose median key holds more than half of it is cut into up to three: the
  keys below, a *sealed* leaf covering exactly that one key [x, x+) (x+ the
  next representable key), and the keys above. A sealed leaf never splits; it
  overflows into chained LLAT entries, and a key gap next to it is covered by
  an empty leaf if no neighbour covers it;
- all leaf storage is one LLAT (``llat.py``) of entries of W slots. Unlike in
  RaP-Table, PtrG starts at entry 0: every new leaf takes an entry, and an
  unsealed leaf is exactly one entry. A split returns the old leaf's entry to a
  free stack before the pieces take entries, so entries are reused, not leaked.

Layout, F = 2, W = 4 (16 tuples over P = 5 partitions), after the trace below::

                        node2 [8]
                 ┌──────────┴──────────┐
            node0 [5]              node1 [9]
           ┌────┴────┐            ┌────┴─────┐
        leaf0      leaf3        leaf1       leaf2        leaves in key order (lnext),
      [-inf, 5)   [5, 8)       [8, 9) S    [9, +inf)     sealed leaf S holds only 8
       e0: 1 2 3  e3: 6 5 7    e1: 8 8 8 8 -> e4: 8 8    LLAT entries (e4 chained)

Worked trace (``WiBTree(16, partitions=5, fanout=2)``: W = ceil(16/5 * 1.25) = 4):

1. insert [3 8 8]: the root is leaf0 (entry 0, all keys): appended, unsorted.
2. insert [1 9]: leaf0 would hold 5 > W: partition [3 8 8 1 9] around its median
   8 (a group of 2, not more than half): cut before it, leaf0 keeps [3 1], the
   new leaf1 (entry 1) takes [8 8 9]; separator 8 goes to a new root node0.
3. insert [5 7 8 8]: two runs. [5 7] fits leaf0 (now [3 1 5 7]). [8 8] overflows
   leaf1: [8 8 9 8 8] has median 8 with 4 of 5 tuples, so leaf1 becomes the
   sealed leaf [8, 9) and leaf2 [9, +inf) takes [9]; node0 = [8 9].
4. insert [2 6]: leaf0 overflows: [3 1 5 7 2 6] is cut at 5 into leaf0 [1 2 3]
   and leaf3 [6 5 7]. node0 would hold [5 8 9] > F keys: it splits, 8 moves up
   into the new root node2; the tree is two levels high, all leaves at depth 2.
5. insert [8 8]: the sealed leaf1 takes them past W: entry 4 is chained to it.
6. insert [10 12]: appended to leaf2.

Probe with bands [0, 6], [4, 7], [8, 8] (one per probe tuple, sorted): [0, 6]
starts in leaf0 and ends in leaf3, both boundary leaves, keys compared: 1 2 3 and
6 5; [4, 7] lies within leaf3: 6 5 7; [8, 8] hits the sealed leaf1, which matches
whole: six 8s.

Batch insert (sorted keys): a cursor keeps the root-to-leaf path of the previous
key; the next key, never smaller, is usually in the same leaf or a near one, so
the cursor climbs only to the lowest node still covering it, gallops forward in
that node and descends (paper III-E). The batch tuples bound for one leaf form a
run, appended at once (or split around it). Leaves live in creation order, so
the traversal runs a few tuples ahead and prefetches their leaves (memory-level
parallelism instead of one cache miss after another). When keys only grow, the
rightmost leaf is cut into full leaves rather than halves, so an increasing key
leaves a packed tree behind. Cost: O(log_F(leaves)) per jump, O(1) per tuple
within a leaf, O(W) per split (amortised over >= W/4 inserts).

Probe (sorted batch, per band ``lo <= key <= hi``): consecutive probe tuples
whose lo falls in one leaf and hi in one leaf form a group and share the scans:
the leaf of lo and the leaf of hi compare keys, leaves strictly between are
copied whole (the window filter applies to every pair); empty bands are
skipped without moving any cursor. Chunks of the batch run in parallel; the
first pass counts and writes each chunk's matches into its own slab (sized from
the last probe's selectivity), the second copies them to the prefix-sum
offsets, probing a chunk again only if it overflowed its slab.

Expiry drops the whole subwindow (the manager's job); there is no delete.

Memory (``nbytes`` counts every array): the LLAT is sized for the worst case,
``entry_bound`` entries (about 5.5 P for sigma 1.25, see :func:`leaf_bound`), of
which a subwindow usually uses ~1.2 P; the arrays are reserved, not touched,
beyond PtrG.
"""

from __future__ import annotations

import math

import numpy as np

from panjoin.config import LLAT_SIGMA, WIB_FANOUT
from panjoin.subwindow.base import Residual, SubwindowIndex, WindowFilter, no_pairs
from panjoin.subwindow.kernels.primitives import I64_MAX, I64_MIN
from panjoin.subwindow.kernels.wib import layout as K
from panjoin.subwindow.kernels.wib.insert import wib_insert
from panjoin.subwindow.kernels.wib.probe import wib_probe
from panjoin.subwindow.llat import LLAT

_ERRORS = {
    K.NO_ENTRY: "LLAT ran out of entries",
    K.NO_LEAF: "leaf table ran out of leaves",
    K.NO_NODE: "internal node table ran out of nodes",
}


def _lowest(dtype):
    return I64_MIN if dtype == np.int64 else -np.inf


def _key_after(x, dtype):
    """(True, smallest key > x) or (False, None) at the top of the key type (the Python twin
    of :func:`panjoin.subwindow.kernels.primitives.key_after`, for check())."""
    if dtype == np.int64:
        return (False, None) if x == I64_MAX else (True, int(x) + 1)
    with np.errstate(over="ignore"):
        y = np.nextafter(np.float64(x), np.inf)
    return (bool(y < np.inf), y)


def leaf_bound(capacity: int, width: int) -> int:
    """Most leaves a tree of ``capacity`` tuples and leaf width W can ever have.

    A leaf splits only when it exceeds W tuples (n > W). Its pieces: a piece cut
    next to the median holds >= ceil(n/4) >= q = ceil((W+1)/4) tuples; a sealed
    piece (one key, more than half of a range > W) holds >= h = (W+1)//2 + 1; a
    side piece next to a sealed one, or an empty leaf filling the key gap beside
    it, may be smaller, but each sealed leaf has only two neighbours; and one more
    small leaf may exist, the rightmost one (the initial leaf, or the piece the
    increasing-key rule cuts off). Sealed leaves never split and leaves never
    shrink, so with S sealed leaves and B other leaves of >= q tuples,
    ``h*S + q*B <= N`` and ``leaves <= 3*S + B + 1 <= max(3N/h, N/q) + 1``.
    """
    n = int(capacity)
    w = int(width)
    h = (w + 1) // 2 + 1
    q = (w + 4) // 4
    return max(3 * n // h, n // q) + 1


def entry_bound(capacity: int, width: int) -> int:
    """LLAT entries that always suffice: one per leaf, plus the overflow of sealed leaves.

    An unsealed leaf holds <= W tuples, so one entry; a sealed leaf of g tuples
    chains ceil(g/W) entries, ceil(g/W) - 1 <= g/W beyond its first. Entries
    freed when a split rewrites a chain go back on a free stack that allocation
    empties before advancing PtrG, and a split frees the old chain before it
    takes any entry, so PtrG never exceeds the entries in use at one time:
    ``leaf_bound + N // W``.
    """
    return leaf_bound(capacity, width) + int(capacity) // int(width)


def node_bound(leaves: int, fanout: int) -> int:
    """Most internal nodes over ``leaves`` leaves: every non-root node keeps >= F//2 keys."""
    mc = fanout // 2 + 1  # children of a non-root node after a split, at least
    total = 0
    c = int(leaves)
    while c > 1:
        c = max(1, c // mc)
        total += c
    return total + 1


#: most speculative output slots a probe allocates (all chunks together; 2 x 8 B each)
_SLAB_SLOTS = 1 << 22

class WiBTree(SubwindowIndex):
    """Wide B+-Tree over one subwindow.

    Options: ``sigma`` (LLAT slack; leaf width W = ceil(NSub / P * sigma)) and
    ``fanout`` (most keys per internal node, default ``config.WIB_FANOUT``).
    ``predecessor`` is accepted and ignored: the tree adapts to any key order.
    """

    kind = "wib"

    def __init__(self, capacity, key_dtype=np.int64, partitions=1024, threads=1,
                 predecessor=None, **opts):
        super().__init__(capacity, key_dtype, partitions, threads)
        sigma = float(opts.get("sigma", LLAT_SIGMA))
        fanout = int(opts.get("fanout", WIB_FANOUT))
        if fanout < 2:
            raise ValueError(f"wib: internal node fan-out must be >= 2, got {fanout}")
        self.fanout = fanout
        width = max(1, math.ceil(self.capacity / self.partitions * sigma))  # = LLAT.cap
        self.max_leaves = leaf_bound(self.capacity, width)
        n_entries = entry_bound(self.capacity, width)
        # entries freed by splits are reused; the worst-case sized columns sit on huge pages
        self.llat = LLAT(self.capacity, self.partitions, self.key_dtype, sigma=sigma,
                         entries=n_entries, normal_entries=0, reuse=True, huge_pages=True)
        L = self.llat
        assert L.cap == width
        self.width = width
        n_nodes = node_bound(self.max_leaves, fanout)
        self.ikeys = np.empty((n_nodes, fanout + 1), dtype=self.key_dtype)
        self.ichild = np.empty((n_nodes, fanout + 2), dtype=np.int64)
        self.icnt = np.zeros(n_nodes, dtype=np.int64)
        ml = self.max_leaves
        # per leaf, one row each (a leaf's fields share a cache line): first LLAT entry,
        # size, next leaf in key order, sealed flag; and the key range [lower, upper)
        self.linfo = np.zeros((ml, 4), dtype=np.int64)
        self.lkey = np.zeros((ml, 2), dtype=self.key_dtype)
        self.meta = np.zeros(K.META_LEN, dtype=np.int64)
        # the first leaf takes LLAT entry 0 and covers every key
        L.ptr[0] = 1
        self.linfo[0] = (0, 0, -1, 0)
        self.lkey[0, K.K_LO] = _lowest(self.key_dtype)
        self.meta[K.ROOT] = 0
        self.meta[K.HEIGHT] = 0
        self.meta[K.NLEAVES] = 1
        self._hint = 1.0  # matches per probe tuple in the last probe (sizes the probe slabs)

    # ------------------------------------------------------------------ kernels' views

    @property
    def _tree(self):
        return self.ikeys, self.ichild, self.icnt

    @property
    def _leaf(self):
        return self.linfo, self.lkey

    # column views of the leaf table, for tests and check()
    lfirst = property(lambda self: self.linfo[:, K.L_FIRST])
    lsize = property(lambda self: self.linfo[:, K.L_SIZE])
    lnext = property(lambda self: self.linfo[:, K.L_NEXT])
    lseal = property(lambda self: self.linfo[:, K.L_SEAL])
    llo = property(lambda self: self.lkey[:, K.K_LO])
    lhi = property(lambda self: self.lkey[:, K.K_HI])

    @property
    def _store(self):
        L = self.llat
        return L.keys, L.ts, L.seq, L.head, L.tail, L.nxt, L.last, L.ptr, L.free

    @property
    def height(self) -> int:
        return int(self.meta[K.HEIGHT])

    @property
    def n_leaves(self) -> int:
        return int(self.meta[K.NLEAVES])

    @property
    def n_nodes(self) -> int:
        return int(self.meta[K.NINODES])

    # ------------------------------------------------------------------ commands

    def insert(self, keys, ts, seq, key2=None):
        """Insert a batch sorted by key: O(m) appends, O(log_F leaves) per jump, O(W) per split."""
        keys, ts, seq = self._check_insert(keys, ts, seq, key2)
        m = keys.shape[0]
        if m == 0:
            return
        if self.key_dtype.kind == "f" and not np.isfinite(keys).all():
            raise ValueError("wib: keys must be finite (no NaN or infinity)")
        bad = np.flatnonzero(keys[1:] < keys[:-1])
        if bad.shape[0]:
            raise ValueError(f"wib: insert batch is not sorted by key (position {bad[0] + 1})")
        q = (self.width + 4) // 4
        st = wib_insert(self._tree, self._leaf, self._store, self.meta, self.width,
                          self.fanout, q, keys, ts, seq)
        if st != K.OK:  # the bounds above say this cannot happen: a bug, not bad input
            raise RuntimeError(f"wib: {_ERRORS.get(st, st)}")

    def probe(self, lo, hi, flt: WindowFilter | None = None, res: Residual | None = None):
        """Every (probe index, stored seq) with lo <= key <= hi for a sorted probe batch."""
        lo, hi, flt = self._check_probe(lo, hi, flt)
        m = lo.shape[1]
        if m == 0 or len(self) == 0 or lo.shape[0] == 0:
            return no_pairs()
        c0, c1, c2 = flt.arrays(m)
        parts = max(1, min(self.threads, m))
        # each chunk's matches go to a slab sized from the last probe's selectivity, so that
        # the leaves are read once; a chunk that overflows its slab is probed again
        chunk = -(-m // parts)
        slab = min(int(chunk * self._hint * 1.25) + 16, _SLAB_SLOTS // parts)
        out = wib_probe(self._tree, self._leaf, self._store, self.meta[K.ROOT],
                        self.meta[K.HEIGHT], self.width, lo, hi, flt.mode, c0, c1, c2, parts,
                        slab)
        self._hint = out[0].shape[0] / m
        return self._keep_residual(out[0], out[1], res, m)

    def __len__(self):
        return int(self.meta[K.SIZE])

    @property
    def nbytes(self):
        arrays = (self.ikeys, self.ichild, self.icnt, self.linfo, self.lkey, self.meta)
        return self.llat.nbytes + sum(a.nbytes for a in arrays)

    # ------------------------------------------------------------------ invariants

    def leaves_in_order(self) -> np.ndarray:
        """Leaf ids in key order, following the leaf links from the leftmost leaf."""
        out = []
        v, h = int(self.meta[K.ROOT]), self.height
        for _ in range(h):
            v = int(self.ichild[v, 0])
        while v >= 0:
            out.append(v)
            v = int(self.lnext[v])
        return np.array(out, dtype=np.int64)

    def check(self):
        """Assert every invariant of tree, leaves and LLAT; the message dumps the state."""
        L = self.llat
        W, F = self.width, self.fanout
        meta = self.meta
        root, h = int(meta[K.ROOT]), int(meta[K.HEIGHT])
        nl, ni, n = int(meta[K.NLEAVES]), int(meta[K.NINODES]), int(meta[K.SIZE])
        state = f"(n={n}, height={h}, leaves={nl}, nodes={ni}, W={W}, F={F}, root={root})"
        assert 0 <= n <= self.capacity, f"wib: size outside [0, {self.capacity}] {state}"
        assert 1 <= nl <= self.max_leaves, f"wib: leaf count outside bounds {state}"
        assert 0 <= ni <= self.icnt.shape[0], f"wib: node count outside bounds {state}"
        assert h >= 0 and (h == 0) == (ni == 0), f"wib: height and node count disagree {state}"
        dt = self.key_dtype
        # walk the tree: every node's separators sorted, strictly inside the range its
        # parent gives it; every leaf at depth h, with the lower bound of its path
        leaves_seen = []
        leaf_lo = {}
        nodes_seen = set()
        stack = [(root, 0, None, None)]  # (node, depth, lower bound, upper bound)
        seps = []
        while stack:
            v, d, lb, ub = stack.pop()
            if d == h:
                assert 0 <= v < nl, f"wib: leaf id {v} outside [0, {nl}) {state}"
                leaves_seen.append(v)
                leaf_lo[v] = lb
                continue
            assert 0 <= v < ni and v not in nodes_seen, f"wib: node {v} bad or shared {state}"
            nodes_seen.add(v)
            c = int(self.icnt[v])
            ks = self.ikeys[v, :c]
            assert 1 <= c <= F, f"wib: node {v} holds {c} keys {state}"
            if v != root:
                assert c >= F // 2, f"wib: non-root node {v} holds {c} < F//2 keys {state}"
            assert np.all(ks[1:] > ks[:-1]), f"wib: node {v} keys not strictly sorted {ks}"
            if lb is not None:
                assert ks[0] > lb, f"wib: node {v} key {ks[0]} <= its lower bound {lb}"
            if ub is not None:
                assert ks[-1] < ub, f"wib: node {v} key {ks[-1]} >= its upper bound {ub}"
            seps.extend(ks.tolist())
            bounds = [lb, *ks.tolist(), ub]
            for i in range(c, -1, -1):  # pushed right to left: leaves come out in key order
                stack.append((int(self.ichild[v, i]), d + 1, bounds[i], bounds[i + 1]))
        assert len(nodes_seen) == ni, f"wib: {ni - len(nodes_seen)} unreachable nodes {state}"
        assert len(leaves_seen) == nl == len(set(leaves_seen)), (
            f"wib: reached {len(leaves_seen)} leaves ({len(set(leaves_seen))} distinct) {state}")
        # separators over the whole tree: strictly increasing in order (no duplicates)
        order_seps = [leaf_lo[v] for v in leaves_seen[1:]]
        assert len(order_seps) == len(seps) == len(set(seps)), f"wib: duplicate separators {state}"
        assert all(a < b for a, b in zip(order_seps, order_seps[1:], strict=False)), (
            f"wib: separators not increasing {order_seps} {state}")
        # leaf links follow key order; each leaf's lower bound is its path's
        linked = self.leaves_in_order().tolist()
        assert linked == leaves_seen, f"wib: leaf links {linked} != tree order {leaves_seen}"
        assert self.llo[leaves_seen[0]] == _lowest(dt), f"wib: leftmost lower bound {state}"
        for v in leaves_seen[1:]:
            assert self.llo[v] == leaf_lo[v], (
                f"wib: leaf {v} lower bound {self.llo[v]} != path's {leaf_lo[v]} {state}")
        # leaves: sizes match the chains, keys inside the range, sealed leaves pure
        order = np.array(leaves_seen, dtype=np.int64)
        info = self.linfo[order]
        first, size, nxt_leaf, sealed = (info[:, c] for c in range(4))
        lo, hi = self.llo[order], self.lhi[order]
        assert np.array_equal(nxt_leaf[:-1], order[1:]) and nxt_leaf[-1] == -1, (
            f"wib: leaf links disagree with the tree {state}")
        assert np.array_equal(hi[:-1], lo[1:]), f"wib: a leaf's upper bound != next lower {state}"
        assert np.all((first >= 0) & (first < L.n_entries)), f"wib: leaf entry out of range {state}"
        unsealed = sealed == 0
        fu = first[unsealed]
        assert np.array_equal(L.head[fu] - L.tail[fu], size[unsealed]), (
            f"wib: an unsealed leaf's size != its entry's Head - Tail {state}")
        assert np.all(size[unsealed] <= W), f"wib: an unsealed leaf holds more than W {state}"
        assert np.all(L.nxt[first[unsealed]] == -1), f"wib: an unsealed leaf is chained {state}"
        # every key of every unsealed leaf, vectorised: slot = first * W + offset
        us = np.flatnonzero(unsealed)
        sz = size[us]
        pos_of = np.repeat(np.arange(us.shape[0]), sz)
        starts = np.cumsum(sz) - sz
        slots = np.repeat(first[us] * W, sz) + np.arange(int(sz.sum())) - np.repeat(starts, sz)
        ks = L.keys[slots]
        idx = us[pos_of]  # position of each key's leaf in key order
        bad = (idx > 0) & (ks < lo[idx])
        assert not bad.any(), f"wib: leaf {order[idx[bad][0]]} holds {ks[bad][0]} below its range"
        bad = (idx < order.shape[0] - 1) & (ks >= hi[idx])
        assert not bad.any(), f"wib: leaf {order[idx[bad][0]]} holds {ks[bad][0]} above its range"
        total = int(sz.sum())
        for i in np.flatnonzero(sealed == 1).tolist():
            v = int(order[i])
            ks = L.chain_keys(int(first[i]))
            assert ks.shape[0] == size[i], f"wib: leaf {v} chain holds {ks.shape[0]} != {size[i]}"
            total += ks.shape[0]
            assert size[i] > W // 2, f"wib: sealed leaf {v} holds only {size[i]} tuples"
            assert np.all(ks == lo[i]), f"wib: sealed leaf {v} holds keys other than {lo[i]}"
            ok, after = _key_after(lo[i], dt)
            if i + 1 < order.shape[0]:
                assert ok and hi[i] == after, (
                    f"wib: sealed leaf {v} = {lo[i]} but the next leaf starts at {hi[i]}")
        assert total == n == len(self), f"wib: leaves hold {total}, size says {n} {state}"
        # LLAT: chains disjoint, full before chained, last[] right, PtrG in range, every
        # entry below PtrG in one leaf's chain or on the free stack
        assert L.check(first) == n, f"wib: LLAT count differs {state}"
