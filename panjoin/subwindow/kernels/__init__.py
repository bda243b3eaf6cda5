"""Numba kernels of the subwindow indexes: arrays in, arrays out, no Python objects.

One module per concern, shared by the indexes:

- :mod:`.search`  rebounding (galloping) binary search over sorted arrays
- :mod:`.window`  the per-pair window filter (time bounds or count bounds)
- :mod:`.nested`  the nested-loop baseline
and one kernel module per index (``llat``, ``rap``, ``wib``, ``bisort``).
"""
