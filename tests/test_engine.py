"""The in-process engine against the brute-force reference (DESIGN section 2).

Grid: every index x {eq, band, bands, ne} x {count, time} x key distribution,
plus the awkward corners: windows smaller than a batch, subwindows of one
tuple, out-of-order time streams with late tuples, skewed arrival rates, and
input pushed in ragged chunks.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from panjoin.generate import generate
from panjoin.manager.engine import JoinEngine
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import I64_MAX, I64_MIN, parse_predicate, parse_window
from panjoin.subwindow import INDEX_KINDS

N = 1200
RATE = 1000.0  # tuples per second: ts advance about 1 ms per tuple
PREDICATES = ["eq", "band:3", "bands:-9,-6;2,4", "ne"]
DISTS = ["uniform", "zipf", "increasing", "normal", "equal", "extreme", "float"]
EXTREMES = np.array([I64_MIN, I64_MIN + 1, I64_MIN + 3, -2, 0, 3, I64_MAX - 3, I64_MAX - 1,
                     I64_MAX], dtype=np.int64)


@functools.cache
def stream(dist: str, n: int = N, disorder_ms: int = 0, r_fraction: float = 0.5, seed: int = 7):
    if dist == "extreme":
        t = generate(n, "uniform", key_min=0, key_max=len(EXTREMES) - 1, seed=seed,
                     disorder_ms=disorder_ms, r_fraction=r_fraction, rate=RATE)
        t.key = EXTREMES[t.key]
        return t
    if dist == "float":
        t = generate(n, "uniform", key_min=0, key_max=40, float_keys=True, seed=seed,
                     disorder_ms=disorder_ms, r_fraction=r_fraction, rate=RATE)
        # quarter steps: equal float keys exist, and band edges are hit exactly
        t.key = np.round(t.key * 4) / 4 + 0.1
        return t
    return generate(n, dist, key_min=-20, key_max=40, seed=seed, disorder_ms=disorder_ms,
                    r_fraction=r_fraction, rate=RATE)


@functools.cache
def expected(dist, window, pred, lateness=0, disorder_ms=0, r_fraction=0.5, n=N):
    t = stream(dist, n, disorder_ms, r_fraction)
    w = parse_window(window, lateness)
    return reference_join(t.stream, t.id, t.key, t.ts, w, parse_predicate(pred))


def run_engine(t, window, pred, index, lateness=0, chunks=(0.3, 0.31, 0.8), **kw):
    eng = JoinEngine(parse_window(window, lateness), pred, index=index, threads=2, **kw)
    cuts = [0] + [int(c * len(t)) for c in chunks] + [len(t)]
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        eng.push(t.slice(a, b))
    eng.flush()
    r, s = eng.take_results()
    return sort_pairs(np.stack([r, s], axis=1)), eng


def assert_same(got, ref):
    assert got.shape == ref.shape, f"{len(got)} pairs, reference has {len(ref)}"
    assert np.array_equal(got, ref)
    # every pair exactly once
    assert len(np.unique(got, axis=0)) == len(got)


# a count window of 150 per stream (W / NSub = 4 subwindows) and a time window of
# comparable reach: ts advance 1 ms per tuple at the generator's default rate
WINDOWS = {"count": "count:150,110", "time": "time:160,120"}


@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("wkind", ["count", "time"])
@pytest.mark.parametrize("pred", PREDICATES)
@pytest.mark.parametrize("index", INDEX_KINDS)
def test_engine_matches_reference(index, pred, wkind, dist):
    if pred == "ne" and dist not in ("uniform", "extreme", "float"):
        pytest.skip("ne is quadratic in the window; three distributions cover it")
    window = WINDOWS[wkind]
    ref = expected(dist, window, pred)
    if not (dist == "equal" and pred in ("bands:-9,-6;2,4", "ne")):  # those can't match
        assert len(ref.pairs) > 0, "reference produced nothing: a weak test"
    got, eng = run_engine(stream(dist), window, pred, index, subwindow_size=40, partitions=8,
                          batch_size=64)
    assert_same(got, ref.pairs)
    assert eng.stats.probes_filtered > 0


@pytest.mark.parametrize("index", INDEX_KINDS)
def test_window_smaller_than_batch_and_unit_subwindows(index):
    t = stream("uniform")
    for window, nsub, batch in [("count:3,5", 1, 64), ("count:7,2", 2, 500),
                                ("time:4,9", 1, 300), ("count:1,1", 1, 1)]:
        ref = expected("uniform", window, "band:2")
        got, _ = run_engine(t, window, "band:2", index, subwindow_size=nsub, partitions=1,
                            batch_size=batch)
        assert_same(got, ref.pairs)


@pytest.mark.parametrize("index", INDEX_KINDS)
@pytest.mark.parametrize("lateness", [0, 30])
def test_out_of_order_time_stream_with_late_tuples(index, lateness):
    t = stream("uniform", disorder_ms=80)
    ref = expected("uniform", "time:100,60", "band:2", lateness=lateness, disorder_ms=80)
    assert sum(len(v) for v in ref.late_ids.values()) > 0, "no late tuple: a weak test"
    got, eng = run_engine(t, "time:100,60", "band:2", index, lateness=lateness,
                          subwindow_size=30, partitions=4, batch_size=50)
    assert_same(got, ref.pairs)
    late = eng.take_late()
    for s in "RS":
        assert np.array_equal(np.sort(late[s]), np.sort(ref.late_ids[s]))


@pytest.mark.parametrize("index", INDEX_KINDS)
@pytest.mark.parametrize("wkind", ["count", "time"])
def test_skewed_arrival_rates(index, wkind):
    """One stream 20x faster: batches of the slow one are cut by max_lag."""
    t = stream("uniform", r_fraction=0.05)
    window = WINDOWS[wkind]
    ref = expected("uniform", window, "band:1", r_fraction=0.05)
    got, eng = run_engine(t, window, "band:1", index, subwindow_size=25, partitions=4,
                          batch_size=40, max_lag=30)
    assert_same(got, ref.pairs)
    # the fast stream's window stays bounded although the slow one rarely fills a batch
    assert max(eng.window_tuples().values()) <= 110 + 150 + 2 * 40 + 25


def test_subwindows_expire():
    t = stream("uniform", n=3000)
    _, eng = run_engine(t, "count:100,100", "eq", "bisort", subwindow_size=20, batch_size=16)
    assert eng.rings["R"].expired > 0 and eng.rings["S"].expired > 0
    assert max(eng.window_tuples().values()) <= 100 + 20 + 16


def test_key_dtype_mismatch_is_rejected():
    eng = JoinEngine("count:10,10", "eq", index="nested")
    eng.push_arrays(np.array([0], np.uint8), np.array([1]), np.array([5]), np.array([0]))
    with pytest.raises(TypeError, match="float64"):
        eng.push_arrays(np.array([1], np.uint8), np.array([1]), np.array([5.0]), np.array([0]))


@pytest.mark.parametrize("bad", [dict(index="btree"), dict(batch_size=0),
                                 dict(subwindow_size=-1)])
def test_bad_engine_options(bad):
    with pytest.raises(ValueError):
        JoinEngine("count:10,10", "eq", **{"index": "nested", **bad})


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    index=st.sampled_from(INDEX_KINDS),
    n=st.integers(1, 300),
    wkind=st.sampled_from(["count", "time"]),
    wr=st.integers(1, 60),
    ws=st.integers(1, 60),
    nsub=st.integers(1, 30),
    batch=st.integers(1, 40),
    lag=st.integers(1, 60),
    keyspan=st.integers(0, 12),
    pred=st.sampled_from(PREDICATES),
    seed=st.integers(0, 10_000),
)
def test_property_any_batching_gives_the_reference(index, n, wkind, wr, ws, nsub, batch, lag,
                                                   keyspan, pred, seed):
    t = generate(n, "uniform", key_min=0, key_max=keyspan, seed=seed, rate=RATE,
                 disorder_ms=seed % 3 * 20)
    window = f"{wkind}:{wr},{ws}"
    lateness = seed % 2 * 10 if wkind == "time" else 0
    w = parse_window(window, lateness)
    ref = reference_join(t.stream, t.id, t.key, t.ts, w, parse_predicate(pred))
    got, _ = run_engine(t, window, pred, index, lateness=lateness, subwindow_size=nsub,
                        partitions=max(1, nsub // 3), batch_size=batch, max_lag=lag,
                        chunks=(0.5,))
    assert_same(got, ref.pairs)


def test_max_collect_time_cuts_a_batch():
    eng = JoinEngine("count:10,10", "eq", index="nested", batch_size=1000, max_collect_ms=50)
    eng.push_arrays(np.array([0, 0], np.uint8), np.array([1, 2]), np.array([5, 6]),
                    np.array([0, 1]))
    assert eng.status()["buffered"]["R"] == 2
    eng.tick(now=eng.buf_since["R"] + 0.01)  # 10 ms: not yet
    assert eng.status()["buffered"]["R"] == 2
    eng.tick(now=eng.buf_since["R"] + 0.06)  # 60 ms: cut and processed
    assert eng.status()["buffered"]["R"] == 0
    assert eng.window_tuples()["R"] == 2


def _payload_stream(n=1200, seed=11):
    t = generate(n, "zipf", key_min=0, key_max=40, rate=1000, seed=seed, disorder_ms=20)
    # bytes that are not text, empty ones, and a null: the manager keeps them as they are
    pay = [f"{'R' if s == 0 else 'S'}{i}:\x00\xff".encode() if i % 7 else b""
           for s, i in zip(t.stream, t.id, strict=True)]
    pay[3] = None
    t.payload = pa.array(pay, pa.binary())
    return t


@pytest.mark.parametrize("index", ["bisort", "rap"])
@pytest.mark.parametrize("window", ["count:150,110", "time:160,120"])
def test_payloads_are_joined_back_onto_the_pairs(index, window):
    t = _payload_stream()
    w = parse_window(window, 10 if window.startswith("time") else 0)
    eng = JoinEngine(w, "band:1", index=index, subwindow_size=50,
                     partitions=8, batch_size=64, pipeline=3)
    for a in range(0, len(t), 300):
        eng.push(t.slice(a, a + 300))
    eng.flush()
    r, s, rp, sp = eng.take_results(payloads=True)
    ref = reference_join(t.stream, t.id, t.key, t.ts, w, parse_predicate("band:1"))
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)
    by_id = {(int(st), int(i)): p for st, i, p in zip(t.stream, t.id, t.payload.to_pylist(),
                                                       strict=True)}
    assert rp.to_pylist() == [by_id[(0, int(i))] for i in r]
    assert sp.to_pylist() == [by_id[(1, int(i))] for i in s]
    assert eng.memory_bytes() > 0


@pytest.mark.parametrize("window", ["count:150,110", "time:160,120"])
def test_a_push_split_into_pieces_gives_the_same_pairs_payloads_and_batches(window,
                                                                           monkeypatch):
    """A push is numbered and cut in pieces of PIECE_ROWS rows: pieces of 7 rows (cuts,
    buffered runs and payloads across piece ends, late tuples dropped first) give the
    reference's pairs, the payloads of their ids, and the batches of one whole piece."""
    import panjoin.manager.engine as engine_mod

    t = _payload_stream()
    t.key2 = (t.key % 5).astype(np.float64)
    w = parse_window(window, 10 if window.startswith("time") else 0)
    pred = "band:1&band2:1"

    def run(piece):
        monkeypatch.setattr(engine_mod, "PIECE_ROWS", piece)
        eng = JoinEngine(w, pred, index="bisort", subwindow_size=50, batch_size=64,
                         max_lag=40)
        for a in range(0, len(t), 300):
            eng.push(t.slice(a, a + 300))
        eng.flush()
        return eng.take_results(payloads=True), eng.stats.batches

    (r, s, rp, sp), batches = run(7)
    ref = reference_join(t.stream, t.id, t.key, t.ts, w, parse_predicate(pred), t.key2)
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)
    by_id = {(int(st), int(i)): p for st, i, p in zip(t.stream, t.id, t.payload.to_pylist(),
                                                       strict=True)}
    assert rp.to_pylist() == [by_id[(0, int(i))] for i in r]
    assert sp.to_pylist() == [by_id[(1, int(i))] for i in s]
    assert batches == run(1 << 17)[1]


