"""WiB+-Tree kernels (PanJoin paper, section III-C; batch mode III-E, probes III-F).

Arrays in, arrays out; the Python class in :mod:`panjoin.subwindow.wib_tree` owns the
arrays and explains the structure with a worked trace. One module per job:

- :mod:`.layout`  what the arrays hold: leaf fields, meta slots, status codes, limits
- :mod:`.tree`    internal nodes: the path-reusing traversal to a key's leaf, and
                  separator insertion (B+-tree node splits up to a new root)
- :mod:`.split`   leaf splits: cutting an overflowing leaf into pieces at key boundaries
- :mod:`.insert`  the batch insert driver (runs of a sorted batch, lookahead prefetch)
- :mod:`.probe`   the probe drivers (groups of probe tuples per leaf, two parallel passes)

Leaf storage is an LLAT whose entries come from the one LLAT allocator
(:mod:`panjoin.subwindow.kernels.llat`); the invariants are checked by
:meth:`panjoin.subwindow.wib_tree.WiBTree.check`.
"""
