"""A join sharded over two managers that share their workers (panjoin/sharded.py): real
worker and manager processes over real gRPC (panjoin.launch), the union of the shards'
pairs exactly the reference's, the late tuples the reference's, for time windows with
out-of-order input; count windows refused with the reason; `panjoin replay --cluster
A,B` the same."""

import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from panjoin.client import Client
from panjoin.events import EventTable, write_events
from panjoin.generate import generate
from panjoin.launch import start_manager, start_workers
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import I64_MAX, I64_MIN, SpecError, parse_predicate, parse_window
from panjoin.sharded import sharded_join
from panjoin.sharding import Router, boundaries


@pytest.fixture(scope="module")
def managers():
    """Two managers over the same two workers."""
    ws = start_workers(2)
    ms = []
    try:
        for _ in range(2):
            ms.append(start_manager([w.address for w in ws]))
        yield [m.address for m in ms]
    finally:
        for p in [*ms, *ws]:
            p.stop()


def check(addresses, ev, window, pred, lateness, **kw):
    """The sharded join against the reference; returns the reference (for its sizes)."""
    res = sharded_join(addresses, ev, window, pred, chunk=kw.pop("chunk", 173),
                       allowed_lateness=lateness, batch_size=64, subwindow_size=50, **kw)
    ref = reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window(window, lateness),
                         parse_predicate(pred), ev.key2)
    got = sort_pairs(np.stack([res.r_id, res.s_id], axis=1))
    assert len(got) == len(ref.pairs), "a pair was lost or found in two shards"
    assert np.array_equal(got, ref.pairs)
    for name in ("R", "S"):
        assert np.array_equal(np.sort(res.late[name]), np.sort(ref.late_ids[name]))
    return ref


@pytest.mark.parametrize("pred", ["eq", "band:3", "band:2&band2:20", "bands:-6,-2;3,8",
                                  "ne"])
def test_sharded_time_join_is_exact(managers, pred):
    # 1500 tuples, keys -40..40, 30 ms of disorder over L = 10 ms: late tuples, and
    # bands that straddle the boundary (the keys' median)
    ev = generate(1500, "uniform", key_min=-40, key_max=40, rate=1000, seed=3,
                  disorder_ms=30, disorder_fraction=0.2,
                  key2_max=100.0 if "&" in pred else None)
    ref = check(managers, ev, "time:60,40", pred, 10)
    assert len(ref.pairs) > 100 and sum(map(len, ref.late_ids.values())) > 10


def test_extreme_int64_keys_straddling_the_boundary(managers):
    rng = np.random.default_rng(5)
    n = 1200
    keys = np.where(rng.random(n) < 0.5, np.int64(I64_MIN) + rng.integers(0, 30, n),
                    np.int64(I64_MAX) - rng.integers(0, 30, n))
    keys[::7] = rng.integers(-15, 15, size=keys[::7].size)  # and some around 0
    stream = rng.integers(0, 2, n).astype(np.uint8)
    ids = np.zeros(n, np.int64)
    for x in (0, 1):
        ids[stream == x] = np.arange(int((stream == x).sum()))
    ts = 1_000 + np.arange(n) - rng.integers(0, 25, n) * (rng.random(n) < 0.2)
    ev = EventTable(stream, ids, keys, ts)
    for bounds in ([I64_MAX - 12], [0], [I64_MIN + 9]):
        check(managers, ev, "time:80,80", "band:5", 8, bounds=np.array(bounds, np.int64))


def test_float_keys(managers):
    ev = generate(1200, "normal", key_min=-5.0, key_max=5.0, float_keys=True, rate=1000,
                  seed=9, disorder_ms=20, disorder_fraction=0.2)
    ev.key[:40] = np.round(ev.key[:40] * 4) / 4  # some on a grid: pairs on the band edges
    check(managers, ev, "time:50,50", "bands:-0.25,0;0.5,0.75", 5)


def test_count_windows_are_refused(managers):
    ev = generate(100, seed=1)
    with pytest.raises(SpecError, match="count windows do not shard"):
        sharded_join(managers, ev, "count:10,10", "eq")