def test_payloads_on_some_pushes_only_are_rejected():
    t = _payload_stream(200)
    eng = JoinEngine("count:50,50", "eq", index="bisort")
    eng.push(t.slice(0, 100))
    bare = t.slice(100, 200)
    bare.payload = None
    with pytest.raises(ValueError, match="payload"):
        eng.push(bare)
    with pytest.raises(ValueError, match="rows"):
        eng.push_arrays(t.stream[:3], t.id[:3], t.key[:3], t.ts[:3], pa.array([b"x"]))


@pytest.mark.parametrize("pipeline", [0, 1, 4])
def test_pipeline_depth_never_changes_the_result(pipeline):
    t = stream("uniform")
    ref = expected("uniform", "count:150,110", "band:2")
    eng = JoinEngine("count:150,110", "band:2", index="wib", subwindow_size=40, partitions=4,
                     batch_size=32, pipeline=pipeline)
    eng.push(t)
    assert eng.status()["probes_in_flight"] <= pipeline
    eng.flush()
    r, s = eng.take_results()
    assert eng.status()["probes_in_flight"] == 0
    assert_same(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)


def _partitioned_stream(n_parts: int, lead_ms: int, disorder: int, seed: int):
    """Tuples from ``n_parts`` sources (think Kafka partitions) whose event times run
    ``lead_ms`` apart: source q is ``q * lead_ms`` ahead of source 0, each within
    ``disorder`` ms of in-order. Arrival interleaves them in random chunks, so the
    largest ts seen is far ahead of the slow sources' tuples."""
    rng = np.random.default_rng(seed)
    parts = []
    for q in range(n_parts):
        m = 300
        ts = q * lead_ms + np.arange(m) * 3 + rng.integers(0, disorder + 1, m)
        parts.append((np.full(m, q), rng.integers(0, 2, m).astype(np.uint8),
                      rng.integers(-10, 30, m), ts))
    pos = [0] * n_parts
    order = []
    while any(p < 300 for p in pos):
        q = int(rng.integers(0, n_parts))
        take = min(300 - pos[q], int(rng.integers(1, 60)))
        order += [(q, i) for i in range(pos[q], pos[q] + take)]
        pos[q] += take
    src = np.array([q for q, _ in order])
    st_ = np.array([parts[q][1][i] for q, i in order], np.uint8)
    key = np.array([parts[q][2][i] for q, i in order], np.int64)
    ts = np.array([parts[q][3][i] for q, i in order], np.int64)
    return src, st_, np.arange(len(src), dtype=np.int64), key, ts


