"""BI-Sort kernels (PanJoin paper, sections III-D, III-E, III-F and III-G3).

Arrays in, arrays out; the orchestration lives in :mod:`panjoin.subwindow.bi_sort`.

Insertion: ``merge_back`` merges a sorted run into the sorted main array IN PLACE,
from the back of the preallocated columns, so no second main-sized array is ever
needed. Elements only move right (a main tuple lands at its index plus the number
of run tuples before it), so walking from the back never overwrites a main tuple
that is still to be read::

    main [1 4 7 9 _ _]   run [5 8]           w = write slot, from the back
          1 4 7 9 _ 9    9 > 8 -> take 9     w = 5
          1 4 7 9 8 9    8 > 7 -> take 8     w = 4
          1 4 7 7 8 9    7 > 5 -> take 7     w = 3
          1 4 5 7 8 9    run exhausted, [1 4] already in place: stop

On equal keys the main tuples stay left of the run (a stable merge), so the layout
is a deterministic function of the insert sequence, whatever the thread count: a
mirror that replays the same inserts holds the same main array.

With threads (III-G3), ``merge_plan`` cuts the moving part of the output into
pieces of equal size at merge-path co-ranks, and ``merge_piece`` runs one piece per
thread (the kernels release the GIL). A piece's front main tuples may be
overwritten by the pieces left of it before it reads them; those few tuples (at
most its run share) are stashed first, everything else is read in place.

Probing (III-E/F): every band of a probe tuple is a closed interval ``[lo, hi]``;
its matches in the main array are the contiguous range ``[start, end)`` with
``start`` = first key >= lo and ``end`` = first key > hi. Each bound is found by
the rebounding binary search on the index array (the sampled keys, one per
partition of ``step`` tuples) from the previous bound's partition, which names the
one partition holding the answer; bounds are sorted, so the index cursors only
move right (the merge-like scan), and an equal consecutive bound reuses the
previous answer. Over a fine index (step <= 16, the engine's default is 8) the
cursor runs 16 tuples ahead of the one being resolved and prefetches the partition it
names, one cache line per column (:func:`locate_sparse`). A small batch over a large
subwindow (more than TOP_GAP index entries per probe tuple) would gallop over a cold
index array, a chain of dependent misses per bound: it starts instead on an upper
level of the index (:func:`build_levels`, every FAN-th entry of the level below, up to
a level small enough that the cursor moves about a block per tuple) and goes down a
level a pass, one line per level, LGROUP tuples in lockstep with the next line
prefetched (:func:`locate_levels`)::

    index    [ 1  3  5  8  . . . . | 9 12 14 20 . . . . | 21 ...]   FAN = 8 a line
    level 1  [ 1  9 21 ...]                                 entry j = index entry 8 j
    lo = 13: first level-1 entry >= 13 is 21 (j = 2), so the answer is in index line
             j - 1 = 1: 8 + (entries of that line below 13: 9 12) = 10, the entry 14;
             the partition of rows (9 step, 10 step] follows.

Cold (caches flushed between calls; 4 subwindows of M rows; ns a probe tuple), M = 1M:
n = 256: 930 -> 310, n = 1024: 370 -> 170; M = 256K, n = 256: 520 -> 300. Over a
coarse index the
searches inside the partitions of a group of 32 probe tuples
then run in lockstep, branch-free, so that their cache misses on the main array
overlap instead of queueing one behind the other; the end of a narrow band is
found from its start (a step or two at S ~ 1). A dense batch (at least one probe
tuple per DENSE_GAP = 4 main rows) skips the index: each bound gallops over the main
array from the previous one (:func:`locate_dense`), which is also how the sorted
insertion buffer is searched. Example, step 4, main
``[1 3 3 5 | 8 9 9 9 | 12 14 15 20]``, index ``[1 8 12]``, probes ``[2, 4] [9, 9]``:
``[2, 4]``: first index entry >= 2 is 8 (q = 1) -> start in rows (0, 4]: 1;
first entry > 4 is also 8 -> end from row 1 on: 3 (keys 3 3).
``[9, 9]``: from q = 1, first entry >= 9 is 12 (q = 2) -> start in (4, 8]: 5;
end from row 5: 8 (keys 9 9 9). The insertion buffer is kept sorted (each batch is
merged into it with ``merge_back``), so its matches are ranges too: the paper's nested
loop over the buffer cost a probe tuple B key tests, ten times the whole probe of a
64K subwindow once a few hundred tuples were buffered.
"""

import numpy as np

from panjoin.config import NJIT, NJIT_PAR
from panjoin.jit import njit, prange
from panjoin.subwindow.kernels.primitives import prefetch_read
from panjoin.subwindow.kernels.search import (
    chunk_bounds,
    gallop_left_range,
    gallop_right_range,
)
from panjoin.subwindow.kernels.window import NONE, in_window  # closed bounds: see window.py

# --------------------------------------------------------------------------- insertion


