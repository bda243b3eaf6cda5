"""The paper's knobs NSub and NBat for a join over a whole file (``panjoin replay``).

A file's join has no latency to hold (every tuple is there already), so its knobs are
the ones that give the most tuples a second on this project's measurements
(benchmarks/RESULTS.md, issues 27 and 31; ``benchmarks/knobs.py``): large batches,
since a batch's sort and merge-probe are sequential passes, but not beyond half the
window (measured: larger ones cost more at W 64K, most on result-heavy band joins),
and 256K at most (beyond it nothing gets cheaper while the batch's memory grows);
subwindows as large as the window up to 512K tuples (a batch probes two of them a
stream), half the window beyond (each stays small enough to merge into cheaply).
Measured: at W 64K the best of NSub {W/4, W/2, W} x NBat {32K, 128K, 256K} was NSub W,
NBat 32K on most workloads; at W 1M, NSub W/2, NBat 256K. With W the tuples a window
holds per stream (a count window's size; a time window's span times the file's tuples
per ms of event time per stream)::

    NBat = clamp(W / 2, 32K, 256K)
    NSub = max(min(W, max(W / 2, 512K)), 32K)

P follows NSub (:func:`panjoin.manager.engine.default_partitions`). A stream with a
latency bound (``--max-latency``) sizes its batches itself (:mod:`panjoin.manager.latency`).

    >>> offline_knobs(parse_window("count:1M,1M"))
    (524288, 262144)
    >>> offline_knobs(parse_window("count:64K,64K"))
    (65536, 32768)
"""

from __future__ import annotations

import numpy as np

from panjoin.semantics import Window, parse_window  # noqa: F401 (the doctest's)

NBAT_MIN = 1 << 15
NBAT_MAX = 1 << 18
NSUB_MIN = 1 << 15
#: windows above this many tuples get subwindows of half the window
NSUB_HALF = 1 << 19


def window_tuples(window: Window, ts: np.ndarray | None = None,
                  stream: np.ndarray | None = None) -> int:
    """Tuples a window holds per stream: a count window's size; a time window's span
    times the tuples per ms of event time of the busier stream in ``ts``/``stream``."""
    if window.kind == "count":
        return int(max(window.r, window.s))
    if ts is None or ts.shape[0] < 2:
        return NSUB_MIN
    span = max(1, int(ts.max()) - int(ts.min()))
    busier = max(int(np.count_nonzero(stream == 0)), int(np.count_nonzero(stream == 1)))
    return int(max(window.r, window.s) * busier / span)


def offline_knobs(window: Window, ts: np.ndarray | None = None,
                  stream: np.ndarray | None = None) -> tuple[int, int]:
    """``(NSub, NBat)`` for joining a whole file (see the module docstring)."""
    w = max(1, window_tuples(window, ts, stream))
    nbat = int(min(NBAT_MAX, max(NBAT_MIN, w // 2)))
    return max(min(w, max(w // 2, NSUB_HALF)), NSUB_MIN), nbat
