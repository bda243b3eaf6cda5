"""A time-window join sharded by key over engines on threads, in one process
(panjoin/manager/sharded_engine.py): the union of the shards' pairs and the router's
late tuples are exactly the reference's for every key distribution, predicate, shard
count and piece size; payloads come back on their pairs; a shard's error reaches the
caller and no shard thread outlives the engine; the plan shards only where the keys
spread; ``panjoin replay --shards`` gives one engine's pairs, and says why it refuses."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import panjoin.manager.sharded_engine as sharded_mod
from panjoin.events import EventTable, write_events
from panjoin.generate import generate
from panjoin.manager.sharded_engine import ShardedEngine, plan_shards
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import I64_MAX, I64_MIN, parse_predicate, parse_window
from panjoin.sharding import boundaries

EXTREMES = np.array([I64_MIN, I64_MIN + 1, I64_MIN + 3, -2, 0, 3, I64_MAX - 3, I64_MAX - 1,
                     I64_MAX], dtype=np.int64)
DISTS = ["uniform", "zipf", "increasing", "equal", "extreme", "float"]
PREDICATES = ["eq", "band:3", "bands:-9,-6;2,4", "ne", "band:2&band2:20"]


def events(dist: str, n: int = 1500, seed: int = 3, disorder_ms: int = 30) -> EventTable:
    if dist == "extreme":
        t = generate(n, "uniform", key_min=0, key_max=len(EXTREMES) - 1, seed=seed,
                     rate=1000, disorder_ms=disorder_ms)
        t.key = EXTREMES[t.key]
    elif dist == "float":
        t = generate(n, "uniform", key_min=0, key_max=40, float_keys=True, seed=seed,
                     rate=1000, disorder_ms=disorder_ms)
        t.key = np.round(t.key * 4) / 4 + 0.1  # equal keys, band edges hit exactly
    else:
        t = generate(n, dist, key_min=-20, key_max=40, seed=seed, rate=1000,
                     disorder_ms=disorder_ms)
    t.key2 = (np.abs(t.id) % 50).astype(np.float64)
    return t


def run(t: EventTable, window: str, pred: str, bounds, lateness: int = 10,
        chunks: int = 400, **kw):
    w = parse_window(window, lateness)
    with ShardedEngine(w, pred, np.asarray(bounds, dtype=t.key.dtype), index=kw.pop("index",
                       "bisort"), subwindow_size=kw.pop("subwindow_size", 80),
                       batch_size=kw.pop("batch_size", 64), **kw) as eng:
        pieces = []
        for a in range(0, len(t), chunks):
            eng.push(t.slice(a, a + chunks))
            pieces += eng.take_result_pieces(payloads=True)
        eng.flush()
        pieces += eng.take_result_pieces(payloads=True)
        late = eng.take_late()
        held = eng.window_tuples()
    ref = reference_join(t.stream, t.id, t.key, t.ts, w, parse_predicate(pred), t.key2)
    r = np.concatenate([np.zeros(0, np.int64)] + [p[0] for p in pieces])
    s = np.concatenate([np.zeros(0, np.int64)] + [p[1] for p in pieces])
    got = sort_pairs(np.stack([r, s], axis=1))
    assert len(got) == len(ref.pairs), "a pair was lost, or found in two shards"
    assert np.array_equal(got, ref.pairs)
    for name in ("R", "S"):
        assert np.array_equal(np.sort(late[name]), np.sort(ref.late_ids[name]))
    return ref, pieces, held


@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("pred", PREDICATES)
@pytest.mark.parametrize("k", [2, 3])
def test_sharded_join_is_the_reference(dist, pred, k, monkeypatch):
    monkeypatch.setattr(sharded_mod, "ROUTE_ROWS", 97)  # many pieces, each its watermark
    t = events(dist)
    ref, _, _ = run(t, "time:120,90", pred, boundaries(t.key, k))
    if not (dist == "equal" and pred in ("bands:-9,-6;2,4", "ne")):
        assert len(ref.pairs) > 0, "the reference found nothing: a weak test"
    assert sum(map(len, ref.late_ids.values())) > 0, "no late tuple: a weak test"


@pytest.mark.parametrize("bounds", [[I64_MIN + 2], [0], [I64_MAX - 2], [I64_MIN, I64_MAX],
                                    [-2, -2, 3]])
def test_boundaries_at_the_int64_ends_and_empty_shards(bounds):
    run(events("extreme"), "time:120,90", "band:3", bounds)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 400), keyspan=st.integers(0, 12), k=st.integers(1, 4),
       w=st.integers(1, 80), lateness=st.integers(0, 30), nsub=st.integers(1, 40),
       batch=st.integers(1, 50), piece=st.integers(1, 90), chunks=st.integers(1, 150),
       pred=st.sampled_from(PREDICATES), seed=st.integers(0, 10_000))
def test_property_any_shards_and_pieces_give_the_reference(n, keyspan, k, w, lateness, nsub,
                                                           batch, piece, chunks, pred, seed):
    t = generate(n, "uniform", key_min=0, key_max=keyspan, seed=seed, rate=1000,
                 disorder_ms=seed % 3 * 20)
    t.key2 = (t.id % 30).astype(np.float64)
    old = sharded_mod.ROUTE_ROWS
    sharded_mod.ROUTE_ROWS = piece
    try:
        run(t, f"time:{w},{w + seed % 7}", pred, boundaries(t.key, k), lateness=lateness,
            chunks=chunks, subwindow_size=nsub, batch_size=batch, index="nested")
    finally:
        sharded_mod.ROUTE_ROWS = old


def test_payloads_come_back_on_their_pairs():
    t = events("zipf")
    pay = [f"{'R' if s == 0 else 'S'}{i}" for s, i in zip(t.stream, t.id, strict=True)]
    t.payload = pa.array(pay, pa.string())
    _, pieces, _ = run(t, "time:120,90", "band:1", boundaries(t.key, 2))
    assert pieces and all(p[2] is not None for p in pieces)
    for r, s, rp, sp in pieces:
        assert rp.to_pylist() == [f"R{i}" for i in r]
        assert sp.to_pylist() == [f"S{i}" for i in s]
        assert pa.types.is_large_string(rp.type)  # as one engine gives strings back


def test_a_shard_holds_a_kth_of_the_join_nsub_and_the_window_is_split():
    t = events("uniform", n=3000, disorder_ms=0)
    with ShardedEngine("time:400,400", "eq", boundaries(t.key, 2), subwindow_size=101) as eng:
        assert (eng.nsub, eng.shard_nsub) == (101, 51)
        assert [e.nsub for e in eng.engines] == [51, 51]
        eng.push(t)
        eng.flush()
        held = [e.window_tuples() for e in eng.engines]
        assert all(h["R"] > 0 and h["S"] > 0 for h in held), "one shard got every key"
        assert eng.window_tuples() == {n: sum(h[n] for h in held) for n in ("R", "S")}
        assert eng.memory_bytes() > 0


def _shard_threads() -> list[str]:
    return [th.name for th in threading.enumerate() if th.name.startswith("panjoin-shard")]


def test_a_shard_error_reaches_the_caller_and_no_thread_is_left():
    t = events("uniform")
    t.payload = pa.array([str(i) for i in t.id])
    eng = ShardedEngine("time:120,90", "eq", boundaries(t.key, 2))
    with pytest.raises(ValueError, match="payloads"):
        with eng:  # payloads, then none: a shard's engine refuses on its thread
            eng.push(t.slice(0, 700))
            rest = t.slice(700, len(t))
            rest.payload = None
            eng.push(rest)
            eng.flush()
    assert not _shard_threads()


def test_plan_shards_only_where_the_keys_spread():
    t = events("uniform", n=4000)
    win, eq = parse_window("time:9,9"), parse_predicate("eq")
    b, why = plan_shards(t.key, t.stream, win, eq, 2)
    assert b is not None and b.size == 1 and "2 shards" in why
    assert plan_shards(t.key, t.stream, win, eq, 4)[0].size == 3
    assert plan_shards(t.key, t.stream, win, eq, 4, threads=2)[0].size == 1
    assert plan_shards(t.key, t.stream, win, eq, 1)[0] is None
    assert plan_shards(t.key, t.stream, parse_window("count:9,9"), eq, 2)[0] is None
    equal = np.full(4000, 7, np.int64)
    assert "spread" in plan_shards(equal, t.stream, win, eq, 2)[1]
    # a band wider than the key range copies every S tuple to both shards
    b, why = plan_shards(t.key, t.stream, win, parse_predicate("band:1000"), 2)
    assert b is None and "copies" in why
    assert plan_shards(t.key, t.stream, win, parse_predicate("band:1"), 2)[0] is not None


@pytest.fixture(scope="module")
def time_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    t = generate(6000, "uniform", key_min=0, key_max=500, rate=1000, seed=5, disorder_ms=40)
    path = d / "ev.parquet"
    write_events(t, path)
    return d, path, t


def _replay(args, cwd, env=None):
    import os

    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "panjoin.cli", "replay", *args, "--no-progress",
                           "-v"], capture_output=True, text=True, cwd=cwd, env=e, timeout=600)


def test_replay_shards_give_one_engines_pairs(time_file):
    d, path, t = time_file
    common = [str(path), "--window", "time:300,300", "--allowed-lateness", "15",
              "--predicate", "band:2"]
    one = _replay(common + ["--out", "one.parquet", "--late-out", "l1.parquet", "--shards",
                            "1"], d)
    three = _replay(common + ["--out", "three.parquet", "--late-out", "l3.parquet",
                              "--shards", "3"], d)
    auto = _replay(common + ["--out", "auto.parquet"], d, {"PANJOIN_THREADS": "2"})
    for p in (one, three, auto):
        assert p.returncode == 0, p.stderr[-3000:]
    assert "3 shards by key" in three.stderr and "shards by key" not in one.stderr
    assert "2 shards by key" in auto.stderr

    def pairs(name):
        tab = pq.read_table(d / name)
        return sort_pairs(np.stack([tab["r_id"].to_numpy(), tab["s_id"].to_numpy()], axis=1))

    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("time:300,300", 15),
                         parse_predicate("band:2"))
    assert len(ref.pairs) > 1000
    for name in ("one.parquet", "three.parquet", "auto.parquet"):
        assert np.array_equal(pairs(name), ref.pairs)
    late = [pq.read_table(d / f"l{k}.parquet").num_rows for k in (1, 3)]
    assert late[0] == late[1] == sum(map(len, ref.late_ids.values())) > 0


@pytest.mark.parametrize("extra,why", [
    (["--window", "count:300,300"], "count window"),
    (["--window", "time:300,300", "--workers", "2"], "in-process"),
    (["--window", "time:300,300", "--max-latency", "5"], "full speed"),
])
def test_replay_shards_refused_where_they_cannot_run(time_file, extra, why):
    d, path, _ = time_file
    p = _replay([str(path), "--predicate", "eq", "--out", "x.parquet", "--shards", "2",
                 *extra], d)
    assert p.returncode != 0 and why in p.stderr and "Traceback" not in p.stderr
    assert not (d / "x.parquet").exists()


@pytest.mark.parametrize("bad", ["0", "65", "two"])
def test_replay_shards_must_be_auto_or_a_count(time_file, bad):
    d, path, _ = time_file
    p = _replay([str(path), "--window", "time:300,300", "--predicate", "eq", "--out",
                 "x.parquet", "--shards", bad], d)
    assert p.returncode == 2 and "1..64" in p.stderr


def test_every_shard_expires_by_the_global_watermark(monkeypatch):
    """Shard 0's keys arrive 40 ms behind shard 1's (on time: L = 50): by its own
    arrivals it would keep 40 ms more of the window; pushed with the global watermark
    it expires as one engine does. Pairs are the reference's either way."""
    n = 2000
    ts = np.arange(n, dtype=np.int64)
    low = np.arange(n) % 2 == 0
    ts[low] -= 40
    stream = ((np.arange(n) // 2) % 2).astype(np.uint8)
    ids = np.zeros(n, np.int64)
    for x in (0, 1):
        ids[stream == x] = np.arange(int((stream == x).sum()))
    keys = np.where(low, 5, 500).astype(np.int64)
    t = EventTable(stream, ids, keys, ts)
    monkeypatch.setattr(sharded_mod, "ROUTE_ROWS", 16)

    def held_by_shard_0():
        with ShardedEngine(parse_window("time:100,100", 50), "eq", np.array([100]),
                           index="nested", subwindow_size=2, batch_size=4) as eng:
            eng.push(t)
            eng.flush()
            return sum(eng.engines[0].window_tuples().values()), eng.engines[0].client_wm

    held, wm = held_by_shard_0()
    assert wm == int(ts[: n - 16].max())  # the largest ts before the last piece
    own = sharded_mod._push
    monkeypatch.setattr(sharded_mod, "_push", lambda eng, piece, rows, watermark:
                        own(eng, piece, rows, None))
    held_own, wm_own = held_by_shard_0()
    assert wm_own is None
    assert held < held_own, "the watermark did not reach shard 0"
    run(t, "time:100,100", "eq", [100], lateness=50)


def test_no_shards_where_numbas_threading_layer_cannot_run_kernels_side_by_side(monkeypatch):
    """Numba's workqueue layer (no libgomp, no tbb) aborts the process when two threads
    run parallel kernels at once: auto plans one engine and says why, K shards are
    refused with how to fix it, and this machine's layer allows shards."""
    assert sharded_mod.kernels_run_side_by_side() == (True, "")
    code = ("from panjoin.manager.sharded_engine import kernels_run_side_by_side as k\n"
            "ok, why = k(); print(ok, 'libgomp' in why)")
    import os

    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, NUMBA_THREADING_LAYER="workqueue"))
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["False", "True"]
    monkeypatch.setattr(sharded_mod, "kernels_run_side_by_side",
                        lambda: (False, "the layer is workqueue"))
    t = events("uniform", n=4000)
    b, why = plan_shards(t.key, t.stream, parse_window("time:9,9"), parse_predicate("eq"), 2)
    assert b is None and why == "the layer is workqueue"
    with pytest.raises(ValueError, match="2 shards: the layer is workqueue.*--shards 1"):
        ShardedEngine("time:9,9", "eq", np.array([3]))
    with ShardedEngine("time:9,9", "eq", np.zeros(0, np.int64)) as one:  # one shard runs
        one.push(t)
        one.flush()
