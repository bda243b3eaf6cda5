"""Exact at the ends of int64 (issue 29, item 3): ts and keys at -2**63, 2**63 - 1 and
within a window of them join exactly as the same data in the middle of the range.

Each case places one small stream at several places (:func:`place`): ts and keys
shifted by a constant so that the smallest ts (key) is I64_MIN, or the largest is
I64_MAX, or all lie around 0. A shift keeps every difference of ts and of keys, so the
pairs (as id pairs) and the late tuples are the same at every place, while at the ends
the bounds ``r.ts - TS``, ``r.ts + TR``, ``key - E`` and ``key + E`` leave the int64
range: a wrapped bound loses pairs there (20K tuples, time:2000: 74,654 pairs of
89,724 before the fix). The reference is itself checked against :func:`brute`, a join
in Python integers that cannot overflow.

Checked: every index in this process, a cluster of real worker processes, the
handshake chain (simulated, and real nodes), float keys near the largest double, and
random streams around the ends (hypothesis).
"""

from __future__ import annotations

import doctest
import functools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from panjoin import reference, semantics
from panjoin.events.table import EventTable
from panjoin.generate import generate
from panjoin.handshake.chain import HandshakeChain
from panjoin.handshake.simulate import Simulation
from panjoin.launch import start_workers
from panjoin.manager.engine import JoinEngine
from panjoin.manager.grpc_backend import GrpcBackend
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import I64_MAX, I64_MIN, Window, parse_predicate, parse_window
from panjoin.subwindow import INDEX_KINDS

I64_MIN, I64_MAX = int(I64_MIN), int(I64_MAX)
N = 600
KEY_SPAN = 30
# (ts at, keys at): both ends, each end with the other's keys, and the middle
PLACES = [("low", "low"), ("high", "high"), ("low", "high"), ("high", "low"), ("mid", "mid")]
# the windows reach over a good part of the stream (about 1 ms per tuple), so that every
# bound near an end passes it; lateness 10 with 30 ms of disorder makes late tuples
CASES = [
    ("time:100,60", 10, "band:3"),
    ("time:100,60", 10, "bands:2,5"),  # S > 0: k + 2 passes I64_MAX at the top
    ("time:1000000,1000000", 0, "bands:-9,-6;2,4"),  # wider than the whole stream
    ("count:150,110", 0, "band:3"),
    ("count:150,110", 0, "bands:-5,-2"),
]
FAST = [c for c in CASES if c[2] == "band:3"]
ENGINE = FAST + [CASES[1]]  # the cases every index and the cluster run


# --------------------------------------------------------------------------- data


@functools.cache
def base(n: int = N, seed: int = 4) -> EventTable:
    """The stream at offset 0: ts from 0 (about 1 ms per tuple, some 30 ms late), keys
    in [0, KEY_SPAN]."""
    t = generate(n, "uniform", key_min=0, key_max=KEY_SPAN, rate=1000, seed=seed,
                 disorder_ms=30)
    t.ts = t.ts - t.ts.min()
    return t