@njit(**NJIT)
def first_moved(mk, m, first_run_key):
    """Main tuples that stay in place: those with key <= the run's smallest key."""
    lo = 0
    hi = m
    while lo < hi:
        mid = (lo + hi) >> 1
        if mk[mid] <= first_run_key:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(**NJIT)
def merge_back(mk, mt, ms, m, rk, rt, rs, r):
    """Merge run rows [0, r) into main rows [0, m) -> main rows [0, m + r), in place."""
    i = m
    j = r
    w = m + r
    # once the run is exhausted the remaining main prefix is already in place
    while j > 0:
        w -= 1
        if i > 0 and mk[i - 1] > rk[j - 1]:
            i -= 1
            mk[w] = mk[i]
            mt[w] = mt[i]
            ms[w] = ms[i]
        else:
            j -= 1
            mk[w] = rk[j]
            mt[w] = rt[j]
            ms[w] = rs[j]


@njit(**NJIT)
def corank(mk, m, rk, r, o):
    """Main tuples among the first o outputs of the stable merge (main first on ties)."""
    lo = o - r if o > r else 0
    hi = o if o < m else m
    while lo < hi:
        mid = (lo + hi) >> 1
        # main[mid] precedes run[o - mid - 1]: it is among the first o outputs too
        if mk[mid] <= rk[o - mid - 1]:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(**NJIT)
def _merge_views(wk, wt, ws, ak, at, as_, rk, rt, rs, copy_rest):
    """``merge_back`` on views: A and R into W (len A + len R) from the back. W may be
    A's memory shifted right; ``copy_rest`` False when W's front IS A's front, so the
    rows of A left when R runs out are already in place. Views index from 0, which
    spares the kernel the negative-index checks that offsets would need."""
    i = ak.shape[0]
    j = rk.shape[0]
    w = i + j
    while j > 0:
        w -= 1
        if i > 0 and ak[i - 1] > rk[j - 1]:
            i -= 1
            wk[w] = ak[i]
            wt[w] = at[i]
            ws[w] = as_[i]
        else:
            j -= 1
            wk[w] = rk[j]
            wt[w] = rt[j]
            ws[w] = rs[j]
    if copy_rest:
        for x in range(i - 1, -1, -1):  # backwards: W[x] lies at or right of A[x]
            wk[x] = ak[x]
            wt[x] = at[x]
            ws[x] = as_[x]


@njit(**NJIT)
def merge_piece(mk, mt, ms, rk, rt, rs, i0, i1, j0, j1, s_end, sk, st, ss):
    """Output piece [i0 + j0, i1 + j1) of the parallel merge, from main rows [i0, i1)
    (rows below s_end in the stash ``sk, st, ss``) and run rows [j0, j1).

    Split at main row s_end: run rows before it (key < its key) go with the stashed
    rows. The upper part merges in place first, then the lower part writes below it.
    """
    jm = j1
    if s_end < i1:
        jm = j0
        pivot = mk[s_end]
        while jm < j1 and rk[jm] < pivot:
            jm += 1
    _merge_views(mk[s_end + jm:i1 + j1], mt[s_end + jm:i1 + j1], ms[s_end + jm:i1 + j1],
                 mk[s_end:i1], mt[s_end:i1], ms[s_end:i1], rk[jm:j1], rt[jm:j1], rs[jm:j1],
                 jm > 0)
    _merge_views(mk[i0 + j0:s_end + jm], mt[i0 + j0:s_end + jm], ms[i0 + j0:s_end + jm],
                 sk, st, ss, rk[j0:jm], rt[j0:jm], rs[j0:jm], True)


@njit(**NJIT)
def merge_plan(mk, m, rk, r, parts):
    """Cut a merge into ``parts`` pieces of equal output size (III-G3).

    Returns ``oi, oj, soff``: piece t writes outputs [o_t, o_t+1), o_t = oi[t] + oj[t],
    from main rows [oi[t], oi[t+1]) and run rows [oj[t], oj[t+1]). Main rows below
    ``first_moved`` stay where they are, so only the moving part is cut. Pieces left
    of t write below o_t, which covers main rows [oi[t], min(o_t, oi[t+1])) of piece
    t: those rows go to the stash at ``soff[t]`` before any piece starts. Pieces
    right of t write from o_t+1 >= oi[t+1] on, past everything t reads, so once the
    stash is taken, the pieces can run at the same time.
    """
    base = first_moved(mk, m, rk[0])
    n = m + r
    oi = np.empty(parts + 1, dtype=np.int64)
    oj = np.empty(parts + 1, dtype=np.int64)
    for t in range(parts + 1):
        o = base + ((n - base) * t) // parts
        i = corank(mk, m, rk, r, o)
        oi[t] = i
        oj[t] = o - i
    soff = np.zeros(parts + 1, dtype=np.int64)
    for t in range(parts):
        s_end = min(oi[t] + oj[t], oi[t + 1])
        soff[t + 1] = soff[t] + max(0, s_end - oi[t])
    return oi, oj, soff


