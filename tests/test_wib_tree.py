"""WiB+-Tree against the nested loop: every predicate, both probe sides, every window
filter, many key distributions and insert patterns (increasing keys in many small
batches force a split every few tuples), small fan-outs so that internal nodes split
and the tree grows several levels, ``check()`` after every step; plus the worst-case
LLAT bound under an adversarial key order, and a hypothesis property test."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from index_helpers import (
    MODES,
    PREDICATES,
    assert_same,
    band_property_cases,
    batch_sizes,
    canon,
    fill,
    probe_cases,
    probe_keys,
    random_filter,
)
from index_helpers import draw_keys as shared_draw_keys

from panjoin.semantics import I64_MAX, I64_MIN, parse_predicate, probe_bounds
from panjoin.subwindow import make_index
from panjoin.subwindow.kernels import window as W
from panjoin.subwindow.nested_loop import NestedLoop
from panjoin.subwindow.wib_tree import WiBTree, entry_bound, leaf_bound

F64_MAX = np.finfo(np.float64).max


# --------------------------------------------------------------------------- helpers


def draw_keys(rng, dist, n, dtype=np.int64):
    # float keys here also take -0.0 and +-F64_MAX: the tree's entry bounds meet them
    return shared_draw_keys(rng, dist, n, dtype, float_extremes=True)


def split_sizes(rng, n, pattern):
    """Batch sizes summing to n: tiny (1-4), small (<= 20), mixed, or one huge batch."""
    if pattern == "huge":
        return [n]
    top = {"single": 1, "tiny": 4, "small": 20, "mixed": 150}[pattern]
    return batch_sizes(rng, n, 1, top)


def run_case(dist, pattern, *, n=700, partitions=16, fanout=3, threads=1, seed=0,
             capacity=None, probes=60, preds=PREDICATES, modes=MODES,
             presorted=False, keys=None):
    rng = np.random.default_rng(seed)
    keys = draw_keys(rng, dist, n) if keys is None else keys
    n = keys.shape[0]
    cap = capacity or n
    ix = WiBTree(cap, key_dtype=keys.dtype, partitions=partitions, threads=threads,
                 fanout=fanout)
    ref = NestedLoop(cap, key_dtype=keys.dtype)
    fill([ix, ref], rng, keys, split_sizes(rng, n, pattern), presorted=presorted)
    assert len(ix) == n

    def make_keys(r):
        pk = probe_keys(r, keys, dist if dist != "increasing" else "uniform", probes,
                        draw_keys)
        if dist == "increasing":  # near the stored keys, which run far above the drawn ones
            pk = np.sort(keys[r.integers(0, n, probes)] + r.integers(-2, 3, probes))
        return pk

    total = 0
    for case in probe_cases(rng, preds, modes, probes, make_keys):
        total += assert_same(ix, ref, *case)
    ix.check()
    return ix, total


# --------------------------------------------------------------------------- the grid


@pytest.mark.parametrize("dist", ["uniform", "zipf", "increasing", "equal", "extreme",
                                  "negative", "float"])
@pytest.mark.parametrize("pattern", ["tiny", "mixed", "huge"])
def test_against_nested_loop(dist, pattern):
    ix, total = run_case(dist, pattern, seed=zlib.crc32(f"{dist}/{pattern}".encode()))
    assert total > 0  # the comparison saw real matches
    assert ix.n_leaves > 1  # leaves split (W = 55 for 700 tuples over 16 partitions)
    if dist in ("equal", "zipf"):
        assert ix.lseal[:ix.n_leaves].any()  # heavy keys were sealed into their own leaves


@pytest.mark.parametrize("fanout", [2, 4, 64])
def test_increasing_keys_many_small_batches(fanout):
    # the case RaP-Table cannot partition: every batch lands right of everything stored
    rng = np.random.default_rng(fanout)
    n = 3000
    keys = np.arange(n, dtype=np.int64) * 3 + rng.integers(0, 2, n)
    ix, total = run_case("increasing", "small", keys=keys, partitions=200, fanout=fanout,
                         presorted=True, preds=["eq", "band:4"], seed=fanout)
    assert total > 0
    assert ix.width == 19 and ix.height >= (3 if fanout <= 4 else 1)
    # the increasing-key rule leaves full leaves behind instead of halves
    assert ix.n_leaves <= 1.3 * n / ix.width + 2, ix.n_leaves


def test_deep_tree_single_tuple_batches():
    # one tuple per insert, W = 1: every insert splits a leaf, fan-out 2 makes the tree deep
    rng = np.random.default_rng(11)
    keys = rng.permutation(400).astype(np.int64)
    ix, _ = run_case("uniform", "single", keys=keys, partitions=1000, fanout=2, presorted=True,
                     probes=30)
    assert ix.width == 1 and ix.n_leaves == 400 and ix.height >= 6


@pytest.mark.parametrize("dist", ["uniform", "zipf", "equal", "float"])
def test_two_threads(dist):
    for pattern in ("tiny", "mixed", "huge"):
        run_case(dist, pattern, threads=2, fanout=4, seed=5)


def test_all_equal_keys_overflow_chain():
    rng = np.random.default_rng(3)
    ix = WiBTree(2000, partitions=100, fanout=4)  # W = 25
    ref = NestedLoop(2000)
    fill([ix, ref], rng, np.full(2000, 42, np.int64), split_sizes(rng, 2000, "mixed"))
    # one sealed leaf with a chain of ceil(2000 / 25) entries, one empty leaf on each side
    assert ix.n_leaves == 3 and ix.lseal[:3].tolist() == [0, 1, 0]
    sealed = int(np.flatnonzero(ix.lseal[:3])[0])
    assert len(ix.llat.chain(int(ix.lfirst[sealed]))) == 80
    for pred in PREDICATES:
        pk = np.array([41, 42, 42, 43], np.int64)
        for side in "RS":
            lo, hi = probe_bounds(parse_predicate(pred), side, pk)
            assert_same(ix, ref, lo, hi, random_filter(rng, W.COUNT, 4))
            assert_same(ix, ref, lo, hi, None)


@pytest.mark.parametrize("dtype", ["int64", "float64"])
def test_largest_and_smallest_keys_sealed(dtype):
    # the largest key has no successor: its sealed leaf is the last, nothing follows
    rng = np.random.default_rng(8)
    if dtype == "int64":
        top, bottom = I64_MAX, I64_MIN
    else:
        top, bottom = F64_MAX, -F64_MAX
    keys = np.concatenate([np.full(300, bottom), np.full(300, top), np.arange(-5, 5) * 2])
    keys = rng.permutation(keys.astype(dtype))
    ix, total = run_case("uniform", "mixed", keys=keys, partitions=40, fanout=3, probes=40,
                         seed=2)
    assert total > 0
    leaves = ix.leaves_in_order()
    assert ix.lseal[leaves[-1]] == 1 and ix.llo[leaves[-1]] == top
    assert ix.lseal[leaves[:2]].tolist() in ([1, 0], [0, 1])  # bottom sealed at the left
    for pk in ([top, top], [bottom, top]):
        with np.errstate(over="ignore"):
            lo, hi = probe_bounds(parse_predicate("eq"), "R", np.array(pk, dtype=dtype))
        assert ix.probe(lo, hi)[0].shape[0] == 600


def test_capacity_one():
    for partitions in (1, 1024):
        ix = WiBTree(1, partitions=partitions)
        ix.insert(np.array([I64_MAX]), np.array([3]), np.array([42]))
        ix.check()
        lo, hi = probe_bounds(parse_predicate("eq"), "R", np.array([I64_MAX - 1, I64_MAX]))
        p, s = ix.probe(lo, hi)
        assert p.tolist() == [1] and s.tolist() == [42]
        with pytest.raises(ValueError):
            ix.insert(np.array([1]), np.array([0]), np.array([1]))
        ix.check()


def test_more_partitions_than_tuples():
    for dist in ("uniform", "equal", "zipf"):
        ix, _ = run_case(dist, "tiny", n=60, partitions=1000, probes=20)
        assert ix.width == 1


def test_empty_subwindow_and_empty_probe():
    ix = WiBTree(10)
    lo, hi = probe_bounds(parse_predicate("band:1"), "R", np.array([1, 2]))
    p, s = ix.probe(lo, hi)
    assert p.shape[0] == 0 and s.shape[0] == 0
    ix.insert(np.array([1]), np.array([0]), np.array([0]))
    z = np.zeros((1, 0), np.int64)
    assert ix.probe(z, z)[0].shape[0] == 0
    ix.insert(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert len(ix) == 1
    # every band empty (lo > hi): nothing, and no cursor moves
    lo = np.array([[I64_MAX, 1, I64_MAX]])
    hi = np.array([[I64_MIN, 1, I64_MIN]])
    assert ix.probe(lo, hi)[0].tolist() == [1]
    ix.check()


def test_adversarial_keys_stay_within_bound():
    # heavy groups (more than W equal keys: sealed leaves, with empty leaves filling the
    # key gaps between them) and single keys wedged into the gaps afterwards, one at a time
    rng = np.random.default_rng(9)
    groups = 80
    cap, parts = 28 * groups, 112  # W = 25
    ix = WiBTree(cap, partitions=parts, fanout=3)
    assert ix.width == 25
    ref = NestedLoop(cap)
    heavy = np.repeat(np.arange(groups, dtype=np.int64) * 100, 26)
    light = rng.permutation(np.concatenate([np.arange(groups) * 100 + 50,
                                            np.arange(groups) * 100 + 51]).astype(np.int64))
    fill([ix, ref], rng, heavy, [26] * groups, presorted=True)
    fill([ix, ref], rng, light, [1] * light.shape[0], presorted=True)
    assert int(ix.lseal[:ix.n_leaves].sum()) == groups
    assert ix.n_leaves <= leaf_bound(cap, ix.width)
    assert int(ix.llat.ptr[0]) <= entry_bound(cap, ix.width) == ix.llat.n_entries
    keys = np.concatenate([heavy, light])
    pk = np.sort(keys[rng.integers(0, cap, 80)])
    for pred in PREDICATES:
        lo, hi = probe_bounds(parse_predicate(pred), "R", pk)
        assert_same(ix, ref, lo, hi, None)


def test_bounds_formulae():
    # NSub = 8M, P = 64K: W = 160; h = 81, q = 41
    w = 160
    assert leaf_bound(1 << 23, w) == 3 * (1 << 23) // 81 + 1
    assert entry_bound(1 << 23, w) == leaf_bound(1 << 23, w) + (1 << 23) // w
    assert leaf_bound(1, 1) == 2 and entry_bound(1, 1) == 3


def test_bad_input_changes_nothing():
    ix = WiBTree(10, partitions=2)
    ix.insert(np.array([1, 2, 3]), np.zeros(3, np.int64), np.arange(3))
    snap = ix.llat.chain_keys(int(ix.lfirst[0])).copy()
    with pytest.raises(ValueError, match="sorted"):
        ix.insert(np.array([5, 4, 6]), np.zeros(3, np.int64), np.arange(3, 6))
    with pytest.raises(TypeError):
        ix.insert(np.array([1.0]), np.zeros(1, np.int64), np.array([9]))
    f = WiBTree(10, key_dtype=np.float64)
    with pytest.raises(ValueError, match="finite"):
        f.insert(np.array([1.0, np.nan]), np.zeros(2, np.int64), np.arange(2))
    with pytest.raises(ValueError):
        WiBTree(10, fanout=1)
    assert len(ix) == 3 and len(f) == 0
    np.testing.assert_array_equal(ix.llat.chain_keys(int(ix.lfirst[0])), snap)
    ix.check()


def test_check_catches_corruption():
    ix = WiBTree(400, partitions=40, fanout=3)
    k = np.arange(400, dtype=np.int64)
    ix.insert(k, k, k)
    ix.check()
    assert ix.height >= 2
    v = int(np.flatnonzero(ix.icnt[:ix.n_nodes] >= 2)[0])
    ix.ikeys[v, 0], saved = ix.ikeys[v, 1], ix.ikeys[v, 0]
    with pytest.raises(AssertionError, match="sorted"):
        ix.check()
    ix.ikeys[v, 0] = saved
    ix.check()
    leaf = int(ix.leaves_in_order()[3])
    e = int(ix.lfirst[leaf])
    ix.llat.keys[e * ix.width], saved = 10**6, ix.llat.keys[e * ix.width]
    with pytest.raises(AssertionError, match="holds"):
        ix.check()
    ix.llat.keys[e * ix.width] = saved
    ix.lsize[leaf] += 1
    with pytest.raises(AssertionError, match="size"):
        ix.check()
    ix.lsize[leaf] -= 1
    ix.llat.ptr[1] += 1  # a phantom free entry
    with pytest.raises(AssertionError, match="free"):
        ix.check()


def test_registry_and_memory():
    ix = make_index("wib", 1 << 16, "int64", partitions=1 << 10)
    assert isinstance(ix, WiBTree) and ix.kind == "wib"
    L = ix.llat
    assert L.n_entries == entry_bound(1 << 16, ix.width) and int(L.ptr[0]) == 1
    assert ix.nbytes >= L.nbytes + ix.ikeys.nbytes + ix.ichild.nbytes + ix.lfirst.nbytes
    # leaf width ~ NSub / P * sigma
    assert ix.width == 80


# --------------------------------------------------------------------------- property


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.lists(st.integers(-6, 6), min_size=0, max_size=12), max_size=10),
    partitions=st.integers(1, 9),
    fanout=st.integers(2, 5),
    probe=st.lists(st.integers(-9, 9), min_size=1, max_size=12),
    band=st.tuples(st.integers(-4, 4), st.integers(0, 5)),
    threads=st.sampled_from([1, 2]),
)
def test_property_band_join(batches, partitions, fanout, probe, band, threads):
    n = sum(len(b) for b in batches)
    ix = WiBTree(max(1, n), partitions=partitions, fanout=fanout, threads=threads)
    for lo, hi, want in band_property_cases(ix, batches, probe, band, sides="RS"):
        np.testing.assert_array_equal(canon(*ix.probe(lo, hi)), want)
