"""WiB+-Tree internal nodes: the traversal to a key's leaf, and separator insertion.

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

Separator insertion (:func:`tree_insert`) is the standard B+-tree one: a node that
reaches F + 1 keys splits, its middle key moving up, up to a new root. Array layout:
:mod:`.layout`.
"""

import numpy as np

from panjoin.config import NJIT
from panjoin.jit import njit
from panjoin.subwindow.kernels.search import gallop_right_range
from panjoin.subwindow.kernels.wib.layout import HEIGHT, MAXH, NINODES, ROOT


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
        # rebounding search from the child taken last time (a row of ikeys is contiguous)
        c = gallop_right_range(ikeys[v], x, pi[d], icnt[v])
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


# --------------------------------------------------------------------------- insertion


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