@njit(**NJIT)
def build_index(mk, m, step, idx, q0):
    """Index array: the key of every ``step``-th main tuple, from entry ``q0`` on (those
    below are unchanged); returns the entry count."""
    nidx = (m + step - 1) // step
    for q in range(q0, nidx):
        idx[q] = mk[q * step]
    return nidx


#: entries of a level per entry of the level above: one cache line of 8-byte keys
FAN = 8


@njit(**NJIT)
def build_levels(idx, nidx, up, lvoff, pad, q0):
    """The index's upper levels: level k (k >= 1) holds every FAN-th entry of level k - 1
    (level 0 is the index array), in ``up[lvoff[k]:]``, up to the first level of at most
    FAN entries. Every level, the index array too, is padded with ``pad`` (the key
    type's largest value) to a multiple of FAN entries, so that a search reads a whole
    line of FAN entries without a bound check. Entries below ``q0`` of the index array
    are unchanged since the last build (a merge moves only the rows after its first
    moved one), and so are the upper entries above them. Returns the level count
    above the index array."""
    for q in range(nidx, ((nidx + FAN - 1) // FAN) * FAN):
        idx[q] = pad
    n = nidx
    k = 0
    src = idx
    lo = q0
    while n > FAN and k + 1 < lvoff.shape[0]:
        k += 1
        nk = (n + FAN - 1) // FAN
        dst = up[lvoff[k]:lvoff[k] + ((nk + FAN - 1) // FAN) * FAN]
        lo = lo // FAN
        for j in range(lo, nk):
            dst[j] = src[j * FAN]
        for j in range(nk, dst.shape[0]):
            dst[j] = pad
        src = dst
        n = nk
    return k


# --------------------------------------------------------------------------- probing


#: probe bounds searched in lockstep: their cache misses overlap (memory-level parallelism)
GROUP = 32


@njit(**NJIT)
def _lockstep_search(mk, m, key, base, ntask, step, strict):
    """Branch-free binary searches over ``step`` rows from each ``base[k]``, all tasks
    one halving step per round: the group's loads are independent within a round,
    so their cache misses overlap. Rows >= m count as past every target.

    ``strict`` False: first row with key >= key[k]; True: first row with key > key[k].
    """
    n = step
    while n > 1:
        half = n >> 1
        if strict:
            for k in range(ntask):
                p = base[k] + half - 1
                v = mk[min(p, m - 1)]
                base[k] += half * ((p < m) & (v <= key[k]))
        else:
            for k in range(ntask):
                p = base[k] + half - 1
                v = mk[min(p, m - 1)]
                base[k] += half * ((p < m) & (v < key[k]))
        n -= half


@njit(**NJIT)
def locate_chunk(mk, m, idx, nidx, step, lo, hi, i0, i1, st, en):
    """Main-array ranges ``[st[b, i], en[b, i])`` of probe tuples [i0, i1), every band.

    Per band, a group of up to GROUP probe tuples at a time:

    1. each bound gallops over the index array from the previous bound's
       partition (rebounding binary search; the end bound from the start's
       partition, as end >= start). Index entry q is the first past the bound,
       so the answer lies in the one partition of rows ((q-1) step, q step].
       A start equal to the previous one reuses its search task;
    2. the start searches inside their partitions run in lockstep (branch-free,
       so that the group's cache misses on the main array are in flight
       together), and so do the end searches whose partition differs from the
       start's (wide bands);
    3. an end in the start's partition is found from the start onwards (its
       cache line is hot; S ~ 1 means a step or two), or reused from the
       previous tuple when its bounds are equal.

    While a group is pending, ``st`` holds -(task + 1) and ``en`` either
    -(task + 1) or the last row of the start's partition.
    """
    if i1 <= i0:
        return
    nb = lo.shape[0]
    s_key = np.empty(GROUP, dtype=lo.dtype)
    s_base = np.empty(GROUP, dtype=np.int64)
    e_key = np.empty(GROUP, dtype=lo.dtype)
    e_base = np.empty(GROUP, dtype=np.int64)
    for b in range(nb):
        q_s = 0  # index-array cursors: only move right over the sorted bounds
        q_e = 0
        i = i0
        while i < i1:
            g0 = i
            ns = 0
            ne = 0
            prev_l = lo[b, i]  # read only once a first task exists
            while i < i1 and ns < GROUP and ne < GROUP:
                l = lo[b, i]
                h = hi[b, i]
                if l > h or m == 0:
                    # empty band (or empty main array): no cursor moves
                    st[b, i] = 0
                    en[b, i] = 0
                    i += 1
                    continue
                if ns == 0 or l != prev_l:
                    q_s = gallop_left_range(idx, l, q_s, nidx)  # first entry >= l
                    s_key[ns] = l
                    s_base[ns] = (q_s - 1) * step + 1 if q_s > 0 else 0
                    ns += 1
                    prev_l = l
                st[b, i] = -ns
                if q_e < q_s:
                    q_e = q_s
                q_e = gallop_right_range(idx, h, q_e, nidx)  # first entry > h
                if q_e == q_s:
                    en[b, i] = min(q_s * step, m)
                else:
                    e_key[ne] = h
                    e_base[ne] = (q_e - 1) * step + 1
                    ne += 1
                    en[b, i] = -ne
                i += 1
            _lockstep_search(mk, m, s_key, s_base, ns, step, False)
            _lockstep_search(mk, m, e_key, e_base, ne, step, True)
            have = False
            ps = 0
            pe = 0
            prev_h = hi[b, g0]
            for j in range(g0, i):
                if st[b, j] >= 0:
                    continue  # empty band
                s = s_base[-st[b, j] - 1]
                h = hi[b, j]
                if have and s == ps and h == prev_h:
                    e = pe  # equal bounds: the previous answer
                elif en[b, j] < 0:
                    e = e_base[-en[b, j] - 1]
                else:
                    e = gallop_right_range(mk, h, s, en[b, j])
                st[b, j] = s
                en[b, j] = e
                have = True
                ps = s
                pe = e
                prev_h = h


#: main rows per probe tuple up to which a batch counts as dense: its bounds are found by
#: the merge-like scan of :func:`locate_dense`, not by the index's one partition per
#: bound. The scan's misses come one after another (the branch it mispredicts about
#: once a probe tuple stops the loads behind it), where locate_sparse keeps 16 in
#: flight: measured with 4 subwindows of M rows probed in turn (ns a probe tuple, dense
#: vs locate_sparse), M = 64K: 13 vs 18 at a gap of 2 rows, 17 vs 20 at 4, 28 vs 21 at
#: 16; M = 256K: 39 vs 30 at 8, 173 vs 41 at 64; M = 1M: 96 vs 44 at 32 (was 64)
DENSE_GAP = 4
#: keys compared at once by the dense scan (a SIMD compare and a count); after
#: BLOCK_TRIES full blocks the rest of the jump is galloped
BLOCK = 8
BLOCK_TRIES = 4
#: largest index step the dense scan walks the index array with (see locate_dense)
DENSE_STEP = 16


@njit(**NJIT)
def locate_dense(mk, m, idx, nidx, step, lo, hi, i0, i1, st, en):
    """``locate_chunk`` for a dense batch (at most DENSE_GAP main rows per probe tuple):
    the merge-like scan. Each start is searched from the previous tuple's (bounds are
    sorted per band), each end from its start, BLOCK keys at a time: the keys below the
    bound are a sorted block's prefix, so counting them (a SIMD compare, no branch per
    row) moves the cursor to the answer, or on to the next block; after BLOCK_TRIES
    full blocks the rest of a long jump is galloped.

    When the index is fine (step <= DENSE_STEP) and the batch no denser than it (a
    probe tuple per ``step`` rows or fewer), the start is scanned for on the index
    array instead (first entry q >= lo), then found by counting the keys below lo in
    its one partition, rows ((q-1) step, q step): a jump of a few entries is one block,
    so the scan's branch is predicted, where a jump of a few blocks on the main array
    mispredicts about once a block. Pass ``nidx = 0`` for an array without an index
    (the insertion buffer). The end is scanned for from the start on the main array.
    (The searches are written out: as a function, even an inlined one, the kernel ran
    twice as slow.)

    Measured at NBat 32K, one band, ns a probe tuple: 8 at NSub 64K (galloping: 15),
    15 at 256K (23); with step 8 at NSub 1M and NBat 64K, 14 (main-array scan: 24)."""
    on_index = nidx > 0 and 1 < step <= DENSE_STEP and (i1 - i0) * step <= m
    arr = idx if on_index else mk  # the array the start is scanned for in
    na = nidx if on_index else m
    for b in range(lo.shape[0]):
        x = 0  # its cursor
        for i in range(i0, i1):
            l = lo[b, i]
            h = hi[b, i]
            if l > h or m == 0:
                st[b, i] = 0
                en[b, i] = 0
                continue
            k = 0
            while True:  # x: first entry >= l
                if x + BLOCK > na:
                    while x < na and arr[x] < l:
                        x += 1
                    break
                c = 0
                for j in range(BLOCK):
                    c += arr[x + j] < l
                x += c
                if c < BLOCK:
                    break
                k += 1
                if k == BLOCK_TRIES:
                    x = gallop_left_range(arr, l, x, na)
                    break
            p = x
            if on_index:
                p = 0
                if x > 0:  # the start is in rows ((x-1) step, x step] (the last: m)
                    a = (x - 1) * step + 1
                    c = 0
                    for j in range(a, min(x * step, m)):
                        c += mk[j] < l
                    p = a + c
            st[b, i] = p
            e = p
            k = 0
            while True:  # end: first row > h
                if e + BLOCK > m:
                    while e < m and mk[e] <= h:
                        e += 1
                    break
                c = 0
                for j in range(BLOCK):
                    c += mk[e + j] <= h
                e += c
                if c < BLOCK:
                    break
                k += 1
                if k == BLOCK_TRIES:
                    e = gallop_right_range(mk, h, e, m)
                    break
            en[b, i] = e


#: probe tuples whose partitions are prefetched before the first of them is resolved
#: (:func:`locate_sparse`; 8 to 64 measured alike)
AHEAD = 16


@njit(**NJIT)
def locate_sparse(mk, ms, m, idx, nidx, step, lo, hi, i0, i1, st, en, cur):
    """``locate_chunk`` for a sparse batch over a fine index (step <= DENSE_STEP): the
    index cursor runs AHEAD probe tuples in front, and the partition it names is
    prefetched (its key line and its seq line), so that by the time a tuple is
    resolved its lines are in cache: the misses of AHEAD tuples are in flight
    together, where a search per tuple waits for each.

    Per bound: the cursor moves over the index by blocks of BLOCK entries (a count of
    the entries below lo, as in :func:`locate_dense`; a gallop after 8 full blocks),
    to q, the first entry >= lo; the start is then a + (keys below lo in the
    partition's rows [a, q step)), a = (q-1) step + 1; the end is counted in the same
    rows when the next index entry is past hi (a narrow band), else galloped for.
    ``cur[b]``: band b's index cursor, from and back (0, or where the previous call
    on the tuples before i0 left it: bounds are sorted, so the cursor never goes back).
    At NSub 8M, step 8, NBat 32K, S = 1, with :func:`probe_pairs`: 24M probe tuples a
    second, against 10.4M by :func:`locate_chunk`'s lockstep searches. (The block scan
    is locate_dense's, written out again: as a shared function the kernel took 31 ns a
    probe tuple, not 24.)"""
    for b in range(lo.shape[0]):
        q = cur[b]  # index cursor, AHEAD tuples in front
        for i in range(i0, i1 + AHEAD):
            if i < i1:
                l = lo[b, i]
                if l <= hi[b, i] and m > 0:
                    k = 0
                    while True:  # q: first entry >= l
                        if q + BLOCK > nidx:
                            while q < nidx and idx[q] < l:
                                q += 1
                            break
                        c = 0
                        for t in range(BLOCK):
                            c += idx[q + t] < l
                        q += c
                        if c < BLOCK:
                            break
                        k += 1
                        if k == 8:
                            q = gallop_left_range(idx, l, q, nidx)
                            break
                    st[b, i] = q  # the partition, until resolved below
                    a = (q - 1) * step + 1 if q > 0 else 0
                    prefetch_read(mk, min(a, m - 1))
                    prefetch_read(ms, min(a, m - 1))
            j = i - AHEAD
            if j < i0:
                continue
            l = lo[b, j]
            h = hi[b, j]
            if l > h or m == 0:
                st[b, j] = 0
                en[b, j] = 0
                continue
            qj = st[b, j]
            # one count for both ends (rows below lo are below hi too); the end is
            # galloped for only when the band runs past these rows
            if qj > 0 and qj * step <= m:
                # rows [(q-1) step, q step): row (q-1) step is index entry q-1, below
                # lo, so it adds one to both counts; a fixed length the compiler unrolls
                a = (qj - 1) * step
                z = a + step
                c = 0
                d = 0
                for r in range(step):
                    c += mk[a + r] < l
                    d += mk[a + r] <= h
            else:
                a = (qj - 1) * step + 1 if qj > 0 else 0
                z = min(qj * step, m)
                c = 0
                d = 0
                for r in range(a, z):
                    c += mk[r] < l
                    d += mk[r] <= h
            st[b, j] = a + c
            if qj >= nidx or idx[qj] > h:
                en[b, j] = a + d
            else:
                en[b, j] = gallop_right_range(mk, h, z, m)
        cur[b] = q


#: probe tuples whose searches go down the index levels in lockstep
#: (:func:`locate_levels`): a level's line loads of the group are independent
LGROUP = 16
#: the top level a sparse search starts on is the lowest with at most TOP_GAP entries
#: per probe tuple, so that its cursor moves by about one block of BLOCK a tuple
TOP_GAP = 8


@njit(**NJIT)
def top_level(nidx, nlev, n):
    """The level a batch of ``n`` probe tuples starts its searches on (see TOP_GAP)."""
    top = 0
    ln = nidx
    while top < nlev and ln > TOP_GAP * n:
        top += 1
        ln = (ln + FAN - 1) // FAN
    return top


@njit(**NJIT)
def locate_levels(mk, ms, mt, m, idx, nidx, step, up, lvoff, top, lo, hi, i0, i1, st, en,
                  cur, with_ts):
    """``locate_chunk`` for a sparse batch over a fine index (step <= DENSE_STEP), by the
    index's levels (:func:`build_levels`).

    Per band, LGROUP probe tuples at a time: each start's search scans the ``top``
    level from the previous tuple's entry (by blocks of BLOCK entries, a gallop after 8
    blocks; the top level is chosen so that this is about one block, and it is small
    enough to stay in cache), then goes down one level a pass, the whole group in
    lockstep: knowing that entry j of level k is the first >= lo, entry (j-1) FAN of
    level k - 1 is below lo and entry j FAN is not, so the answer is the count of that
    line's FAN entries below lo (a fixed length, no branch), and the line of the next
    level (and, after level 0, the partition's key and seq lines, and ts when
    ``with_ts``) is prefetched as soon as it is known. The loads of a pass are
    independent, so the group's cache misses are in flight together, where a gallop
    over a cold index array is a chain of misses each waiting for the one before.
    At level 0, q is the first index entry >= lo and the partition rows
    ((q-1) step, q step] are counted as in :func:`locate_sparse`.

    ``cur[b]``: band b's cursor on the top level, from and back."""
    nb = lo.shape[0]
    ntop = nidx
    for _ in range(top):
        ntop = (ntop + FAN - 1) // FAN
    tarr = idx if top == 0 else up[lvoff[top]:lvoff[top] + ntop]
    jb = np.empty(LGROUP, dtype=np.int64)
    for b in range(nb):
        t = cur[b]
        for g0 in range(i0, i1, LGROUP):
            g1 = min(i1, g0 + LGROUP)
            for i in range(g0, g1):
                l = lo[b, i]
                if l <= hi[b, i] and m > 0:  # an empty band moves no cursor
                    k = 0
                    while True:  # t: first top entry >= l
                        if t + BLOCK > ntop:
                            while t < ntop and tarr[t] < l:
                                t += 1
                            break
                        c = 0
                        for x in range(BLOCK):
                            c += tarr[t + x] < l
                        t += c
                        if c < BLOCK:
                            break
                        k += 1
                        if k == 8:
                            t = gallop_left_range(tarr, l, t, ntop)
                            break
                j = t
                jb[i - g0] = j
                if top == 1:
                    prefetch_read(idx, max(j - 1, 0) * FAN)
                elif top > 1:
                    prefetch_read(up, lvoff[top - 1] + max(j - 1, 0) * FAN)
            for lv in range(top - 1, -1, -1):
                arr = idx if lv == 0 else up[lvoff[lv]:]
                for i in range(g0, g1):
                    l = lo[b, i]
                    j = jb[i - g0]
                    a = max(j - 1, 0) * FAN
                    c = 0
                    for x in range(FAN):
                        c += arr[a + x] < l
                    j = a + c if j > 0 else 0
                    jb[i - g0] = j
                    if lv > 1:
                        prefetch_read(up, lvoff[lv - 1] + max(j - 1, 0) * FAN)
                    elif lv == 1:
                        prefetch_read(idx, max(j - 1, 0) * FAN)
                    else:
                        r = min(max(j - 1, 0) * step, m - 1)
                        prefetch_read(mk, r)
                        prefetch_read(ms, r)
                        if with_ts:
                            prefetch_read(mt, r)
            for i in range(g0, g1):
                l = lo[b, i]
                h = hi[b, i]
                if l > h or m == 0:
                    st[b, i] = 0
                    en[b, i] = 0
                    continue
                qj = jb[i - g0]
                if qj > 0 and qj * step <= m:
                    a = (qj - 1) * step
                    z = a + step
                    c = 0
                    d = 0
                    for r in range(step):
                        c += mk[a + r] < l
                        d += mk[a + r] <= h
                else:
                    a = (qj - 1) * step + 1 if qj > 0 else 0
                    z = min(qj * step, m)
                    c = 0
                    d = 0
                    for r in range(a, z):
                        c += mk[r] < l
                        d += mk[r] <= h
                st[b, i] = a + c
                if qj >= nidx or idx[qj] > h:
                    en[b, i] = a + d
                else:
                    en[b, i] = gallop_right_range(mk, h, z, m)
        cur[b] = t


@njit(**NJIT)
def locate_fine(mk, ms, mt, m, idx, nidx, step, up, lvoff, nlev, lo, hi, i0, i1, st, en,
                cur, n, with_ts):
    """A sparse chunk over a fine index, from the top level a batch of ``n`` starts on:
    :func:`locate_sparse` on the index array itself, else :func:`locate_levels`."""
    top = top_level(nidx, nlev, n)
    if top == 0:
        locate_sparse(mk, ms, m, idx, nidx, step, lo, hi, i0, i1, st, en, cur)
    else:
        locate_levels(mk, ms, mt, m, idx, nidx, step, up, lvoff, top, lo, hi, i0, i1, st, en,
                      cur, with_ts)


@njit(**NJIT)
def locate(mk, ms, mt, m, idx, nidx, step, up, lvoff, nlev, lo, hi, i0, i1, st, en,
           with_ts):
    """Main-array ranges ``[st[b, i], en[b, i])`` of probe tuples [i0, i1): by
    :func:`locate_dense` when the chunk is dense, by :func:`locate_sparse` or
    :func:`locate_levels` over a fine index, else by :func:`locate_chunk`."""
    if (i1 - i0) * DENSE_GAP >= m:
        locate_dense(mk, m, idx, nidx, step, lo, hi, i0, i1, st, en)
    elif step <= DENSE_STEP:
        locate_fine(mk, ms, mt, m, idx, nidx, step, up, lvoff, nlev, lo, hi, i0, i1, st, en,
                    np.zeros(lo.shape[0], dtype=np.int64), i1 - i0, with_ts)
    else:
        locate_chunk(mk, m, idx, nidx, step, lo, hi, i0, i1, st, en)


#: probe tuples located at a time by :func:`probe_pairs` before their pairs are written,
#: so that the seq lines :func:`locate_sparse` prefetched are still in cache
PAIRS_CHUNK = 1024


@njit(**NJIT)
def probe_pairs(mk, mt, ms, m, idx, nidx, step, up, lvoff, nlev, bk, bt, bs, nbuf, lo, hi,
                mode, c0, c1, c2):
    """One thread's probe of a sorted batch: matching ``(probe_idx, seq)`` pairs, in the
    order of :func:`probe_kernel` (per probe tuple its main ranges band by band, then
    its ranges of the sorted insertion buffer).

    Fewer passes than the parallel kernel: the candidates are written in one pass that
    applies the window filter (each candidate is written, and kept by moving the end
    past it; the unused tail is cut off), instead of a counting pass per probe tuple
    and prefix sums. A sparse batch is located PAIRS_CHUNK probe tuples at a time, each
    chunk's pairs written right after (its prefetched seq lines still in cache), into
    an output that grows by doubling.
    """
    nb, n = lo.shape
    st = np.empty((nb, n), dtype=np.int64)
    en = np.empty((nb, n), dtype=np.int64)
    nbn = n if nbuf > 0 else 0
    bst = np.empty((nb, nbn), dtype=np.int64)
    ben = np.empty((nb, nbn), dtype=np.int64)
    locate_dense(bk, nbuf, idx, 0, 1, lo, hi, 0, nbn, bst, ben)
    # the batch's density picks the search, as :func:`locate` would for all of it: a
    # dense batch is located at once (its scan is sequential) and its output sized
    # exactly; a sparse one a chunk at a time, its index cursors carried over from
    # chunk to chunk, its output grown as the chunks need
    dense = n * DENSE_GAP >= m
    with_ts = mode != NONE or nbuf > 0
    if dense:
        locate(mk, ms, mt, m, idx, nidx, step, up, lvoff, nlev, lo, hi, 0, n, st, en, with_ts)
    need = 1  # slots: a spare one (every range's first row is written, in it or not),
    for b in range(nb):  # the buffer's pairs, and the main array's located so far
        for i in range(nbn):
            need += ben[b, i] - bst[b, i]
        for i in range(n if dense else 0):
            need += en[b, i] - st[b, i]
    cap = need if dense else need + n  # sparse: about a pair per probe tuple to start
    out_probe = np.empty(cap, dtype=np.int64)
    out_seq = np.empty(cap, dtype=np.int64)
    pos = 0
    last = max(m - 1, 0)
    cur = np.zeros(nb, dtype=np.int64)
    for i0 in range(0, n, PAIRS_CHUNK):
        i1 = min(n, i0 + PAIRS_CHUNK)
        if not dense:
            if step <= DENSE_STEP:
                locate_fine(mk, ms, mt, m, idx, nidx, step, up, lvoff, nlev, lo, hi, i0, i1,
                            st, en, cur, n, with_ts)
            else:
                locate_chunk(mk, m, idx, nidx, step, lo, hi, i0, i1, st, en)
            for b in range(nb):
                for i in range(i0, i1):
                    need += en[b, i] - st[b, i]
            if need > cap:
                cap = max(2 * cap, need)
                grown = np.empty(cap, dtype=np.int64)
                grown[:pos] = out_probe[:pos]
                out_probe = grown
                grown = np.empty(cap, dtype=np.int64)
                grown[:pos] = out_seq[:pos]
                out_seq = grown
        # At S ~ 1 a range holds 0, 1 or 2 rows at random, so a loop over it
        # mispredicts about once a probe tuple: its first row is written and kept by
        # arithmetic, and only the rest is looped over (the loops are written out: a
        # helper function for them, even inlined, made the kernel twice as slow)
        for i in range(i0, i1):
            if mode == NONE and nbuf == 0:  # ts is not read: at NSub 8M a miss of its own
                for b in range(nb):
                    s = st[b, i]
                    e = en[b, i]
                    out_seq[pos] = ms[min(s, last)]
                    out_probe[pos] = i
                    pos += s < e
                    for p in range(s + 1, e):
                        out_seq[pos] = ms[p]
                        out_probe[pos] = i
                        pos += 1
                continue
            a0 = c0[i]
            a1 = c1[i]
            a2 = c2[i]
            for b in range(nb):
                s = st[b, i]
                e = en[b, i]
                r = min(s, last)
                q = ms[r]
                out_seq[pos] = q
                out_probe[pos] = i
                pos += (s < e) & in_window(mode, a0, a1, a2, q, mt[r])
                for p in range(s + 1, e):
                    q = ms[p]
                    out_seq[pos] = q
                    out_probe[pos] = i
                    pos += in_window(mode, a0, a1, a2, q, mt[p])
            for b in range(nb if nbuf > 0 else 0):  # the buffer's ranges
                for p in range(bst[b, i], ben[b, i]):
                    q = bs[p]
                    out_seq[pos] = q
                    out_probe[pos] = i
                    pos += in_window(mode, a0, a1, a2, q, bt[p])
    return out_probe[:pos], out_seq[:pos]


@njit(**NJIT_PAR)
def probe_kernel(mk, mt, ms, m, idx, nidx, step, up, lvoff, nlev, bk, bt, bs, nbuf, lo, hi,
                 mode, c0, c1, c2, parts, ranges):
    """Probe a sorted batch; chunks of it in parallel, each pass split the same way.

    Pass 1 locates every band's ranges in the main array and in the sorted insertion
    buffer and counts per probe tuple; a prefix sum gives each tuple its output slots;
    pass 2 fills them (no two chunks share a slot). Returns five int64 arrays:

    - ``ranges`` False: ``(probe_idx, seq)`` of every matching pair (window filter
      applied), then three empty arrays;
    - ``ranges`` True: records ``(probe_idx, start, end)`` of the non-empty main-array
      ranges, ordered by probe tuple then band (no window filter), then the
      buffer's matching ``(probe_idx, seq)`` pairs (filter applied).
    """
    nb, n = lo.shape
    st = np.empty((nb, n), dtype=np.int64)
    en = np.empty((nb, n), dtype=np.int64)
    nbn = n if nbuf > 0 else 0
    bst = np.empty((nb, nbn), dtype=np.int64)
    ben = np.empty((nb, nbn), dtype=np.int64)
    counts = np.zeros(n + 1, dtype=np.int64)  # main pairs, or main records
    bcount = np.zeros(n + 1, dtype=np.int64)  # buffer pairs
    cb = chunk_bounds(n, parts)
    for t in prange(parts):
        i0 = cb[t]
        i1 = cb[t + 1]
        locate(mk, ms, mt, m, idx, nidx, step, up, lvoff, nlev, lo, hi, i0, i1, st, en,
               mode != NONE and not ranges)
        if nbuf > 0:
            locate_dense(bk, nbuf, idx, 0, 1, lo, hi, i0, i1, bst, ben)
        for i in range(i0, i1):
            for src in range(2 if nbuf > 0 else 1):  # main array, then the buffer
                cs = ms if src == 0 else bs
                ct = mt if src == 0 else bt
                c = 0
                for b in range(nb):
                    s = st[b, i] if src == 0 else bst[b, i]
                    e = en[b, i] if src == 0 else ben[b, i]
                    if ranges and src == 0:
                        c += e > s
                    elif mode == NONE:
                        c += e - s
                    else:
                        for p in range(s, e):
                            c += in_window(mode, c0[i], c1[i], c2[i], cs[p], ct[p])
                if src == 0:
                    counts[i + 1] = c
                else:
                    bcount[i + 1] = c
    if not ranges:
        for i in range(n):
            counts[i + 1] += bcount[i + 1]
    offs = np.cumsum(counts)
    boffs = np.cumsum(bcount)
    out_probe = np.empty(offs[n], dtype=np.int64)
    out_a = np.empty(offs[n], dtype=np.int64)  # seq, or range start
    out_b = np.empty(offs[n] if ranges else 0, dtype=np.int64)  # range end
    buf_probe = np.empty(boffs[n] if ranges else 0, dtype=np.int64)
    buf_seq = np.empty(boffs[n] if ranges else 0, dtype=np.int64)
    for t in prange(parts):
        for i in range(cb[t], cb[t + 1]):
            pos = offs[i]
            bpos = boffs[i]
            for src in range(2 if bcount[i + 1] > 0 else 1):  # main array, then the buffer
                cs = ms if src == 0 else bs
                ct = mt if src == 0 else bt
                # ranges: the buffer's pairs go to buf_seq, else after the main pairs
                out = buf_seq if ranges and src == 1 else out_a
                w = bpos if ranges and src == 1 else pos
                for b in range(nb):
                    s = st[b, i] if src == 0 else bst[b, i]
                    e = en[b, i] if src == 0 else ben[b, i]
                    if ranges and src == 0:
                        if e > s:
                            out_a[w] = s
                            out_b[w] = e
                            w += 1
                    else:  # slots are exact: only qualifying seqs are written
                        for p in range(s, e):
                            q = cs[p]
                            if in_window(mode, c0[i], c1[i], c2[i], q, ct[p]):
                                out[w] = q
                                w += 1
                if ranges and src == 1:
                    bpos = w
                else:
                    pos = w
            for x in range(offs[i], pos):
                out_probe[x] = i
            for x in range(boffs[i], bpos if ranges else boffs[i]):
                buf_probe[x] = i
    return out_probe, out_a, out_b, buf_probe, buf_seq
