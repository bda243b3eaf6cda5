"""The paper's knobs NSub and NBat for a join over a whole file (``panjoin replay``).

A file's join has no latency to hold (every tuple is there already), so its knobs are
the ones that give the most tuples a second on this project's measurements
(benchmarks/RESULTS.md, issues 27 and 31): batches as large as the window, up to
256K tuples (a batch's sort and merge-probe are sequential passes, and beyond 256K
they stop getting cheaper while the batch's memory grows), and subwindows as large as
the window, so that a batch probes two subwindows a stream, not five. With W the tuples
a window holds per stream (a count window's size; a time window's span times the file's
tuples per ms of event time per stream)::

    NBat = clamp(W, 32K, 256K)
    NSub = max(W, NBat) for count windows, max(W / 2, 64K) for time windows

(a time window's subwindows hold a ts range, so half a window keeps each one's range
narrow enough to be skipped or probed without the filter more often). P follows NSub
(:func:`panjoin.manager.engine.default_partitions`). A stream with a latency bound
(``--max-latency``) sizes its batches itself instead (:mod:`panjoin.manager.latency`).

    >>> offline_knobs(parse_window("count:1M,1M"))
    (1048576, 262144)
    >>> offline_knobs(parse_window("count:10K,10K"))
    (32768, 32768)
"""

from __future__ import annotations

import numpy as np

from panjoin.semantics import Window, parse_window  # noqa: F401 (the doctest's)

NBAT_MIN = 1 << 15
NBAT_MAX = 1 << 18
NSUB_TIME_MIN = 1 << 16


def window_tuples(window: Window, ts: np.ndarray | None = None,
                  stream: np.ndarray | None = None) -> int:
    """Tuples a window holds per stream: a count window's size; a time window's span
    times the tuples per ms of event time of the busier stream in ``ts``/``stream``."""
    if window.kind == "count":
        return int(max(window.r, window.s))
    if ts is None or ts.shape[0] < 2:
        return NSUB_TIME_MIN
    span = max(1, int(ts.max()) - int(ts.min()))
    busier = max(int(np.count_nonzero(stream == 0)), int(np.count_nonzero(stream == 1)))
    return int(max(window.r, window.s) * busier / span)


def offline_knobs(window: Window, ts: np.ndarray | None = None,
                  stream: np.ndarray | None = None) -> tuple[int, int]:
    """``(NSub, NBat)`` for joining a whole file (see the module docstring)."""
    w = max(1, window_tuples(window, ts, stream))
    nbat = int(min(NBAT_MAX, max(NBAT_MIN, w)))
    if window.kind == "count":
        return max(w, nbat), nbat
    return max(w // 2, NSUB_TIME_MIN), nbat
