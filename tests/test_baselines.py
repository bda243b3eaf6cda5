"""The peer operators of issue 7 against the brute-force reference, and the interval machinery."""

import numpy as np
import pytest
from index_helpers import MODES, PREDICATES, assert_same, fill, random_filter

from panjoin.baselines.intervals import (
    INF,
    Add,
    And,
    Cmp,
    Col,
    Const,
    Interval,
    Sub,
    evaluate,
    linear_form,
    propagate,
)
from panjoin.baselines.symmetric_hash_join import SymmetricHashJoin, shj_join
from panjoin.events import EventTable
from panjoin.generate import generate
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window

A, B = Col("build", "a"), Col("probe", "b")

# --------------------------------------------------------------------------- intervals


def test_interval_operators():
    x, y = Interval(1, 2), Interval(3, 4)
    assert x + y == Interval(4, 6)
    assert x - y == Interval(-3, -1)
    assert (x & y).empty and not (Interval(1, 5) & y).empty
    assert Interval(1, INF) - Interval(6, INF) == Interval(-INF, INF)


def test_bottom_up_evaluation():
    e = Sub(Add(A, Const(1)), B)
    assert evaluate(e, {A: Interval(0, 10), B: Interval(2, 3)}) == Interval(-2, 9)
    assert evaluate(And(Cmp(">", A, B)), {A: Interval(5, 9), B: Interval(0, 4)}) == Interval(1, 1)
    assert evaluate(And(Cmp(">", A, B)), {A: Interval(0, 4), B: Interval(4, 9)}) == Interval(0, 0)
    assert evaluate(And(Cmp(">=", A, B)), {A: Interval(0, 4), B: Interval(4, 9)}) == Interval(0, 1)


def test_top_down_propagation_paper_example():
    # a >= b - 3 (closed, as in the post's figure), a in [1, inf], b in [6, inf] -> a in [3, inf]
    f = And(Cmp(">=", A, Sub(B, Const(3))))
    out = propagate(f, {A: Interval(1, INF), B: Interval(6, INF)})
    assert out[A] == Interval(3, INF) and out[B] == Interval(6, INF)
    # strict over integers: a > b - 3 -> a >= 4
    out = propagate(And(Cmp(">", A, Sub(B, Const(3)))), {A: Interval(1, INF), B: Interval(6, INF)})
    assert out[A] == Interval(4, INF)


def test_propagation_through_sums_and_both_directions():
    # a + 1 > b + 5 and a + 3 < b + 10 (the post's benchmark filter), b in [10, 20]
    f = And(Cmp(">", Add(A, Const(1)), Add(B, Const(5))),
            Cmp("<", Add(A, Const(3)), Add(B, Const(10))))
    out = propagate(f, {B: Interval(10, 20)})
    assert out[A] == Interval(15, 26)  # a > b + 4 >= 14 ; a < b + 7 <= 27
    # a narrowed to [0, 3] narrows b the other way: b < a - 4 <= -1 -> infeasible with b >= 10
    out = propagate(f, {A: Interval(0, 3), B: Interval(10, 20)})
    assert out[A].empty or out[B].empty


def test_linear_form_is_exact_for_strict_and_closed():
    f = And(Cmp(">", A, Sub(B, Const(3))), Cmp("<=", A, B))
    rows = linear_form(f)
    assert rows == [({A: 1, B: -1}, 3 - 1), ({B: 1, A: -1}, 0)]
    for a in range(-5, 6):
        for b in range(-5, 6):
            want = a > b - 3 and a <= b
            got = all(sum(c * {A: a, B: b}[k] for k, c in co.items()) + k0 >= 0 for co, k0 in rows)
            assert want == got, (a, b)


def test_bad_comparison_is_rejected():
    with pytest.raises(ValueError, match="comparison"):
        Cmp("==", A, B)


# --------------------------------------------------------------------------- SHJ vs reference


