"""BI-Sort: Buffered Indexed Sort (PanJoin paper, section III-D; batch mode III-E/F; III-G3).

A subwindow kept fully sorted, made cheap to insert into by an insertion buffer and
cheap to search by an index array::

    main array (sorted, preallocated at capacity; M used)      insertion buffer (B, sorted)
    ┌────────────┬────────────┬────────────┬─────┬───────┐       ┌──────────┬──────┐
    │ partition 0│ partition 1│ partition 2│ ... │ free  │       │ 1 20 26  │ free │
    └────────────┴────────────┴────────────┴─────┴───────┘       └──────────┴──────┘
      ▲ idx[0]     ▲ idx[1]     ▲ idx[2]      index array: every step-th key,
                                              step = ceil(M / P), rebuilt after a merge

- insert (a sorted batch of K tuples): K > B -> merged straight into the main array
  (the buffer stays); otherwise merged into the buffer, which stays sorted, after
  the buffer, if the batch would overflow it, is merged into the main array. A merge runs in
  place from the back of the preallocated columns, O(M + K) but touching only the
  tuples that move, split over threads at merge-path co-ranks (III-G3). B defaults
  to capacity / 16 within [1K, 16K] (:func:`panjoin.config.bisort_buffer`: a small
  batch costs about B / 4K + M / 2B moves a tuple); the batch that fills the
  subwindow merges the buffer, so a full subwindow's probes search no buffer.
- probe (a sorted batch, per band a closed interval [lo, hi]): the matches in the
  main array are one contiguous range [start, end); each bound is found by the
  rebounding binary search on the index array, with cursors that only move right
  over the batch (the merge-like scan), then inside its one partition (over a fine
  index, step <= 16, the cursor runs 16 tuples ahead and prefetches each partition;
  over a coarse one, 32 probe tuples' searches run in lockstep: either way their cache
  misses overlap); a small batch over a large subwindow starts on an upper level of
  the index (every 8th entry of the level below) and goes down a line per level, 16
  probe tuples in lockstep; a dense
  batch (a probe tuple per 4 main rows or more) gallops over the main array
  itself. The sorted buffer's ranges are found the same way. Chunks of the batch
  run on ``threads`` threads; one thread runs a leaner kernel (one pass over the
  ranges, no parallel region). Results
  are pairs (``probe``), or ranges of the main array plus the buffer's pairs
  (``probe_ranges``), which the manager expands against its mirror of the main
  array (``main_columns``).
- expire: the manager drops the whole (oldest) subwindow.
- residual (``key2``, e.g. ``band:10&band2:10``): key2 is kept by arrival position
  (as every index does) and, with ``residual_layout="permuted"`` (the default),
  also permuted with the main array (``mk2[p]`` beside ``mkeys[p]``; after a merge
  only the rows from the first moved one on are refreshed). The probe checks it
  inside the kernel while it walks a candidate range
  (:func:`panjoin.subwindow.kernels.residual.bisort_probe_residual`), so failing
  candidates are never written; ``"gather"`` reads ``k2pos[seq - base]`` instead.

Worked trace, P = 3, B = 4, a dozen keys::

    insert [2 5 9 12 17 23 30]  7 > B: merge into the empty main array
        main  [2 5 9 | 12 17 23 | 30]       M = 7, step = ceil(7/3) = 3
        index [2 12 30]
    insert [5 14]               fits: buffer [5 14]
    insert [1 20 26]            2 + 3 > B: merge the buffer (back to front:
                                30 23 17 14 12 9 5 5, then [2] is already in place)
        main  [2 5 5 | 9 12 14 | 17 23 30]  M = 9, step = 3
        index [2 9 17]          buffer [1 20 26]
    probe band:2 from keys [6 15]  ->  intervals [4, 8] and [13, 17]
        [4, 8]:   first idx >= 4 is idx[1] = 9  -> start in (0, 3]: start = 1
                  first idx >  8 is idx[1]      -> end   in (0, 3]: end   = 3
        [13, 17]: gallop from idx[1]: idx[2] = 17 >= 13 -> start in (3, 6]: 5
                  gallop from idx[2]: none > 17 (q = 3)  -> end in (6, 9]: 7
        ranges (probe 0, [1, 3)) = keys 5 5 and (probe 1, [5, 7)) = keys 14 17;
        the buffer [1 20 26] adds nothing. (This is the index path; a batch this
        dense against so small a main array gallops over the main array instead.)

Memory: 24 bytes per tuple of capacity for the main array, plus 24 B for the
buffer and about 8 min(P, capacity) x 8/7 for the index array and its upper levels
(1.003x the raw columns at NSub = 8M, P = 64K, B = 1K). A merge allocates temporaries
of at most the run's size (the OpenCL twin's buffer sort) or max(run, capacity / 16)
rows (the parallel merge's stash; beyond that it merges on one thread), never a
second main array.

The main array's layout is a deterministic function of the insert sequence (a merged
run goes right of equal main keys, whatever the thread count), so a mirror replaying
the same inserts holds the same main array, and ranges mean the same rows on both
sides.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from panjoin.config import bisort_buffer
from panjoin.subwindow.base import Residual, SubwindowIndex, WindowFilter, no_pairs
from panjoin.subwindow.kernels.bisort import (
    FAN,
    build_index,
    build_levels,
    first_moved,
    merge_back,
    merge_piece,
    merge_plan,
    probe_kernel,
    probe_pairs,
)
from panjoin.subwindow.kernels.residual import bisort_probe_residual

#: smallest merge (main + run tuples) worth splitting over threads
PAR_MERGE_MIN = 1 << 16
#: fewest probe tuples per chunk worth a thread of its own
PROBE_CHUNK_MIN = 64

_POOLS: dict[int, ThreadPoolExecutor] = {}


def _merge_pool(workers: int) -> ThreadPoolExecutor:
    """Threads that run merge pieces (shared by all subwindows; kernels drop the GIL)."""
    pool = _POOLS.get(workers)
    if pool is None:
        pool = _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="bisort-merge")
    return pool


@dataclass
class RangeResult:
    """A probe's result as index records (paper III-D, the <id_start, id_end> format).

    Main array: rows ``[start[k], end[k])`` of :meth:`BISort.main_columns` match probe
    tuple ``probe_idx[k]`` (one record per non-empty (probe tuple, band); the window
    filter is NOT applied, the caller filters after expanding). Buffer: the pairs
    ``(buf_probe_idx, buf_seq)``, window filter applied.
    """

    probe_idx: np.ndarray
    start: np.ndarray
    end: np.ndarray
    buf_probe_idx: np.ndarray
    buf_seq: np.ndarray

    @property
    def n_main(self) -> int:
        """Candidate pairs the main-array records stand for."""
        return int((self.end - self.start).sum())

    def expand(self, keys: np.ndarray, ts: np.ndarray, seq: np.ndarray,
               flt: WindowFilter | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(probe_idx, seq)`` pairs: main ranges expanded against the columns given
        (the subwindow's or a mirror's) and filtered, then the buffer pairs."""
        lens = self.end - self.start
        total = int(lens.sum())
        pidx = np.repeat(self.probe_idx, lens)
        # row = start of its record + offset inside the record
        first = np.repeat(np.cumsum(lens) - lens, lens)
        rows = np.repeat(self.start, lens) + (np.arange(total, dtype=np.int64) - first)
        s = seq[rows]
        if flt is not None:
            keep = flt.mask(pidx, s, ts[rows])
            pidx, s = pidx[keep], s[keep]
        return (np.concatenate([pidx, self.buf_probe_idx]),
                np.concatenate([s, self.buf_seq]))


