"""The offline peers Polars and DataFusion (issue 20) against the brute-force reference:
every plan, window and predicate on generated streams (uniform, Zipf, increasing,
all-equal keys; negative, extreme int64 and float keys; out-of-order input with
lateness; the 2-D residual band), property tests, and the peer benchmark's runs, whose
pair digests must agree with PanJoin's and DuckDB's."""

import os
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from panjoin.baselines.datafusion_join import check_int64, datafusion_join, int_bands
from panjoin.baselines.duckdb_join import join_sql
from panjoin.baselines.polars_join import check_threads, polars_join
from panjoin.bench.peers import (
    OFFLINE_PEERS,
    PeerConfig,
    PeerRunner,
    Workload,
    calibrate,
    check_results,
    events_for,
    pair_digest,
    run_peers,
)
from panjoin.events import EventTable
from panjoin.generate import generate
from panjoin.reference import reference_join
from panjoin.semantics import I64_MAX, I64_MIN, parse_predicate, parse_window

pytest.importorskip("polars")
pytest.importorskip("datafusion")

# (join, plan): every plan of both peers
JOINS = [(polars_join, "bucket"), (polars_join, "iejoin"), (datafusion_join, "bucket"),
         (datafusion_join, "range")]
JOIN_IDS = ["polars-bucket", "polars-iejoin", "datafusion-bucket", "datafusion-range"]


def _ref(ev, window, pred, lateness=0, key2=None):
    p = parse_predicate(pred)
    return reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window(window, lateness), p,
                          key2=key2).pairs


def _events(keys, seed=0, ts=None) -> EventTable:
    """An event table of these keys in arrival order, streams drawn at random."""
    keys = np.asarray(keys)
    rng = np.random.default_rng(seed)
    stream = rng.integers(0, 2, len(keys)).astype(np.uint8)
    ids = np.zeros(len(keys), np.int64)
    for x in (0, 1):
        ids[stream == x] = np.arange(int((stream == x).sum()))
    ts = np.arange(len(keys), dtype=np.int64) if ts is None else np.asarray(ts, np.int64)
    return EventTable(stream, ids, keys, ts)


def _check(join, plan, ev, window, pred, lateness=0, **kw):
    want = _ref(ev, window, pred, lateness)
    got = join(ev, window, pred, allowed_lateness=lateness, pairs=True, threads=1, plan=plan,
               **kw)
    np.testing.assert_array_equal(got.pairs, want)
    assert got.count == len(want)
    return want


# (window, disorder_ms, lateness): count windows, and time windows over out-of-order
# input with late tuples
WINDOWS = [("count:40,25", 0, 0), ("time:30,20", 8, 4)]
PREDICATES = ["eq", "band:30", "bands:-200,-150;10,40", "band:12.5", "ne"]


@pytest.mark.parametrize("dist", ["uniform", "zipf", "increasing"])
@pytest.mark.parametrize("window", WINDOWS, ids=[w[0] for w in WINDOWS])
@pytest.mark.parametrize("pred", PREDICATES)
def test_matches_reference(pred, window, dist):
    window, disorder, lateness = window
    ev = generate(500, dist, key_min=-300, key_max=300, rate=20_000,
                  disorder_ms=disorder, seed=11, r_fraction=0.55)
    for join, plan in JOINS:
        want = _check(join, plan, ev, window, pred, lateness)
        assert len(want) > 10  # a join that finds nothing fails
    if lateness:  # the input is out of order and some tuples are late
        late = reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window(window, lateness),
                              parse_predicate(pred)).late_ids
        assert sum(len(v) for v in late.values()) > 0


@pytest.mark.parametrize("join,plan", JOINS, ids=JOIN_IDS)
def test_all_equal_keys(join, plan):
    """Every tuple has the same key: the window alone decides."""
    ev = _events(np.full(400, 7, np.int64), seed=3)
    for pred in ("eq", "band:0", "bands:-3,-1;0,2"):
        assert len(_check(join, plan, ev, "count:20,35", pred)) > 1000
    assert len(_check(join, plan, ev, "count:20,35", "ne")) == 0