def shifted(a: np.ndarray, at: str, span: int) -> np.ndarray:
    """``a`` (values in [0, span]) moved so that its smallest is I64_MIN ("low"), its
    largest I64_MAX ("high"), or about 0 ("mid")."""
    if at == "low":
        return np.int64(I64_MIN) + a
    if at == "high":
        return np.int64(I64_MAX) - (np.int64(span) - a)
    return a - np.int64(span // 2)


@functools.cache
def place(ts_at: str, key_at: str, n: int = N) -> EventTable:
    t = base(n)
    return EventTable(t.stream, t.id, shifted(t.key, key_at, KEY_SPAN),
                      shifted(t.ts, ts_at, int(t.ts.max())))


def brute(t: EventTable, window: Window, pred) -> tuple[np.ndarray, dict]:
    """DESIGN section 2 in Python integers (Fractions for float keys): no bound wraps.
    Returns the sorted pairs and the late ids per stream. Quadratic: small inputs only."""
    stream, ids, ts = t.stream.tolist(), t.id.tolist(), t.ts.tolist()
    keys = t.key.tolist() if t.key.dtype == np.int64 else [Fraction(k) for k in t.key]
    bands = [(Fraction(a), Fraction(b)) for a, b in pred.bands]

    def match(rk, sk):
        d = sk - rk
        return any(a <= d <= b for a, b in bands) != pred.negated

    pairs, late = [], {"R": [], "S": []}
    if window.kind == "count":
        seen = {0: [], 1: []}
        for i, x in enumerate(stream):
            w = window.s if x == 0 else window.r
            for j in seen[1 - x][-w:]:
                r, s = (i, j) if x == 0 else (j, i)
                if match(keys[r], keys[s]):
                    pairs.append((ids[r], ids[s]))
            seen[x].append(i)
    else:
        kept, top = [], None
        for i, x in enumerate(stream):
            if top is not None and ts[i] < top - window.lateness:
                late["RS"[x]].append(ids[i])
            else:
                kept.append(i)
            top = ts[i] if top is None else max(top, ts[i])
        rs = [i for i in kept if stream[i] == 0]
        ss = [i for i in kept if stream[i] == 1]
        for r in rs:
            for s in ss:
                if ts[r] - window.s < ts[s] < ts[r] + window.r and match(keys[r], keys[s]):
                    pairs.append((ids[r], ids[s]))
    return (sort_pairs(np.array(pairs, dtype=np.int64).reshape(-1, 2)),
            {k: np.sort(np.array(v, dtype=np.int64)) for k, v in late.items()})


@functools.cache
def expected(window: str, lateness: int, pred: str):
    """Pairs and late ids of the stream in the middle (brute force)."""
    pairs, late = brute(place("mid", "mid"), parse_window(window, lateness),
                        parse_predicate(pred))
    assert len(pairs) > 200, "few pairs: a weak test"
    return pairs, late


def same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    got = sort_pairs(got)
    assert len(np.unique(got, axis=0)) == len(got), f"{what}: a pair came twice"
    assert got.shape == want.shape, f"{what}: {len(got)} pairs, expected {len(want)}"
    assert np.array_equal(got, want), what


def same_late(late: dict, want: dict, what: str) -> None:
    for x in "RS":
        assert np.array_equal(np.sort(late[x]), want[x]), f"{what}: late {x}"


def run_engine(t, window: Window, pred: str, index: str, backend=None, n_workers=1):
    eng = JoinEngine(window, pred, index=index, subwindow_size=40, partitions=4,
                     batch_size=32, threads=2, backend=backend, n_workers=n_workers)
    for a, b in ((0, 170), (170, 171), (171, len(t))):  # ragged pushes
        eng.push(t.slice(a, b))
    eng.flush()
    r, s = eng.take_results()
    return np.stack([r, s], axis=1), eng.take_late()


# --------------------------------------------------------------------------- reference


def test_doctests_of_the_bounds_and_the_reference():
    assert doctest.testmod(semantics).failed == 0
    assert doctest.testmod(reference).failed == 0


@pytest.mark.parametrize("window,lateness,pred", CASES)
@pytest.mark.parametrize("ts_at,key_at", PLACES)
def test_reference_is_the_brute_force_join_at_every_place(ts_at, key_at, window, lateness,
                                                          pred):
    t = place(ts_at, key_at)
    w, p = parse_window(window, lateness), parse_predicate(pred)
    want, want_late = expected(window, lateness, pred)
    pairs, late = brute(t, w, p)
    same(pairs, want, "brute force, shifted")  # the shift keeps the pairs
    same_late(late, want_late, "brute force, shifted")
    ref = reference_join(t.stream, t.id, t.key, t.ts, w, p)
    same(ref.pairs, want, "reference")
    same_late(ref.late_ids, want_late, "reference")


def test_saturating_bounds():
    a = np.array([I64_MIN, -1, 0, I64_MAX], dtype=np.int64)
    assert semantics.saturating_add(a, 5).tolist() == [I64_MIN + 5, 4, 5, I64_MAX]
    assert semantics.saturating_add(a, -5).tolist() == [I64_MIN, -6, -5, I64_MAX - 5]
    assert semantics.saturating_add(a, 1 << 70).tolist() == [I64_MAX] * 4
    assert semantics.saturating_add(a, -(1 << 70)).tolist() == [I64_MIN] * 4
    c0, c1, c2 = semantics.window_bounds(parse_window("time:10,20"), "R", a, a)
    # r.ts - 20 < s.ts < r.ts + 10, closed: [r.ts - 19, r.ts + 9]
    assert c0.tolist() == [I64_MIN, -20, -19, I64_MAX - 19]
    assert c1.tolist() == [I64_MIN + 9, 8, 9, I64_MAX]
    # probing from S: opp - W_R (beyond int64) and seq + W_S, clamped
    c0, c1, c2 = semantics.window_bounds(parse_window(f"count:{1 << 70},3"), "S",
                                         np.array([0, 5]), np.array([7, I64_MAX - 1]))
    assert c0.tolist() == [I64_MIN, I64_MIN] and c1.tolist() == [0, 5]
    assert c2.tolist() == [10, I64_MAX]


# --------------------------------------------------------------------------- in process


@pytest.mark.parametrize("index", INDEX_KINDS)
@pytest.mark.parametrize("window,lateness,pred", ENGINE)
def test_every_index_in_process_joins_the_ends_as_the_middle(index, window, lateness, pred):
    w = parse_window(window, lateness)
    want, want_late = expected(window, lateness, pred)
    for ts_at, key_at in PLACES:
        got, late = run_engine(place(ts_at, key_at), w, pred, index)
        same(got, want, f"{index}, ts {ts_at}, keys {key_at}")
        same_late(late, want_late, f"{index}, ts {ts_at}, keys {key_at}")


@pytest.mark.parametrize("index", ["bisort", "rap", "wib", "nested"])
def test_windows_wider_than_int64(index):
    """TS = TR = I64_MAX: every bound of every tuple saturates, at both ends at once."""
    t = place("low", "high", n=200)
    w = parse_window(f"time:{I64_MAX}", 0)
    for pred in ("band:3", f"band:{I64_MAX}"):
        want, _ = brute(t, w, parse_predicate(pred))
        got, _ = run_engine(t, w, pred, index)
        same(got, want, f"{index}, {pred}")
    # both ends in one stream: ts and keys alternate between I64_MIN and I64_MAX
    n = 60
    ends = np.where(np.arange(n) % 3 == 0, I64_MIN, I64_MAX - np.arange(n) % 2)
    t2 = EventTable(np.arange(n) % 2, np.arange(n) // 2, ends[::-1].copy(), np.sort(ends))
    for pred in ("eq", "ne", "bands:1,1", f"bands:{I64_MAX},{1 << 64}"):
        want, _ = brute(t2, w, parse_predicate(pred))
        got, _ = run_engine(t2, w, pred, index)
        same(got, want, f"{index}, both ends, {pred}")


@pytest.mark.parametrize("index", ["bisort", "rap", "wib", "nested"])
def test_float_keys_near_the_largest_double(index):
    """key + E beyond the largest double is inf, never NaN: a band stays exact."""
    big = np.finfo(np.float64).max
    near = np.array([-big, np.nextafter(-big, 0), -1e308, -1.0, 0.0, 1.0, 1e308,
                     np.nextafter(big, 0), big])
    t = base(300)
    t = EventTable(t.stream, t.id, near[t.key % len(near)], shifted(t.ts, "high",
                                                                       int(t.ts.max())))
    w = parse_window("time:100,60", 10)
    for pred in ("band:1e308", "bands:0,1.7e308", "eq", "band:0.5"):
        p = parse_predicate(pred)
        want, want_late = brute(t, w, p)
        ref = reference_join(t.stream, t.id, t.key, t.ts, w, p)
        same(ref.pairs, want, f"reference, {pred}")
        got, late = run_engine(t, w, pred, index)
        same(got, want, f"{index}, {pred}")
        same_late(late, want_late, f"{index}, {pred}")


_anchor = st.sampled_from([I64_MIN, I64_MAX, 0])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 40),
    ts_anchor=_anchor,
    key_anchor=_anchor,
    data=st.data(),
    wr=st.sampled_from([1, 3, 20, 1 << 62, I64_MAX]),
    ws=st.sampled_from([1, 7, 20, I64_MAX]),
    kind=st.sampled_from(["time", "count"]),
    lateness=st.sampled_from([0, 5, I64_MAX]),
    pred=st.sampled_from(["eq", "ne", "band:2", "bands:1,4", "bands:-4,-1",
                          f"band:{I64_MAX}", f"bands:{1 << 63},{1 << 64}"]),
)
def test_random_streams_around_the_ends(n, ts_anchor, key_anchor, data, wr, ws, kind,
                                        lateness, pred):
    """Reference and engine (BI-Sort, nested loop) against the brute force, for random
    ts and keys within a few units of an end (in any arrival order)."""
    def near(anchor):
        lo, hi = max(I64_MIN, anchor - 20), min(I64_MAX, anchor + 20)
        return np.array(data.draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)),
                        dtype=np.int64)
    stream = np.array(data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    t = EventTable(stream, np.arange(n), near(key_anchor), near(ts_anchor))
    w = parse_window(f"{kind}:{wr},{ws}", lateness if kind == "time" else 0)
    p = parse_predicate(pred)
    want, want_late = brute(t, w, p)
    ref = reference_join(t.stream, t.id, t.key, t.ts, w, p)
    same(ref.pairs, want, "reference")
    same_late(ref.late_ids, want_late, "reference")
    for index in ("bisort", "nested"):
        eng = JoinEngine(w, p, index=index, subwindow_size=4, partitions=2, batch_size=3)
        eng.push(t)
        eng.flush()
        r, s = eng.take_results()
        same(np.stack([r, s], axis=1), want, index)
        same_late(eng.take_late(), want_late, index)


# --------------------------------------------------------------------------- a cluster


@pytest.fixture(scope="module")
def two_workers():
    ws = start_workers(2)
    yield ws
    for x in ws:
        x.stop()


@pytest.mark.parametrize("index", ["bisort", "rap", "wib"])
@pytest.mark.parametrize("window,lateness,pred", ENGINE)
def test_a_cluster_joins_the_ends_as_the_middle(two_workers, index, window, lateness, pred):
    w = parse_window(window, lateness)
    want, want_late = expected(window, lateness, pred)
    for ts_at, key_at in PLACES[:2]:
        backend = GrpcBackend([x.address for x in two_workers])
        try:
            got, late = run_engine(place(ts_at, key_at), w, pred, index, backend=backend,
                                   n_workers=2)
        finally:
            backend.close()
        same(got, want, f"cluster {index}, ts {ts_at}, keys {key_at}")
        same_late(late, want_late, f"cluster {index}, ts {ts_at}, keys {key_at}")


# --------------------------------------------------------------------------- handshake


@pytest.mark.parametrize("index,fast_forward", [("nested", False), ("sorted", True)])
@pytest.mark.parametrize("window,lateness,pred", FAST)
def test_simulated_handshake_chain_joins_the_ends_as_the_middle(index, fast_forward, window,
                                                                lateness, pred):
    w, p = parse_window(window, lateness), parse_predicate(pred)
    want, want_late = expected(window, lateness, pred)
    for ts_at, key_at in PLACES[:4]:  # the ends (the middle is what they must give)
        t = place(ts_at, key_at)
        sim = Simulation(3, w, p, order="random", seed=2, feed_chunk=9, max_batch=7,
                         index=index, fast_forward=fast_forward)
        what = f"chain {index}, ts {ts_at}, keys {key_at}"
        same(sim.run(t.stream, t.id, t.key, t.ts), want, what)
        same_late(sim.driver.take_late(), want_late, what)


@pytest.fixture(scope="module")
def nodes():
    ns = start_workers(2, role="handshake-node")
    yield ns
    for x in ns:
        x.stop()


@pytest.mark.parametrize("window,lateness,pred", FAST)
def test_a_chain_of_node_processes_joins_the_ends_as_the_middle(nodes, window, lateness, pred):
    w = parse_window(window, lateness)
    want, want_late = expected(window, lateness, pred)
    for ts_at, key_at in PLACES[:2]:
        t = place(ts_at, key_at)
        with HandshakeChain([x.address for x in nodes], w, parse_predicate(pred),
                            batch_size=57, max_batch=25) as ch:
            for a in range(0, len(t), 250):
                ch.push(t.slice(a, min(len(t), a + 250)))
            ch.flush()
            r, s = ch.take_results()
            late = ch.take_late()
        what = f"chain of processes, ts {ts_at}, keys {key_at}"
        same(np.stack([r, s], axis=1), want, what)
        same_late(late, want_late, what)
