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

A result-heavy join is the exception: with S pairs a probe tuple (estimated from
samples of the file, :func:`pairs_per_tuple`), a batch makes about NBat x S pairs, and
once those outgrow the caches a smaller batch is cheaper per pair; and the subwindows
shrink as S grows, since a probe also meets the expired tail of a window's oldest
subwindow (on average NSub / 2 tuples beyond the window's W: candidates it finds,
checks and drops)::

    NBat = min(NBat, max(32K, 2M / S))                   # about 2M pairs a batch (a power of 2)
    NSub = min(NSub, max(1K, W / clamp(S / 16, 1, 4)))   # W/2 from S = 32, W/4 from 64
                                                         # (W/2 at least: increasing keys, W > 512K)

On a cluster whose manager cuts every subwindow by key over its N workers (``panjoin
manager --placement key``), each worker joins about 1/N of every batch, so the rule
above sizes a worker's share, and the batch is N of them, within the same cap::

    NBat = min(clamp(W / 2, 32K, 256K), N x NBat)

A batch's commands cost a worker a fixed part besides its rows (milliseconds of a
quarter core: the Python around a command, gRPC's messages), which 1/N of a small
batch does not pay for: the 2-D band join (``band:10&band2:10``, W 256K, some 540 candidates a
probe tuple: NBat 32K in-process) on 4 workers at a quarter core each took 2.1 of their
CPU-s at NBat 128K against 2.7 at 32K; the equi joins at W 1M and 4M are at the cap
already (256K).

Measured (``benchmarks/knobs.py``, CPU seconds of separate processes, best of 2): at
W 1M, band S = 64, NBat 32K was the best or within 1.1x of it on uniform, zipf and
increasing keys (128K: 1.0x, 1.4x, 1.3x; 256K: 1.6-2.2x), NSub 256K-1M within 1.1x
of each other there, while NSub 64K lost 1.2x on increasing keys; at W 64K NSub W/4 or
W/2 took 0.43-0.55x the CPU of NSub W on zipf and increasing keys (eighth session,
one round); all-equal keys at W 4K, every tuple a pair: NSub 1K-2K against 16K, up
to 1.7x. Keys that arrive increasing (:func:`keys_increase`) in a window beyond 512K
shrink the subwindows to W/2 at most: a band's probe tuples carry the newest keys, so
the oldest subwindow's expired tail holds keys below every band (W 4M, band S = 64: NSub
W/4 1.24x the CPU of NSub W, W/2 1.10x; W 1M: W/2 1.03x); at W 64K W/4 stays the best
(W/2 1.8x).

P follows NSub (:func:`panjoin.manager.engine.default_partitions`). Replay pushes the
file a chunk at a time and hands each chunk's pairs to the writer's thread, which
encodes them while the next chunk joins; after the last chunk the process waits for its
pairs alone, so a chunk makes about 8M pairs at most (:func:`chunk_rows`)::

    chunk = clamp(8M / S, NBat, 1M)

A stream with a latency bound (``--max-latency``) sizes its batches itself
(:mod:`panjoin.manager.latency`).

Threads: replay's process writes the pairs on a thread of its own, and its main thread
cuts, sorts and pushes between kernels, so its kernels take every CPU the process may
use but one (:func:`offline_threads`); a predicate with a residual takes them all, since
its probes filter hundreds of candidates for each pair they keep. Measured on 2 CPUs
(one kernel thread against two, the join time): 1.2-1.3x faster on eq and band:1-4 at
W 256K-1M, 2M-16M tuples, count and time windows, 1.03-1.1x on band:16-64; the 2-D
band join with a residual 1.5x slower::

    threads = CPUs           with a residual
              max(1, CPUs - 1)  otherwise

    >>> offline_knobs(parse_window("count:1M,1M"))
    (524288, 262144)
    >>> offline_knobs(parse_window("count:64K,64K"))
    (65536, 32768)
    >>> offline_knobs(parse_window("count:1M,1M"), pairs=64.0)  # 64 pairs a tuple
    (262144, 32768)
    >>> offline_knobs(parse_window("count:64K,64K"), pairs=64.0)
    (16384, 32768)
    >>> chunk_rows(64.0, 131072)  # 64 pairs a tuple: a batch's worth of rows
    131072