def _ref(ev, window, pred, lateness=0):
    w = parse_window(window, lateness)
    return reference_join(ev.stream, ev.id, ev.key, ev.ts, w, parse_predicate(pred))


CASES = [
    # (window, predicate, dist, float_keys, disorder_ms, lateness)
    ("count:40,25", "eq", "zipf", False, 0, 0),
    ("count:40,25", "band:3000", "uniform", False, 0, 0),
    ("count:16,64", "bands:-900,-100;200,2500", "increasing", False, 0, 0),
    ("count:30,30", "ne", "zipf", False, 0, 0),
    ("count:7,50", "eq", "equal", False, 0, 0),
    ("count:33,21", "band:1500.5", "uniform", True, 0, 0),
    ("time:20,35", "eq", "zipf", False, 0, 0),
    ("time:20,35", "band:2000", "uniform", False, 15, 15),
    ("time:25,10", "eq", "zipf", False, 30, 10),  # out of order, some tuples late
    ("time:40,40", "band:800.25", "normal", True, 20, 5),
    ("time:15,15", "eq", "equal", False, 10, 0),
]


@pytest.mark.parametrize("chunk", [1, 13, 256])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_shj_matches_reference(case, chunk):
    window, pred, dist, fk, disorder, lateness = case
    ev = generate(700, dist, key_max=20_000, float_keys=fk, rate=20_000, disorder_ms=disorder,
                  seed=len(window) + chunk, r_fraction=0.45)
    ref = _ref(ev, window, pred, lateness)
    pairs, late = shj_join(ev, window, pred, allowed_lateness=lateness, chunk=chunk)
    np.testing.assert_array_equal(sort_pairs(pairs), ref.pairs)
    for s in ("R", "S"):
        np.testing.assert_array_equal(late[s], ref.late_ids[s])


def test_zipf_skew_equi_count_window_matches_reference():
    ev = generate(1500, "zipf", key_max=1000, seed=3)
    ref = _ref(ev, "count:100,100", "eq")
    pairs, _ = shj_join(ev, "count:100,100", "eq", chunk=64)
    assert len(ref.pairs) > 1000  # heavy duplicates: long hash chains
    np.testing.assert_array_equal(sort_pairs(pairs), ref.pairs)


def test_extreme_int64_keys():
    i64 = np.iinfo(np.int64)
    ev = generate(400, "uniform", key_min=i64.min, key_max=i64.max, seed=5)
    ev.key[::7] = i64.max
    ev.key[3::7] = i64.min
    for pred in ("eq", "band:9223372036854775807"):
        ref = _ref(ev, "count:30,30", pred)
        pairs, _ = shj_join(ev, "count:30,30", pred, chunk=17)
        np.testing.assert_array_equal(sort_pairs(pairs), ref.pairs)


def test_float_signed_zero_keys_join():
    ev = EventTable(np.array([0, 1], np.uint8), np.array([0, 0]), np.array([-0.0, 0.0]),
                    np.array([0, 1]))
    pairs, _ = shj_join(ev, "count:5,5", "eq")
    assert pairs.tolist() == [[0, 0]]


def test_pruning_keeps_buffers_at_window_size():
    """The buffers stay near the window (count) or the time span (time), not the stream."""
    ev = generate(20_000, "uniform", key_max=1 << 30, rate=10_000, seed=1)
    j = SymmetricHashJoin("count:500,300", "eq")
    for a in range(0, len(ev), 1000):
        j.push(ev.slice(a, a + 1000))
    assert j.pruned > 15_000
    b = j.buffered()
    # R rows are kept while a future S can still see them: the last WR R-tuples
    assert 500 <= b["R"] <= 500 + 1000 and 300 <= b["S"] <= 300 + 1000
    j = SymmetricHashJoin("time:200,100", "eq", allowed_lateness=50)
    ev = generate(20_000, "uniform", key_max=1 << 30, rate=10_000, disorder_ms=40, seed=2)
    for a in range(0, len(ev), 500):
        j.push(ev.slice(a, a + 500))
    # 10 tuples/ms; an R row lives while ts > maxts - L - TR: ~ (200 + 50 + 50) ms of R
    assert j.peak_rows < 8000 and j.pruned > 10_000
    # without pruning everything stays, and the result is the same
    j2 = SymmetricHashJoin("time:200,100", "eq", allowed_lateness=50, prune=False)
    for a in range(0, len(ev), 500):
        j2.push(ev.slice(a, a + 500))
    assert sum(j2.buffered().values()) == len(ev) - sum(len(v) for v in j2.take_late().values())


