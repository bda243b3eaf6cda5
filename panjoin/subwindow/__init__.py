"""Subwindow indexes (PanJoin paper, section III-B to III-D), behind one interface.

``make_index(kind, capacity, ...)`` builds one; ``INDEX_KINDS`` lists them:

- ``rap``     RaP-Table: range partitions (splitters) + histograms + LLAT storage
- ``wib``     WiB+-Tree: small sorted internal nodes, wide unsorted leaves in an LLAT
- ``bisort``  BI-Sort: sorted main array + insertion buffer + index array
- ``hash``    a hash table on the key over arrival order: equi joins at small batches
  (not in the paper; ``panjoin.subwindow.hash_table`` says when it wins)
- ``nested``  nested loop, the baseline
- ``sortedlist``  a ``sortedcontainers.SortedList`` (panjoin/baselines/sorted_list.py), the
  peer a Python programmer would write first
- ``bisort-opencl``  BI-Sort with its main array on an OpenCL device (``opencl/``;
  pyopencl is imported only when one is made)
"""

from __future__ import annotations

import importlib

from panjoin.config import INDEX_KINDS
from panjoin.subwindow.base import Residual, ResidualError, SubwindowIndex, WindowFilter

_CLASSES = {
    "rap": ("panjoin.subwindow.rap_table", "RaPTable"),
    "wib": ("panjoin.subwindow.wib_tree", "WiBTree"),
    "bisort": ("panjoin.subwindow.bi_sort", "BISort"),
    "hash": ("panjoin.subwindow.hash_table", "HashTable"),
    "nested": ("panjoin.subwindow.nested_loop", "NestedLoop"),
    "sortedlist": ("panjoin.baselines.sorted_list", "SortedListIndex"),
    "bisort-opencl": ("opencl.bisort", "OpenCLBISort"),
}
if tuple(_CLASSES) != INDEX_KINDS:  # the CLI's list (panjoin.config) and the classes agree
    raise ImportError(f"panjoin.config.INDEX_KINDS {INDEX_KINDS} != {tuple(_CLASSES)}")


def index_class(kind: str) -> type[SubwindowIndex]:
    if kind not in _CLASSES:
        raise ValueError(f"unknown index {kind!r}; choose one of {', '.join(INDEX_KINDS)}")
    module, name = _CLASSES[kind]
    return getattr(importlib.import_module(module), name)


def make_index(kind: str, capacity: int, key_dtype="int64", partitions: int = 1024,
               threads: int = 1, predecessor: SubwindowIndex | None = None,
               **opts) -> SubwindowIndex:
    """A new, empty subwindow index. ``predecessor`` (the previous subwindow of the
    same stream) seeds RaP-Table's splitters by the paper's Algorithm 1."""
    cls = index_class(kind)
    return cls(capacity, key_dtype=key_dtype, partitions=partitions, threads=threads,
               predecessor=predecessor, **opts)


__all__ = ["INDEX_KINDS", "Residual", "ResidualError", "SubwindowIndex", "WindowFilter",
           "index_class", "make_index"]