@pytest.mark.parametrize("index", INDEX_KINDS)
@pytest.mark.parametrize("disorder,lateness", [(0, 0), (20, 20), (40, 10)])
@pytest.mark.parametrize("lead", [0, 2000])
def test_client_watermark_decides_lateness_and_expiry(index, disorder, lateness, lead):
    """A client watermark W (least over sources of the largest ts each sent so far):
    exactly the tuples with ts < W - L are late, and the pairs among the rest equal
    the reference, also when the sources' event times run 2,000 ms apart (the manager's
    own rule would call the slow ones late, and expire their partners)."""
    src, stream_, ids, key, ts = _partitioned_stream(3, lead, disorder, seed=disorder + 1)
    eng = JoinEngine(parse_window("time:60,90", lateness), "band:2", index=index, threads=2,
                     subwindow_size=64, batch_size=50)
    top = np.full(3, I64_MIN)
    late = np.zeros(len(ids), bool)
    cuts = np.unique(np.r_[0, np.random.default_rng(5).integers(1, len(ids), 25), len(ids)])
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        w = int(top.min())  # W of this micro-batch: from the batches before it
        late[a:b] = ts[a:b] < w - lateness
        if not late[a:b].all():
            w_stored = w  # expiry runs when a batch is processed
        eng.push_arrays(stream_[a:b], ids[a:b], key[a:b], ts[a:b], watermark=w)
        eng.flush()
        np.maximum.at(top, src[a:b], ts[a:b])
    r, s = eng.take_results()
    got_late = eng.take_late()
    assert sorted(np.r_[got_late["R"], got_late["S"]].tolist()) == ids[late].tolist()
    assert late.any() == (disorder > lateness)
    keep = ~late
    ref = reference_join(stream_[keep], ids[keep], key[keep], ts[keep],
                         parse_window("time:60,90", 1 << 40), parse_predicate("band:2"))
    assert len(ref.pairs) > 100
    assert np.array_equal(sort_pairs(np.c_[r, s]), ref.pairs)
    # expiry went as far as W allows: each stream's oldest subwindow can still pair
    # with a tuple at W - L (expiring too early would have lost pairs above)
    for name, reach in (("R", 60), ("S", 90)):
        oldest = eng.rings[name].oldest
        assert oldest is None or oldest.ts_max > w_stored - lateness - reach
    if not lead:
        assert sum(eng.window_tuples().values()) < keep.sum() // 2


