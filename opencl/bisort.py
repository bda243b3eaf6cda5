"""BI-Sort on an OpenCL device (PanJoin paper, section IV, Figures 7-9).

The same structure and results as :class:`panjoin.subwindow.bi_sort.BISort` (sorted
main array + insertion buffer + index array, see that module for the worked
trace), with the main array, the index array and the buffer held in device
memory between commands, and the work done by the FPGA design's engines as
kernels (``opencl/kernels/bisort.cl``)::

    host                              device (Figure 7)
    insert batch --(K > B)--------->  insertion engine: merge_path, stash,
      | K <= B: append to buffer        mergers x N (in place, disjoint pieces),
      | (host copy + device copy)       indexer
      | buffer full: stable sort ---> (the sorted buffer is the merged run)
    probe lo/hi, or keys ---------->  probing engine: boundary generator (keys),
                                        partitioners, probers x N (count, host
                                        prefix sum, emit)
                                 <---  pairs, or (start, end) ranges + buffer pairs

- **insert**: as the Numba BI-Sort: a batch larger than the buffer B is merged
  straight into the main array; otherwise it is appended to the buffer, which is
  first sorted (on the host, stable, where its copy lives) and merged when the
  batch would overflow it. A merge cuts the moving part of the output into
  ``mergers`` pieces at merge-path co-ranks (one small read-back), stashes the
  front rows a piece would lose, and runs one merger per piece; then the
  indexer rebuilds the index array (every ``step``-th key, step = ceil(M / P)).
  Main tuples stay left of equal run tuples, so the layout is the Numba one,
  row for row, whatever the number of mergers.
- **probe**: :meth:`probe` takes the bounds from the manager, as every index does
  (:func:`panjoin.semantics.probe_bounds`); :meth:`probe_keys` takes the probe keys
  and makes the bounds on the device (the boundary generator: int64 keys, overflow
  detected as probe_bounds does; float64 keys, whose band edges are rounded to the
  ulp, get probe_bounds' bounds uploaded). The batch is cut into ``probers`` chunks; per
  chunk and band a partitioner finds each bound's target partition through the
  index array with a cursor that only moves right; per chunk a prober finds the
  exact rows inside those partitions, counts the results (window filter
  applied; the buffer scanned), the host turns counts into offsets, and the
  prober writes them. Results come back in the Numba BI-Sort's order.

The number of mergers and probers is a parameter (``mergers=8, probers=8`` as in
the paper); each is one work-group of one work-item, so a CPU device runs them on
its cores and a GPU or FPGA on its compute units.
"""

from __future__ import annotations

import numpy as np

from opencl.device import runtime
from panjoin.config import bisort_buffer
from panjoin.semantics import I64_MAX, I64_MIN, _int_band, probe_bounds, stored_bands
from panjoin.subwindow.base import Residual, ResidualError, SubwindowIndex, WindowFilter
from panjoin.subwindow.bi_sort import RangeResult, buffer_flush, buffer_insert, check_state
from panjoin.subwindow.kernels import window as W

#: the paper's FPGA design: 8 mergers and 8 probers
MERGERS = 8
PROBERS = 8
#: smallest merge (main + run tuples) worth several mergers (a merge-path read-back)
PAR_MERGE_MIN = 1 << 12
#: fewest probe tuples per prober
PROBE_CHUNK_MIN = 16

#: work-group size of the one-item-per-element kernels (indexer, boundary generator):
#: fixed, as pocl compiles a kernel anew for every work-group size it is launched with
WG = 64

_KERNELS = ("merge_path", "stash", "merger", "indexer", "partitioner", "prober_count",
            "prober_emit")

i64 = np.int64


