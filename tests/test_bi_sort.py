"""BI-Sort against the nested loop: every predicate, both probe sides, every window
filter, many key distributions and insert patterns, ``check()`` after every step;
the range result format expanded against ``main_columns`` equals ``probe``."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from index_helpers import (
    MODES,
    PREDICATES,
    band_property_cases,
    buffer_sizes,
    canon,
    draw_keys,
    fill,
    probe_cases,
    probe_keys,
    random_filter,
)
from index_helpers import assert_same as assert_same_pairs

from panjoin.semantics import I64_MAX, parse_predicate, probe_bounds
from panjoin.subwindow import make_index
from panjoin.subwindow.bi_sort import BISort
from panjoin.subwindow.kernels import window as W
from panjoin.subwindow.kernels.bisort import DENSE_GAP, FAN, PAIRS_CHUNK, top_level
from panjoin.subwindow.nested_loop import NestedLoop

# --------------------------------------------------------------------------- helpers


def assert_same(bi: BISort, ref: NestedLoop, lo, hi, flt, what=""):
    """The same pairs as the reference, and the range format, expanded against the main
    array and filtered, the same again; returns the pair count."""
    total = assert_same_pairs(bi, ref, lo, hi, flt, what)
    rr = bi.probe_ranges(lo, hi, flt)
    assert np.all(rr.end > rr.start)
    assert np.all(np.diff(rr.probe_idx) >= 0)
    mk, mt, ms = bi.main_columns()
    assert mk.shape[0] == bi.m
    exp = rr.expand(mk, mt, ms, flt)
    np.testing.assert_array_equal(canon(*exp), canon(*ref.probe(lo, hi, flt)), err_msg=what)
    return total


def run_case(dist, pattern, *, n=700, buffer=64, partitions=16, threads=1, seed=0,
             capacity=None, probes=60, preds=PREDICATES, modes=MODES):
    rng = np.random.default_rng(seed)
    keys = draw_keys(rng, dist, n)
    cap = capacity or n + 1  # one row spare: a full subwindow merges its buffer
    bi = BISort(cap, key_dtype=keys.dtype, partitions=partitions, threads=threads,
                buffer=buffer, par_merge_min=1 if threads > 1 else 1 << 16)
    ref = NestedLoop(cap, key_dtype=keys.dtype)
    fill([bi, ref], rng, keys, buffer_sizes(rng, n, pattern, buffer))
    assert len(bi) == n
    total = 0
    for case in probe_cases(rng, preds, modes, probes,
                            lambda r: probe_keys(r, keys, dist, probes)):
        total += assert_same(bi, ref, *case)
        bi.check()
    return bi, total


# --------------------------------------------------------------------------- the grid


@pytest.mark.parametrize("dist", ["uniform", "zipf", "increasing", "equal", "extreme",
                                  "negative", "float"])
@pytest.mark.parametrize("pattern", ["small", "large", "mixed", "huge"])
def test_against_nested_loop(dist, pattern):
    bi, total = run_case(dist, pattern, seed=zlib.crc32(f'{dist}/{pattern}'.encode()))
    assert total > 0  # the comparison saw real matches
    if pattern == "huge":
        assert bi.nbuf == 0 and bi.m == 700  # one batch larger than B goes straight in
    if pattern == "small":
        assert bi.m > 0  # the buffer overflowed and was merged at least once


@pytest.mark.parametrize("dist", ["uniform", "equal", "extreme", "float"])
def test_two_threads(dist):
    # parallel merge pieces (par_merge_min = 1) and two probe chunks
    for pattern in ("small", "large", "mixed"):
        run_case(dist, pattern, threads=2, seed=5, probes=300, modes=(W.NONE, W.COUNT))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("partitions", [32, 1250])
def test_dense_and_sparse_probe_paths(threads, partitions):
    """A batch with fewer probe tuples than main rows / DENSE_GAP finds its bounds through
    the index array (by lockstep searches at step 313, by the prefetching cursor of
    locate_sparse at step 8), a denser one by galloping over the main array: all against
    the nested loop, with tuples in the sorted buffer too."""
    n = 10_000  # 140 probe tuples: sparse, also in each of two threads' chunks
    for probes, dense in ((4, False), (140, False), (n // DENSE_GAP, True)):
        assert (probes * DENSE_GAP >= n) == dense
        # dense: thousands of probe tuples, each matching ~1% of the stored keys (eq)
        preds = PREDICATES[:1] if dense else PREDICATES[:3]
        total = 0
        for dist in ("uniform", "extreme", "float"):  # not ne or equal keys: W^2 pairs
            rng = np.random.default_rng(zlib.crc32(f"{dist}/{probes}".encode()))
            keys = draw_keys(rng, dist, n)
            bi = BISort(n + 1, key_dtype=keys.dtype, partitions=partitions, threads=threads,
                        buffer=200, par_merge_min=1 if threads > 1 else 1 << 16)
            ref = NestedLoop(n, key_dtype=keys.dtype)
            fill([bi, ref], rng, keys, [4000, 3000, 2850, 100, 50])  # 150 stay buffered
            assert bi.nbuf == 150
            for case in probe_cases(rng, preds, MODES, probes,
                                    lambda r, k=keys, d=dist, m=probes: probe_keys(r, k, d, m)):
                total += assert_same(bi, ref, *case)
        assert total > 0


@pytest.mark.parametrize("dist", ["uniform-wide", "extreme", "float"])
def test_small_batches_over_a_large_subwindow(dist):
    """Small sorted batches (1 to 1000 probe tuples) over 40K rows at step 8 start their
    searches on each upper level of the index in turn (locate_levels) and on the index
    array itself (locate_sparse); against the nested loop, with the window filter, with
    keys past both ends and a sorted buffer; the index rebuilt after each small merge."""
    rng = np.random.default_rng(zlib.crc32(dist.encode()))
    n = 40_000
    if dist == "uniform-wide":
        keys = rng.integers(-(1 << 40), 1 << 40, n)
        draw = None
    else:
        keys = draw_keys(rng, dist, n)
        draw = draw_keys
    bi = BISort(n + 1, key_dtype=keys.dtype, partitions=n // 8, buffer=256)
    ref = NestedLoop(n, key_dtype=keys.dtype)
    sizes = [30_000, 9_000] + [100] * 9 + [70]  # merges of the buffer into 30K+ rows
    seq = np.arange(n, dtype=np.int64) * 3 + 11
    a = 0
    for k in sizes:
        order = np.argsort(keys[a:a + k], kind="stable")
        cols = keys[a:a + k][order], rng.integers(0, 1000, k)[order], seq[a:a + k][order]
        bi.insert(*cols)
        ref.insert(*cols)
        bi.check()
        a += k
    assert bi.step == 8 and bi.nlev == 4 and 0 < bi.nbuf < 256
    tops = set()
    for m in (1, 7, 64, 300, 1000):
        tops.add(int(top_level(bi.nidx, bi.nlev, m)))
        if draw is None:
            pk = np.sort(np.where(rng.random(m) < 0.5, keys[rng.integers(0, n, m)],
                                  rng.integers(-(1 << 41), 1 << 41, m)))
        else:
            pk = probe_keys(rng, keys, dist, m, draw)
        for pred in PREDICATES[:3]:
            lo, hi = probe_bounds(parse_predicate(pred), "R", pk)
            for mode in MODES:
                flt = random_filter(rng, mode, m, seq_max=3 * n + 11)
                assert_same_pairs(bi, ref, lo, hi, flt, f"{pred} n={m} mode {mode}")
    assert tops == {0, 1, 2, 3, 4}


def test_duplicates_span_partitions():
    # runs of equal keys much longer than a partition: a bound's target partition is
    # the first of several, and the range crosses partition borders
    rng = np.random.default_rng(1)
    keys = np.repeat(np.array([-3, 0, 2, 9], dtype=np.int64), [90, 300, 7, 203])
    bi = BISort(600, partitions=64, buffer=32)
    ref = NestedLoop(600)
    fill([bi, ref], rng, rng.permutation(keys), buffer_sizes(rng, 600, "mixed", 32))
    assert bi.step < 300
    for pred in PREDICATES:
        pk = np.sort(rng.choice(np.array([-4, -3, -1, 0, 1, 2, 5, 9, 12]), 40))
        lo, hi = probe_bounds(parse_predicate(pred), "R", pk)
        assert_same(bi, ref, lo, hi, None)
    bi.flush()
    bi.check()
    rr = bi.probe_ranges(*probe_bounds(parse_predicate("eq"), "S", np.array([0, 0, 9])))
    # the whole run of 0s is one record, reused for the equal second probe key
    np.testing.assert_array_equal(rr.end - rr.start, [300, 300, 203])


@pytest.mark.parametrize("probes", [1100, 5000])
def test_probe_pairs_in_chunks_with_a_growing_output(probes):
    """The one-thread probe locates PAIRS_CHUNK probe tuples at a time (sparse: 1100 over
    80K rows at step 8; dense: 5000) and grows its output past one pair per probe tuple
    (about 12 per tuple here), with equal keys spanning partitions and the window filter."""
    rng = np.random.default_rng(probes)
    n = 80_000
    keys = rng.integers(-3000, 3000, n) * 7  # ~13 copies of each key: runs cross partitions
    bi = BISort(n + 1, partitions=n // 8, buffer=500, threads=1)
    ref = NestedLoop(n)
    fill([bi, ref], rng, keys, [40_000, 39_700, 300])  # 300 stay buffered
    assert bi.step == 8 and bi.nbuf == 300 and probes > PAIRS_CHUNK
    pk = np.sort(rng.integers(-3100, 3100, probes) * 7 + rng.integers(-1, 2, probes))
    for pred in ("eq", "band:3", "bands:-15,-8;4,9"):
        lo, hi = probe_bounds(parse_predicate(pred), "R", pk)
        for mode in MODES:
            flt = random_filter(rng, mode, probes, seq_max=3 * n + 11)
            pairs = assert_same(bi, ref, lo, hi, flt, f"{pred} mode {mode}")
            assert pairs > (4 * probes if mode == W.NONE else 0)


def test_a_full_subwindow_merges_its_buffer():
    """The batch that fills the subwindow leaves the buffer empty: probes of a full
    subwindow search the main array only; the layout is what a later flush would give."""
    rng = np.random.default_rng(7)
    keys = rng.integers(0, 40, 300)
    bi = BISort(300, partitions=30, buffer=64)
    ref = NestedLoop(300)
    late = BISort(301, partitions=30, buffer=64)  # not full: flushed by hand
    fill([bi, ref, late], rng, keys, [100, 50, 60, 40, 30, 20])
    assert bi.nbuf == 0 and bi.m == 300 and late.nbuf > 0
    late.flush()
    np.testing.assert_array_equal(bi.mkeys[:300], late.mkeys[:300])
    np.testing.assert_array_equal(bi.mseq[:300], late.mseq[:300])
    for case in probe_cases(rng, PREDICATES[:3], MODES, 40,
                            lambda r: probe_keys(r, keys, "uniform", 40)):
        assert_same(bi, ref, *case)


def test_empty_main_array_buffer_only():
    rng = np.random.default_rng(2)
    bi = BISort(100, partitions=8, buffer=50)
    ref = NestedLoop(100)
    keys = np.array([5, 1, 9, 1, 3], dtype=np.int64)
    fill([bi, ref], rng, keys, [2, 3])
    assert bi.m == 0 and bi.nbuf == 5 and bi.nidx == 0
    for pred in PREDICATES:
        lo, hi = probe_bounds(parse_predicate(pred), "R", np.array([0, 1, 1, 4, 9, 20]))
        for mode in (W.NONE, W.TIME, W.COUNT):
            assert_same(bi, ref, lo, hi, random_filter(rng, mode, 6))
    rr = bi.probe_ranges(lo, hi)
    assert rr.probe_idx.shape[0] == 0 and rr.buf_seq.shape[0] > 0


def test_empty_buffer_main_only():
    rng = np.random.default_rng(3)
    bi = BISort(500, partitions=32, buffer=16)
    ref = NestedLoop(500)
    keys = draw_keys(rng, "uniform", 500)
    fill([bi, ref], rng, keys, [100, 200, 200])
    assert bi.nbuf == 0 and bi.m == 500
    for pred in PREDICATES:
        lo, hi = probe_bounds(parse_predicate(pred), "S", probe_keys(rng, keys, "uniform", 50))
        assert_same(bi, ref, lo, hi, None)
        assert bi.probe_ranges(lo, hi).buf_seq.shape[0] == 0


def test_empty_subwindow_and_empty_probe():
    bi = BISort(10)
    lo, hi = probe_bounds(parse_predicate("band:1"), "R", np.array([1, 2]))
    p, s = bi.probe(lo, hi)
    assert p.shape[0] == 0 and s.shape[0] == 0
    bi.insert(np.array([1]), np.array([0]), np.array([0]))
    z = np.zeros((1, 0), np.int64)
    assert bi.probe(z, z)[0].shape[0] == 0
    assert bi.probe_ranges(z, z).probe_idx.shape[0] == 0
    bi.insert(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert len(bi) == 1
    bi.check()


def test_capacity_one():
    for buffer in (1, 1024):
        bi = BISort(1, partitions=1024, buffer=buffer)
        # one index entry, padded to one line of FAN keys; no upper level
        assert bi.buffer_size == 1 and bi.index.shape[0] == FAN and bi.up.shape[0] == 1
        bi.insert(np.array([I64_MAX]), np.array([3]), np.array([42]))
        bi.check()
        lo, hi = probe_bounds(parse_predicate("eq"), "R", np.array([I64_MAX - 1, I64_MAX]))
        p, s = bi.probe(lo, hi)
        assert p.tolist() == [1] and s.tolist() == [42]
        with pytest.raises(ValueError):
            bi.insert(np.array([1]), np.array([0]), np.array([1]))
        bi.flush()
        bi.check()
        assert bi.m == 1 and bi.probe(lo, hi)[1].tolist() == [42]


def test_more_partitions_than_tuples():
    for dist in ("uniform", "equal"):
        bi, _ = run_case(dist, "mixed", n=40, partitions=1000, buffer=4, probes=20)
        assert bi.step == 1 and bi.nidx == bi.m


def test_merge_order_is_deterministic_and_thread_independent():
    # the manager's mirror replays the inserts: same layout whatever the thread count
    rng = np.random.default_rng(4)
    keys = draw_keys(rng, "zipf", 3000)
    a = BISort(3000, partitions=50, buffer=40)
    b = BISort(3000, partitions=50, buffer=40, threads=2, par_merge_min=1)
    c = BISort(3000, partitions=50, buffer=40, threads=3, par_merge_min=1)
    fill([a, b, c], rng, keys, buffer_sizes(rng, 3000, "mixed", 40))
    for x in (b, c):
        for u, v in zip(a.main_columns(), x.main_columns(), strict=True):
            np.testing.assert_array_equal(u, v)
    # equal keys: a merged run goes right of the equal main tuples (a model of the
    # buffer / direct-merge paths predicts the exact layout)
    d = BISort(200, partitions=7, buffer=10, threads=2, par_merge_min=1)
    main, buf, seq = [], [], 0
    for size in (3, 9, 1, 25, 4, 40, 8, 2, 30):
        s = list(range(seq, seq + size))
        seq += size
        d.insert(np.full(size, 5), np.zeros(size, np.int64), np.array(s))
        d.check()
        if size > 10:
            main += s
        else:
            if len(buf) + size > 10:
                main, buf = main + buf, []
            buf += s
    d.flush()
    np.testing.assert_array_equal(d.main_columns()[2], main + buf)


def test_insert_paths():
    bi = BISort(100, partitions=4, buffer=8)
    k = np.arange(8, dtype=np.int64)
    bi.insert(k, k, k)  # fits exactly: buffer
    assert (bi.m, bi.nbuf) == (0, 8)
    bi.insert(k[:1] + 3, k[:1], k[:1] + 100)  # would overflow: flush, then buffer
    assert (bi.m, bi.nbuf) == (8, 1)
    big = np.arange(9, dtype=np.int64) * 2
    bi.insert(big, big, big + 200)  # larger than B: straight in, buffer stays
    assert (bi.m, bi.nbuf) == (17, 1)
    bi.check()
    np.testing.assert_array_equal(bi.index[:bi.nidx], bi.main_columns()[0][::bi.step])


def test_bad_input_changes_nothing():
    bi = BISort(10, buffer=2)
    bi.insert(np.array([1, 2, 3]), np.zeros(3, np.int64), np.arange(3))
    before = [a.copy() for a in bi.main_columns()]
    with pytest.raises(ValueError, match="sorted"):
        bi.insert(np.array([5, 4, 6]), np.zeros(3, np.int64), np.arange(3, 6))
    with pytest.raises(TypeError):
        bi.insert(np.array([1.0]), np.zeros(1, np.int64), np.array([9]))
    with pytest.raises(ValueError):
        BISort(10, buffer=0)
    assert len(bi) == 3
    for u, v in zip(before, bi.main_columns(), strict=True):
        np.testing.assert_array_equal(u, v)
    bi.check()


def test_check_catches_corruption():
    bi = BISort(50, partitions=4, buffer=4)
    k = np.arange(20, dtype=np.int64)
    bi.insert(k, k, k)
    bi.check()
    bi.mkeys[3], bi.mkeys[4] = bi.mkeys[4], bi.mkeys[3]
    with pytest.raises(AssertionError, match="sorted"):
        bi.check()
    bi.mkeys[3], bi.mkeys[4] = bi.mkeys[4], bi.mkeys[3]
    bi.index[1] += 1
    with pytest.raises(AssertionError, match="index"):
        bi.check()
    bi.index[1] -= 1
    bi.mseq[5] = bi.mseq[6]
    with pytest.raises(AssertionError, match="seq"):
        bi.check()


def test_check_catches_stale_levels():
    bi = BISort(2000, partitions=500, buffer=4)
    k = np.arange(1001, dtype=np.int64) * 2
    bi.insert(k, k, k)
    bi.check()
    assert bi.step == 3 and bi.nidx == 334 and bi.nlev == 2  # levels of 42 and 6 entries
    for arr, at, what in ((bi.up, 1, "stale level 1"), (bi.up, bi.lvoff[2], "stale level 2"),
                          (bi.up, 42, "level 1 padding"), (bi.index, 334, "index padding")):
        old = arr[at]
        arr[at] = 5
        with pytest.raises(AssertionError, match=what):
            bi.check()
        arr[at] = old
        bi.check()


def test_memory_within_bound():
    bi = make_index("bisort", 1 << 20, "int64", partitions=1 << 14)
    assert isinstance(bi, BISort) and bi.kind == "bisort"
    assert bi.buffer_size == 1 << 14  # the default: capacity / 16, at most 16K
    assert bi.memory_ratio() < 1.2
    assert bi.nbytes >= 24 * (1 << 20) + 24 * bi.buffer_size + 8 * (1 << 14)


# --------------------------------------------------------------------------- property


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.lists(st.integers(-6, 6), min_size=0, max_size=12), max_size=10),
    buffer=st.integers(1, 8),
    partitions=st.integers(1, 9),
    probe=st.lists(st.integers(-9, 9), min_size=1, max_size=12),
    band=st.tuples(st.integers(-4, 4), st.integers(0, 5)),
    threads=st.sampled_from([1, 2]),
)
def test_property_band_join(batches, buffer, partitions, probe, band, threads):
    n = sum(len(b) for b in batches)
    bi = BISort(max(1, n), partitions=partitions, buffer=buffer, threads=threads,
                par_merge_min=1)
    for lo, hi, want in band_property_cases(bi, batches, probe, band, sides="RS"):
        np.testing.assert_array_equal(canon(*bi.probe(lo, hi)), want)
        mk, mt, ms = bi.main_columns()
        np.testing.assert_array_equal(canon(*bi.probe_ranges(lo, hi).expand(mk, mt, ms)), want)
