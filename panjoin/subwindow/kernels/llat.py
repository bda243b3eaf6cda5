"""LLAT kernels: the Linked List Adaptive Table (PanJoin paper, section III-B2, Figure 5).

State, all flat arrays so that kernels stay arrays-in / arrays-out:

- ``keys, ts, seq``: entries of C slots each, entry e at ``[e*C, (e+1)*C)``;
- ``head[e]``: slots used in entry e (the paper's Head); ``tail[e]``: slots
  expired (Tail; whole-subwindow expiry never moves it, LLAT keeps it for
  per-tuple expiry);
- ``nxt[e]``: next entry of e's chain or -1; ``last[e]``: for the first entry of
  a chain, its last entry (so an append does not walk the list);
- ``ptr[0]``: PtrG, the first unused entry; ``ptr[1]``: entries on the free stack
  ``free`` (``free[:ptr[1]]``), which allocation hands out before advancing
  PtrG. RaP-Table never frees an entry (its stack is empty); WiB+-Tree
  frees a leaf's chain when a split rewrites it (:func:`llat_release`).

This module holds the one allocator of LLAT entries, inside :func:`llat_push_run`:
every kernel that needs a new entry (an append that fills one, a leaf split that
starts a chain) gets it there.

Trace, P = 2, C = 2 (4 entries, PtrG = 2): push 5, 6, 7 into partition 0 ->
entry 0 = [5, 6] full, next[0] = 2, entry 2 = [7], PtrG = 3. Release the chain of
entry 0 -> free = [0, 2]; the next allocation takes entry 2, then 0, then PtrG's 3.
"""

from panjoin.config import NJIT
from panjoin.jit import njit


@njit(**NJIT)
def llat_release(nxt, ptr, free, first):
    """Push every entry of the chain of ``first`` on the free stack."""
    e = first
    while e >= 0:
        nx = nxt[e]
        free[ptr[1]] = e
        ptr[1] += 1
        e = nx


@njit(**NJIT)
def llat_push_run(keys, ts, seq, head, tail, nxt, last, ptr, free, cap, first, bk, bt, bs,
                  start, end):
    """Append batch rows [start, end) to the chain of ``first``, entry-sized copies at a
    time; ``first = -1`` starts a new chain (of one empty entry if the rows are none).
    Returns the chain's first entry, or -1 if the LLAT ran out of entries.

    The one allocator of LLAT entries: a fresh entry is the last one freed if any, else
    PtrG's, and comes back empty, a chain of its own. (Written here, in the copy loop:
    a call there, even an inlined one, costs RaP-Table's insert half its speed.)"""
    i = start
    e = -1 if first < 0 else last[first]
    while i < end or e < 0:
        if e < 0 or head[e] >= cap:
            top = ptr[1]
            if top > 0:
                g = free[top - 1]
                ptr[1] = top - 1
            else:
                g = ptr[0]
                if g >= head.shape[0]:
                    return -1
                ptr[0] = g + 1
            head[g] = 0
            tail[g] = 0
            nxt[g] = -1
            last[g] = g
            if e < 0:
                first = g
            else:
                nxt[e] = g
                last[first] = g
            e = g
        take = min(end - i, cap - head[e])
        p = e * cap + head[e]
        for j in range(take):
            keys[p + j] = bk[i + j]
            ts[p + j] = bt[i + j]
            seq[p + j] = bs[i + j]
        head[e] += take
        i += take
    return first


@njit(**NJIT)
def llat_chain_size(head, tail, nxt, first):
    """Live tuples in the chain of ``first``."""
    total = 0
    e = first
    while e >= 0:
        total += head[e] - tail[e]
        e = nxt[e]
    return total
