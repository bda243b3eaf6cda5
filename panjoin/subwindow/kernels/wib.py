"""WiB+-Tree kernels (PanJoin paper, section III-C; batch mode III-E, probes III-F).

Arrays in, arrays out; the Python class in :mod:`panjoin.subwindow.wib_tree`
owns the arrays and explains the structure with a worked trace. Three tuples of
arrays travel together:

- ``tree = (ikeys, ichild, icnt)``: internal node ``v`` holds ``icnt[v]`` sorted
  separators ``ikeys[v, :icnt[v]]`` and ``icnt[v] + 1`` children
  ``ichild[v, :icnt[v] + 1]`` (node ids, or leaf ids on the last internal level);
  child ``c`` covers ``[ikeys[v, c-1], ikeys[v, c])``. One spare key slot lets a
  node reach F + 1 keys for the instant before it splits.
- ``leaf = (linfo, lkey)``: one row per leaf, so that a leaf's fields share a
  cache line. ``linfo[l] = (first, size, next, sealed)``: leaf ``l`` stores
  ``size`` unsorted tuples in the LLAT chain starting at entry ``first``,
  ``next`` links the leaves in key order (-1 after the last), and ``sealed``
  marks a leaf whose range holds exactly one key value, so that it never splits
  and overflows into chained LLAT entries (an unsealed leaf is exactly one
  entry). ``lkey[l] = (lower, upper)``: it covers keys ``[lower, upper)``
  (``upper`` = the next leaf's ``lower``; unused on the last leaf).
- ``store = (keys, ts, seq, head, tail, nxt, last, ptr, free)``: the LLAT
  (see :mod:`panjoin.subwindow.kernels.llat`; entry capacity ``W`` = leaf width)
  plus a stack of entries freed when a split rewrites a leaf's chain, which
  allocation takes before advancing PtrG.

``meta`` holds the scalars: root, height (0: the root is a leaf), leaf count,
internal node count, tuple count, free-stack top.

Path-reusing traversal (:func:`find_leaf`): a cursor keeps the root-to-leaf path
of the previous key with each level's upper bound. The next key of a sorted
batch is usually in the same leaf (one comparison) or a neighbour; otherwise the
cursor climbs only to the lowest node whose range still holds the key, gallops
forward from the child it took last time, and descends from there by binary
search in each (cache resident) node.

Trace, F = 2, two levels (node2 [8] over node0 [5] and node1 [9], leaves
[-inf,5) [5,8) [8,9) [9,+inf)), keys 1, 6, 9: 1 descends from the root (8 ->
child 0, node0: 5 -> child 0: leaf [-inf,5)); 6 is not below that leaf's upper
bound 5, node0's range (-inf, 8) still holds it: gallop in node0 from child 0 to
child 1, leaf [5,8); 9 leaves node0's range too: climb to the root, child 1,
node1: 9 -> child 1, leaf [9,+inf).
"""

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from panjoin.config import NJIT, NJIT_PAR
from panjoin.subwindow.kernels.search import (
    chunk_bounds,
    gallop_left,
    gallop_left_range,
)
from panjoin.subwindow.kernels.window import NONE, in_window

# leaf fields: linfo[l, :] and lkey[l, :]
L_FIRST = 0
L_SIZE = 1
L_NEXT = 2
L_SEAL = 3
K_LO = 0
K_HI = 1

# meta slots
ROOT = 0
HEIGHT = 1
NLEAVES = 2
NINODES = 3
SIZE = 4
FREETOP = 5
META_LEN = 6

#: deepest tree the path arrays can describe, leaf level included (fan-out >= 2 per level)
MAXH = 64
#: stack for the piece cutter; every pending level leaves <= 2 items, ranges shrink by >= 1/4
CUT_STACK = 1024

# status codes returned by the insert kernel
OK = 0
NO_ENTRY = 1
NO_LEAF = 2
NO_NODE = 3

I64_MAX = np.iinfo(np.int64).max


# --------------------------------------------------------------------------- keys


def key_after(x):
    """(True, smallest key > x) or (False, x) when x is the largest key of its type."""
    raise NotImplementedError("key_after runs inside Numba kernels only")


@overload(key_after)
def _key_after_impl(x):
    if isinstance(x, types.Float):
        def impl(x):
            y = np.nextafter(x, np.inf)
            return y < np.inf, y  # keys are finite: nothing can follow the largest double
        return impl

    def impl_int(x):
        if x == I64_MAX:
            return False, x
        return True, x + 1
    return impl_int


# --------------------------------------------------------------------------- prefetch


