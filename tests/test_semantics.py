"""Spec parsing and exact probe bounds (DESIGN section 2)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from panjoin.reference import _key_match
from panjoin.semantics import (
    I64_MAX,
    I64_MIN,
    SpecError,
    parse_predicate,
    parse_size,
    parse_window,
    probe_bounds,
)


def test_parse_window():
    w = parse_window("count:1000,2000")
    assert (w.kind, w.r, w.s) == ("count", 1000, 2000)
    assert parse_window("count:8M").r == 8 << 20
    t = parse_window("time:5000,3000", lateness=100)
    assert (t.kind, t.r, t.s, t.lateness) == ("time", 5000, 3000, 100)
    assert str(t) == "time:5000,3000"
    assert parse_size("64K") == 65536


@pytest.mark.parametrize("bad", ["", "count", "rows:5", "count:0,5", "count:a,b", "time:1,2,3",
                                 "count:-4,4"])
def test_bad_window(bad):
    with pytest.raises(SpecError, match="window"):
        parse_window(bad)


def test_lateness_only_for_time():
    with pytest.raises(SpecError, match="lateness"):
        parse_window("count:5,5", lateness=3)
    with pytest.raises(SpecError, match="lateness"):
        parse_window("time:5,5", lateness=-1)


def test_parse_predicate():
    assert parse_predicate("eq").bands == ((0.0, 0.0),)
    assert parse_predicate("band:10").bands == ((-10.0, 10.0),)
    assert parse_predicate("bands:20,35;-5,5").bands == ((-5.0, 5.0), (20.0, 35.0))
    # overlapping bands merge, so a pair is never reported twice
    assert parse_predicate("bands:0,10;5,15").bands == ((0.0, 15.0),)
    assert parse_predicate("ne").negated
    assert str(parse_predicate("bands:-5,5;20,35")) == "bands:-5,5;20,35"


@pytest.mark.parametrize("bad", ["", "lt", "band:", "band:-1", "band:x", "bands:", "bands:5,1",
                                 "bands:1,2,3", "eq:4", "band:nan"])
def test_bad_predicate(bad):
    with pytest.raises(SpecError, match="predicate"):
        parse_predicate(bad)


def _brute(pred, side, keys, stored):
    """Mask [i, j]: stored[j] matches probe key i, by the reference's exact comparison."""
    return np.array([_key_match(k, stored, pred, probe_is_r=(side == "R")) for k in keys])


def _by_bounds(pred, side, keys, stored):
    lo, hi = probe_bounds(pred, side, keys)
    m = np.zeros((len(keys), len(stored)), dtype=bool)
    for b in range(lo.shape[0]):
        m |= (stored[None, :] >= lo[b][:, None]) & (stored[None, :] <= hi[b][:, None])
    return m


EXTREME = np.array([I64_MIN, I64_MIN + 1, I64_MIN + 5, -3, 0, 2, I64_MAX - 4, I64_MAX - 1,
                    I64_MAX], dtype=np.int64)


@pytest.mark.parametrize("spec", ["eq", "ne", "band:3", "bands:-7,-2;4,9", "band:0.5",
                                  "bands:0.2,0.8", "band:9223372036854775807",
                                  "bands:-18446744073709551615,-9223372036854775809"])
@pytest.mark.parametrize("side", ["R", "S"])
def test_int_bounds_exact_at_extremes(spec, side):
    pred = parse_predicate(spec)
    keys = np.sort(EXTREME)
    assert np.array_equal(_by_bounds(pred, side, keys, EXTREME), _brute(pred, side, keys, EXTREME))


def test_bounds_sorted_for_sorted_keys():
    keys = np.sort(np.random.default_rng(0).integers(-100, 100, 500))
    for spec in ("band:5", "bands:-9,-3;2,40", "ne"):
        lo, hi = probe_bounds(parse_predicate(spec), "S", keys)
        for b in range(lo.shape[0]):
            ok = lo[b] <= hi[b]
            assert np.all(np.diff(lo[b][ok]) >= 0) and np.all(np.diff(hi[b][ok]) >= 0)


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False), min_size=1,
                  max_size=12),
    stored=st.lists(st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False), min_size=1,
                    max_size=12),
    a=st.floats(-50, 50, allow_nan=False),
    width=st.floats(0, 50, allow_nan=False),
    side=st.sampled_from(["R", "S"]),
)
def test_float_bounds_exact(keys, stored, a, width, side):
    """Float bands: s.key - r.key compared exactly, from both probe sides."""
    # stored keys near each probe key's band edges, where rounding would bite
    k = np.sort(np.array(keys))
    s = np.array(stored + [x + a for x in keys] + [x + a + width for x in keys])
    pred = parse_predicate(f"bands:{a!r},{a + width!r}")
    assert np.array_equal(_by_bounds(pred, side, k, s), _brute(pred, side, k, s))


_FMAX = float(np.finfo(np.float64).max)


def _least_exact(k: float, a: float, lo: float) -> bool:
    """``lo`` is the least float64 c with c - k >= a in reals (-inf: every finite
    float passes; inf: none does)."""
    from fractions import Fraction as F

    if lo == -np.inf:
        return F(-_FMAX) - F(k) >= F(a)
    if lo == np.inf:
        return F(_FMAX) - F(k) < F(a)
    with np.errstate(over="ignore"):
        below = np.nextafter(lo, -np.inf)
    return F(lo) - F(k) >= F(a) and (below == -np.inf or F(float(below)) - F(k) < F(a))


def _greatest_exact(k: float, b: float, hi: float) -> bool:
    """``hi`` is the greatest float64 c with c - k <= b in reals."""
    return _least_exact(-k, -b, -hi)  # c - k <= b  <=>  (-c) - (-k) >= -b


@settings(max_examples=400, deadline=None)
@given(keys=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1,
                     max_size=16),
       a=st.floats(allow_nan=False, allow_infinity=False),
       b=st.floats(allow_nan=False, allow_infinity=False))
def test_float_bound_kernel_is_exact_over_the_whole_range(keys, a, b):
    """Each bound alone (the other side open) is the least, or the greatest, float64
    whose exact difference from the key passes, from subnormals to overflow; both
    together mark a band that no float passes as lo = inf, hi = -inf."""
    from panjoin.bounds_kernels import float_bounds

    k = np.array(keys)
    lo, hi, lo1, hi1 = (np.empty(k.size) for _ in range(4))
    float_bounds(k, a, np.inf, lo1, hi)
    assert (hi == np.inf).all()
    float_bounds(k, -np.inf, b, lo, hi1)
    assert (lo == -np.inf).all()
    for x, lx, hx in zip(keys, lo1, hi1, strict=True):
        assert _least_exact(x, a, float(lx)), (x, a, lx)
        assert _greatest_exact(x, b, float(hx)), (x, b, hx)
    float_bounds(k, a, b, lo, hi)
    empty = lo1 > hi1
    assert np.array_equal(lo, np.where(empty, np.inf, lo1))
    assert np.array_equal(hi, np.where(empty, -np.inf, hi1))


def test_float_ne():
    k = np.array([0.1, 1.0, 2.5])
    s = np.array([0.1, np.nextafter(0.1, 1), 1.0, 3.0])
    pred = parse_predicate("ne")
    assert np.array_equal(_by_bounds(pred, "R", k, s), _brute(pred, "R", k, s))
