"""The unsorted-band scan: one probe tuple's band against stored rows in no key order.

The one loop behind every scan of unsorted columns (the paper's nested loop):

- the nested-loop index (:mod:`.nested`): every stored tuple, per probe tuple and band;
- BI-Sort's insertion buffer (:mod:`.bisort`) and its residual twin (:mod:`.residual`);
- a handshake-join node's immediate scan of its segment
  (:mod:`panjoin.handshake.kernels`).

:func:`scan_band` takes the rows ``[0, n)`` of columns ``keys, ts, seq`` (and ``key2``
when there is a residual) and one band ``[l, h]`` of probe tuple ``i``; a row matches
when ``l <= keys[p] <= h``, ``key2[p]`` lies in one of i's residual intervals
``[lo2[b2, i], hi2[b2, i]]`` (only if ``has_res``, see :func:`res_ok`), and the window
condition holds (:func:`panjoin.subwindow.kernels.window.in_window`). Callers run it
twice per probe tuple, as every kernel here does: a counting pass (``write`` False:
returns ``pos`` plus the count, so a caller sums over bands by passing its running
total as ``pos``), then, for the probe tuples that have matches, a writing pass at
prefix-sum offsets (``write`` True: each match's ``seq[p]``, or its row ``p`` if
``emit_pos``, goes to ``out[pos]`` on; returns the new end; ``stop`` is the end of the
tuple's slots).

How it runs. Counting: a branch-free pass that the compiler vectorises counts the
key candidates; none ends the scan, and without a residual that count, or a second
branch-free pass that also tests the window condition, is the answer. With a
residual, a few candidates (at most ``FEW``, or one per ``2 BLOCK`` rows: the residual
check keeps a plain pass from vectorising) are checked block by block (``BLOCK`` rows;
a branch-free pass finds the blocks holding one) up to the last of them, more in one
plain pass. Writing: the caller knows how many matches it expects (``stop``, the end
of its slots), and the same rule picks blocks, ending at the last match, or one plain
pass. At join selectivities most probe tuples end after the first counting pass and
are never scanned again. The function is inlined into its callers (``inline="always"``),
so that no call passes arrays per probe tuple; ``write`` and ``has_res`` should be
constants there (the compiler then keeps only the code they select).

:func:`scan_bands` runs it over every band of probe tuple i (the nested loop, the
buffer and the segment scans; BI-Sort's residual probe interleaves it with its main
ranges band by band).

Example: keys ``[5, 9, 6, 7]``, seq ``[10, 11, 12, 13]``, band ``[5, 6]``, no filter:
counting from ``pos = 0`` returns 2; writing from ``out[0]`` with ``stop = 2``:
``out = [10, 12]`` (rows ``[0, 2]`` with ``emit_pos``), returns 2.
"""

from panjoin.config import NJIT
from panjoin.jit import njit
from panjoin.subwindow.kernels.window import NONE, TIME, in_window

#: rows per block of the branch-free candidate pass
BLOCK = 32
#: candidates (counting, with a residual) or matches (writing) up to which the rows are
#: checked block by block; beyond, one plain pass is cheaper (with a residual, up to one
#: candidate per 2 BLOCK rows)
FEW = 2


@njit(inline="always", **NJIT)
def res_ok(lo2, hi2, i, k2):
    """Stored key2 ``k2`` inside one of probe tuple i's residual intervals."""
    for b in range(lo2.shape[0]):
        if k2 >= lo2[b, i] and k2 <= hi2[b, i]:
            return True
    return False


@njit(inline="always", **NJIT)
def scan_band(keys, ts, seq, key2, n, l, h, i, mode, c0, c1, c2, lo2, hi2, has_res,
              write, out, pos, stop, emit_pos):
    """Rows of ``[0, n)`` matching band ``[l, h]`` of probe tuple i (see the module
    docstring). ``write``: written from ``out[pos]`` on (``seq[p]``, or ``p`` if
    ``emit_pos``), ``stop`` the end of the caller's slots for probe tuple i; returns
    the new end. Else only counted: returns ``pos`` plus the count."""
    cand = 0
    if write:
        cand = stop - pos  # the matches still to come: at most this many candidates
    else:
        for p in range(n):  # branch-free: vectorised
            x = keys[p]
            cand += (x >= l) & (x <= h)
        if cand == 0 or (mode == NONE and not has_res):
            return pos + cand
        if not has_res:  # the window condition, branch-free per mode: vectorised
            c = 0
            a0 = c0[i]
            a1 = c1[i]
            if mode == TIME:
                for p in range(n):
                    x = keys[p]
                    t = ts[p]
                    c += (x >= l) & (x <= h) & (a0 <= t) & (t <= a1)
            else:  # COUNT: seq < c1 ? seq >= c0 : ts <= c2
                a2 = c2[i]
                for p in range(n):
                    x = keys[p]
                    q = seq[p]
                    c += (x >= l) & (x <= h) & (((q < a1) & (q >= a0))
                                                | ((q >= a1) & (ts[p] <= a2)))
            return pos + c
    # a residual check keeps the plain pass from vectorising: blocks pay off sooner
    few = cand <= FEW or 2 * BLOCK * cand <= n
    if not few:  # one plain pass
        for p in range(n):
            x = keys[p]
            if x >= l and x <= h and (not has_res or res_ok(lo2, hi2, i, key2[p])) \
                    and in_window(mode, c0[i], c1[i], c2[i], seq[p], ts[p]):
                if write:
                    out[pos] = p if emit_pos else seq[p]
                pos += 1
        return pos
    a = 0
    while a < n and (pos < stop if write else cand > 0):  # up to the last candidate/match
        e = min(n, a + BLOCK)
        bc = 0
        for p in range(a, e):  # branch-free: vectorised
            x = keys[p]
            bc += (x >= l) & (x <= h)
        if bc > 0:
            cand -= bc
            for p in range(a, e):
                x = keys[p]
                if x >= l and x <= h and (not has_res or res_ok(lo2, hi2, i, key2[p])) \
                        and in_window(mode, c0[i], c1[i], c2[i], seq[p], ts[p]):
                    if write:
                        out[pos] = p if emit_pos else seq[p]
                    pos += 1
        a = e
    return pos


@njit(inline="always", **NJIT)
def scan_bands(keys, ts, seq, key2, n, lo, hi, i, mode, c0, c1, c2, lo2, hi2, has_res,
               write, out, pos, stop, emit_pos):
    """:func:`scan_band` over every band ``b`` of probe tuple i (``[lo[b, i], hi[b, i]]``,
    empty when lo > hi): the matches over all bands counted onto ``pos``, or written
    from ``out[pos]`` on, returning the new end."""
    for b in range(lo.shape[0]):
        l = lo[b, i]
        h = hi[b, i]
        if l > h:
            continue
        pos = scan_band(keys, ts, seq, key2, n, l, h, i, mode, c0, c1, c2, lo2, hi2, has_res,
                        write, out, pos, stop, emit_pos)
    return pos