def test_client_watermark_on_a_count_window_or_after_the_own_rule_is_rejected():
    one = (np.zeros(1, np.uint8), np.zeros(1, np.int64), np.zeros(1, np.int64),
           np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="time windows only"):
        JoinEngine("count:5,5", "eq").push_arrays(*one, watermark=0)
    eng = JoinEngine("time:5,5", "eq")
    eng.push_arrays(*one)
    with pytest.raises(ValueError, match="from its first push on"):
        eng.push_arrays(*one, watermark=0)


@pytest.mark.parametrize("kind", ["small", "wide", "extreme", "equal", "float", "tiny",
                                  "edge", "over"])
def test_key_order_is_a_stable_sort(kind):
    """The batch sort: packed (key, row) int64s when the span allows, else an argsort;
    either way the stable order (ties in arrival order) and the sorted keys."""
    from panjoin.backend import key_order
    from panjoin.key_sort_kernels import pack_rows

    rng = np.random.default_rng(len(kind))
    n = 5000
    keys = {"small": rng.integers(-50, 50, n),
            "wide": rng.integers(-(1 << 45), 1 << 45, n),  # packed: 45 + 13 bits
            "extreme": rng.choice(np.array([I64_MIN, -1, 0, I64_MAX]), n),  # argsort
            "equal": np.full(n, 7),
            "float": rng.normal(0, 3, n).round(1),
            "tiny": np.array([3]),
            # spans at the packing limit, 63 - 13 bits: packed at I64_MIN, argsorted at max
            "edge": I64_MIN + rng.integers(0, 2, n) * ((1 << 50) - 10) + rng.integers(0, 9, n),
            "over": I64_MAX - rng.integers(0, 2, n) * (1 << 50)}[kind]
    if kind in ("edge", "over"):
        keys[:2] = keys[[0, 1]] if kind == "over" else [I64_MIN, I64_MIN + (1 << 50) - 1]
        keys[2:4] = [I64_MAX, I64_MAX - (1 << 50)] if kind == "over" else keys[2:4]
        assert bool(pack_rows(keys)[0]) == (kind == "edge")
    ts, ids = rng.integers(0, 1 << 40, (2, keys.size))
    order, skey, sts, sids = key_order(keys, ts, ids)
    want = np.argsort(keys, kind="stable")
    np.testing.assert_array_equal(order, want)
    np.testing.assert_array_equal(skey, keys[want])
    np.testing.assert_array_equal(sts, ts[want])
    np.testing.assert_array_equal(sids, ids[want])
    assert skey.dtype == keys.dtype


