"""LLAT kernels: the Linked List Adaptive Table (PanJoin paper, section III-B2, Figure 5).

State, all flat arrays so that kernels stay arrays-in / arrays-out:

- ``keys, ts, seq``: 2P entries x C slots each, entry e at ``[e*C, (e+1)*C)``;
- ``head[e]``: slots used in entry e (the paper's Head); ``tail[e]``: slots
  expired (Tail; whole-subwindow expiry never moves it, LLAT keeps it for
  per-tuple expiry);
- ``nxt[e]``: next entry of e's chain or -1; ``last[e]``: for the first entry of
  a chain, its last entry (so an append does not walk the list);
- ``ptr[0]``: PtrG, the first unused entry.

Trace, P = 2, C = 2 (4 entries, PtrG = 2): push 5, 6, 7 into partition 0 ->
entry 0 = [5, 6] full, next[0] = 2, entry 2 = [7], PtrG = 3.
"""

from numba import njit

from panjoin.config import NJIT


@njit(**NJIT)
def llat_push(keys, ts, seq, head, nxt, last, ptr, cap, first, k, t, s):
    """Append one tuple to the chain starting at entry ``first``; False if LLAT is exhausted."""
    e = last[first]
    if head[e] >= cap:
        g = ptr[0]
        if g >= head.shape[0]:
            return False
        nxt[e] = g
        last[first] = g
        ptr[0] = g + 1
        e = g
    p = e * cap + head[e]
    keys[p] = k
    ts[p] = t
    seq[p] = s
    head[e] += 1
    return True


@njit(**NJIT)
def llat_push_run(keys, ts, seq, head, nxt, last, ptr, cap, first, bk, bt, bs, start, end):
    """Append batch rows [start, end) to the chain of ``first``, entry-sized copies at a time."""
    i = start
    while i < end:
        e = last[first]
        if head[e] >= cap:
            g = ptr[0]
            if g >= head.shape[0]:
                return False
            nxt[e] = g
            last[first] = g
            ptr[0] = g + 1
            e = g
        room = cap - head[e]
        take = end - i
        if take > room:
            take = room
        p = e * cap + head[e]
        for j in range(take):
            keys[p + j] = bk[i + j]
            ts[p + j] = bt[i + j]
            seq[p + j] = bs[i + j]
        head[e] += take
        i += take
    return True


@njit(**NJIT)
def llat_chain_size(head, tail, nxt, first):
    """Live tuples in the chain of ``first``."""
    total = 0
    e = first
    while e >= 0:
        total += head[e] - tail[e]
        e = nxt[e]
    return total
