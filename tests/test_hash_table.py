"""The hash table subwindow against the nested loop (and a brute force) on every key
distribution, predicate shape (point lookups, enumerated narrow bands, the scan of wide
and float bands), window filter mode and batch pattern; its check() catches a broken
table; in the engine against the reference of DESIGN section 2."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from panjoin.generate import generate
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import I64_MAX, I64_MIN, parse_predicate, parse_window, probe_bounds
from panjoin.subwindow import make_index
from panjoin.subwindow.hash_table import SPAN, HashTable, predicate_fits
from tests.index_helpers import (
    MODES,
    PREDICATES,
    assert_same,
    band_property_cases,
    batch_sizes,
    canon,
    draw_keys,
    fill,
    probe_cases,
    probe_keys,
)

DISTS = ["uniform", "zipf", "increasing", "equal", "extreme", "negative", "float"]
#: eq and a narrow band go through lookups, the rest through the scan
SHAPES = [*PREDICATES, "band:7", "bands:-3,3;20,22", f"band:{SPAN}"]


@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("sizes", ["ones", "small", "one batch"])
def test_hash_matches_nested_loop(dist, sizes):
    rng = np.random.default_rng(DISTS.index(dist) * 10 + len(sizes))
    n = 600
    keys = draw_keys(rng, dist, n, float_extremes=True)
    batches = {"ones": [1] * n, "small": batch_sizes(rng, n, 1, 40), "one batch": [n]}[sizes]
    ix = HashTable(n, key_dtype=keys.dtype)
    ref = make_index("nested", n, key_dtype=keys.dtype)
    fill([ix, ref], rng, keys, batches)
    total = 0
    for case in probe_cases(rng, SHAPES, MODES, 150,
                            lambda r: probe_keys(r, keys, dist, 150)):
        total += assert_same(ix, ref, *case)
    assert total > 0
    assert len(ix) == n and ix.nbytes > 0


def test_lookups_are_what_answers_eq_and_narrow_bands():
    """The fast paths are the ones taken (a test that the scan fallback is not all)."""
    ix = HashTable(64)
    k = np.arange(64, dtype=np.int64)
    ix.insert(k, k, k)
    for pred, fast in [("eq", True), ("band:3", True), (f"band:{(SPAN - 1) // 2}", True),
                       (f"band:{SPAN}", False), ("ne", False)]:
        lo, hi = probe_bounds(parse_predicate(pred), "R", np.array([10], np.int64))
        assert (ix._points(lo, hi) is not None) == fast, pred
    lo, hi = probe_bounds(parse_predicate("eq"), "R", np.array([1.5]))
    assert ix._points(lo, hi) is not None
    lo, hi = probe_bounds(parse_predicate("band:1"), "R", np.array([1.5]))
    assert ix._points(lo, hi) is None
    assert predicate_fits(parse_predicate("eq")) and predicate_fits(parse_predicate("band:3"))
    assert not predicate_fits(parse_predicate("ne"))
    assert not predicate_fits(parse_predicate("band:100"))


def test_int64_ends_enumerate_without_overflow():
    keys = np.array([I64_MIN, I64_MIN + 1, I64_MIN + 2, I64_MAX - 2, I64_MAX - 1, I64_MAX],
                    dtype=np.int64)
    ix, ref = HashTable(6), make_index("nested", 6)
    for x in (ix, ref):
        x.insert(keys, np.zeros(6, np.int64), np.arange(6, dtype=np.int64))
    probe = keys.copy()
    for pred in ("eq", "band:1", "band:2", "bands:-2,-1"):
        for side in "RS":
            lo, hi = probe_bounds(parse_predicate(pred), side, probe)
            assert assert_same(ix, ref, lo, hi, what=f"{pred} {side}") > 0


def test_negative_zero_equals_zero():
    ix = HashTable(4, key_dtype=np.float64)
    ix.insert(np.array([-0.0, 0.0, 1.0]), np.zeros(3, np.int64), np.arange(3, dtype=np.int64))
    ix.check()
    lo, hi = probe_bounds(parse_predicate("eq"), "R", np.array([0.0]))
    assert sorted(ix.probe(lo, hi)[1].tolist()) == [0, 1]


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.lists(st.integers(-20, 20), min_size=0, max_size=12),
                        min_size=1, max_size=8),
       probe=st.lists(st.integers(-25, 25), min_size=1, max_size=15),
       band=st.tuples(st.integers(-6, 6), st.integers(0, 6)))
def test_bands_against_brute_force(batches, probe, band):
    n = sum(len(b) for b in batches)
    ix = HashTable(max(1, n))
    for lo, hi, want in band_property_cases(ix, batches, probe, band, sides="RS"):
        np.testing.assert_array_equal(canon(*ix.probe(lo, hi)), want)


def test_check_catches_a_broken_table():
    ix = HashTable(32)
    k = np.repeat(np.arange(8, dtype=np.int64), 4)
    ix.insert(k, k, np.arange(32, dtype=np.int64))
    ix.check()
    broken = [
        lambda t: t.nxt.__setitem__(31, 31),                  # a chain looping on itself
        lambda t: t.slots.__setitem__(np.flatnonzero(t.slots[1::2])[0] * 2 + 1, 0),  # lost
        lambda t: t.keys.__setitem__(5, 99),                  # a row under another key
        lambda t: setattr(t, "n", 33),                        # more rows than capacity
    ]
    for breaker in broken:
        t = HashTable(32)
        t.insert(k, k, np.arange(32, dtype=np.int64))
        breaker(t)
        with pytest.raises(AssertionError):
            t.check()


def test_capacity_and_dtypes_are_checked():
    ix = HashTable(3)
    with pytest.raises(ValueError, match="inserting 4"):
        ix.insert(np.arange(4), np.zeros(4, np.int64), np.arange(4))
    with pytest.raises(TypeError, match="keys are float64"):
        ix.insert(np.array([1.0]), np.zeros(1, np.int64), np.arange(1))


@pytest.mark.parametrize("window", ["count:300,200", "time:60,90"])
@pytest.mark.parametrize("pred", ["eq", "band:2"])
@pytest.mark.parametrize("dist", ["zipf", "increasing", "equal"])
def test_hash_in_the_engine_matches_reference(window, pred, dist):
    from panjoin.manager.engine import JoinEngine

    ev = generate(3000, dist, key_max=400, rate=10_000,
                  disorder_ms=20 if window.startswith("time") else 0, seed=7)
    lateness = 10 if window.startswith("time") else 0
    ref = reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window(window, lateness),
                         parse_predicate(pred))
    eng = JoinEngine(parse_window(window, lateness), pred, index="hash",
                     subwindow_size=64, batch_size=23, threads=1)
    for a in range(0, len(ev), 250):
        eng.push(ev.slice(a, a + 250))
    eng.flush()
    r, s = eng.take_results()
    assert len(ref.pairs) > 100
    np.testing.assert_array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)


def test_the_engine_says_when_hash_would_scan(caplog):
    from panjoin.manager.engine import JoinEngine

    with caplog.at_level("WARNING", logger="panjoin.subwindow.hash"):
        JoinEngine("count:10,10", "eq", index="hash")
    assert not caplog.records
    for pred in ("ne", "band:100"):
        with caplog.at_level("WARNING", logger="panjoin.subwindow.hash"):
            JoinEngine("count:10,10", pred, index="hash")
        assert "use --index bisort" in caplog.text
        caplog.clear()
    with caplog.at_level("WARNING", logger="panjoin.subwindow.hash"):
        JoinEngine("count:10,10", "band:1", index="hash", key_dtype="float64")
    assert "scans every subwindow" in caplog.text