def test_prune_bounds_time_and_count():
    j = SymmetricHashJoin("time:100,40", "eq", allowed_lateness=5)
    j.push(EventTable(np.array([0, 1], np.uint8), np.array([0, 0]), np.array([1, 2]),
                      np.array([1000, 1010])))
    # future ts >= 1010 - 5; R row needs s.ts < r.ts + 100 -> r.ts >= 1005 - 99 = 906
    assert j.prune_bounds("R").tolist() == [906]
    # S row needs s.ts > r.ts - 40 with r.ts >= 1005 -> s.ts >= 966
    assert j.prune_bounds("S").tolist() == [966]
    j = SymmetricHashJoin("count:10,4", "eq")
    j.push(generate(50, seed=0))
    nr, ns = j.total["R"], j.total["S"]
    # R row needs r.seq >= s.opp - WR with future s.opp >= #R so far; S row likewise
    assert j.prune_bounds("R").tolist()[0] == nr - 10
    assert j.prune_bounds("S").tolist()[0] == ns - 4


def test_mixed_key_types_are_rejected():
    j = SymmetricHashJoin("count:5,5", "eq")
    j.push(generate(10, seed=0))
    with pytest.raises(TypeError, match="one key type"):
        j.push(generate(10, float_keys=True, seed=0))


# --------------------------------------------------------------------------- sorted list


@pytest.mark.parametrize("pred", PREDICATES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["int64", "float64"])
def test_sortedlist_index_matches_nested_loop(pred, mode, dtype):
    from panjoin.semantics import probe_bounds
    from panjoin.subwindow import make_index

    rng = np.random.default_rng(len(pred) * 7 + mode)
    keys = rng.integers(-30, 30, 400).astype(dtype)
    if dtype == "float64":
        keys = keys / 2 + 0.1
    ixs = [make_index(k, 400, dtype) for k in ("sortedlist", "nested")]
    fill(ixs, rng, keys, [1, 50, 149, 200])
    probe = np.sort(rng.integers(-35, 35, 120).astype(dtype))
    if dtype == "float64":
        probe = probe / 2 + 0.1
    flt = random_filter(rng, mode, probe.shape[0])
    for side in ("R", "S"):
        lo, hi = probe_bounds(parse_predicate(pred), side, probe)
        assert assert_same(ixs[0], ixs[1], lo, hi, flt, f"{pred} from {side}") > 0
    assert ixs[0].nbytes > 0 and len(ixs[0]) == 400


@pytest.mark.parametrize("window", ["count:60,45", "time:50,80"])
@pytest.mark.parametrize("pred", ["eq", "band:900"])
def test_sortedlist_in_the_engine_matches_reference(window, pred):
    from panjoin.manager.engine import JoinEngine

    ev = generate(900, "zipf" if pred == "eq" else "uniform", key_max=30_000, rate=10_000,
                  disorder_ms=20 if window.startswith("time") else 0, seed=4)
    lateness = 10 if window.startswith("time") else 0
    ref = _ref(ev, window, pred, lateness)
    eng = JoinEngine(parse_window(window, lateness), pred, index="sortedlist",
                     subwindow_size=16, batch_size=37, threads=1)
    for a in range(0, len(ev), 100):
        eng.push(ev.slice(a, a + 100))
    eng.flush()
    r, s = eng.take_results()
    assert len(ref.pairs) > 50
    np.testing.assert_array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)