"""

from __future__ import annotations

import numpy as np

from panjoin.semantics import (  # noqa: F401 (parse_*: the doctests')
    Predicate,
    Window,
    parse_predicate,
    parse_window,
    stored_bands,
)

NBAT_MIN = 1 << 15
NBAT_MAX = 1 << 18
NSUB_MIN = 1 << 15
#: windows above this many tuples get subwindows of half the window
NSUB_HALF = 1 << 19
#: a batch makes at most about this many pairs (a result-heavy join's batches shrink)
BATCH_PAIRS = 1 << 21
#: a chunk replay pushes makes at most about this many pairs
CHUNK_PAIRS = 1 << 23
#: from this many pairs a probe tuple on, subwindows shrink (to W/4 at 4x as many)
HEAVY_PAIRS = 16
#: the least NSub of a result-heavy join (all-equal keys, W 4K: the best was 1K-2K)
NSUB_MIN_HEAVY = 1 << 10
#: rows replay pushes at a time at most (a join with few pairs a tuple)
CHUNK_MAX = 1 << 20
#: rows a JoinInput of ``replay --cluster`` holds: 6.5 MB, where 1M rows (25 MB) passed
#: glibc's mmap threshold in the client and the manager (gRPC's buffers, protobuf's
#: copies), whose every message was then faulted in afresh: on eq-4M at N = 4, a quarter
#: core a host, the join took 4.6-5.4 s in 1M-row messages, 3.8-4.0 s in 128K-256K
#: (manager 0.9-1.0 CPU-s against 1.1-1.3, the client 0.3 against 0.6)
CHUNK_WIRE = 1 << 18


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


def pairs_per_tuple(key: np.ndarray, stream: np.ndarray, pred: Predicate, w: int,
                    probes: int = 256, sample: int = 1 << 14, points: int = 4) -> float:
    """About how many pairs a probe tuple finds in a full window of the other stream:
    the median of :func:`pairs_at` at ``points`` places of the file
    (:func:`sample_ends`), so that a file whose keys change on the way is judged by
    most of it, not by its end (the peers' increasing keys reach their cap and end all
    equal: 41 pairs a tuple at the end of a file that finds about 1 elsewhere).

    >>> k = np.arange(10_000) // 2; st = np.tile([0, 1], 5_000).astype(np.uint8)
    >>> pairs_per_tuple(k, st, parse_predicate("band:3"), 1000)  # R finds 3, S 4
    3.5
    """
    w = max(1, w)
    if pred.negated:
        return float(w)
    found = [f for e in sample_ends(stream.shape[0], w, probes, points)
             if (f := pairs_at(key[:e], stream[:e], pred, w, probes, sample)) is not None]
    if not found:
        return 0.0
    found.sort()  # the median of a few (numpy's would import numpy.ma: 6 ms of a start)
    return (found[(len(found) - 1) // 2] + found[len(found) // 2]) / 2


def sample_ends(n: int, w: int, probes: int = 256, points: int = 4) -> list[int]:
    """Where :func:`pairs_per_tuple` looks: the file's end, and evenly before it down to
    where both streams' windows are first full (about 2W + the probes of two streams).

    >>> sample_ends(10_000, 1000, 250)
    [3000, 5333, 7666, 10000]
    >>> sample_ends(2_000, 1000, 250)  # the windows never fill: the end only
    [2000]
    """
    first = 2 * w + 4 * probes
    if n <= first or points <= 1:
        return [n]
    return sorted({int(e) for e in np.linspace(first, n, points)})


def pairs_at(key: np.ndarray, stream: np.ndarray, pred: Predicate, w: int,
             probes: int = 256, sample: int = 1 << 14) -> float | None:
    """Pairs a probe tuple finds at the end of ``key``/``stream`` (None: no probes).

    Per stream, its last ``probes`` tuples in the file, each against its own window
    (the ``w`` other-stream tuples before it; increasing keys match only near the
    window's end, so a window shared by all probes would miss them). The windows of
    consecutive probes overlap: their union U is counted once from a strided sample of
    at most ``sample`` keys (sorted, one binary search per band end, scaled up), and
    each probe's count loses, exactly, the few keys of U outside its own window. The
    residual on key2 is left out: its candidates cost probing all the same."""
    found = []
    for side in (0, 1):
        mine, theirs, j = _probes_and_windows(stream, side, w, probes)
        if mine.size == 0 or j[-1] == 0:
            continue
        lo = max(0, int(j[0]) - w)
        u = theirs[lo:int(j[-1])]  # positions of U's tuples
        win = np.sort(key[u[::max(1, u.size // sample)]].astype(np.float64))
        pk = key[mine].astype(np.float64)

        bands = stored_bands(pred, "RS"[side])  # on the window's key - the probe's
        n = np.zeros(pk.size)
        for a, b in bands:
            n += np.searchsorted(win, pk + b, "right") - np.searchsorted(win, pk + a, "left")
        n *= u.size / win.size
        start = j - w - lo  # where each probe's window starts in U (< 0: nothing cut)
        edge = int(j[-1] - j[0])
        head, tail = np.arange(min(edge, u.size)), np.arange(max(0, u.size - edge), u.size)
        n -= (_hits(bands, pk, key[u[head]]) & (head < start[:, None])).sum(axis=1)
        n -= (_hits(bands, pk, key[u[tail]]) & (tail >= (j - lo)[:, None])).sum(axis=1)
        found.append(float(n.mean()))
    return float(np.mean(found)) if found else None


def _hits(bands, probe: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """probes x keys: does the pair match (``bands`` on key - probe key)?"""
    d = keys[None, :] - probe[:, None]
    return np.logical_or.reduce([(d >= a) & (d <= b) for a, b in bands])


def _probes_and_windows(stream: np.ndarray, side: int, w: int, probes: int):
    """Positions of the last ``probes`` tuples of ``side``, of the other stream's tuples
    before them, and per probe how many of those precede it. Only the file's end is
    looked at: the probes, and a full window before the first of them (or the file)."""
    n = stream.shape[0]
    look = 4 * probes
    while True:
        base = max(0, n - look)
        mine = base + np.flatnonzero(stream[base:] == side)[-probes:]
        if mine.size == probes or base == 0:
            break
        look *= 4
    if mine.size == 0:
        return mine, mine, mine
    span = 2 * (w + probes)
    while True:
        base = max(0, int(mine[0]) - span)
        theirs = base + np.flatnonzero(stream[base:mine[-1]] != side)
        j = np.searchsorted(theirs, mine)
        if base == 0 or j[0] >= w:
            return mine, theirs, j
        span *= 2


def keys_increase(key: np.ndarray, blocks: int = 16, sample: int = 1 << 16) -> bool:
    """Whether a file's keys arrive increasing: the medians of ``blocks`` equal slices (of
    a strided sample) rise from one slice to the next in at least
    :data:`~panjoin.manager.index_choice.INCREASING` of the steps where they differ, and
    they differ in at least half the steps (all-equal keys do not increase; keys that
    reach a cap and stay there still do).

    >>> keys_increase(np.arange(100_000)), keys_increase(np.zeros(100_000))
    (True, False)
    >>> keys_increase(np.random.default_rng(1).integers(0, 1000, 100_000))
    False
    """
    from panjoin.manager.index_choice import INCREASING

    n = key.shape[0]
    if n < 2 * blocks:
        return False
    k = key[:: max(1, n // sample)]
    med = np.array([np.median(part) for part in np.array_split(k, blocks)])
    d = np.diff(med)
    d = d[d != 0]
    return bool(d.size >= (blocks - 1) // 2 and np.mean(d > 0) >= INCREASING)


def offline_knobs(window: Window, ts: np.ndarray | None = None,
                  stream: np.ndarray | None = None, pairs: float = 0.0,
                  increasing: bool = False, makers: int = 1) -> tuple[int, int]:
    """``(NSub, NBat)`` for joining a whole file whose probe tuples find about ``pairs``
    pairs each, its keys ``increasing`` or not, each batch shared by ``makers`` workers
    (N in the module docstring; 1 in-process).

        >>> offline_knobs(parse_window("count:256K,256K"), pairs=540.0)
        (65536, 32768)
        >>> offline_knobs(parse_window("count:256K,256K"), pairs=540.0, makers=4)
        (65536, 131072)
    """
    w = max(1, window_tuples(window, ts, stream))
    cap = int(min(NBAT_MAX, max(NBAT_MIN, w // 2)))
    nsub = max(min(w, max(w // 2, NSUB_HALF)), NSUB_MIN)
    # the nearest power of two, as the grids measured (an estimate of 66 pairs: 32K)
    cut = max(NBAT_MIN, 1 << round(np.log2(max(1.0, BATCH_PAIRS / max(pairs, 1.0)))))
    nbat = min(cap, max(1, makers) * min(cap, cut))
    # the expired tail a probe meets is NSub / 2 on average: W/2 at 2x, W/4 at 4x HEAVY
    shrink = round(np.log2(min(4.0, max(1.0, pairs / HEAVY_PAIRS))))
    if increasing and w > NSUB_HALF:  # a band meets the newest keys, not the tail's
        shrink = min(shrink, 1)
    if shrink:
        nsub = min(nsub, max(NSUB_MIN_HEAVY, w >> shrink))
    return nsub, nbat


def offline_threads(pred: Predicate, cpus: int) -> int:
    """Kernel threads for joining a whole file in a process of ``cpus`` CPUs (see the
    module docstring).

    >>> offline_threads(parse_predicate("eq"), 2), offline_threads(parse_predicate("eq"), 1)
    (1, 1)
    >>> offline_threads(parse_predicate("band:10&band2:10"), 2)
    2
    """
    return max(1, cpus if pred.residual is not None else cpus - 1)


def chunk_rows(pairs: float, nbat: int) -> int:
    """Rows replay pushes at a time: about :data:`CHUNK_PAIRS` pairs' worth, at least a
    batch and at most :data:`CHUNK_MAX` (a power of two, as the batches)."""
    rows = 1 << round(np.log2(max(1.0, CHUNK_PAIRS / max(pairs, 1.0))))
    return int(min(CHUNK_MAX, max(nbat, rows)))
