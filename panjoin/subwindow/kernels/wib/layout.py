"""What the WiB+-Tree's arrays hold (PanJoin paper, section III-C).

Three tuples of arrays travel together through the kernels:

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
  with its stack of entries freed when a split rewrites a leaf's chain, which
  allocation takes before advancing PtrG.

``meta`` holds the scalars: root, height (0: the root is a leaf), leaf count,
internal node count, tuple count.
"""

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
META_LEN = 5

#: deepest tree the path arrays can describe, leaf level included (fan-out >= 2 per level)
MAXH = 64

# status codes returned by the insert kernel
OK = 0
NO_ENTRY = 1
NO_LEAF = 2
NO_NODE = 3

#: runs (of batch tuples bound for one leaf) between the one being inserted and the one
#: whose leaf the lookahead finds and whose leaf row it prefetches; half as far ahead,
#: the LLAT slot the run will go to is prefetched
INSERT_AHEAD = 16
#: the same for probes: leaves of lo (of distinct leaves) the lookahead runs ahead
PROBE_AHEAD = 16
#: ring of looked-ahead runs (a power of two > INSERT_AHEAD + 1, PROBE_AHEAD + 1)
RING = 32
