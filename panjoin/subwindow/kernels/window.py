"""The per-pair window filter, applied while probing subwindows that straddle a window edge.

The manager probes a subwindow *without* a filter when every stored tuple is
inside every probe tuple's window, and with one otherwise (the paper's
"filtering operation" on the oldest subwindow, section III-G). The filter is
three int64 numbers per probe tuple, ``c0, c1, c2``
(:func:`panjoin.semantics.window_bounds` makes them), read by mode:

- ``NONE`` (0): every pair qualifies;
- ``TIME`` (1): stored ``ts`` in the closed interval ``[c0, c1]`` (the integers of
  ``r.ts - TS < s.ts < r.ts + TR``);
- ``COUNT`` (2): the stored tuple arrived before the probe tuple and is among
  the last W of its stream (``c0 <= seq < c1``, with c1 = opposite arrivals
  before the probe tuple and c0 = c1 - W), or it arrived after the probe tuple
  and the probe tuple is among the last W' of its own stream before it
  (``seq >= c1`` and stored ``ts <= c2``; for count windows the engine stores
  in ``ts`` the number of opposite-stream arrivals before the tuple, and
  c2 = probe seq + W').

Every bound is closed, so that it may be saturated at the ends of int64 and stay
exact: probing from r at ts 2**63 - 10 with time:100,100 gives c1 = 2**63 - 1 (not a
wrapped negative number), and ``ts <= c1`` holds for every stored ts, as it should;
an open ``ts < c1`` would drop the tuples at ts = 2**63 - 1.

Example, count:3,3: probe r with seq 7 after 10 S arrivals -> c0, c1, c2 = 7, 10, 10;
s#8 qualifies, s#6 does not (it left the window), s#11 qualifies if at most
10 R tuples had arrived before it. time:5,5, probe r at ts 100 -> c0, c1 = 96, 104.
"""

from panjoin.jit import njit

NONE = 0
TIME = 1
COUNT = 2


@njit(inline="always", cache=True)
def in_window(mode, c0, c1, c2, seq, ts):
    if mode == NONE:
        return True
    if mode == TIME:
        return c0 <= ts and ts <= c1
    if seq < c1:
        return seq >= c0
    return ts <= c2