def _prefetch_intrinsic(rw):
    def prefetch(typingctx, arr, idx):
        sig = types.void(arr, idx)

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]],
                                           wraparound=False)
            i8p = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
            # (address, read 0 / write 1, high temporal locality, data cache)
            builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, rw),
                              ir.Constant(i32, 3), ir.Constant(i32, 1)])
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(prefetch)


#: ``prefetch_read(arr, i)``: ask for the cache line of 1-d ``arr[i]`` (a hint only)
prefetch_read = _prefetch_intrinsic(0)
#: ``prefetch_write(arr, i)``: the same, for a line about to be written
prefetch_write = _prefetch_intrinsic(1)


# --------------------------------------------------------------------------- traversal


@njit(**NJIT)
def _upper(ikeys, v, cnt, x):
    """Child index of x in node v: the number of separators <= x (binary search)."""
    lo = 0
    hi = cnt
    while lo < hi:
        mid = (lo + hi) >> 1
        if ikeys[v, mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(**NJIT)
def _upper_from(ikeys, v, cnt, x, c):
    """Child index of x in node v, known to be >= c (rebounding search from c)."""
    if c >= cnt or ikeys[v, c] > x:
        return c
    lo = c  # ikeys[v, lo] <= x
    step = 1
    hi = lo + step
    while hi < cnt and ikeys[v, hi] <= x:
        lo = hi
        step <<= 1
        hi = lo + step
    if hi > cnt:
        hi = cnt
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if ikeys[v, mid] <= x:
            lo = mid
        else:
            hi = mid
    return hi


@njit(**NJIT)
def new_path(key_dtype_probe):
    """An empty cursor: (node per level, child per level, upper bound per level,
    unbounded flag per level, [current leaf or -1])."""
    pn = np.zeros(MAXH, dtype=np.int64)
    pi = np.zeros(MAXH, dtype=np.int64)
    pu = np.empty(MAXH, dtype=key_dtype_probe.dtype)
    pinf = np.ones(MAXH, dtype=np.uint8)
    cur = np.full(1, -1, dtype=np.int64)
    return pn, pi, pu, pinf, cur


@njit(**NJIT)
def find_leaf(x, ikeys, ichild, icnt, root, height, pn, pi, pu, pinf, cur):
    """Leaf whose range holds x; x must not be below the previous key of this cursor.

    ``cur[0] = -1`` starts from the root; afterwards the cursor climbs only as
    far as needed (paper III-E: "starts with the node path in the tree of the
    previous batch tuple, backtracks to the upper levels, and then goes
    downwards"). Level d of the path holds node ``pn[d]``, the child ``pi[d]``
    taken there, and the node's upper bound ``pu[d]`` (none if ``pinf[d]``);
    level ``height`` holds the leaf's upper bound. Only internal nodes are read,
    never a leaf's row: those are scattered in memory, the nodes are in cache.
    """
    l = cur[0]
    if l >= 0:
        if pinf[height] == 1 or x < pu[height]:
            return l
        d = height - 1
        while d > 0 and pinf[d] == 0 and x >= pu[d]:
            d -= 1
        v = pn[d]
        c = _upper_from(ikeys, v, icnt[v], x, pi[d])
    else:
        pinf[0] = 1
        if height == 0:
            cur[0] = root
            return root
        d = 0
        v = root
        pn[0] = root
        c = _upper(ikeys, v, icnt[v], x)
    while True:
        pi[d] = c
        child = ichild[v, c]
        if c < icnt[v]:
            pu[d + 1] = ikeys[v, c]
            pinf[d + 1] = 0
        else:
            pu[d + 1] = pu[d]
            pinf[d + 1] = pinf[d]
        if d + 1 == height:
            cur[0] = child
            return child
        d += 1
        v = child
        pn[d] = v
        c = _upper(ikeys, v, icnt[v], x)


# --------------------------------------------------------------------------- LLAT with reuse


@njit(**NJIT)
def alloc_entry(store, meta):
    """A fresh LLAT entry: a freed one if any, else PtrG's; -1 when exhausted."""
    keys, ts, seq, head, tail, nxt, last, ptr, free = store
    top = meta[FREETOP]
    if top > 0:
        e = free[top - 1]
        meta[FREETOP] = top - 1
    else:
        e = ptr[0]
        if e >= head.shape[0]:
            return -1
        ptr[0] = e + 1
    head[e] = 0
    tail[e] = 0
    nxt[e] = -1
    last[e] = e
    return e


@njit(**NJIT)
def push_run(store, meta, W, first, bk, bt, bs, start, end):
    """Append rows [start, end) of (bk, bt, bs) to the chain of ``first``."""
    keys, ts, seq, head, tail, nxt, last, ptr, free = store
    i = start
    while i < end:
        e = last[first]
        if head[e] >= W:
            g = alloc_entry(store, meta)
            if g < 0:
                return False
            nxt[e] = g
            last[first] = g
            e = g
        take = min(end - i, W - head[e])
        p = e * W + head[e]
        for j in range(take):
            keys[p + j] = bk[i + j]
            ts[p + j] = bt[i + j]
            seq[p + j] = bs[i + j]
        head[e] += take
        i += take
    return True


# --------------------------------------------------------------------------- internal nodes


@njit(**NJIT)
def _new_node(icnt, meta):
    v = meta[NINODES]
    if v >= icnt.shape[0]:
        return -1
    meta[NINODES] = v + 1
    icnt[v] = 0
    return v


@njit(**NJIT)
def tree_insert(tree, meta, F, sep, right, pn, pi):
    """Add separator ``sep`` with new leaf ``right`` just right of the leaf holding sep.

    Standard B+-tree insertion: a node that reaches F + 1 keys splits in two
    (the middle key moves up), up to a new root. Returns False when out of nodes.
    """
    ikeys, ichild, icnt = tree
    h = meta[HEIGHT]
    if h == 0:
        r = _new_node(icnt, meta)
        if r < 0:
            return False
        ikeys[r, 0] = sep
        ichild[r, 0] = meta[ROOT]
        ichild[r, 1] = right
        icnt[r] = 1
        meta[ROOT] = r
        meta[HEIGHT] = 1
        return True
    v = meta[ROOT]
    for d in range(h):
        pn[d] = v
        c = _upper(ikeys, v, icnt[v], sep)
        pi[d] = c
        v = ichild[v, c]
    d = h - 1
    key = sep
    while True:
        v = pn[d]
        c = pi[d]
        cnt = icnt[v]
        for t in range(cnt, c, -1):
            ikeys[v, t] = ikeys[v, t - 1]
        for t in range(cnt + 1, c + 1, -1):
            ichild[v, t] = ichild[v, t - 1]
        ikeys[v, c] = key
        ichild[v, c + 1] = right
        icnt[v] = cnt + 1
        if cnt + 1 <= F:
            return True
        # split: keys [0, mid) stay, key mid moves up, keys (mid, F] go to the new node
        rn = _new_node(icnt, meta)
        if rn < 0:
            return False
        mid = (F + 1) // 2
        moved = F - mid
        for t in range(moved):
            ikeys[rn, t] = ikeys[v, mid + 1 + t]
        for t in range(moved + 1):
            ichild[rn, t] = ichild[v, mid + 1 + t]
        icnt[rn] = moved
        icnt[v] = mid
        key = ikeys[v, mid]
        right = rn
        if d == 0:
            nr = _new_node(icnt, meta)
            if nr < 0:
                return False
            ikeys[nr, 0] = key
            ichild[nr, 0] = v
            ichild[nr, 1] = rn
            icnt[nr] = 1
            meta[ROOT] = nr
            meta[HEIGHT] = h + 1
            return True
        d -= 1


# --------------------------------------------------------------------------- leaf split


@njit(**NJIT)
def _swap(ck, ct, cs, a, b):
    k = ck[a]
    ck[a] = ck[b]
    ck[b] = k
    t = ct[a]
    ct[a] = ct[b]
    ct[b] = t
    t = cs[a]
    cs[a] = cs[b]
    cs[b] = t


@njit(**NJIT)
def _random_row(rng, lo, hi):
    """A pseudo-random row in [lo, hi) (xorshift64)."""
    z = rng[0]
    z ^= z << np.uint64(13)
    z ^= z >> np.uint64(7)
    z ^= z << np.uint64(17)
    rng[0] = z
    return lo + np.int64(z % np.uint64(hi - lo))


@njit(**NJIT)
def cut_group(ck, ct, cs, a, b, rng):
    """Partition rows [a, b) around a key group fit to cut at; returns (lb, ub).

    Afterwards rows [lb, ub) hold exactly the keys equal to some key x, rows
    [a, lb) the smaller and [ub, b) the larger ones (each side unsorted). The
    group is either heavy (more than half of the rows: it is the median's) or
    leaves >= ceil((b - a) / 4) rows on the side of a cut at lb or ub. That is
    quickselect for the median (three-way partitions, so equal keys never make
    it quadratic; random median-of-3 pivots, so no key order does) that stops at
    the first pivot good enough; the median's group always is (see
    :func:`cut_pieces`). Expected O(b - a).
    """
    n = b - a
    need = (n + 3) // 4
    m = a + n // 2
    lo = a
    hi = b
    while True:
        x0 = ck[_random_row(rng, lo, hi)]
        x1 = ck[_random_row(rng, lo, hi)]
        x2 = ck[_random_row(rng, lo, hi)]
        x = max(min(x0, x1), min(max(x0, x1), x2))
        lt = lo
        i = lo
        gt = hi
        while i < gt:
            k = ck[i]
            if k < x:
                _swap(ck, ct, cs, lt, i)
                lt += 1
                i += 1
            elif k > x:
                gt -= 1
                _swap(ck, ct, cs, i, gt)
            else:
                i += 1
        if 2 * (gt - lt) > n:
            return lt, gt
        if lt > a and min(lt - a, b - lt) >= need:
            return lt, gt
        if gt < b and min(gt - a, b - gt) >= need:
            return lt, gt
        if m < lt:
            hi = lt
        elif m >= gt:
            lo = gt
        else:
            return lt, gt  # the median's group (cannot get here: it is always fit)


@njit(**NJIT)
def cut_pieces(ck, ct, cs, start, n, W, pst, pen, psl, k, sa, sb, sk, rng):
    """Cut rows [start, n) into leaf pieces; appended to pst/pen/psl from k on.

    A range of at most W tuples is one piece. A longer one (n rows) is split at
    a key boundary that leaves >= ceil(n/4) rows on each side, unless the
    median's key fills more than half of the range: then that key's tuples
    become a *sealed* piece and the two sides are cut on their own (no duplicate
    separators: equal keys never straddle a cut). Such a boundary exists: next to
    the median's group (g <= n/2 rows, lb..ub), the side of the boundary away
    from the median holds >= (n - g)/2 >= n/4 rows on one of the two choices and
    the other side >= n/2. The rows need not be sorted: :func:`cut_group`
    partitions each range around a fit group, so cutting costs O(n log(n / W))
    and a plain split O(W).
    Pieces come out in key order (every key of a piece is below every key of the
    next); empty ranges yield no piece. Returns the new piece count. ``sa, sb,
    sk``: scratch stack of CUT_STACK ranges.
    """
    top = 1
    sa[0] = start
    sb[0] = n
    sk[0] = 0
    while top > 0:
        top -= 1
        a = sa[top]
        b = sb[top]
        if a >= b:
            continue
        if sk[top] == 1 or b - a <= W:
            pst[k] = a
            pen[k] = b
            psl[k] = sk[top]
            k += 1
            continue
        lb, ub = cut_group(ck, ct, cs, a, b, rng)
        if 2 * (ub - lb) > b - a:
            # pushed right to left so that pieces come out in key order
            sa[top] = ub
            sb[top] = b
            sk[top] = 0
            sa[top + 1] = lb
            sb[top + 1] = ub
            sk[top + 1] = 1
            sa[top + 2] = a
            sb[top + 2] = lb
            sk[top + 2] = 0
            top += 3
        else:
            bal_lb = min(lb - a, b - lb) if lb > a else -1
            bal_ub = min(ub - a, b - ub) if ub < b else -1
            c = lb if bal_lb >= bal_ub else ub
            sa[top] = c
            sb[top] = b
            sk[top] = 0
            sa[top + 1] = a
            sb[top + 1] = c
            sk[top + 1] = 0
            top += 2
    return k


@njit(**NJIT)
def split_leaf(tree, leaf, store, meta, W, F, q, l, bk, bt, bs, i, j, scratch, pn, pi):
    """Insert batch rows [i, j) into leaf l, which then holds more than W tuples.

    Gather the leaf (unsorted, <= W tuples) and the run, cut them into pieces
    (:func:`cut_pieces`: the paper sorts the leaf here; partitioning it around
    its median is all a split needs, since the pieces are unsorted leaves again),
    give the first piece back to l and each other piece a new leaf, rewrite the
    chains (freed entries first), then add one separator per new leaf to the
    tree. Returns a status code.
    """
    linfo, lkey = leaf
    keys, ts, seq, head, tail, nxt, last, ptr, free = store
    ck, ct, cs, pst, pen, psl, fst, fen, fsl, flb, sa, sb, sk, rng = scratch
    # gather the leaf (one entry: unsealed leaves never overflow) and the run behind it
    s = linfo[l, L_SIZE]
    base = linfo[l, L_FIRST] * W
    old_max = ck[0]
    for t in range(s):
        ck[t] = keys[base + t]
        ct[t] = ts[base + t]
        cs[t] = seq[base + t]
        if t == 0 or ck[t] > old_max:
            old_max = ck[t]
    r = j - i
    n = s + r
    for t in range(r):
        ck[s + t] = bk[i + t]
        ct[s + t] = bt[i + t]
        cs[s + t] = bs[i + t]
    # pieces
    k = np.int64(0)  # np.int64: a literal 0 would compile callees twice
    old_next = linfo[l, L_NEXT]
    old_hi = lkey[l, K_HI]
    start = np.int64(0)
    if old_next < 0 and s >= q and old_max < bk[i]:
        # rightmost leaf and the run lies above all it holds (increasing keys): nothing will
        # land left of the run again, so cut full leaves (at key boundaries, >= q tuples)
        # instead of halves, and leave only the tail to the median cutter. Row start + W
        # lies in the sorted run and every row before the run is smaller, so "key >= its
        # key" is monotone over the rows and a rebounding search finds the boundary.
        while n - start > W:
            c = gallop_left_range(ck, ck[start + W], start, start + W)
            if c - start < q:
                break
            pst[k] = start
            pen[k] = c
            psl[k] = 0
            k += 1
            start = c
    k = cut_pieces(ck, ct, cs, start, n, W, pst, pen, psl, k, sa, sb, sk, rng)
    # final pieces with their lower bounds; an empty piece fills a key gap that a sealed
    # piece leaves (before it, between two sealed ones, or after the last)
    f = np.int64(0)
    prev_sealed = False
    prev_key = ck[0]
    for t in range(k):
        x = ck[pst[t]]
        if f == 0:
            if psl[t] == 1 and lkey[l, K_LO] < x:
                fst[f] = pst[t]
                fen[f] = pst[t]
                fsl[f] = 0
                flb[f] = lkey[l, K_LO]
                f += 1
                lbx = x
            else:
                lbx = lkey[l, K_LO]
        elif psl[t] == 1:
            if prev_sealed:
                ok, y = key_after(prev_key)
                if y < x:
                    fst[f] = pst[t]
                    fen[f] = pst[t]
                    fsl[f] = 0
                    flb[f] = y
                    f += 1
            lbx = x
        elif prev_sealed:
            ok, y = key_after(prev_key)
            lbx = y
        else:
            lbx = x  # the piece's smallest key: pieces are partitioned, not sorted
            for p in range(pst[t] + 1, pen[t]):
                if ck[p] < lbx:
                    lbx = ck[p]
        fst[f] = pst[t]
        fen[f] = pen[t]
        fsl[f] = psl[t]
        flb[f] = lbx
        f += 1
        prev_sealed = psl[t] == 1
        prev_key = x
    if prev_sealed:
        ok, y = key_after(prev_key)
        if ok and (old_next < 0 or y < old_hi):
            fst[f] = n
            fen[f] = n
            fsl[f] = 0
            flb[f] = y
            f += 1
    # release the old chain; the pieces take these entries back first
    e = linfo[l, L_FIRST]
    while e >= 0:
        nx = nxt[e]
        free[meta[FREETOP]] = e
        meta[FREETOP] += 1
        e = nx
    first_new = meta[NLEAVES]
    if first_new + f - 1 > linfo.shape[0]:
        return NO_LEAF
    prev = -1
    for t in range(f):
        if t == 0:
            lf = l
        else:
            lf = meta[NLEAVES]
            meta[NLEAVES] = lf + 1
            lkey[lf, K_LO] = flb[t]
            linfo[prev, L_NEXT] = lf
            lkey[prev, K_HI] = flb[t]
        e = alloc_entry(store, meta)
        if e < 0:
            return NO_ENTRY
        linfo[lf, L_FIRST] = e
        if not push_run(store, meta, W, e, ck, ct, cs, fst[t], fen[t]):
            return NO_ENTRY
        linfo[lf, L_SIZE] = fen[t] - fst[t]
        linfo[lf, L_SEAL] = fsl[t]
        prev = lf
    linfo[prev, L_NEXT] = old_next
    lkey[prev, K_HI] = old_hi
    # one separator per new leaf, left to right: each lands just right of its predecessor
    for t in range(1, f):
        if not tree_insert(tree, meta, F, flb[t], first_new + t - 1, pn, pi):
            return NO_NODE
    return OK


# --------------------------------------------------------------------------- insert


@njit(**NJIT)
def new_scratch(bk, W, q, m):
    """Work arrays of one insert call, big enough for any split in it.

    A split handles n <= W + m tuples (the leaf, unsealed so <= W, plus a run).
    Pieces: those of >= q tuples, sealed ones of >= h = (W+1)//2 + 1, at most one
    smaller piece per side of a sealed one, and one more (the last, small, run
    piece); the final list adds at most one empty gap leaf per sealed piece.
    """
    n = W + m
    h = (W + 1) // 2 + 1
    cap = n // q + 3 * (n // h) + 4
    return (np.empty(n, dtype=bk.dtype), np.empty(n, dtype=np.int64),
            np.empty(n, dtype=np.int64),
            np.empty(cap, dtype=np.int64), np.empty(cap, dtype=np.int64),
            np.zeros(cap, dtype=np.uint8), np.empty(2 * cap + 2, dtype=np.int64),
            np.empty(2 * cap + 2, dtype=np.int64), np.zeros(2 * cap + 2, dtype=np.uint8),
            np.empty(2 * cap + 2, dtype=bk.dtype), np.empty(CUT_STACK, dtype=np.int64),
            np.empty(CUT_STACK, dtype=np.int64), np.empty(CUT_STACK, dtype=np.uint8),
            np.full(1, 0x2545F4914F6CDD1D + n, dtype=np.uint64))


#: runs (of batch tuples bound for one leaf) between the one being inserted and the one
#: whose leaf the lookahead finds and whose leaf row it prefetches; half as far ahead,
#: the LLAT slot the run will go to is prefetched
INSERT_AHEAD = 16
#: the same for probes: leaves of lo (of distinct leaves) the lookahead runs ahead
PROBE_AHEAD = 16
#: ring of looked-ahead runs (a power of two > INSERT_AHEAD + 1, PROBE_AHEAD + 1)
RING = 32


@njit(**NJIT)
def wib_insert(tree, leaf, store, meta, W, F, q, bk, bt, bs):
    """Insert a batch sorted by key (paper III-E batch mode). Returns a status code.

    Consecutive tuples bound for one leaf form a run (found by a rebounding
    search for the leaf's upper bound in the batch) and go in together: appended
    when they fit or the leaf is sealed, else the leaf splits around them.

    Leaves and LLAT entries are numbered in creation order, not key order, so a
    sorted batch still hits them at random; the traversal therefore runs
    INSERT_AHEAD runs ahead of the inserts, prefetching each run's leaf row and,
    half as far ahead, the slot the run goes to, so that several memory accesses
    are in flight at once. A split changes the tree: the lookahead restarts
    behind it from the root.
    """
    ikeys, ichild, icnt = tree
    linfo, lkey = leaf
    keys, ts, seq, head, tail, nxt, last, ptr, free = store
    m = bk.shape[0]
    pn, pi, pu, pinf, cur = new_path(bk)
    scratch = new_scratch(bk, W, q, m)
    # queue of looked-ahead runs: counters qh (the run being inserted), qt (runs found),
    # qb (runs whose slots were prefetched); slot c of the ring is counter c & (RING - 1)
    q_start = np.empty(RING, dtype=np.int64)
    q_end = np.empty(RING, dtype=np.int64)
    q_leaf = np.empty(RING, dtype=np.int64)
    info_flat = linfo.reshape(linfo.size)
    key_flat = lkey.reshape(lkey.size)
    half = INSERT_AHEAD // 2
    qh = np.int64(0)
    qt = np.int64(0)
    qb = np.int64(0)
    la = np.int64(0)  # the first tuple not yet in a looked-ahead run
    while qh < qt or la < m:
        while la < m and qt - qh <= INSERT_AHEAD:
            h = meta[HEIGHT]
            l2 = find_leaf(bk[la], ikeys, ichild, icnt, meta[ROOT], h, pn, pi, pu, pinf, cur)
            end2 = m if pinf[h] == 1 else gallop_left(bk, pu[h], la + 1)
            c = qt & (RING - 1)
            q_start[c] = la
            q_end[c] = end2
            q_leaf[c] = l2
            prefetch_read(info_flat, l2 * 4)
            prefetch_read(key_flat, l2 * 2)
            qt += 1
            la = end2
        while qb < qt and qb <= qh + half:
            l2 = q_leaf[qb & (RING - 1)]
            e = linfo[l2, L_FIRST]
            p = e * W + linfo[l2, L_SIZE]
            prefetch_write(keys, p)
            prefetch_write(ts, p)
            prefetch_write(seq, p)
            prefetch_write(head, e)
            qb += 1
        c = qh & (RING - 1)
        qh += 1
        i = q_start[c]
        j = q_end[c]
        l = q_leaf[c]
        r = j - i
        sz = linfo[l, L_SIZE]
        if linfo[l, L_SEAL] == 0 and sz + r <= W:
            # an unsealed leaf is one entry: append in place, no chain to follow
            e = linfo[l, L_FIRST]
            p = e * W + sz
            for t in range(r):
                keys[p + t] = bk[i + t]
                ts[p + t] = bt[i + t]
                seq[p + t] = bs[i + t]
            linfo[l, L_SIZE] = sz + r
            head[e] = sz + r
        elif linfo[l, L_SEAL] == 1:
            if not push_run(store, meta, W, linfo[l, L_FIRST], bk, bt, bs, i, j):
                return NO_ENTRY
            linfo[l, L_SIZE] = sz + r
        else:
            st = split_leaf(tree, leaf, store, meta, W, F, q, l, bk, bt, bs, i, j, scratch,
                            pn, pi)
            if st != OK:
                return st
            # the tree changed: looked-ahead runs may be stale, restart from the root
            cur[0] = -1
            la = j
            qh = qt = qb = 0
        meta[SIZE] += r
    return OK


# --------------------------------------------------------------------------- probe


@njit(**NJIT)
def _segment(keys, ts, seq, p0, p1, xl, xh, whole, g, mode, c0, c1, c2,
             out_p, out_s, pos, limit, cnt):
    """Pairs of probe tuple g with slots [p0, p1) whose key lies in [xl, xh].

    ``whole``: every key is inside, no comparison needed. ``limit`` = 0 counts
    only (branch-free compares that vectorise when there is no window filter);
    otherwise pairs are written at out_*[pos + cnt] while cnt < limit, and counted on.
    """
    if limit == 0:
        if mode == NONE:
            if whole:
                return cnt + (p1 - p0)
            c = 0
            for p in range(p0, p1):
                k = keys[p]
                c += (k >= xl) & (k <= xh)
            return cnt + c
        for p in range(p0, p1):
            k = keys[p]
            if (whole or (k >= xl and k <= xh)) and in_window(mode, c0[g], c1[g], c2[g],
                                                             seq[p], ts[p]):
                cnt += 1
        return cnt
    if mode == NONE and not whole:
        # few keys match: count them branch-free first, then stop after the last one
        c = 0
        for p in range(p0, p1):
            k = keys[p]
            c += (k >= xl) & (k <= xh)
        p = p0
        while c > 0:
            k = keys[p]
            if k >= xl and k <= xh:
                if cnt < limit:
                    out_p[pos + cnt] = g
                    out_s[pos + cnt] = seq[p]
                cnt += 1
                c -= 1
            p += 1
        return cnt
    for p in range(p0, p1):
        k = keys[p]
        if (whole or (k >= xl and k <= xh)) and in_window(mode, c0[g], c1[g], c2[g],
                                                         seq[p], ts[p]):
            if cnt < limit:
                out_p[pos + cnt] = g
                out_s[pos + cnt] = seq[p]
            cnt += 1
    return cnt


@njit(**NJIT)
def _probe_leaf(leaf, store, W, l, boundary, b, i, j, lo, hi, mode, c0, c1, c2,
                out_p, out_s, pos, limit, cnt):
    """Leaf l against probe group [i, j).

    A boundary leaf compares keys (a sealed one holds a single key, so it matches
    a probe tuple whole or not at all); a leaf strictly between the boundary
    leaves is copied whole. The leaf stays in cache across the group, so the loop
    runs probe tuple by probe tuple. An unsealed leaf is one LLAT entry, read as
    one slice (its size is the leaf's, Tail is always 0: whole-subwindow expiry
    never moves it); only sealed leaves walk a chain.
    """
    linfo, lkey = leaf
    keys, ts, seq, head, tail, nxt, last, ptr, free = store
    sealed = linfo[l, L_SEAL] == 1
    x = lkey[l, K_LO]
    e0 = linfo[l, L_FIRST]
    size = linfo[l, L_SIZE]
    for g in range(i, j):
        xl = lo[b, g]
        xh = hi[b, g]
        if xl > xh:
            continue
        whole = not boundary
        if sealed:
            if not (whole or (xl <= x and x <= xh)):
                continue
            whole = True
        e = e0
        while e >= 0:
            p0 = e * W
            if sealed:
                p1 = p0 + head[e]
                e = nxt[e]
            else:
                p1 = p0 + size
                e = -1
            cnt = _segment(keys, ts, seq, p0, p1, xl, xh, whole, g, mode, c0, c1, c2,
                           out_p, out_s, pos, limit, cnt)
    return cnt


@njit(**NJIT)
def probe_chunk(tree, leaf, store, root, height, W, lo, hi, mode, c0, c1, c2,
                start, end, out_p, out_s, pos, limit):
    """Matches of probe tuples [start, end), written from out_*[pos] on (see _segment).

    Per band row (sorted), consecutive probe tuples whose lower bound falls in
    the same leaf and whose upper bound falls in the same leaf form a group
    (paper III-E: a partition is scanned for all its related batch tuples at
    once). The two boundary leaves are scanned comparing keys, leaves strictly
    between are copied whole; the window filter applies to every pair. The
    traversal runs PROBE_AHEAD leaves ahead of the scans and prefetches each
    leaf's row, then (half as far ahead) its keys, so that the scans, which
    meet the leaves in random memory order, find them in cache.
    """
    ikeys, ichild, icnt = tree
    linfo, lkey = leaf
    keys = store[0]
    info_flat = linfo.reshape(linfo.size)
    key_flat = lkey.reshape(lkey.size)
    cnt = np.int64(0)  # np.int64: a literal 0 would compile callees twice
    pn, pi, pu, pinf, cur = new_path(lo)
    # queue of looked-ahead lo leaves: q_start[c] is the first probe tuple whose lo lies
    # in leaf q_leaf[c]; counters qh (current), qt (found), qb (keys prefetched)
    q_start = np.empty(RING, dtype=np.int64)
    q_leaf = np.empty(RING, dtype=np.int64)
    half = PROBE_AHEAD // 2
    for b in range(lo.shape[0]):
        cur[0] = -1
        qh = np.int64(0)
        qt = np.int64(0)
        qb = np.int64(0)
        la = start  # the first probe tuple the lookahead has not placed
        i = start
        while i < end:
            x = lo[b, i]
            y = hi[b, i]
            if x > y:
                i += 1  # empty band: no cursor moves
                continue
            while la < end and qt - qh <= PROBE_AHEAD:
                if lo[b, la] > hi[b, la]:
                    la += 1
                    continue
                l3 = find_leaf(lo[b, la], ikeys, ichild, icnt, root, height, pn, pi, pu, pinf,
                               cur)
                c = qt & (RING - 1)
                q_start[c] = la
                q_leaf[c] = l3
                prefetch_read(info_flat, l3 * 4)
                prefetch_read(key_flat, l3 * 2)
                qt += 1
                # the following probe tuples whose lo lies in the same leaf
                la += 1
                if pinf[height] == 1:
                    la = end
                else:
                    u = pu[height]
                    while la < end and (lo[b, la] > hi[b, la] or lo[b, la] < u):
                        la += 1
            while qb < qt and qb <= qh + half:
                l3 = q_leaf[qb & (RING - 1)]
                base = linfo[l3, L_FIRST] * W
                stop = base + min(linfo[l3, L_SIZE], W)
                for p in range(base, stop, 8):
                    prefetch_read(keys, p)
                qb += 1
            while qh + 1 < qt and q_start[(qh + 1) & (RING - 1)] <= i:
                qh += 1
            l1 = q_leaf[qh & (RING - 1)]
            n1 = linfo[l1, L_NEXT]
            u1 = lkey[l1, K_HI]
            l2 = l1
            while True:
                n2 = linfo[l2, L_NEXT]
                if n2 < 0 or lkey[l2, K_HI] > y:
                    break
                l2 = n2
            u2 = lkey[l2, K_HI]
            j = i + 1
            while j < end:
                xj = lo[b, j]
                yj = hi[b, j]
                if xj <= yj and ((n1 >= 0 and xj >= u1) or (n2 >= 0 and yj >= u2)):
                    break
                j += 1
            l = l1
            while True:
                cnt = _probe_leaf(leaf, store, W, l, l == l1 or l == l2, b, i, j, lo, hi, mode,
                                  c0, c1, c2, out_p, out_s, pos, limit, cnt)
                if l == l2:
                    break
                l = linfo[l, L_NEXT]
            i = j
    return cnt


@njit(**NJIT_PAR)
def wib_probe(tree, leaf, store, root, height, W, lo, hi, mode, c0, c1, c2, parts, slab):
    """Probe driver: ``parts`` chunks of the batch in parallel, two passes.

    Pass 1 counts each chunk's matches and, speculatively, writes them into the
    chunk's own slab of ``slab`` slots (slab = 0: count only). Pass 2 fills the
    output at the prefix-sum offsets: a chunk whose matches fit its slab is
    copied, any other is probed again straight into place. With a slab sized
    from the expected selectivity the leaves are read from memory once, not twice.
    """
    m = lo.shape[1]
    bounds = chunk_bounds(m, parts)
    counts = np.zeros(parts + 1, dtype=np.int64)
    sp = np.empty(parts * slab, dtype=np.int64)
    ss = np.empty(parts * slab, dtype=np.int64)
    for t in prange(parts):
        counts[t + 1] = probe_chunk(tree, leaf, store, root, height, W, lo, hi, mode, c0, c1,
                                    c2, bounds[t], bounds[t + 1], sp, ss, t * slab, slab)
    offs = np.cumsum(counts)
    total = offs[parts]
    out_p = np.empty(total, dtype=np.int64)
    out_s = np.empty(total, dtype=np.int64)
    for t in prange(parts):
        c = counts[t + 1]
        if c == 0:
            continue
        o = offs[t]
        if c <= slab:
            base = t * slab
            out_p[o:o + c] = sp[base:base + c]
            out_s[o:o + c] = ss[base:base + c]
        else:
            probe_chunk(tree, leaf, store, root, height, W, lo, hi, mode, c0, c1, c2,
                        bounds[t], bounds[t + 1], out_p, out_s, o, c)
    return out_p, out_s
