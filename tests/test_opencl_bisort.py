"""The OpenCL BI-Sort (opencl/) on the pocl CPU device against the Numba BI-Sort.

Same inserts into both, then: the same main array row for row after every insert,
and for every probe the same pairs and the same ranges, array for array (order
included), over every key distribution, eq / band / multi-band / ne, both probe
sides, no / time / count window filter, batches smaller and larger than the
buffer, one or several mergers and probers. Then the engine and a cluster with one
OpenCL worker among Numba workers against the reference, and the error messages.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
from index_helpers import (
    MODES,
    PREDICATES,
    buffer_sizes,
    canon,
    draw_keys,
    fill,
    probe_cases,
    probe_keys,
    random_filter,
)

from opencl.bisort import OpenCLBISort
from opencl.device import OpenCLError, build_program, choose_device, runtime
from panjoin.backend import LocalBackend
from panjoin.generate import generate
from panjoin.launch import start_workers
from panjoin.manager.engine import JoinEngine
from panjoin.manager.grpc_backend import GrpcBackend
from panjoin.proto.panjoin.v1 import common_pb2, worker_pb2
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window, probe_bounds
from panjoin.subwindow import make_index
from panjoin.subwindow.bi_sort import BISort
from panjoin.subwindow.kernels import window as W
from workers.server import WorkerServicer

RANGE_FIELDS = ("probe_idx", "start", "end", "buf_probe_idx", "buf_seq")


def same_main(cl: OpenCLBISort, nb: BISort):
    for a, b in zip(cl.main_columns(), nb.main_columns(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert (cl.m, cl.nbuf, cl.step, cl.nidx) == (nb.m, nb.nbuf, nb.step, nb.nidx)


def same_pairs(got, want, what=""):
    """The same pairs; as sets, since the order within a probe tuple's buffer matches
    differs: the Numba BI-Sort keeps its insertion buffer sorted, this one appends."""
    for g in got:
        assert g.dtype == np.int64
    np.testing.assert_array_equal(canon(*got), canon(*want), err_msg=what)


def same_ranges(rg, rw, what=""):
    """The same main-array records, array for array (one main array layout), and the
    same buffer pairs (as sets, see :func:`same_pairs`)."""
    for f in RANGE_FIELDS[:3]:
        np.testing.assert_array_equal(getattr(rg, f), getattr(rw, f), err_msg=f"{f} {what}")
    same_pairs((rg.buf_probe_idx, rg.buf_seq), (rw.buf_probe_idx, rw.buf_seq), what)


def assert_identical(cl: OpenCLBISort, nb: BISort, lo, hi, flt, what="") -> int:
    """Same pairs and same ranges (:func:`same_pairs`, :func:`same_ranges`); returns the
    pair count."""
    want = nb.probe(lo, hi, flt)
    same_pairs(cl.probe(lo, hi, flt), want, what)
    same_ranges(cl.probe_ranges(lo, hi, flt), nb.probe_ranges(lo, hi, flt), what)
    return want[0].shape[0]


def fill_both(cl, nb, rng, keys, sizes):
    """``fill`` one batch at a time, comparing the main arrays after every insert."""
    fill([cl, nb], rng, keys, sizes, after=lambda: same_main(cl, nb))


def run_case(dist, pattern, *, n=600, buffer=48, partitions=16, mergers=8, probers=8,
             seed=0, probes=80, preds=PREDICATES, modes=MODES, par_merge_min=0):
    rng = np.random.default_rng(seed)
    keys = draw_keys(rng, dist, n)
    cl = OpenCLBISort(n, key_dtype=keys.dtype, partitions=partitions, buffer=buffer,
                      mergers=mergers, probers=probers, par_merge_min=par_merge_min)
    nb = BISort(n, key_dtype=keys.dtype, partitions=partitions, buffer=buffer)
    fill_both(cl, nb, rng, keys, buffer_sizes(rng, n, pattern, buffer))
    total = 0
    for case in probe_cases(rng, preds, modes, probes,
                            lambda r: probe_keys(r, keys, dist, probes)):
        total += assert_identical(cl, nb, *case)
    cl.check()
    return cl, nb, total


# --------------------------------------------------------------------------- the grid


@pytest.mark.parametrize("dist", ["uniform", "zipf", "increasing", "equal", "extreme",
                                  "negative", "float"])
@pytest.mark.parametrize("pattern", ["small", "large", "mixed", "huge"])
def test_identical_to_numba_bisort(dist, pattern):
    cl, nb, total = run_case(dist, pattern, seed=zlib.crc32(f"{dist}/{pattern}".encode()))
    assert total > 0  # the comparison saw real matches
    if pattern == "huge":
        assert cl.nbuf == 0 and cl.m == 600  # a batch larger than B goes straight in
    if pattern == "small":
        assert cl.m > 0  # the buffer overflowed and was merged at least once
    if pattern != "huge":
        assert cl.merge_stats["split"] > 0  # merges were cut over several mergers
        if dist not in ("increasing", "equal"):  # (those only append)
            assert cl.merge_stats["stashed"] > 0  # and some pieces needed the stash


@pytest.mark.parametrize("mergers,probers", [(1, 1), (3, 5), (16, 2)])
def test_merger_and_prober_counts(mergers, probers):
    # the result and the layout do not depend on how many mergers / probers there are
    for dist in ("uniform", "equal", "float"):
        run_case(dist, "mixed", mergers=mergers, probers=probers, seed=mergers * 7 + probers,
                 probes=150, modes=(W.NONE, W.COUNT))


def test_default_merge_threshold_single_merger():
    # below par_merge_min every merge is one merger's, above it they are cut
    cl, _, _ = run_case("uniform", "mixed", n=500, par_merge_min=1 << 20,
                        preds=["band:3"], modes=(W.NONE,))
    assert cl.merge_stats["merges"] > 0 and cl.merge_stats["split"] == 0


def test_duplicates_span_partitions():
    rng = np.random.default_rng(1)
    keys = np.repeat(np.array([-3, 0, 2, 9], dtype=np.int64), [90, 300, 7, 203])
    cl = OpenCLBISort(600, partitions=64, buffer=32, mergers=4, probers=3, par_merge_min=0)
    nb = BISort(600, partitions=64, buffer=32)
    fill_both(cl, nb, rng, rng.permutation(keys), buffer_sizes(rng, 600, "mixed", 32))
    assert cl.step < 300
    for pred in PREDICATES:
        # many equal probe keys: one prober's chunk and the next start inside one run
        pk = np.sort(rng.choice(np.array([-4, -3, -1, 0, 1, 2, 5, 9, 12]), 100))
        lo, hi = probe_bounds(parse_predicate(pred), "R", pk)
        for mode in (W.NONE, W.COUNT):
            assert_identical(cl, nb, lo, hi, random_filter(rng, mode, 100))
    cl.flush()
    nb.flush()
    same_main(cl, nb)
    rr = cl.probe_ranges(*probe_bounds(parse_predicate("eq"), "S", np.array([0, 0, 9])))
    np.testing.assert_array_equal(rr.end - rr.start, [300, 300, 203])


def test_empty_main_array_buffer_only():
    rng = np.random.default_rng(2)
    cl = OpenCLBISort(100, partitions=8, buffer=50)
    nb = BISort(100, partitions=8, buffer=50)
    fill([cl, nb], rng, np.array([5, 1, 9, 1, 3], dtype=np.int64), [2, 3])
    assert cl.m == 0 and cl.nbuf == 5 and cl.nidx == 0
    for pred in PREDICATES:
        lo, hi = probe_bounds(parse_predicate(pred), "R", np.array([0, 1, 1, 4, 9, 20]))
        for mode in (W.NONE, W.TIME, W.COUNT):
            assert_identical(cl, nb, lo, hi, random_filter(rng, mode, 6))
    assert cl.probe_ranges(lo, hi).buf_seq.shape[0] > 0


def test_empty_buffer_main_only():
    rng = np.random.default_rng(3)
    cl = OpenCLBISort(500, partitions=32, buffer=16)
    nb = BISort(500, partitions=32, buffer=16)
    keys = draw_keys(rng, "uniform", 500)
    fill_both(cl, nb, rng, keys, [100, 200, 200])
    assert cl.nbuf == 0 and cl.m == 500
    for pred in PREDICATES:
        lo, hi = probe_bounds(parse_predicate(pred), "S", probe_keys(rng, keys, "uniform", 50))
        assert_identical(cl, nb, lo, hi, None)


def test_empty_subwindow_empty_probe_and_bad_input():
    cl = OpenCLBISort(10)
    lo, hi = probe_bounds(parse_predicate("band:1"), "R", np.array([1, 2]))
    assert cl.probe(lo, hi)[0].shape[0] == 0
    assert cl.probe_ranges(lo, hi).probe_idx.shape[0] == 0
    cl.insert(np.array([1]), np.array([0]), np.array([0]))
    z = np.zeros((1, 0), np.int64)
    assert cl.probe(z, z)[0].shape[0] == 0
    cl.insert(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert len(cl) == 1
    with pytest.raises(ValueError, match="sorted"):
        cl.insert(np.array([3, 2]), np.array([0, 0]), np.array([5, 6]))
    with pytest.raises(ValueError, match="holding 1 of 10"):
        cl.insert(np.arange(10), np.zeros(10, np.int64), np.arange(10) + 100)
    with pytest.raises(TypeError, match="float64"):
        cl.insert(np.array([1.5]), np.array([0]), np.array([9]))
    with pytest.raises(ValueError, match="mergers and probers"):
        OpenCLBISort(10, mergers=0)
    cl.check()
    assert len(cl) == 1  # nothing was lost


def test_made_by_make_index_and_memory():
    ix = make_index("bisort-opencl", 4096, "float64", partitions=64, buffer=256)
    assert isinstance(ix, OpenCLBISort) and ix.key_dtype == np.float64
    nb = make_index("bisort", 4096, "float64", partitions=64, buffer=256)
    # the device holds what the Numba one holds but the index's upper levels; the host
    # keeps a copy of the buffer
    assert ix.nbytes == nb.nbytes - nb.up.nbytes + 24 * 256


def test_default_buffer_as_the_numba_one():
    """Both twins size the default buffer alike (bisort_buffer), so they lay out the main
    array alike: 1K, 4K and 16K at 2K, 64K and 1M tuples."""
    for cap, want in ((2048, 1024), (1 << 16, 4096), (1 << 20, 1 << 14)):
        cl = make_index("bisort-opencl", cap, "int64", partitions=cap // 8)
        nb = make_index("bisort", cap, "int64", partitions=cap // 8)
        assert cl.buffer_size == nb.buffer_size == want


# --------------------------------------------------------------------------- devices, errors


def test_device_choice():
    dev = choose_device("")
    assert "portable computing language" in dev.platform.name.lower()  # pocl CPU default
    assert choose_device("cpu") == dev and choose_device("0:0") == dev
    assert choose_device("POCL") == dev
    assert runtime("cpu") is runtime("pocl")  # one context per device


def test_missing_device_lists_the_devices():
    with pytest.raises(OpenCLError, match=r"no OpenCL device matches 'no-such-board'.*\n0:0"):
        choose_device("no-such-board")
    with pytest.raises(OpenCLError, match="no OpenCL device matches '7:3'"):
        OpenCLBISort(10, device="7:3")


def test_kernel_build_failure_carries_the_build_log():
    rt = runtime()
    src = "__kernel void broken(__global long *a) { a[0] = undeclared_name; }"
    with pytest.raises(OpenCLError) as e:
        build_program(rt.context, src, ["-DKEY_T=long"])
    msg = str(e.value)
    assert "failed to build" in msg and "build log" in msg and "undeclared_name" in msg


def test_no_device_is_a_clear_error():
    # POCL_DEVICES names a driver this pocl lacks: the platform is there, no device is
    env = dict(os.environ, POCL_DEVICES="none")
    r = subprocess.run([sys.executable, "-m", "opencl"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "no device" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "panjoin.cli", "worker", "--port", "0",
                        "--index-backend", "opencl"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "panjoin worker:" in r.stderr and "no device" in r.stderr


# ------------------------------------------------------------ engine, worker, cluster


def test_engine_with_opencl_equals_reference():
    t = generate(1500, "zipf", key_min=0, key_max=60, rate=1000, seed=11, disorder_ms=20)
    for window, pred in [("count:300,200", "bands:-3,-1;2,5"), ("time:250,180", "band:2")]:
        w = parse_window(window, 10 if window.startswith("time") else 0)
        eng = JoinEngine(w, pred, index="bisort-opencl", subwindow_size=64, partitions=8,
                         batch_size=100, index_opts={"buffer": 16, "mergers": 3,
                                                     "par_merge_min": 0})
        eng.push(t.slice(0, 800))
        eng.push(t.slice(800, len(t)))
        eng.flush()
        r, s = eng.take_results()
        ref = reference_join(t.stream, t.id, t.key, t.ts, w, parse_predicate(pred))
        assert len(ref.pairs) > 0
        assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)


def test_worker_maps_bisort_to_opencl():
    for backend_name, cls in (("opencl", OpenCLBISort), ("numba", BISort)):
        servicer = WorkerServicer(1, backend_name, "cpu")
        backend = LocalBackend(1)
        fb = servicer.handle(backend, worker_pb2.Command(command_id=1, create=worker_pb2.Create(
            sub_id=4, stream=common_pb2.STREAM_R, index="bisort", capacity=100,
            key_dtype="int64", partitions=8)))
        assert not fb.error, fb.error
        assert type(backend.subs[4].index) is cls


def test_worker_with_a_missing_device_does_not_start():
    with pytest.raises(RuntimeError, match="did not start"):
        start_workers(1, worker_args=[["--index-backend", "opencl", "--device", "no-such"]])
    with pytest.raises(ValueError, match="one list per worker|2 workers"):
        start_workers(2, worker_args=[[]])


@pytest.fixture(scope="module")
def mixed_cluster():
    """Three workers; the middle one serves BI-Sort from the pocl device."""
    ws = start_workers(3, worker_args=[[], ["--index-backend", "opencl", "--device", "cpu"],
                                       []])
    yield ws
    for w in ws:
        w.stop()


@pytest.mark.parametrize("result_format", ["pairs", "ranges"])
@pytest.mark.parametrize("window", ["count:150,110", "time:160,120"])
def test_cluster_with_one_opencl_worker_equals_reference(mixed_cluster, window, result_format):
    t = generate(1500, "zipf", key_min=0, key_max=60, rate=1000, seed=5, disorder_ms=30)
    pred = "bands:-3,-1;2,5"
    w = parse_window(window, 10 if window.startswith("time") else 0)
    backend = GrpcBackend([x.address for x in mixed_cluster], result_format=result_format)
    try:
        eng = JoinEngine(w, pred, index="bisort", subwindow_size=30, partitions=8,
                         batch_size=64, backend=backend, n_workers=3,
                         index_opts={"buffer": 8})
        eng.push(t.slice(0, 700))
        eng.push(t.slice(700, len(t)))
        eng.flush()
        r, s = eng.take_results()
        if result_format == "ranges":
            assert backend.ranges_expanded > 0  # the OpenCL worker's ranges hit the mirror
    finally:
        backend.close()
    ref = reference_join(t.stream, t.id, t.key, t.ts, w, parse_predicate(pred))
    assert len(ref.pairs) > 0
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)


# --------------------------------------------------------------------------- boundary generator


@pytest.mark.parametrize("dist", ["uniform", "extreme", "negative", "float"])
def test_boundary_generator_equals_probe_bounds(dist):
    rng = np.random.default_rng(zlib.crc32(dist.encode()))
    keys = draw_keys(rng, dist, 400)
    cl = OpenCLBISort(400, key_dtype=keys.dtype, partitions=16, buffer=32, probers=3)
    nb = BISort(400, key_dtype=keys.dtype, partitions=16, buffer=32)
    fill([cl, nb], rng, keys, buffer_sizes(rng, 400, "mixed", 32))
    preds = PREDICATES + ["band:0.5", "bands:0.2,0.8", "bands:-3.5,-1;2,9.5",
                          f"band:{2**63 + 10}", "bands:-9223372036854775807,-5;5,9"]
    for pred in preds:
        p = parse_predicate(pred)
        for side in "RS":
            pk = probe_keys(rng, keys, dist, 90)
            want = probe_bounds(p, side, pk)
            for g, w in zip(cl.bounds(p, side, pk), want, strict=True):
                np.testing.assert_array_equal(g, w, err_msg=f"{pred} {side}")
            flt = random_filter(rng, W.COUNT, 90)
            same_pairs(cl.probe_keys(p, side, pk, flt), nb.probe(*want, flt), pred)
            same_ranges(cl.probe_keys(p, side, pk, ranges=True), nb.probe_ranges(*want), pred)