def test_each_shard_stores_its_share(managers):
    """The shards split the R tuples and find no pair twice: without the router, both
    managers joining everything would double every pair (the check above fails)."""
    ev = generate(1000, "uniform", key_min=0, key_max=999, rate=1000, seed=2)
    r = Router(boundaries(ev.key, 2), parse_window("time:100,100"), parse_predicate("eq"))
    routed = r.route(ev.stream, ev.key, ev.ts)
    n_r = [int((ev.stream[rows] == 0).sum()) for rows in routed.rows]
    assert sum(n_r) == int((ev.stream == 0).sum()) and min(n_r) > 0.4 * sum(n_r)
    with Client(managers[0]) as c:  # one manager alone: the same pairs as both
        one = c.join(ev, "time:100,100", "eq")
    both = sharded_join(managers, ev, "time:100,100", "eq")
    assert np.array_equal(sort_pairs(np.stack(one[:2], axis=1)),
                          sort_pairs(np.stack(both[:2], axis=1)))


def test_sharded_pairs_go_to_a_writer_as_the_shards_answer(managers):
    """``sharded_join(out=...)``: every shard's answers go to the one writer (one at a
    time), with their payloads; the Result keeps the late ids only."""
    import pyarrow as pa

    from panjoin.events import EventTable

    g = generate(1500, "uniform", key_min=-40, key_max=40, rate=1000, seed=3,
                 disorder_ms=30, disorder_fraction=0.2)
    ev = EventTable(g.stream, g.id, g.key, g.ts,
                    payload=pa.array([f"{'RS'[a]}{b}" for a, b in zip(g.stream, g.id,
                                                                     strict=True)]))

    class Writes(list):
        def write(self, r, s, rp, sp):
            assert rp.to_pylist() == [f"R{i}" for i in r]
            assert sp.to_pylist() == [f"S{i}" for i in s]
            self.append((r, s))

    out = Writes()
    res = sharded_join(managers, ev, "time:60,40", "band:3", chunk=173, allowed_lateness=10,
                       batch_size=64, subwindow_size=50, out=out)
    assert len(res.r_id) == 0 and len([w for w in out if len(w[0])]) >= 4
    ref = reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window("time:60,40", 10),
                         parse_predicate("band:3"))
    got = sort_pairs(np.stack([np.concatenate([w[0] for w in out]),
                               np.concatenate([w[1] for w in out])], axis=1))
    assert np.array_equal(got, ref.pairs) and len(got) > 100
    for name in ("R", "S"):
        assert np.array_equal(np.sort(res.late[name]), np.sort(ref.late_ids[name]))


def test_replay_cli_over_two_managers(managers, tmp_path):
    ev = generate(1500, "uniform", key_min=0, key_max=60, rate=1000, seed=4, disorder_ms=30,
                  disorder_fraction=0.2)
    src = tmp_path / "events.parquet"
    write_events(ev, src)
    out, late = tmp_path / "pairs.parquet", tmp_path / "late.parquet"
    cmd = [sys.executable, "-m", "panjoin.cli", "replay", str(src), "--window", "time:50,50",
           "--allowed-lateness", "10", "--predicate", "band:2", "--out", str(out),
           "--late-out", str(late), "--cluster", ",".join(managers), "--no-progress"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "2 managers" in p.stdout, p.stdout
    ref = reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window("time:50,50", 10),
                         parse_predicate("band:2"))
    t = pq.read_table(out)
    got = sort_pairs(np.stack([t["r_id"].to_numpy(), t["s_id"].to_numpy()], axis=1))
    assert np.array_equal(got, ref.pairs) and len(got) > 0
    lt = pq.read_table(late)
    assert lt.num_rows == sum(map(len, ref.late_ids.values())) > 0
    # a count window over several managers: one line that says why
    cmd[cmd.index("time:50,50")] = "count:50,50"
    cmd.remove("--allowed-lateness")
    cmd.remove("10")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode != 0
    assert "count windows do not shard" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_a_failed_shard_stops_the_routing(managers, monkeypatch):
    """A shard whose join fails (its manager is gone) stops the routing at once with
    that shard's error: the router does not go on queueing the whole input for it (a
    copy of the input in memory, with unbounded queues)."""
    import socket

    import panjoin.sharded as sharded

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        gone = f"127.0.0.1:{s.getsockname()[1]}"
    routed = []
    route = sharded.Router.route
    monkeypatch.setattr(sharded.Router, "route",
                        lambda self, *a: routed.append(1) or route(self, *a))
    ev = generate(200_000, "uniform", key_min=0, key_max=999, rate=1000, seed=5)
    with pytest.raises(Exception) as e:
        sharded_join([managers[0], gone], ev, "time:100,100", "eq", chunk=1000)
    assert len(routed) < 50, f"{len(routed)} of 200 chunks routed after the shard failed"
    assert "UNAVAILABLE" in str(e.value) or "connect" in str(e.value).lower(), e.value