_EDGE_TS = [I64_MIN, I64_MIN + 1, -1, 0, 1, I64_MAX - 1, I64_MAX]


@settings(max_examples=300, deadline=None)
@given(ts=st.lists(st.integers(-20, 20) | st.sampled_from(_EDGE_TS)
                   | st.integers(I64_MIN, I64_MAX), max_size=30),
       maxts=st.none() | st.integers(-30, 30) | st.sampled_from(_EDGE_TS),
       lateness=st.sampled_from([0, 1, 3, 10, 1 << 62, I64_MAX]))
def test_late_rows_is_the_lateness_rule_in_one_pass(ts, maxts, lateness):
    """The engine's one-pass kernel marks the rows :func:`panjoin.semantics.late_mask`
    marks (a row is late iff its ts is below every earlier ts's maximum minus L, the
    bound clamped at int64's ends) and returns their count and the largest ts."""
    from panjoin.manager.kernels import late_rows
    from panjoin.semantics import late_mask

    ts = np.array(ts, dtype=np.int64)
    want, want_top = late_mask(ts, maxts, lateness)
    late = np.empty(ts.size, dtype=bool)
    n_late, top = late_rows(ts, 0 if maxts is None else maxts, maxts is not None, lateness,
                            late)
    np.testing.assert_array_equal(late, want)
    assert n_late == int(want.sum())
    if ts.size:
        assert top == want_top


