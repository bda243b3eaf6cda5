"""One point of the per-index microbenchmarks (PanJoin paper, section V-A, Figures 10-13).

``insert``: a fresh subwindow of NSub tuples is filled with sorted batches of
NBat uniform keys; throughput = NSub / time. ``probe``: a full subwindow is
probed with sorted batches of NBat keys, the predicate chosen so that each
probe tuple matches about S stored tuples (eq: keys drawn from NSub / S
values; band: half-width S * range / (2 NSub)). ``expire``: a full subwindow
of NSub tuples (filled with batches of NBat) is expired the way the engine does
it: its successor is created from it (RaP-Table: splitters by Algorithm 1, from
its histograms), then it is dropped and its memory freed; throughput = NSub /
time (tuples expired per second). Each point is run once to
warm up (JIT compile, page faults), then ``repeat`` times; the median counts.
The nested loop probes only as many tuples as fit in about half a second,
since each costs a full scan.

    >>> res = run_point(IndexPoint("nested", "probe", nsub=1024, partitions=8, batch=64,
    ...                            repeat=1))
    >>> res.tuples_per_s > 0
    True
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from panjoin import jit
from panjoin.semantics import parse_predicate, probe_bounds
from panjoin.subwindow import WindowFilter, make_index

KEY_RANGE = 1 << 40


@dataclass
class IndexPoint:
    index: str
    op: str
    nsub: int = 1 << 20
    partitions: int = 8192
    batch: int = 32768
    selectivity: float = 1.0
    predicate: str = "band"
    threads: int = 1
    repeat: int = 3
    seed: int = 0
    #: insert only: stop filling after this many seconds (BI-Sort with tiny batches into
    #: a big subwindow is quadratic); throughput is then tuples inserted / time
    budget_s: float | None = None
    #: insert only: fault the new subwindow's pages in before timing, as when a manager
    #: recycles an expired subwindow's memory; False times fresh memory (page faults included)
    warm_memory: bool = True


@dataclass
class IndexResult:
    point: IndexPoint
    tuples_per_s: float
    seconds: list
    results_per_tuple: float
    bytes_per_tuple: float


def _keys(rng, n, point: IndexPoint) -> np.ndarray:
    if point.predicate == "eq":
        domain = max(1, round(point.nsub / max(point.selectivity, 1e-9)))
        return rng.integers(0, domain, n, dtype=np.int64)
    return rng.integers(0, KEY_RANGE, n, dtype=np.int64)


def _pred(point: IndexPoint):
    if point.predicate == "eq":
        return parse_predicate("eq")
    e = int(point.selectivity * KEY_RANGE / (2 * point.nsub))
    return parse_predicate(f"band:{e}")


def _fill(point: IndexPoint, rng, batch: int):
    ix = make_index(point.index, point.nsub, "int64", point.partitions, point.threads)
    keys = _keys(rng, point.nsub, point)
    ts = np.arange(point.nsub, dtype=np.int64)  # written, so no lazy zero pages are timed
    seq = np.arange(point.nsub, dtype=np.int64)
    batches = []
    for a in range(0, point.nsub, batch):
        b = min(point.nsub, a + batch)
        order = np.argsort(keys[a:b], kind="stable")
        batches.append((keys[a:b][order], ts[a:b], seq[a:b][order]))
    return ix, batches


def run_point(point: IndexPoint, progress: bool = False) -> IndexResult:
    jit.set_threads(point.threads)
    rng = np.random.default_rng(point.seed)
    # warm-up: compile every kernel on a small instance of the same shape
    small = IndexPoint(**{**point.__dict__, "nsub": min(point.nsub, 4096),
                          "batch": min(point.batch, 1024),
                          "partitions": min(point.partitions, 64), "repeat": 1})
    _run_once(small, np.random.default_rng(1))
    rates, secs, rpt, bpt = [], [], 0.0, 0.0
    for _ in range(max(1, point.repeat)):
        s, n_done, rpt, bpt = _run_once(point, rng)
        secs.append(s)
        rates.append(n_done / s if s > 0 else float("inf"))
    return IndexResult(point, statistics.median(rates), secs, rpt, bpt)


def touch_pages(obj, depth: int = 2) -> None:
    """Write one byte per 4 KiB page of every array an index holds (values unchanged)."""
    if hasattr(obj, "touch_device_pages"):  # an index whose arrays live on a device
        obj.touch_device_pages()
    for v in vars(obj).values():
        if isinstance(v, np.ndarray) and v.size and v.flags.writeable and v.flags.c_contiguous:
            b = v.reshape(-1).view(np.uint8)
            # a copy: numpy skips ``b[::4096] = b[::4096]`` (same memory), which touched nothing
            b[::4096] = b[::4096].copy()
        elif depth > 0 and hasattr(v, "__dict__") and not isinstance(v, type):
            touch_pages(v, depth - 1)


def _run_once(point: IndexPoint, rng):
    if point.op == "insert":
        ix, batches = _fill(point, rng, point.batch)
        if point.warm_memory:
            touch_pages(ix)
        t0 = time.perf_counter()
        done = 0
        for k, t, s in batches:
            ix.insert(k, t, s)
            done += k.size
            if point.budget_s is not None and time.perf_counter() - t0 > point.budget_s:
                break
        sec = time.perf_counter() - t0
        return sec, done, 0.0, ix.nbytes / max(1, len(ix))
    if point.op == "expire":
        return _expire_once(point, rng)
    if point.op != "probe":
        raise ValueError(f"op must be insert, probe or expire, got {point.op!r}")
    ix, batches = _fill(point, rng, min(point.nsub, 1 << 20))
    for k, t, s in batches:
        ix.insert(k, t, s)
    pred = _pred(point)
    flt = WindowFilter.none()
    # several batches per timing, so that a fast index is not timed on one 3 ms call
    n_probe = point.batch * max(1, (1 << 18) // point.batch)
    if point.index == "nested":
        n_probe = min(point.batch, 16)
    while True:
        keys = np.sort(_keys(rng, n_probe, point))
        t0 = time.perf_counter()
        done = 0
        found = 0
        for a in range(0, n_probe, point.batch):
            kb = keys[a:a + point.batch]
            lo, hi = probe_bounds(pred, "R", kb)
            pi, _ = ix.probe(lo, hi, flt)
            found += pi.size
            done += kb.size
        sec = time.perf_counter() - t0
        if point.index != "nested" or sec > 0.5 or n_probe >= point.batch * 64:
            return sec, done, found / max(1, done), ix.nbytes / max(1, len(ix))
        n_probe *= 4


def _expire_once(point: IndexPoint, rng):
    ix, batches = _fill(point, rng, point.batch)
    for k, t, s in batches:
        ix.insert(k, t, s)
    n, per_tuple = len(ix), ix.nbytes / max(1, len(ix))
    del batches
    t0 = time.perf_counter()
    succ = make_index(point.index, point.nsub, "int64", point.partitions, point.threads,
                      predecessor=ix)
    del ix  # the last reference: its arrays are freed here, inside the timing
    sec = time.perf_counter() - t0
    del succ
    return sec, n, 0.0, per_tuple