# --------------------------------------------------------------------------- DuckDB


DUCK_CASES = [
    ("count:40,25", "eq", "zipf", 0, 0),
    ("count:16,64", "bands:-900,-100;200,2500", "increasing", 0, 0),
    ("count:33,21", "band:1500", "uniform", 0, 0),
    ("count:30,30", "ne", "uniform", 0, 0),
    ("time:25,10", "eq", "zipf", 30, 10),
    ("time:20,35", "band:2000", "uniform", 15, 15),
]


@pytest.mark.parametrize("plan", ["bucket", "range"])
@pytest.mark.parametrize("case", DUCK_CASES, ids=[f"{c[0]}-{c[1]}" for c in DUCK_CASES])
def test_duckdb_join_matches_reference(case, plan):
    from panjoin.baselines.duckdb_join import duckdb_join

    window, pred, dist, disorder, lateness = case
    ev = generate(700, dist, key_max=20_000, rate=20_000, disorder_ms=disorder, seed=9,
                  r_fraction=0.55)
    ref = _ref(ev, window, pred, lateness)
    assert len(ref.pairs) > 0
    got = duckdb_join(ev, window, pred, allowed_lateness=lateness, pairs=True, threads=1,
                      plan=plan)
    np.testing.assert_array_equal(got.pairs, ref.pairs)
    assert duckdb_join(ev, window, pred, allowed_lateness=lateness, plan=plan).count == len(
        ref.pairs)


def test_duckdb_bucket_plan_negative_keys_and_fractional_band():
    from panjoin.baselines.duckdb_join import duckdb_join

    ev = generate(600, "uniform", key_min=-5000, key_max=5000, seed=2)
    for pred in ("band:37.5", "bands:-300,-251;0.5,9.5", "band:0"):
        ref = _ref(ev, "count:80,50", pred)
        got = duckdb_join(ev, "count:80,50", pred, pairs=True)
        np.testing.assert_array_equal(got.pairs, ref.pairs)


# --------------------------------------------------------------------------- residual bands


@pytest.mark.parametrize("window", ["count:120,90", "time:40,25"])
def test_residual_band_in_shj_filter_and_duckdb_sql(window):
    """A 2-D band join (x band as the key, y band as a residual): SHJ (in its filter) and
    DuckDB (in SQL, both plans) give the reference's x-band pairs that pass the y band."""
    from panjoin.baselines.duckdb_join import duckdb_join

    ev = generate(1500, "uniform", key_min=1, key_max=400, rate=20_000, seed=5)
    y = np.random.default_rng(1).integers(0, 300, len(ev)).astype(np.int64)
    ref = _ref(ev, window, "band:10").pairs
    yr, ys = y[ev.stream == 0], y[ev.stream == 1]
    d = ys[ref[:, 1]] - yr[ref[:, 0]]
    want = ref[(d >= -7) & (d <= 12)]
    assert 0 < len(want) < len(ref)
    residual = {"y": (-7, 12)}
    j = SymmetricHashJoin(window, "band:10", residual=residual)
    rs, ss = [], []
    for a in range(0, len(ev), 128):
        j.push(ev.slice(a, a + 128), {"y": y[a:a + 128]})
        r, s = j.take_results()
        rs.append(r)
        ss.append(s)
    got = sort_pairs(np.stack([np.concatenate(rs), np.concatenate(ss)], axis=1))
    np.testing.assert_array_equal(got, want)
    assert j.pruned > 0  # the window still prunes with an unbounded residual column
    for plan in ("bucket", "range"):
        res = duckdb_join(ev, window, "band:10", pairs=True, threads=1, plan=plan,
                          residual=residual, extra={"y": y})
        np.testing.assert_array_equal(res.pairs, want)
    with pytest.raises(ValueError, match="residual columns"):
        SymmetricHashJoin(window, "band:10", residual={"y": (0, 1)}).push(ev.slice(0, 4))
