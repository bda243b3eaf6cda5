"""Residual conditions on a second attribute (key2): ``band:10&band2:10`` and friends.

Against the brute-force reference: every index in-process (count and time windows,
eq / band / bands primary, int, float and extreme keys, extreme key2), the gRPC
cluster (pairs and ranges result formats), the handshake chain (simulated with 1-4
nodes, and a real 2-node chain, nested and sorted segments). Each index's residual
probe is also compared pair for pair with an unfiltered probe post-filtered in numpy.
Tests that must fail: a wrong residual bound, and the same join without the residual.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from index_helpers import random_filter

from panjoin.events import EventTable, read_events, write_events
from panjoin.generate import generate
from panjoin.handshake.chain import HandshakeChain
from panjoin.handshake.simulate import Simulation
from panjoin.launch import start_workers
from panjoin.manager.engine import JoinEngine
from panjoin.manager.grpc_backend import GrpcBackend
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import (
    I64_MAX,
    I64_MIN,
    SpecError,
    parse_predicate,
    parse_window,
    probe_bounds,
    residual_bounds,
)
from panjoin.subwindow import Residual, ResidualError, make_index
from panjoin.subwindow.kernels import window as W

N = 1200
WINDOWS = {"count": "count:150,110", "time": "time:160,120"}
EXTREMES = np.array([I64_MIN, I64_MIN + 1, -2, 0, 3, I64_MAX - 1, I64_MAX], dtype=np.int64)
# key2 values near the top of float64 and around 0.1 + 0.2: band edges need exact arithmetic
KEY2_EXTREMES = np.array([-1.7e308, -1e300, -0.5, 0.0, 0.1, 0.2, 0.30000000000000004, 0.3,
                          0.5, 1e300, 1.7e308])
INDEXES = ["bisort", "rap", "wib", "nested", "sortedlist"]


@functools.cache
def stream(dist: str = "uniform", key2: str = "quarters", n: int = N, disorder_ms: int = 0,
           seed: int = 7) -> EventTable:
    if dist == "extreme":
        t = generate(n, "uniform", key_min=0, key_max=len(EXTREMES) - 1, seed=seed,
                     disorder_ms=disorder_ms, rate=1000.0)
        t.key = EXTREMES[t.key]
    elif dist == "float":
        t = generate(n, "uniform", key_min=0, key_max=40, float_keys=True, seed=seed,
                     disorder_ms=disorder_ms, rate=1000.0)
        t.key = np.round(t.key * 4) / 4 + 0.1
    else:
        t = generate(n, dist, key_min=-20, key_max=40, seed=seed, disorder_ms=disorder_ms,
                     rate=1000.0)
    rng = np.random.default_rng(seed + 1)
    if key2 == "extreme":
        t.key2 = KEY2_EXTREMES[rng.integers(0, KEY2_EXTREMES.shape[0], n)]
    else:  # quarter steps: equal key2 values exist and band2 edges are hit exactly
        t.key2 = rng.integers(0, 16, n) * 0.25 + 0.1
    return t


def ref_pairs(t, window, pred, lateness=0):
    w = parse_window(window, lateness)
    return reference_join(t.stream, t.id, t.key, t.ts, w, parse_predicate(pred), t.key2).pairs


def run_engine(t, window, pred, index="bisort", lateness=0, backend=None, n_workers=1, **kw):
    eng = JoinEngine(parse_window(window, lateness), pred, index=index, threads=2,
                     backend=backend, n_workers=n_workers, **kw)
    for a, b in ((0, 400), (400, 410), (410, len(t))):
        eng.push(t.slice(a, b))
    eng.flush()
    r, s = eng.take_results()
    return sort_pairs(np.stack([r, s], axis=1))


def assert_same(got, want):
    assert got.shape == want.shape, f"{len(got)} pairs, reference has {len(want)}"
    assert np.array_equal(got, want)


# --------------------------------------------------------------------------- the spec


def test_parse_and_format():
    p = parse_predicate("band:10&band2:10")
    assert p.bands == ((-10, 10),) and p.residual.bands == ((-10, 10),)
    assert str(p) == "band:10&band2:10" and parse_predicate(str(p)) == p
    q = parse_predicate("bands:-5,5;20,35 & bands2:2,3;-1,0.5")
    assert q.residual.bands == ((-1, 0.5), (2, 3))
    assert parse_predicate(str(q)) == q
    assert str(parse_predicate("eq&eq2")) == "eq&eq2"
    assert parse_predicate("ne&band2:1").negated
    assert parse_predicate("band:10&band2:10").primary == parse_predicate("band:10")
    assert parse_predicate("band:10").residual is None


@pytest.mark.parametrize("bad", ["band:1&band:2", "band:1&band2:-1", "band:1&ne2",
                                 "band:1&band2:1&eq2", "band:1&", "band:1&bands2:3,1",
                                 "band:1&band2:nan"])
def test_bad_residual_spec(bad):
    with pytest.raises(SpecError, match="residual"):
        parse_predicate(bad)


def test_residual_bounds_exact():
    # s.key2 - r.key2 in [-0.1, 0.1] from r.key2 = 0.2: 0.30000000000000004 - 0.2 > 0.1
    lo, hi = residual_bounds(parse_predicate("eq&band2:0.1"), "R", np.array([0.2]))
    assert lo[0, 0] <= 0.3 <= hi[0, 0]
    assert not (0.30000000000000004 <= hi[0, 0])
    assert residual_bounds(parse_predicate("eq"), "R", None) is None
    with pytest.raises(SpecError, match="key2"):
        residual_bounds(parse_predicate("eq&eq2"), "R", None)


def test_events_key2_round_trip(tmp_path):
    t = stream("uniform", "extreme", n=50)
    for name in ("e.csv", "e.parquet"):
        write_events(t, tmp_path / name)
        back = read_events(tmp_path / name)
        assert back.equals(t) and back.key2.dtype == np.float64
    assert t.take(np.array([3, 1])).key2.tolist() == t.key2[[3, 1]].tolist()
    assert not t.equals(EventTable(t.stream, t.id, t.key, t.ts, None, t.key2 + 1))
    bad = EventTable(t.stream, t.id, t.key, t.ts, None, np.where(np.arange(50) == 7, np.nan, 1.0))
    with pytest.raises(ValueError, match="data row 8: column 'key2'"):
        write_events(bad, tmp_path / "bad.csv")
    (tmp_path / "text.csv").write_text("stream,id,key,ts,key2\nR,0,1,0,x\n")
    with pytest.raises(ValueError, match="key2"):
        read_events(tmp_path / "text.csv")


# --------------------------------------------------------------------------- indexes


def _fill(ix, rng, n, dtype, key2=True, sizes=(1, 5, 40, 3, 90, 7, 200, 1)):
    keys = rng.integers(-30, 30, n).astype(dtype)
    k2 = rng.integers(0, 12, n) * 0.5
    ts = rng.integers(0, 1000, n)
    seq = np.arange(100, 100 + n, dtype=np.int64)  # a subwindow's seqs: one contiguous run
    pos = 0
    for s in sizes:
        if pos >= n:
            break
        sl = slice(pos, min(n, pos + s))
        o = np.argsort(keys[sl], kind="stable")
        ix.insert(keys[sl][o], ts[sl][o], seq[sl][o], k2[sl][o] if key2 else None)
        ix.check()
        pos = sl.stop
    return keys, k2, seq


@pytest.mark.parametrize("kind", INDEXES + ["bisort-gather", "bisort-2threads"])
@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_index_residual_equals_post_filter(kind, dtype):
    rng = np.random.default_rng(3)
    opts, threads = {}, 1
    if kind.startswith("bisort"):
        opts = {"buffer": 16, "par_merge_min": 1}
        if kind == "bisort-gather":
            opts["residual_layout"] = "gather"
        threads = 2 if kind == "bisort-2threads" else 1
        kind = "bisort"
    n = 347
    ix = make_index(kind, 400, key_dtype=np.dtype(dtype).name, partitions=8, threads=threads,
                    **opts)
    keys, k2, seq = _fill(ix, rng, n, dtype)
    key2_of = dict(zip(seq.tolist(), k2.tolist(), strict=True))
    total = kept = 0
    for pred in ["eq&band2:1", "band:3&bands2:-2,-1;0.5,1", "bands:-5,-2;4,9&eq2", "ne&band2:0"]:
        p = parse_predicate(pred)
        for side in "RS":
            m = 150
            pk = np.sort(rng.integers(-30, 30, m)).astype(dtype)
            pk2 = rng.integers(0, 12, m) * 0.5
            lo, hi = probe_bounds(p, side, pk)
            res = Residual(*residual_bounds(p, side, pk2))
            for mode in (W.NONE, W.TIME, W.COUNT):
                flt = random_filter(rng, mode, m)
                a, b = ix.probe(lo, hi, flt)  # no residual: every key candidate
                keep = res.mask(a, np.array([key2_of[s] for s in b.tolist()]))
                want = np.sort((a[keep] << 32) | b[keep])
                ga, gb = ix.probe(lo, hi, flt, res)
                np.testing.assert_array_equal(np.sort((ga << 32) | gb), want)
                total += a.size
                kept += int(keep.sum())
        ix.check()
    assert 0 < kept < total  # the residual both kept and dropped real candidates


@pytest.mark.parametrize("threads", [1, 2])
def test_bisort_residual_over_a_full_buffer(threads):
    """Batches no larger than BI-Sort's insertion buffer stay in it, so its probes with a
    residual find most candidates in the buffer: its sorted ranges (several key bands,
    several key2 bands, duplicates at the bounds, every window mode) must give the pairs
    the post filter keeps, as the buffer fills and after each merge."""
    rng = np.random.default_rng(11)
    ix = make_index("bisort", 2000, partitions=16, threads=threads, buffer=64,
                    par_merge_min=1)
    n, pos, seen_buffer = 900, 0, 0
    keys = rng.integers(-20, 20, n)
    k2 = rng.integers(0, 8, n) * 0.5
    ts = rng.integers(0, 1000, n)
    seq = np.arange(5, 5 + n, dtype=np.int64)
    key2_of = dict(zip(seq.tolist(), k2.tolist(), strict=True))
    preds = ["eq&band2:1", "band:2&bands2:-2,-1;0.5,1", "bands:-5,-2;4,9&eq2", "ne&band2:0"]
    while pos < n:
        sl = slice(pos, min(n, pos + int(rng.integers(5, 30))))
        o = np.argsort(keys[sl], kind="stable")
        ix.insert(keys[sl][o], ts[sl][o], seq[sl][o], k2[sl][o])
        ix.check()
        pos = sl.stop
        seen_buffer += ix.nbuf > 10
        p = parse_predicate(preds[pos % len(preds)])
        for side in "RS":
            m = int(rng.integers(1, 90))
            pk = np.sort(rng.integers(-22, 22, m))
            lo, hi = probe_bounds(p, side, pk)
            res = Residual(*residual_bounds(p, side, rng.integers(0, 8, m) * 0.5))
            flt = random_filter(rng, (W.NONE, W.TIME, W.COUNT)[pos % 3], m)
            a, b = ix.probe(lo, hi, flt)
            keep = res.mask(a, np.array([key2_of[s] for s in b.tolist()]))
            ga, gb = ix.probe(lo, hi, flt, res)
            np.testing.assert_array_equal(np.sort((ga << 32) | gb),
                                          np.sort((a[keep] << 32) | b[keep]))
    assert seen_buffer > 10  # the buffer held candidates in many of the probes


def test_index_residual_errors():
    ix = make_index("bisort", 50, partitions=4)
    ix.insert(np.array([1, 2]), np.zeros(2, np.int64), np.array([0, 1]))  # no key2
    lo, hi = probe_bounds(parse_predicate("eq"), "R", np.array([1]))
    res = Residual(np.array([[0.0]]), np.array([[1.0]]))
    with pytest.raises(ResidualError, match="without it"):
        ix.probe(lo, hi, None, res)
    with pytest.raises(ResidualError, match="without key2"):
        ix.insert(np.array([3]), np.zeros(1, np.int64), np.array([2]), np.array([0.5]))
    jx = make_index("nested", 10)
    jx.insert(np.array([1]), np.zeros(1, np.int64), np.array([5]), np.array([0.5]))
    with pytest.raises(ResidualError, match="insert every batch with key2"):
        jx.insert(np.array([2]), np.zeros(1, np.int64), np.array([6]))
    with pytest.raises(ResidualError, match="arrival position"):
        jx.insert(np.array([2]), np.zeros(1, np.int64), np.array([50]), np.array([0.5]))
    with pytest.raises(ResidualError, match="probe tuples"):
        jx.probe(lo, hi, None, Residual(np.zeros((1, 3)), np.ones((1, 3))))
    assert len(jx) == 1  # the refused inserts changed nothing


# --------------------------------------------------------------------------- the engine


@pytest.mark.parametrize("index", INDEXES)
@pytest.mark.parametrize("wkind", ["count", "time"])
@pytest.mark.parametrize("pred", ["eq&band2:1", "band:3&band2:0.5",
                                  "bands:-9,-6;2,4&bands2:-1,-0.5;0.25,0.75"])
def test_engine_matches_reference(index, wkind, pred):
    t = stream("uniform")
    lateness = 10 if wkind == "time" else 0
    want = ref_pairs(t, WINDOWS[wkind], pred, lateness)
    assert len(want) > 50
    got = run_engine(t, WINDOWS[wkind], pred, index, lateness, subwindow_size=40,
                     partitions=8, batch_size=64,
                     index_opts={"buffer": 16} if index == "bisort" else None)
    assert_same(got, want)


@pytest.mark.parametrize("dist,key2", [("float", "quarters"), ("extreme", "extreme"),
                                       ("uniform", "extreme"), ("zipf", "quarters")])
@pytest.mark.parametrize("index", ["bisort", "rap", "wib"])
def test_engine_float_and_extreme(dist, key2, index):
    t = stream(dist, key2, disorder_ms=20)
    for wkind, pred in (("count", "band:2&band2:0.2"), ("time", "eq&bands2:0,1e300")):
        lateness = 5 if wkind == "time" else 0
        want = ref_pairs(t, WINDOWS[wkind], pred, lateness)
        got = run_engine(t, WINDOWS[wkind], pred, index, lateness, subwindow_size=30,
                         partitions=4, batch_size=50)
        assert_same(got, want)


def test_wrong_residual_bound_fails():
    """The comparison can fail: a different band2, or no residual, gives other pairs."""
    t = stream("uniform")
    want = ref_pairs(t, "count:150,110", "band:3&band2:0.5")
    assert not np.array_equal(run_engine(t, "count:150,110", "band:3&band2:0.75"), want)
    no_res = run_engine(t, "count:150,110", "band:3")
    assert len(no_res) > 2 * len(want)
    # and the reference itself depends on key2 (not a constant filter)
    t2 = EventTable(t.stream, t.id, t.key, t.ts, None, t.key2[::-1].copy())
    assert not np.array_equal(ref_pairs(t2, "count:150,110", "band:3&band2:0.5"), want)


def test_engine_needs_key2():
    eng = JoinEngine("count:10,10", "eq&eq2", index="bisort")
    t = stream("uniform", n=20)
    with pytest.raises(ValueError, match="key2"):
        eng.push_arrays(t.stream, t.id, t.key, t.ts)
    with pytest.raises(ValueError, match="finite"):
        eng.push_arrays(t.stream, t.id, t.key, t.ts, key2=np.full(20, np.inf))
    # without a residual, key2 is simply not needed
    plain = JoinEngine("count:10,10", "eq", index="bisort")
    plain.push(t)


def test_peers_refuse_a_residual():
    from panjoin.baselines.symmetric_hash_join import SymmetricHashJoin

    with pytest.raises(ValueError, match="residual"):
        SymmetricHashJoin("count:10,10", "band:1&band2:1")


# --------------------------------------------------------------------------- the cluster


@pytest.mark.parametrize("index,fmt", [("bisort", "pairs"), ("bisort", "ranges"),
                                       ("rap", "pairs"), ("wib", "pairs")])
@pytest.mark.parametrize("wkind", ["count", "time"])
def test_cluster_matches_reference(workers, index, fmt, wkind):
    t = stream("zipf", disorder_ms=30)
    pred = "bands:-3,-1;2,5&band2:1"
    lateness = 10 if wkind == "time" else 0
    backend = GrpcBackend([w.address for w in workers[:2]], result_format=fmt)
    try:
        got = run_engine(t, WINDOWS[wkind], pred, index, lateness, backend=backend,
                         n_workers=2, subwindow_size=30, partitions=8, batch_size=64)
        # with a residual the workers answer pairs, filtered where they are produced
        assert backend.ranges_expanded == 0
    finally:
        backend.close()
    want = ref_pairs(t, WINDOWS[wkind], pred, lateness)
    assert len(want) > 50
    assert_same(got, want)


@pytest.mark.parametrize("wkind", ["count", "time"])
def test_failover_replays_key2_and_the_residual(wkind):
    """A worker killed mid-join: its subwindows are rebuilt from the manager's copy, key2
    included, and its unanswered probes are retried with their residual bounds."""
    t = stream("uniform", disorder_ms=30 if wkind == "time" else 0)
    pred, lateness = "band:2&band2:1", 10 if wkind == "time" else 0
    ws = start_workers(3)
    # the killed worker is seen by its closed connection; the deadline only has to outlast
    # a live worker compiling its kernels on a cold Numba cache (20 s did not, under load)
    backend = GrpcBackend([w.address for w in ws], deadline=60)
    try:
        eng = JoinEngine(parse_window(WINDOWS[wkind], lateness), pred, index="bisort",
                         subwindow_size=30, partitions=8, batch_size=64, backend=backend,
                         n_workers=3)
        eng.push(t.slice(0, len(t) // 2))
        ws[1].kill()  # SIGKILL: no goodbye
        eng.push(t.slice(len(t) // 2, len(t)))
        eng.flush()
        r, s = eng.take_results()
        assert backend.failovers >= 1
    finally:
        backend.close()
        for w in ws:
            w.stop()
    want = ref_pairs(t, WINDOWS[wkind], pred, lateness)
    assert len(want) > 50
    assert_same(sort_pairs(np.stack([r, s], axis=1)), want)


def test_worker_refuses_ranges_with_a_residual(workers):
    import grpc

    from panjoin import codec
    from panjoin.backend import SortedBatch
    from panjoin.proto.panjoin.v1 import common_pb2, worker_pb2, worker_pb2_grpc
    from panjoin.wire import from_array

    def batch(batch_id, stream, key2, residual):
        b = SortedBatch.of(batch_id, stream, np.array([1]), np.zeros(1), np.array([0]),
                           np.array([9]), np.array([key2]), predicate=f"eq&{residual}",
                           window="count:4,4")
        return worker_pb2.Batch.FromString(codec.encode_batch(b).tobytes())

    with grpc.insecure_channel(workers[0].address) as ch:
        stub = worker_pb2_grpc.WorkerStub(ch)
        cmds = [
            worker_pb2.Command(command_id=1, create=worker_pb2.Create(
                sub_id=1, stream=common_pb2.STREAM_R, index="bisort", capacity=4,
                key_dtype="int64", partitions=1)),
            worker_pb2.Command(command_id=2, batch=batch(1, "R", 0.5, "band2:0.5")),
            worker_pb2.Command(command_id=3, insert=worker_pb2.Insert(
                sub_id=1, batch_id=1, seq_from=0, seq_to=1)),
            # S probes with key2 1.2: s.key2 - r.key2 = 0.7
            worker_pb2.Command(command_id=4, batch=batch(2, "S", 1.2, "band2:0.5")),
            worker_pb2.Command(command_id=5, probe=worker_pb2.Probe(
                batch_id=2, sub_ids=[1], format=worker_pb2.RESULT_FORMAT_RANGES)),
            worker_pb2.Command(command_id=6, probe=worker_pb2.Probe(batch_id=2, sub_ids=[1])),
            worker_pb2.Command(command_id=7, batch=batch(3, "S", 1.2, "band2:0.75")),
            worker_pb2.Command(command_id=8, probe=worker_pb2.Probe(batch_id=3, sub_ids=[1])),
        ]
        fbs = [f for out in stub.Session(iter([worker_pb2.Commands(commands=cmds)]))
           for f in out.feedback]
    assert not any(fbs[i].error for i in (0, 1, 2, 3, 5, 6, 7))
    assert fbs[4].code == "INVALID_ARGUMENT" and "residual" in fbs[4].error
    assert not fbs[5].results[0].ids.data  # 0.7 outside [-0.5, 0.5]
    assert from_array(fbs[7].results[0].ids).tolist() == [9]  # 0.7 inside [-0.75, 0.75]


# --------------------------------------------------------------------------- handshake


@pytest.mark.parametrize("n_nodes", [1, 2, 4])
@pytest.mark.parametrize("wkind", ["count", "time"])
@pytest.mark.parametrize("segment", ["nested", "sorted"])
def test_handshake_simulation(n_nodes, wkind, segment):
    t = stream("uniform", n=500)
    window = {"count": "count:60,35", "time": "time:70,45"}[wkind]
    for pred in ("band:3&band2:0.5", "eq&eq2"):
        w, p = parse_window(window), parse_predicate(pred)
        sim = Simulation(n_nodes, w, p, key_dtype=t.key.dtype, index=segment)
        got = sort_pairs(sim.run(t.stream, t.id, t.key, t.ts, t.key2))
        assert_same(got, ref_pairs(t, window, pred))
    with pytest.raises(ValueError, match="key2"):
        Simulation(1, w, p).run(t.stream, t.id, t.key, t.ts)


def test_handshake_chain_of_processes():
    nodes = start_workers(2, role="handshake-node")
    try:
        t = stream("float", "extreme", n=900)
        for segment, window, pred in (("nested", "count:300,200", "band:2&band2:0.25"),
                                      ("sorted", "time:250,180", "band:1&bands2:-1e300,0")):
            w, p = parse_window(window), parse_predicate(pred)
            with HandshakeChain([n.address for n in nodes], w, p, batch_size=113, max_batch=50,
                                index=segment) as ch:
                for a in range(0, len(t), 300):
                    ch.push(t.slice(a, a + 300))
                ch.flush()
                r, s = ch.take_results()
            want = ref_pairs(t, window, pred)
            assert len(want) > 20
            assert_same(sort_pairs(np.stack([r, s], axis=1)), want)
    finally:
        for n in nodes:
            n.stop()


@pytest.mark.parametrize("n_nodes", [1, 3])
def test_handshake_bulk_fill(n_nodes):
    """Bulk fill puts the first tuples straight into the segments, balanced: afterwards
    the chain gives every reference pair except those among loaded tuples that sit on
    one node or have crossed already (S on a node left of R's)."""
    nodes = start_workers(n_nodes, role="handshake-node")
    try:
        t = stream("uniform", n=1500)
        window, pred, fill = "count:300,250", "band:2&band2:0.5", 700
        w, p = parse_window(window), parse_predicate(pred)
        with HandshakeChain([n.address for n in nodes], w, p, batch_size=97,
                            max_batch=40) as ch:
            ch.bulk_fill(t.slice(0, fill))
            for a in range(fill, len(t), 250):
                ch.push(t.slice(a, a + 250))
            ch.flush()
            r, s = ch.take_results()
            with pytest.raises(ValueError, match="empty chain"):
                ch.bulk_fill(t.slice(0, 10))
        want = ref_pairs(t, window, pred)
        node = {}  # loaded id -> node: runs of sizes q+1.. then q, oldest first
        for i, x in enumerate("RS"):
            ids = t.id[:fill][t.stream[:fill] == i]
            q, rem = divmod(len(ids), n_nodes)
            run = np.repeat(np.arange(n_nodes), [q + (k < rem) for k in range(n_nodes)])
            node[x] = dict(zip(ids.tolist(), (n_nodes - 1 - run if x == "R" else run).tolist(),
                               strict=True))
        keep = np.array([not (a in node["R"] and b in node["S"] and node["S"][b] <= node["R"][a])
                         for a, b in want.tolist()])
        assert 0 < keep.sum() < len(want)
        assert_same(sort_pairs(np.stack([r, s], axis=1)), want[keep])
    finally:
        for n in nodes:
            n.stop()


def test_opencl_bisort_residual():
    """The OpenCL BI-Sort (pocl CPU device) applies the residual through the generic
    filter, and refuses it in probe_keys (its device-side bounds know no key2)."""
    t = stream("uniform", n=600)
    want = ref_pairs(t, "count:150,110", "band:3&band2:0.5")
    got = run_engine(t, "count:150,110", "band:3&band2:0.5", "bisort-opencl",
                     subwindow_size=40, partitions=8, batch_size=64)
    assert_same(got, want)
    ix = make_index("bisort-opencl", 8, partitions=2)
    ix.insert(np.array([1, 2]), np.zeros(2, np.int64), np.array([0, 1]), np.array([0.0, 1.0]))
    with pytest.raises(ResidualError, match="probe_keys"):
        ix.probe_keys(parse_predicate("eq&eq2"), "R", np.array([1]))