def _extreme_keys(n: int, seed: int) -> np.ndarray:
    """Keys within 20 of int64's ends, and some around 0."""
    rng = np.random.default_rng(seed)
    k = np.concatenate([rng.integers(I64_MAX - 20, I64_MAX, n // 3, endpoint=True),
                        rng.integers(I64_MIN, I64_MIN + 20, n // 3, endpoint=True),
                        rng.integers(-20, 20, n - 2 * (n // 3))]).astype(np.int64)
    return k[rng.permutation(n)]


@pytest.mark.parametrize("plan", ["bucket", "iejoin"])
def test_polars_extreme_int64_keys_are_exact(plan):
    """Polars sums a band's bounds in int128: keys at int64's ends join exactly, bands of
    any width included (a bound beyond int64 is no bound, or an empty band)."""
    ev = _events(_extreme_keys(450, 1), seed=1)
    for pred in ("eq", "band:3", "bands:-5,-1;2,7", "band:0.5", "bands:0,9223372036854775807",
                 "bands:-18446744073709551616,-10", "band:1e30", "ne"):
        want = _check(polars_join, plan, ev, "count:60,80", pred)
        assert len(want) > 0, pred


def test_datafusion_refuses_int64_overflow():
    """DataFusion wraps int64 sums silently: the peer raises before the query where a
    sum would leave int64 (as DuckDB raises in it), and joins exactly where none does."""
    ev = _events(_extreme_keys(450, 2), seed=2)
    for pred in ("band:3", "bands:-5,-1;2,7"):
        with pytest.raises(ValueError, match="leave int64"):
            datafusion_join(ev, "count:60,80", pred, pairs=True)
    for pred in ("eq", "ne"):  # no sums on the key
        assert len(_check(datafusion_join, "bucket", ev, "count:60,80", pred)) > 0
    # the bucket's last + 1 overflows at int64's top even for a band of width 0
    with pytest.raises(ValueError, match="leave int64"):
        datafusion_join(ev, "count:60,80", "band:0.5", pairs=True)
    # keys that stay clear of the ends by more than the band: exact
    near = _events(np.where(_extreme_keys(450, 2) > 0, I64_MAX - 40, I64_MIN + 40)
                   + np.random.default_rng(5).integers(-9, 9, 450), seed=2)
    for plan in ("bucket", "range"):
        assert len(_check(datafusion_join, plan, near, "count:60,80", "band:7")) > 0


def test_check_int64_counts_every_sum():
    ev = _events(np.array([I64_MIN + 5, 0, I64_MAX - 5]), seed=0)
    w = parse_window("count:2,2")
    check_int64(ev, w, int_bands(parse_predicate("band:5")), "range")
    with pytest.raises(ValueError, match="band edges"):
        check_int64(ev, w, int_bands(parse_predicate("band:6")), "range")
    with pytest.raises(ValueError):  # a bucket floors the least key below int64
        check_int64(ev, w, int_bands(parse_predicate("band:5")), "bucket")
    assert int_bands(parse_predicate("bands:0.2,0.8;2.5,4")).bands == ((3, 4),)
    assert int_bands(parse_predicate("bands:0.2,0.8")).bands == ((1, 0),)  # empty


@pytest.mark.parametrize("join,plan", JOINS, ids=JOIN_IDS)
def test_negative_keys_and_fractional_edges(join, plan):
    ev = generate(500, "uniform", key_min=-5000, key_max=5000, seed=2)
    for pred in ("band:37.5", "bands:-300,-251;0.5,9.5", "band:0", "bands:0.2,0.8"):
        want = _check(join, plan, ev, "count:80,50", pred)
        assert len(want) > 0 or pred == "bands:0.2,0.8"


def _float_cases():
    rng = np.random.default_rng(1)
    tenths = rng.integers(-30, 30, 400) * 0.1  # s - r rounds to either side of 0.3
    zeros = np.where(rng.random(300) < 0.5, -0.0, 0.0) + np.where(rng.random(300) < 0.3, 0.1, 0)
    big = rng.integers(-30, 30, 300) * 0.1 + 1e16  # sums round to a multiple of 2
    return {"tenths": tenths, "signed-zeros": zeros, "big": big}


@pytest.mark.parametrize("join,plan", JOINS, ids=JOIN_IDS)
@pytest.mark.parametrize("name", list(_float_cases()))
def test_float_keys_exact_at_band_edges(join, plan, name):
    """Float keys whose differences round onto a band's edge: the pairs of the exact
    semantics (rational differences), -0.0 equal to 0.0."""
    ev = _events(_float_cases()[name], seed=4)
    for pred in ("eq", "band:0.3", "bands:-0.5,-0.2;0.1,0.3", "band:3", "ne"):
        want = _check(join, plan, ev, "count:50,60", pred)
        # near 1e16 floats are 2 apart: no difference lies in (0.1, 0.5)
        assert len(want) > 0 or (name, pred) == ("big", "bands:-0.5,-0.2;0.1,0.3")


def test_float_edges_differ_from_float_arithmetic():
    """The float case is a real test: among the window's pairs, plain float sums
    (``s.key >= r.key - 0.3``) would join a different set than the exact semantics."""
    k = _float_cases()["tenths"]
    ev = _events(k, seed=4)
    window = {tuple(p) for pred in ("eq", "ne") for p in _ref(ev, "count:50,60", pred).tolist()}
    r, s = k[ev.stream == 0], k[ev.stream == 1]
    naive = {(i, j) for i, j in window if r[i] - 0.3 <= s[j] <= r[i] + 0.3}
    exact = {tuple(p) for p in _ref(ev, "count:50,60", "band:0.3").tolist()}
    assert exact <= window and naive != exact


@pytest.mark.parametrize("join,plan", JOINS, ids=JOIN_IDS)
@pytest.mark.parametrize("window", ["count:120,90", "time:40,25"])
@pytest.mark.parametrize("yfloat", [False, True], ids=["int-y", "float-y"])
def test_residual_band(join, plan, window, yfloat):
    """The 2-D band join: the x band on the key, the y band as the residual column."""
    ev = generate(900, "uniform", key_min=1, key_max=400, rate=20_000, seed=5)
    y = np.random.default_rng(1).integers(0, 300, len(ev)).astype(np.int64)
    residual = {"y": (-7.5, 12.5)}  # on ints: [-7, 12]
    if yfloat:  # tenths: s.y - r.y rounds onto the edges
        y, residual = y * 0.1, {"y": (-0.7, 1.2)}
    ref = _ref(ev, window, "band:10")
    yr, ys = y[ev.stream == 0], y[ev.stream == 1]
    a, b = residual["y"]
    want = ref[np.array([a <= _exact(ys[j], yr[i]) <= b for i, j in ref], bool)]
    assert 0 < len(want) < len(ref)
    got = join(ev, window, "band:10", pairs=True, threads=1, plan=plan, residual=residual,
               extra={"y": y})
    np.testing.assert_array_equal(got.pairs, want)


def _exact(s, r):
    from fractions import Fraction

    return Fraction(float(s)) - Fraction(float(r)) if isinstance(s, float | np.floating) \
        else int(s) - int(r)


# ------------------------------------------------------------------- property tests

_preds = st.one_of(st.just("eq"), st.just("ne"),
                   st.integers(0, 40).map(lambda e: f"band:{e}"),
                   st.tuples(st.integers(-30, 10), st.integers(0, 20), st.integers(1, 15),
                             st.integers(0, 20))
                   .map(lambda t: f"bands:{t[0]},{t[0] + t[1]};{t[0] + t[1] + t[2]},"
                                  f"{t[0] + t[1] + t[2] + t[3]}"))
_windows = st.one_of(
    st.tuples(st.just("count"), st.integers(1, 40), st.integers(1, 40), st.just(0)),
    st.tuples(st.just("time"), st.integers(1, 30), st.integers(1, 30), st.integers(0, 10)))


@st.composite
def _streams(draw):
    n = draw(st.integers(0, 160))
    kind = draw(st.sampled_from(["small", "extreme", "float"]))
    if kind == "small":
        keys = draw(st.lists(st.integers(-25, 25), min_size=n, max_size=n))
        keys = np.array(keys, np.int64)
    elif kind == "extreme":
        ends = st.one_of(st.integers(I64_MIN, I64_MIN + 30), st.integers(I64_MAX - 30, I64_MAX),
                         st.integers(-30, 30))
        keys = np.array(draw(st.lists(ends, min_size=n, max_size=n)), np.int64)
    else:
        keys = np.array(draw(st.lists(st.integers(-40, 40), min_size=n, max_size=n)),
                        np.float64) * 0.1
    stream = np.array(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)), np.uint8)
    # time: mostly increasing, some steps back (late tuples)
    steps = draw(st.lists(st.integers(-6, 4), min_size=n, max_size=n))
    ts = 1_000 + np.cumsum(np.array(steps, np.int64))
    ids = np.zeros(n, np.int64)
    for x in (0, 1):
        ids[stream == x] = np.arange(int((stream == x).sum()))
    return kind, EventTable(stream, ids, keys, ts.astype(np.int64))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_streams(), _windows, _preds, st.sampled_from(JOINS))
def test_property_matches_reference(stream, win, pred, join_plan):
    kind, ev = stream
    join, plan = join_plan
    window = f"{win[0]}:{win[1]},{win[2]}"
    want = _ref(ev, window, pred, win[3])
    try:
        got = join(ev, window, pred, allowed_lateness=win[3], pairs=True, threads=1, plan=plan)
    except ValueError as e:  # DataFusion refuses int64 overflow, and only that
        assert join is datafusion_join and kind == "extreme" and "leave int64" in str(e)
        return
    np.testing.assert_array_equal(got.pairs, want)


# ------------------------------------------------------------------- the SQL's dialects


def test_join_sql_dialects_differ_only_in_integer_division():
    w, p = parse_window("count:5,5"), parse_predicate("band:3")
    duck = join_sql(w, p, True, "bucket")
    fusion = join_sql(w, p, True, "bucket", dialect="datafusion")
    assert "//" in duck and "//" not in fusion
    assert duck.replace("//", "/") == fusion
    assert join_sql(w, p, True, "range", dialect="datafusion") == join_sql(w, p, True, "range")
    with pytest.raises(ValueError, match="dialect"):
        join_sql(w, p, True, dialect="sqlite")


# ------------------------------------------------------------------- threads


def test_polars_thread_check():
    """The pool's size is fixed at import (tests: POLARS_MAX_THREADS=1, conftest.py):
    asking for another count raises, never runs silently multi-threaded."""
    import polars as pl

    check_threads(pl.thread_pool_size())
    check_threads(None)
    ev = generate(50, "uniform", seed=1)
    with pytest.raises(RuntimeError, match="POLARS_MAX_THREADS"):
        polars_join(ev, "count:5,5", "eq", threads=pl.thread_pool_size() + 1)


# ------------------------------------------------------------------- the peer benchmark

PEERS = ("panjoin-bisort", "duckdb", "polars", "polars-iejoin", "datafusion")


def test_peers_run_agrees_with_panjoin_and_the_reference(tmp_path, monkeypatch):
    """A tiny run of the peer benchmark: Polars and DataFusion find the same pairs (count
    and digest) as PanJoin, DuckDB and the reference on every workload kind."""
    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)  # run_peers sets it
    cfg = PeerConfig(windows=[256], measure=256, selectivities=(1, 64), band2d_max=256,
                     chunk=128, repeat=1, peers=PEERS)
    recs = run_peers(cfg, progress=False, out_json=tmp_path / "r.json", log=lambda *_: None)
    assert os.environ["POLARS_MAX_THREADS"] == "1"
    assert check_results(recs) == []
    by = {(r.workload, r.peer): r for r in recs}
    for wl in cfg.workloads():
        data = events_for(wl, 256, cfg.seed)
        wl = calibrate(wl, data)
        ref = _ref(data.events, wl.window_spec(), wl.predicate())
        if wl.residual:
            ((_, (a, b)),) = wl.residual.items()
            yr, ys = data.y[data.events.stream == 0], data.y[data.events.stream == 1]
            d = ys[ref[:, 1]] - yr[ref[:, 0]]
            ref = ref[(d >= a) & (d <= b)]
        want = pair_digest(ref)
        assert wl.pred == "band2d" or want.count > 100, wl.name
        for peer in PEERS:
            r = by[(wl.name, peer)]
            assert r.status == "ok", (wl.name, peer, r.note)
            assert (r.results, r.pair_digest) == (want.count, want.hex()), (wl.name, peer)
            if peer in OFFLINE_PEERS:
                assert r.whole_tps > 0 and r.steady_tps is None
                assert "offline, pairs fetched, 1 thread" in r.note
    assert "band as bucket equi-join" in by[("band S=64 uniform", "polars")].note
    assert "band as IEJoin" in by[("band S=64 uniform", "polars-iejoin")].note
    assert "y band in the filter" in by[("band2d handshake", "datafusion")].note


def test_default_thread_peers_give_the_reference_pairs_next_to_one_thread():
    """polars-mt and datafusion-mt run at their engine's default threads (their own
    child: this process's Polars pool is pinned to one thread) and find the reference
    pairs, as the one-thread rows do."""
    import polars as pl

    assert pl.thread_pool_size() == 1  # conftest pins it: the -mt peers must not share it
    cfg = PeerConfig(windows=[256], measure=256, repeat=1, chunk=128,
                     peers=("polars", "polars-mt", "datafusion", "datafusion-mt"))
    from panjoin.cpus import available_cpus

    cpus = available_cpus()
    for wl in (Workload("eq", 1, "uniform", 256), Workload("band", 64, "uniform", 256)):
        data = events_for(wl, 256, cfg.seed)
        wl = calibrate(wl, data)
        want = pair_digest(_ref(data.events, wl.window_spec(), wl.predicate()))
        recs = PeerRunner(cfg, progress=False, log=lambda *_: None).run_workload(wl)
        by = {r.peer: r for r in recs}
        for peer in cfg.peers:
            r = by[peer]
            assert r.status == "ok", (wl.name, peer, r.note)
            assert (r.results, r.pair_digest) == (want.count, want.hex()), (wl.name, peer)
        assert "pairs fetched, 1 thread" in by["polars"].note
        # Polars' own pool size (its child's, unpinned; the CPUs here on a machine with
        # no quota) and DataFusion's default partitions
        n_mt = int(re.search(r"(\d+) threads? \(the engine's default\)",
                             by["polars-mt"].note).group(1))
        assert n_mt >= 1 and (cpus == 1 or n_mt > 1), by["polars-mt"].note
        assert f"{cpus} thread" in by["datafusion-mt"].note, by["datafusion-mt"].note
        assert "default" in by["polars-mt"].note and "default" in by["datafusion-mt"].note


def test_missing_package_is_skipped(monkeypatch):
    monkeypatch.setitem(OFFLINE_PEERS, "polars",
                        (OFFLINE_PEERS["polars"][0], "bucket", "no_such_package_3e9"))
    cfg = PeerConfig(windows=[256], measure=256, repeat=1, peers=("polars", "datafusion"))
    said = []
    recs = PeerRunner(cfg, progress=False, log=said.append).run_workload(
        Workload("eq", 1, "uniform", 256))
    by = {r.peer: r for r in recs}
    assert by["polars"].status == "skipped" and "not installed" in by["polars"].note
    assert by["datafusion"].status == "ok" and by["datafusion"].results > 100
    assert said == ["polars: skipped: no_such_package_3e9 is not installed "
                    "(pip install -e '.[peers]')"]


def test_polars_peer_fails_on_a_thread_mismatch():
    """A run asking Polars for more threads than its pool has fails that peer, clearly."""
    import polars as pl

    cfg = PeerConfig(windows=[256], measure=256, repeat=1, peers=("polars",),
                     threads=pl.thread_pool_size() + 1)
    (rec,) = PeerRunner(cfg, progress=False, log=lambda *_: None).run_workload(
        Workload("eq", 1, "uniform", 256))
    assert rec.status == "failed" and "POLARS_MAX_THREADS" in rec.note