def buffer_insert(ix, name: str, keys, ts, seq, key2=None) -> tuple[int, int]:
    """The insertion buffer's front half, shared by BI-Sort and its OpenCL twin: check
    the batch, merge a batch larger than the buffer at once, else append it to the
    buffer (merging a full buffer first); an index with ``sorted_buffer`` merges it into
    the buffer instead, which stays sorted. A batch that fills the subwindow leaves the
    buffer empty (merged into the main array). Returns ``(a, k)``: buffer rows ``a:a + k``
    changed (the batch's rows; a sorted buffer's whole used part); ``k == 0`` when
    nothing was buffered."""
    keys, ts, seq = ix._check_insert(keys, ts, seq, key2)
    k = keys.shape[0]
    if k == 0:
        return 0, 0
    if k > 1 and not bool(np.all(keys[1:] >= keys[:-1])):
        raise ValueError(f"{name}: insert batch must be sorted by key")
    if k > ix.buffer_size:
        ix._merge(keys, ts, seq, k)
        return 0, 0
    if ix.nbuf + k > ix.buffer_size:
        ix.flush()
    a = ix.nbuf
    if ix.sorted_buffer:
        # merged in, stable (buffered tuples stay left of equal keys): the buffer is
        # what a stable sort of its arrivals gives, so a flush merges it as it is
        merge_back(ix.bkeys, ix.bts, ix.bseq, a, keys, ts, seq, k)
        ix.nbuf += k
        a, k = 0, ix.nbuf
    else:
        ix.bkeys[a:a + k] = keys
        ix.bts[a:a + k] = ts
        ix.bseq[a:a + k] = seq
        ix.nbuf += k
    if len(ix) == ix.capacity:
        # full: no insert follows, and the subwindow is probed by every batch of the
        # other stream until it expires, each probe searching the buffer too (and
        # reading ts for every candidate): one merge now spares them all
        ix.flush()
        return 0, 0
    return a, k