def _pad(n: int) -> int:
    """``n`` rounded up to whole work-groups of WG."""
    return max(WG, -(-n // WG) * WG)


class OpenCLBISort(SubwindowIndex):
    """BI-Sort whose main array lives on an OpenCL device; see the module docstring.

    Options (besides those of every index): ``buffer`` (B), ``mergers``, ``probers``,
    ``par_merge_min``, ``device`` (a device spec, see :mod:`opencl.device`; default
    ``$PANJOIN_OPENCL_DEVICE``, else the pocl CPU device).
    """

    kind = "bisort-opencl"
    #: the buffer is appended to (each batch copied to the device as it comes) and
    #: scanned by the device's probe kernel; sorted only when merged
    sorted_buffer = False

    def __init__(self, capacity, key_dtype=np.int64, partitions=1024, threads=1,
                 predecessor=None, **opts):
        super().__init__(capacity, key_dtype, partitions, threads)
        buffer = int(opts.get("buffer", bisort_buffer(self.capacity)))
        if buffer <= 0:
            raise ValueError(f"bisort-opencl: insertion buffer size must be positive, "
                             f"got {buffer}")
        self.buffer_size = min(buffer, self.capacity)
        self.mergers = int(opts.get("mergers", MERGERS))
        self.probers = int(opts.get("probers", PROBERS))
        if self.mergers < 1 or self.probers < 1:
            raise ValueError("bisort-opencl: mergers and probers must be >= 1, got "
                             f"{self.mergers} and {self.probers}")
        self.par_merge_min = int(opts.get("par_merge_min", PAR_MERGE_MIN))
        dev = opts.get("device")
        self.rt = runtime(None if dev in (None, "") else str(dev))
        import pyopencl as cl

        self._cl = cl
        prg = self.rt.program(self.key_dtype)
        # kernel objects of our own: argument setting is not shared between subwindows
        names = _KERNELS + (("boundary_generator",) if self.key_dtype == i64 else ())
        self.k = {name: cl.Kernel(prg, name) for name in names}
        kd = self.key_dtype
        self.m = 0
        self.nbuf = 0
        self.nidx = 0
        self.step = 1
        nidx_cap = min(self.partitions, self.capacity)
        # device memory: main array, buffer and index array, kept between commands
        self.d_mk = self._buf(self.capacity * 8)
        self.d_mt = self._buf(self.capacity * 8)
        self.d_ms = self._buf(self.capacity * 8)
        self.d_bk = self._buf(self.buffer_size * 8)
        self.d_bt = self._buf(self.buffer_size * 8)
        self.d_bs = self._buf(self.buffer_size * 8)
        self.d_idx = self._buf(nidx_cap * 8)
        self._nidx_cap = nidx_cap
        #: merges, merges cut over several mergers, rows stashed by those
        self.merge_stats = {"merges": 0, "split": 0, "stashed": 0}
        # the host's copy of the buffer (sorted here before a merge)
        self.bkeys = np.empty(self.buffer_size, dtype=kd)
        self.bts = np.empty(self.buffer_size, dtype=i64)
        self.bseq = np.empty(self.buffer_size, dtype=i64)

    # ------------------------------------------------------------------ device helpers

    @property
    def queue(self):
        return self.rt.queue

    def _buf(self, nbytes):
        # OpenCL has no zero-sized buffer
        return self._cl.Buffer(self.rt.context, self._cl.mem_flags.READ_WRITE, max(8, nbytes))

    def _up(self, a):
        """A device copy of host array ``a`` (a temporary for one command)."""
        a = np.ascontiguousarray(a)
        if a.size == 0:
            return self._buf(8)
        mf = self._cl.mem_flags
        return self._cl.Buffer(self.rt.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)

    def _down(self, dbuf, n, dtype=i64, wait=True):
        """``n`` values from the device; ``wait=False``: valid after ``queue.finish()``."""
        out = np.empty(n, dtype=dtype)
        if n:
            self._cl.enqueue_copy(self.queue, out, dbuf, is_blocking=wait)
        return out

    def _run(self, name, gsize, *args):
        """Launch kernel ``name`` over ``gsize`` work-groups of one work-item each."""
        gsize = tuple(int(g) for g in gsize)
        self.k[name](self.queue, gsize, (1,) * len(gsize), *args)

    # ------------------------------------------------------------------ insertion engine

    def insert(self, keys, ts, seq, key2=None):
        """Insert a sorted batch: O(K) into the buffer, else a merge on the device."""
        a, k = buffer_insert(self, "bisort-opencl", keys, ts, seq, key2)
        if k == 0:
            return
        # not blocking: the source rows of the host's copy are not written again before
        # a merge, which waits for the queue (and the in-order queue runs every later
        # kernel after these copies)
        for dst, src in ((self.d_bk, self.bkeys), (self.d_bt, self.bts), (self.d_bs, self.bseq)):
            self._cl.enqueue_copy(self.queue, dst, src[a:a + k], dst_offset=a * 8,
                                  is_blocking=False)

    def flush(self) -> None:
        """Sort the insertion buffer (stable, as the Numba BI-Sort) and merge it."""
        buffer_flush(self)

    def _merge(self, rk, rt, rs, r):
        """Merge the sorted run into the main array on the device, then re-index."""
        d_rk, d_rt, d_rs = self._up(rk), self._up(rt), self._up(rs)
        parts = self.mergers if self.m + r >= self.par_merge_min else 1
        # piece t stashes at most oj[t] <= r rows: a temporary of at most mergers x run rows
        oi, oj, soff = self._merge_plan(d_rk, r, parts)
        d_oi, d_oj, d_soff = self._up(oi), self._up(oj), self._up(soff)
        ns = int(soff[parts])
        self.merge_stats["merges"] += 1
        self.merge_stats["split"] += parts > 1
        self.merge_stats["stashed"] += ns
        d_sk, d_st, d_ss = (self._buf(ns * 8) for _ in range(3))
        if ns:
            self._run("stash", (parts,), self.d_mk, self.d_mt, self.d_ms, d_oi, d_soff,
                      d_sk, d_st, d_ss)
        self._run("merger", (parts,), self.d_mk, self.d_mt, self.d_ms, d_rk, d_rt, d_rs,
                  d_oi, d_oj, d_soff, d_sk, d_st, d_ss)
        self.m += r
        self.step = max(1, -(-self.m // self.partitions))  # ceil(M / P)
        self.nidx = (self.m + self.step - 1) // self.step
        self.k["indexer"](self.queue, (_pad(self.nidx),), (WG,), self.d_mk, i64(self.step),
                          i64(self.nidx), self.d_idx)
        self.queue.finish()

    def _merge_plan(self, d_rk, r, parts):
        """Merge-path cut on the device: ``oi, oj`` co-ranks, ``soff`` stash offsets."""
        d_oi, d_oj = self._buf((parts + 1) * 8), self._buf((parts + 1) * 8)
        self._run("merge_path", (parts + 1,), self.d_mk, i64(self.m), d_rk, i64(r),
                  i64(parts), d_oi, d_oj)
        # in order: once the second copy is done, so is the first
        oi, oj = self._down(d_oi, parts + 1, wait=False), self._down(d_oj, parts + 1)
        # piece t's main rows below min(o_t, oi[t+1]) are overwritten by pieces left of it
        s_end = np.minimum(oi[:-1] + oj[:-1], oi[1:])
        soff = np.zeros(parts + 1, dtype=i64)
        np.cumsum(np.maximum(0, s_end - oi[:-1]), out=soff[1:])
        return oi, oj, soff

    # ------------------------------------------------------------------ probing engine

    def _band_edges(self, pred, probe_stream):
        """Integer edges and flags per band for the boundary generator, or None when an
        edge lies beyond int64 (then the host's probe_bounds is exact and used)."""
        if pred.negated:
            bands = [(None, -1), (1, None)]  # s.key != r.key: below k, or above k
        else:
            bands = [_int_band(a, b) for a, b in stored_bands(pred, probe_stream)]
        ea, eb, fl = [], [], []
        for a, b in bands:
            if any(x is not None and not I64_MIN <= x <= I64_MAX for x in (a, b)):
                return None
            fl.append((a is None) * 1 + (b is None) * 2
                      + (a is not None and b is not None and a > b) * 4)
            ea.append(0 if a is None else a)
            eb.append(0 if b is None else b)
        return np.array(ea, i64), np.array(eb, i64), np.array(fl, np.int32)

    def _device_bounds(self, pred, probe_stream, keys):
        """Device buffers lo, hi of shape (bands, n): the boundary generator for int64
        keys, the host's probe_bounds (uploaded) for float64 keys or huge band edges."""
        keys = np.ascontiguousarray(keys)
        if keys.dtype != self.key_dtype or keys.ndim != 1:
            raise TypeError(f"{self.kind}: probe keys must be a 1-d {self.key_dtype} array")
        edges = self._band_edges(pred, probe_stream) if self.key_dtype == i64 else None
        if edges is None or keys.shape[0] == 0:
            lo, hi = probe_bounds(pred, probe_stream, keys)
            return self._up(lo), self._up(hi), lo.shape[0]
        nb, n = edges[0].shape[0], keys.shape[0]
        d_lo, d_hi = self._buf(nb * n * 8), self._buf(nb * n * 8)
        self.k["boundary_generator"](self.queue, (_pad(n), nb), (WG, 1), self._up(keys), i64(n),
                                     *(self._up(e) for e in edges), d_lo, d_hi)
        return d_lo, d_hi, nb

    def bounds(self, pred, probe_stream: str, keys) -> tuple[np.ndarray, np.ndarray]:
        """``probe_bounds(pred, probe_stream, keys)`` made by the boundary generator."""
        d_lo, d_hi, nb = self._device_bounds(pred, probe_stream, keys)
        n = np.asarray(keys).shape[0]
        lo, hi = (self._down(d, nb * n, self.key_dtype).reshape(nb, n) for d in (d_lo, d_hi))
        return lo, hi

    def probe_keys(self, pred, probe_stream: str, keys, flt: WindowFilter | None = None,
                   ranges: bool = False):
        """Probe with a sorted batch of keys: the bounds are made on the device and never
        leave it (the paper's probing engine end to end). Returns what :meth:`probe`
        returns, or a :class:`RangeResult` when ``ranges``. A predicate with a residual on
        key2 is refused: use :meth:`probe` with ``res`` (the host checks it)."""
        if getattr(pred, "residual", None) is not None:
            raise ResidualError(f"{self.kind}: probe_keys has no residual (key2) condition; "
                                "call probe(lo, hi, flt, res) for predicate " + str(pred))
        n = np.asarray(keys).shape[0]
        if flt is None:
            flt = WindowFilter.none(n)
        elif flt.mode != W.NONE and flt.c0.shape[0] != n:
            raise ValueError(f"{self.kind}: window filter has the wrong length")
        if n == 0 or len(self) == 0:
            z = np.zeros(0, dtype=i64)
            return RangeResult(z, z, z, z, z) if ranges else (z, z.copy())
        d_lo, d_hi, nb = self._device_bounds(pred, probe_stream, keys)
        out = self._probe_dev(d_lo, d_hi, nb, n, flt, int(ranges))
        return RangeResult(*out) if ranges else out[:2]

    def _probe(self, lo, hi, flt, ranges):
        nb, n = lo.shape
        return self._probe_dev(self._up(lo), self._up(hi), nb, n, flt, ranges)

    def _probe_dev(self, d_lo, d_hi, nb, n, flt, ranges):
        parts = max(1, min(self.probers, n // PROBE_CHUNK_MIN))
        mode = int(flt.mode)
        c0, c1, c2 = (np.ascontiguousarray(c, dtype=i64) for c in flt.arrays(n))
        d_c0, d_c1, d_c2 = self._up(c0), self._up(c1), self._up(c2)
        d_qs, d_qe, d_st, d_en = (self._buf(nb * n * 8) for _ in range(4))
        d_cnt = self._buf(2 * n * 8)  # main counts, then buffer counts
        # partitioners: (chunk, band); probers: chunk
        self._run("partitioner", (parts, nb), self.d_idx, i64(self.nidx), i64(self.m), d_lo,
                  d_hi, i64(n), i64(parts), d_qs, d_qe)
        self._run("prober_count", (parts,), self.d_mk, self.d_mt, self.d_ms, i64(self.m),
                  i64(self.step), self.d_bk, self.d_bt, self.d_bs, i64(self.nbuf), d_lo, d_hi,
                  i64(nb), i64(n), i64(parts), d_qs, d_qe, np.int32(mode), d_c0, d_c1, d_c2,
                  np.int32(ranges), d_st, d_en, d_cnt)
        both = self._down(d_cnt, 2 * n)  # the one wait between the passes
        counts, bcount = both[:n], both[n:]
        if not ranges:
            counts = counts + bcount
        offs = np.zeros(n + 1, dtype=i64)
        np.cumsum(counts, out=offs[1:])
        boffs = np.zeros(n + 1, dtype=i64)
        np.cumsum(bcount, out=boffs[1:])
        total, btotal = int(offs[n]), int(boffs[n]) if ranges else 0
        d_offs, d_boffs = self._up(offs), self._up(boffs)
        d_op, d_oa = self._buf(total * 8), self._buf(total * 8)
        d_ob = self._buf(total * 8 if ranges else 0)
        d_bp, d_bq = self._buf(btotal * 8), self._buf(btotal * 8)
        self._run("prober_emit", (parts,), self.d_mk, self.d_mt, self.d_ms, self.d_bk,
                  self.d_bt, self.d_bs, i64(self.nbuf), d_lo, d_hi, i64(nb), i64(n),
                  i64(parts), np.int32(mode), d_c0, d_c1, d_c2, np.int32(ranges), d_st, d_en,
                  d_offs, d_boffs, d_op, d_oa, d_ob, d_bp, d_bq)
        out = (self._down(d_op, total, wait=False), self._down(d_oa, total, wait=False),
               self._down(d_ob, total if ranges else 0, wait=False),
               self._down(d_bp, btotal, wait=False), self._down(d_bq, btotal, wait=False))
        self.queue.finish()
        return out

    def probe(self, lo, hi, flt: WindowFilter | None = None, res: Residual | None = None):
        """Matching ``(probe_idx, seq)`` pairs, as :meth:`BISort.probe`."""
        lo, hi, flt = self._check_probe(lo, hi, flt)
        if lo.shape[1] == 0 or len(self) == 0:
            z = np.zeros(0, dtype=i64)
            return z, z.copy()
        p, q, _, _, _ = self._probe(lo, hi, flt, 0)
        return self._keep_residual(p, q, res, lo.shape[1])

    def probe_ranges(self, lo, hi, flt: WindowFilter | None = None) -> RangeResult:
        """Main-array ranges (unfiltered) plus buffer pairs (filtered), as the Numba one."""
        lo, hi, flt = self._check_probe(lo, hi, flt)
        z = np.zeros(0, dtype=i64)
        if lo.shape[1] == 0 or len(self) == 0:
            return RangeResult(z, z.copy(), z.copy(), z.copy(), z.copy())
        return RangeResult(*self._probe(lo, hi, flt, 1))

    def main_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies ``(key, ts, seq)`` of main rows [0, M), read back from the device."""
        return (self._down(self.d_mk, self.m, self.key_dtype), self._down(self.d_mt, self.m),
                self._down(self.d_ms, self.m))

    def index_array(self) -> np.ndarray:
        return self._down(self.d_idx, self.nidx, self.key_dtype)

    def touch_device_pages(self) -> None:
        """Write every page of the device arrays once (zeros), so that a timed insert
        does not pay the first-touch page faults (benchmarks' warm memory)."""
        zero = np.zeros(1, dtype=i64)
        for b in (self.d_mk, self.d_mt, self.d_ms, self.d_bk, self.d_bt, self.d_bs,
                  self.d_idx):
            self._cl.enqueue_fill_buffer(self.queue, b, zero, 0, b.size)
        self.queue.finish()

    # ------------------------------------------------------------------ state

    def __len__(self):
        return self.m + self.nbuf

    @property
    def device_name(self) -> str:
        return self.rt.name

    @property
    def nbytes(self):
        """Device memory (main array, buffer, index array) plus the host's buffer copy."""
        dev = 24 * self.capacity + 24 * self.buffer_size + 8 * self._nidx_cap
        return dev + self.bkeys.nbytes + self.bts.nbytes + self.bseq.nbytes

    def check(self):
        """The invariants of every BI-Sort (:func:`panjoin.subwindow.bi_sort.check_state`)
        over the arrays read back from the device, and the device's buffer = the host's."""
        mk, _, ms = self.main_columns()
        n = self.nbuf
        bk = self._down(self.d_bk, n, self.key_dtype)
        bs = self._down(self.d_bs, n)
        bt = self._down(self.d_bt, n)
        state = check_state(self, mk, ms, self.index_array(), bs, self._nidx_cap,
                            f" on {self.device_name}")
        assert np.array_equal(bk, self.bkeys[:n]) and np.array_equal(bs, self.bseq[:n]) \
            and np.array_equal(bt, self.bts[:n]), "device buffer differs\n" + state()


__all__ = ["MERGERS", "OpenCLBISort", "PROBERS"]
