"""Numba kernels of the subwindow indexes: arrays in, arrays out, no Python objects.

One module per concern, shared by the indexes:

- :mod:`.primitives`  int64 bounds, typed key helpers (lowest, key_after), prefetch
- :mod:`.search`  rebounding (galloping) binary search over sorted arrays
- :mod:`.window`  the per-pair window filter (time bounds or count bounds)
- :mod:`.scan`    the unsorted-band scan (nested loop, BI-Sort's buffer, handshake
  segments)
- :mod:`.llat`    the LLAT: the one entry allocator, appends, chain sizes
- :mod:`.nested`  the nested-loop baseline
and one kernel module per index (``rap``, ``bisort`` with ``residual``), or package
(``wib``: layout, tree, split, insert, probe).

Numba's on-disk cache keys a function on its own file only: after editing a function
that others inline (``scan``, ``window``, ``primitives``), delete the callers'
``__pycache__`` ``*.nbi``/``*.nbc`` files (``make clean-numba``), or they keep running
the old code.
"""