def test_split_streams_numbers_each_arrival():
    """seq = the stream's total + rank, opp = the other stream's arrivals before it (the
    module docstring's example, and random chunks against a plain loop)."""
    from panjoin.manager.kernels import split_streams

    ok, ot, oseq, oid, oopp, nr, ns, c_r = split_streams(
        np.array([0, 1, 0], np.uint8), np.array([4, 5, 6]), np.array([7, 8, 9]),
        np.array([10, 11, 12]), 5, 7)
    assert (nr, ns) == (2, 1) and c_r.tolist() == [1, 1, 2]
    assert oseq[0, :2].tolist() == [5, 6] and oopp[0, :2].tolist() == [7, 8]
    assert oseq[1, :1].tolist() == [7] and oopp[1, :1].tolist() == [6]
    assert ok[0, :2].tolist() == [4, 6] and oid[1, :1].tolist() == [11]
    rng = np.random.default_rng(3)
    for n in (0, 1, 1000):
        stream = rng.integers(0, 2, n).astype(np.uint8)
        keys = rng.normal(size=n)
        ok, ot, oseq, oid, oopp, nr, ns, c_r = split_streams(
            stream, keys, np.arange(n), np.arange(n) + 100, 40, 9)
        tot, rank = [40, 9], [0, 0]
        for i in range(n):
            x = int(stream[i])
            j = rank[x]
            assert ok[x, j] == keys[i] and oid[x, j] == i + 100 and ot[x, j] == i
            assert oseq[x, j] == tot[x] + j and oopp[x, j] == tot[1 - x] + rank[1 - x]
            rank[x] += 1
            assert c_r[i] == rank[0]
        assert (nr, ns) == tuple(rank)


def test_split_streams_without_ts_and_ids_numbers_the_same():
    """A count window whose ids are seqs: key, seq and opp as the full split's."""
    from panjoin.manager.kernels import split_streams

    rng = np.random.default_rng(8)
    stream = rng.integers(0, 2, 999).astype(np.uint8)
    keys = rng.integers(-9, 9, 999)
    full = split_streams(stream, keys, np.arange(999), np.arange(999) + 5, 3, 70)
    lean = split_streams(stream, keys, None, None, 3, 70)
    assert lean[1] is None and lean[3] is None and lean[5:7] == full[5:7]
    nr, ns = lean[5:7]
    for a, b in ((lean[0], full[0]), (lean[2], full[2]), (lean[4], full[4])):
        np.testing.assert_array_equal(a[0, :nr], b[0, :nr])
        np.testing.assert_array_equal(a[1, :ns], b[1, :ns])
    np.testing.assert_array_equal(lean[7], full[7])


@pytest.mark.parametrize("index", ["bisort", "hash"])
def test_an_engine_whose_ids_are_seqs_names_each_tuple_by_its_arrival(index):
    """seq_ids: pushes carry no ids (nor ts, on a count window); each pair names its
    tuples by their arrival numbers in their streams, from 0."""
    ev = generate(4000, "zipf", key_min=0, key_max=300, rate=1000, seed=4)
    eng = JoinEngine("count:500,300", "eq", index=index, batch_size=128, subwindow_size=100,
                     threads=1, seq_ids=True)
    for a in range(0, 4000, 700):
        eng.push_arrays(ev.stream[a:a + 700], None, ev.key[a:a + 700], None)
    eng.flush()
    r, s = eng.take_results()
    seq = np.empty(4000, np.int64)  # each tuple's rank in its stream
    for x in (0, 1):
        rows = np.flatnonzero(ev.stream == x)
        seq[rows] = np.arange(rows.size)
    ref = reference_join(ev.stream, seq, ev.key, ev.ts, parse_window("count:500,300"),
                         parse_predicate("eq"))
    assert len(ref.pairs) > 1000
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)
    with pytest.raises(ValueError, match="push no ids"):
        eng.push_arrays(ev.stream[:5], ev.id[:5], ev.key[:5], None)
    with pytest.raises(ValueError, match="count window"):
        JoinEngine("time:50,50", "eq", index="nested", seq_ids=True)
    plain = JoinEngine("count:5,5", "eq", index="nested")
    with pytest.raises(ValueError, match="an id per tuple"):
        plain.push_arrays(ev.stream[:5], None, ev.key[:5], None)


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux only")
def test_engine_advises_its_heap_for_huge_pages():
    """A library in the same process may trim the heap (DuckDB calls malloc_trim): the
    engine asks for huge pages on it, so its arrays fault back in 2 MiB at a time."""
    import subprocess
    import sys

    code = ("import numpy as np; from panjoin.manager.engine import JoinEngine\n"
            "junk = [np.ones(1 << 16) for _ in range(64)]\n"  # grow the heap
            "JoinEngine('count:8,8', 'eq')\n"
            "flags = []; heap = False\n"
            "for line in open('/proc/self/smaps'):\n"
            "    if '-' in line.split()[0]: heap = line.rstrip().endswith('[heap]')\n"
            "    elif heap and line.startswith('VmFlags'): flags.append(line.split()[1:])\n"
            "print(any('hg' in f for f in flags))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[-1] == "True"
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PANJOIN_TUNE_MALLOC": "0"})
    assert off.stdout.split()[-1] == "False"