def buffer_flush(ix) -> None:
    """The insertion buffer's back half, shared like :func:`buffer_insert`: sort the
    buffer (unless it is kept sorted) and merge it into the main array."""
    n = ix.nbuf
    if n == 0:
        return
    if ix.sorted_buffer:
        ix._merge(ix.bkeys[:n], ix.bts[:n], ix.bseq[:n], n)
    else:
        # stable, so that a mirror replaying the inserts sorts ties the same way
        order = np.argsort(ix.bkeys[:n], kind="stable")
        ix._merge(ix.bkeys[:n][order], ix.bts[:n][order], ix.bseq[:n][order], n)
    ix.nbuf = 0


def check_state(ix, mk, ms, idx, bseq, idx_cap: int, where: str = ""):
    """The invariants every BI-Sort keeps, wherever its arrays live (the Numba one and its
    OpenCL twin): sizes within the preallocated arrays, the main array sorted, the index
    array = every step-th main key with step = ceil(M / P), every stored seq once.

    ``mk, ms``: main rows [0, M) (keys, seqs); ``idx``: the index array's ``nidx``
    entries; ``bseq``: the buffer's seqs; ``idx_cap``: the index array's capacity;
    ``where``: added to the state dump (e.g. the device). Returns the dump function, for
    the caller's own asserts."""

    def state():
        return (f"{ix.kind}{where}: M={ix.m} nbuf={ix.nbuf}/{ix.buffer_size} "
                f"step={ix.step} nidx={ix.nidx} cap={ix.capacity}\n"
                f"main={mk[:40]} index={idx[:20]}")

    m = ix.m
    # sizes within the preallocated arrays
    assert 0 <= m <= ix.capacity, state()
    assert 0 <= ix.nbuf <= ix.buffer_size, state()
    assert m + ix.nbuf == len(ix) <= ix.capacity, state()
    # main array sorted
    assert mk.shape[0] == m and ms.shape[0] == m, "main columns of the wrong length\n" + state()
    assert m < 2 or bool(np.all(mk[1:] >= mk[:-1])), "main array not sorted\n" + state()
    # index array = every step-th main key, step = ceil(M / P)
    step = max(1, -(-m // ix.partitions))
    assert ix.step == step, "wrong index step\n" + state()
    assert ix.nidx == (m + step - 1) // step <= idx_cap, state()
    assert np.array_equal(idx, mk[::step]), "stale index\n" + state()
    # every stored tuple once: seq values unique over main array and buffer
    seqs = np.concatenate([ms, bseq])
    assert np.unique(seqs).shape[0] == seqs.shape[0], "duplicate seq\n" + state()
    return state


def aligned_empty(n: int, dtype, align: int = 64) -> np.ndarray:
    """``np.empty(n, dtype)`` whose first element starts on an ``align``-byte boundary
    (a view into a slightly larger array; numpy's own start 16 bytes past one)."""
    dtype = np.dtype(dtype)
    raw = np.empty(n + align // dtype.itemsize, dtype=dtype)
    off = (-raw.ctypes.data % align) // dtype.itemsize
    return raw[off:off + n]


class BISort(SubwindowIndex):
    """Sorted main array + insertion buffer + index array; see the module docstring."""

    kind = "bisort"
    #: the insertion buffer is kept sorted (each batch merged into it), so a probe finds
    #: its matches there by the same merge-like gallop as in the main array
    sorted_buffer = True

    def __init__(self, capacity, key_dtype=np.int64, partitions=1024, threads=1,
                 predecessor=None, **opts):
        super().__init__(capacity, key_dtype, partitions, threads)
        buffer = int(opts.get("buffer", bisort_buffer(self.capacity)))
        if buffer <= 0:
            raise ValueError(f"bisort: insertion buffer size must be positive, got {buffer}")
        # a buffer beyond the capacity could never fill
        self.buffer_size = min(buffer, self.capacity)
        self.par_merge_min = int(opts.get("par_merge_min", PAR_MERGE_MIN))
        layout = opts.get("residual_layout", "permuted")
        if layout not in ("permuted", "gather"):
            raise ValueError(f"bisort: residual_layout is 'permuted' or 'gather', not {layout!r}")
        self.residual_layout = layout
        self.mk2: np.ndarray | None = None  # key2 of main rows (permuted layout), lazily
        kd = self.key_dtype
        # on cache-line boundaries, so that a partition of 8 rows (step 8, a sparse
        # probe's unit) is one line: locate_sparse prefetches one line per column
        self.mkeys = aligned_empty(self.capacity, kd)
        self.mts = aligned_empty(self.capacity, np.int64)
        self.mseq = aligned_empty(self.capacity, np.int64)
        self.m = 0
        self.bkeys = np.empty(self.buffer_size, dtype=kd)
        self.bts = np.empty(self.buffer_size, dtype=np.int64)
        self.bseq = np.empty(self.buffer_size, dtype=np.int64)
        self.nbuf = 0
        # at most P entries, and never more than there are tuples; padded to whole lines
        ncap = min(self.partitions, self.capacity)
        self.index = aligned_empty(-(-ncap // FAN) * FAN, kd)
        self.nidx = 0
        self.step = 1
        # the index's upper levels (see build_levels): level k from lvoff[k], each
        # padded to whole lines, up to the first of at most FAN entries
        offs = [0, 0]
        n = ncap
        while n > FAN:
            n = -(-n // FAN)
            offs.append(offs[-1] + -(-n // FAN) * FAN)
        self.lvoff = np.array(offs[:-1], dtype=np.int64)
        self.up = aligned_empty(max(offs[-1], 1), kd)
        self.nlev = 0
        self._pad = np.iinfo(kd).max if kd.kind in "iu" else np.inf

    # ------------------------------------------------------------------ insert

    def insert(self, keys, ts, seq, key2=None):
        """Insert a sorted batch. O(K) into the buffer, else O(moved + K) per merge."""
        buffer_insert(self, "bisort", keys, ts, seq, key2)

    def flush(self) -> None:
        """Merge the (sorted) insertion buffer into the main array."""
        buffer_flush(self)

    def _merge(self, rk, rt, rs, r):
        # rows below the first main key > the run's smallest stay in place (stable merge),
        # and so do their index entries
        f = int(first_moved(self.mkeys, self.m, rk[0]))
        self._merge_cols(rk, rt, rs, r)
        if self._k2 is not None and self.residual_layout == "permuted":
            if self.mk2 is None:
                self.mk2 = np.empty(self.capacity, dtype=np.float64)
                f = 0
            end = self.m + r
            self.mk2[f:end] = self._k2[self.mseq[f:end] - self._k2base]
        self.m += r
        self._rebuild_index(f)

    def _merge_cols(self, rk, rt, rs, r):
        parts = self.threads
        if parts > 1 and self.m + r >= self.par_merge_min:
            self._merge_parallel(rk, rt, rs, r, parts)
        else:
            merge_back(self.mkeys, self.mts, self.mseq, self.m, rk, rt, rs, r)

    def _merge_parallel(self, rk, rt, rs, r, parts):
        """The merge cut into ``parts`` pieces run by threads (see ``merge_plan``)."""
        mk, mt, ms = self.mkeys, self.mts, self.mseq
        oi, oj, soff = merge_plan(mk, self.m, rk, r, parts)
        # the stash is bounded by the run, or 1/16 of the capacity for big merges
        if soff[parts] > max(r, self.capacity // 16):
            merge_back(mk, mt, ms, self.m, rk, rt, rs, r)
            return
        stash = [np.empty(soff[parts], dtype=a.dtype) for a in (mk, mt, ms)]
        jobs = []
        for t in range(parts):
            a, z = soff[t], soff[t + 1]
            for col, src in zip(stash, (mk, mt, ms), strict=True):
                col[a:z] = src[oi[t]:oi[t] + z - a]
            jobs.append((mk, mt, ms, rk, rt, rs, oi[t], oi[t + 1], oj[t], oj[t + 1],
                         oi[t] + z - a, stash[0][a:z], stash[1][a:z], stash[2][a:z]))
        pool = _merge_pool(parts - 1)
        futures = [pool.submit(merge_piece, *job) for job in jobs[1:]]
        merge_piece(*jobs[0])
        for f in futures:
            f.result()

    def _rebuild_index(self, first: int = 0):
        """The index array and its levels after a merge whose first moved row is
        ``first`` (entries of rows below it are kept, unless the step changed)."""
        step = max(1, -(-self.m // self.partitions))  # ceil(M / P)
        q0 = -(-first // step) if step == self.step else 0
        self.step = step
        self.nidx = int(build_index(self.mkeys, self.m, step, self.index, q0))
        self.nlev = int(build_levels(self.index, self.nidx, self.up, self.lvoff, self._pad, q0))

    # ------------------------------------------------------------------ probe

    def _probe_args(self, lo, hi, flt):
        c0, c1, c2 = flt.arrays(lo.shape[1])
        parts = max(1, min(self.threads, lo.shape[1] // PROBE_CHUNK_MIN))
        return c0, c1, c2, parts

    def probe(self, lo, hi, flt: WindowFilter | None = None, res: Residual | None = None):
        """Matching ``(probe_idx, seq)`` pairs. O(n log(M/n) + results + n B) per batch;
        with a residual ``res``, O(n log(M/n) + candidates + n B), writing only results."""
        lo, hi, flt = self._check_probe(lo, hi, flt)
        if lo.shape[1] == 0 or len(self) == 0:
            return no_pairs()
        c0, c1, c2, parts = self._probe_args(lo, hi, flt)
        res = self._check_residual(res, lo.shape[1])
        if res is not None:
            permuted = self.residual_layout == "permuted" and self.mk2 is not None
            mk2 = self.mk2 if permuted else self._k2
            return bisort_probe_residual(
                self.mkeys, self.mts, self.mseq, mk2, self.m, self.index, self.nidx, self.step,
                self.up, self.lvoff, self.nlev, self.bkeys, self.bts, self.bseq, self.nbuf,
                self._k2, self._k2base, lo, hi,
                flt.mode, c0, c1, c2, res.lo, res.hi, parts, permuted)
        if parts == 1:  # the lean one-thread kernel: no parallel region, fewer passes
            return probe_pairs(
                self.mkeys, self.mts, self.mseq, self.m, self.index, self.nidx, self.step,
                self.up, self.lvoff, self.nlev, self.bkeys, self.bts, self.bseq, self.nbuf,
                lo, hi, flt.mode, c0, c1, c2)
        p, q, _, _, _ = probe_kernel(
            self.mkeys, self.mts, self.mseq, self.m, self.index, self.nidx, self.step,
            self.up, self.lvoff, self.nlev, self.bkeys, self.bts, self.bseq, self.nbuf,
            lo, hi, flt.mode, c0, c1, c2, parts,
            False)
        return p, q

    def probe_ranges(self, lo, hi, flt: WindowFilter | None = None) -> RangeResult:
        """The result as main-array ranges (unfiltered) plus buffer pairs (filtered)."""
        lo, hi, flt = self._check_probe(lo, hi, flt)
        z = np.zeros(0, dtype=np.int64)
        if lo.shape[1] == 0 or len(self) == 0:
            return RangeResult(z, z.copy(), z.copy(), z.copy(), z.copy())
        c0, c1, c2, parts = self._probe_args(lo, hi, flt)
        return RangeResult(*probe_kernel(
            self.mkeys, self.mts, self.mseq, self.m, self.index, self.nidx, self.step,
            self.up, self.lvoff, self.nlev, self.bkeys, self.bts, self.bseq, self.nbuf,
            lo, hi, flt.mode, c0, c1, c2, parts,
            True))

    def main_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Views ``(key, ts, seq)`` of main rows [0, M): what ranges index into."""
        return self.mkeys[:self.m], self.mts[:self.m], self.mseq[:self.m]

    # ------------------------------------------------------------------ state

    def __len__(self):
        return self.m + self.nbuf

    @property
    def nbytes(self):
        return sum(a.nbytes for a in (self.mkeys, self.mts, self.mseq, self.bkeys, self.bts,
                                      self.bseq, self.index, self.up, self._k2, self.mk2)
                   if a is not None)

    def memory_ratio(self) -> float:
        """``nbytes`` over the raw key + ts + seq bytes at capacity (24 per tuple)."""
        return self.nbytes / (24 * self.capacity)

    def check(self):
        m = self.m
        bk = self.bkeys[:self.nbuf]
        assert bk.shape[0] < 2 or bool(np.all(bk[1:] >= bk[:-1])), "buffer not sorted"
        state = check_state(self, self.mkeys[:m], self.mseq[:m], self.index[:self.nidx],
                            self.bseq[:self.nbuf], self.index.shape[0])
        # index array padded to whole lines; level k >= 1 = every FAN-th entry of level
        # k - 1, padded too, up to the first level of at most FAN entries
        nidx = self.nidx
        lvl = self.index[:-(-nidx // FAN) * FAN]
        assert np.all(lvl[nidx:] == self._pad), "index padding\n" + state()
        k = 0
        while lvl.shape[0] > FAN:
            k += 1
            n = -(-nidx // FAN)
            up = self.up[self.lvoff[k]:self.lvoff[k] + -(-n // FAN) * FAN]
            assert np.array_equal(up[:n], lvl[:nidx:FAN]), f"stale level {k}\n" + state()
            assert np.all(up[n:] == self._pad), f"level {k} padding\n" + state()
            lvl, nidx = up, n
        assert self.nlev == k, "wrong level count\n" + state()
        # key2 permuted with the main array agrees with key2 by arrival position
        if self.mk2 is not None and self._k2 is not None and m:
            want = self._k2[self.mseq[:m] - self._k2base]
            assert np.array_equal(self.mk2[:m], want), "stale main key2\n" + state()


__all__ = ["BISort", "RangeResult"]
