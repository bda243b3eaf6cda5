"""Key placement (``--placement key``): every subwindow cut by key over all the workers.

The routing of a batch in arrival order (which rows each worker gets, and which of
them it inserts once it has sorted them) is checked against brute force on generated
keys (int64 extremes and floats, every predicate shape); a piece's ids by rank against a dict;
and whole joins through real worker processes and a real manager against the
reference: every index, predicate (a residual and ``ne`` included), key type and
window, the pairs sent past the manager or through it, payloads kept at the
manager (the path whose probe indexes the backend shifts per worker), keys all
equal and steadily increasing (every tuple on one worker), and the refusals.
"""

from __future__ import annotations

import grpc
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from panjoin import codec
from panjoin.backend import SortedBatch
from panjoin.client import Client, rows_of
from panjoin.generate import generate
from panjoin.launch import start_cluster, start_workers
from panjoin.manager.engine import JoinEngine
from panjoin.manager.key_placement import KeyPlacedBackend, route_batch
from panjoin.proto.panjoin.v1 import manager_pb2, worker_pb2
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window, probe_bounds
from panjoin.sharding import shard_of
from panjoin.subwindow.piece_ids import PieceIds
from panjoin.subwindow.store import SubwindowStore

I64 = np.iinfo(np.int64)
PREDICATES = ["eq", "band:3", "bands:-5,-2;4,9", "ne", "band:0", "band:4&band2:1"]


@st.composite
def _cut_case(draw):
    floats = draw(st.booleans())
    if floats:
        keys = draw(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=0, max_size=60))
        keys = np.array(keys, np.float64)
        bounds = np.sort(np.array(draw(st.lists(st.floats(-1e6, 1e6), min_size=0,
                                                max_size=4)), np.float64))
    else:
        edge = st.sampled_from([int(I64.min), int(I64.min) + 2, -3, 0, 5, int(I64.max) - 1,
                                int(I64.max)])
        ints = st.one_of(st.integers(-50, 50), edge)
        keys = np.array(draw(st.lists(ints, min_size=0, max_size=60)), np.int64)
        bounds = np.sort(np.array(draw(st.lists(ints, min_size=0, max_size=4)), np.int64))
    return keys, bounds, draw(st.sampled_from(PREDICATES)), draw(st.sampled_from("RS"))


@settings(max_examples=300, deadline=None)
@given(_cut_case())
def test_a_batch_is_routed_where_its_inserts_and_probes_belong(case):
    keys, bounds, pred, stream = case  # keys in arrival order (any order)
    p = parse_predicate(pred)
    rows, own = route_batch(keys, bounds, p, stream)
    shard = shard_of(bounds, keys)
    lo, hi = probe_bounds(p.primary, stream, keys)
    for k in range(bounds.size + 1):
        r = rows[k]
        assert np.all(np.diff(r) > 0)  # ascending positions: still in arrival order
        # the rows it probes with: at least every row whose interval meets its range
        klo = bounds[k - 1] if k else None
        khi = bounds[k] if k < bounds.size else None
        meets = np.zeros(keys.size, bool)
        for lo_b, hi_b in zip(lo, hi, strict=True):
            m = lo_b <= hi_b
            if khi is not None:
                m &= lo_b < khi
            if klo is not None:
                m &= hi_b >= klo
            meets |= m
        assert set(np.flatnonzero(meets | (shard == k))) <= set(r.tolist()), k
        # the rows it inserts once sorted (stable, by key): exactly its own keys, in
        # arrival order among equal keys
        mine = r[np.argsort(keys[r], kind="stable")]
        a, b = own[k]
        assert np.array_equal(mine[a:b], r[shard[r] == k][np.argsort(keys[r][shard[r] == k],
                                                                      kind="stable")])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 199), min_size=1, max_size=40), min_size=1,
                max_size=8), st.randoms(use_true_random=False))
def test_a_piece_finds_its_ids_by_rank(runs, rnd):
    span = 200 * len(runs)
    p = PieceIds(span)
    held: dict[int, int] = {}
    for j, run in enumerate(runs):  # each run's offsets past the ones before, any order
        offs = sorted({200 * j + x for x in run})
        rnd.shuffle(offs)
        ids = [rnd.randrange(-1 << 40, 1 << 40) for _ in offs]
        p.insert(np.array(offs, np.int64), np.array(ids, np.int64))
        held.update(zip(offs, ids, strict=True))
        ask = np.array(list(held), np.int64)
        assert p.ids_of(ask).tolist() == [held[o] for o in ask.tolist()]
    assert p.count == len(held)


def test_a_piece_takes_seqs_with_gaps_but_not_backwards():
    st_ = SubwindowStore("bisort", 100, "int64", 4, piece=True)
    z = np.zeros(3, np.int64)
    st_.insert(np.array([1, 2, 3]), z, np.array([10, 14, 12]), np.array([7, 8, 9]))
    st_.insert(np.array([5, 6]), z[:2], np.array([40, 31]), np.array([5, 6]))
    st_.check()
    assert st_.ids_of(np.array([40, 12, 10])).tolist() == [5, 9, 7]
    with pytest.raises(ValueError, match="after the ones it holds"):
        st_.insert(np.array([9]), z[:1], np.array([20]), np.array([1]))
    with pytest.raises(ValueError, match="continue the subwindow's run"):
        SubwindowStore("bisort", 100, "int64", 4).insert(
            np.array([1, 2]), z[:2], np.array([0, 2]), np.array([1, 2]))


@pytest.fixture(scope="module")
def cluster():
    with start_cluster(3, manager_args=["--replicas", "1", "--placement", "key"]) as c:
        yield c


CASES = [
    ("count:700,500", "eq", "bisort", {}),
    ("count:600,600", "band:3", "rap", {"dist": "zipf"}),
    ("count:800,300", "band:2", "wib", {"float_keys": True}),
    ("time:900,600", "band:1", "bisort", {"disorder_ms": 40}),
    ("count:500,500", "band:4&band2:0.5", "hash", {"key2_max": 4.0}),
    ("count:300,300", "ne", "nested", {"dist": "zipf"}),
    ("count:600,400", "bands:-9,-3;2,6", "bisort", {"dist": "increasing"}),
]


def _events(n=6000, dist="uniform", **kw):
    return generate(n, dist, key_min=-40, key_max=400, rate=1000, seed=7, **kw)


def _run(c: Client, ev, window: str, pred: str, index: str, direct: bool):
    lateness = {"allowed_lateness": 100} if window.startswith("time") else {}
    jid = c.open(window, pred, index, subwindow_size=256, batch_size=128,
                 direct_results=direct, **lateness)
    assert (jid in c.direct) == direct  # past the manager when asked (replicas 1)
    outs = c.run_join(jid, [rows_of(ev, np.arange(a, min(len(ev), a + 1000)))
                            for a in range(0, len(ev), 1000)])
    got = sort_pairs(np.stack([np.concatenate([o.r_id for o in outs]),
                               np.concatenate([o.s_id for o in outs])], axis=1))
    want = reference_join(ev.stream, ev.id, ev.key, ev.ts,
                          parse_window(window, 100 if lateness else 0),
                          parse_predicate(pred), getattr(ev, "key2", None)).pairs
    return got, want, jid


@pytest.mark.parametrize("direct", [True, False], ids=["past-the-manager", "through-it"])
@pytest.mark.parametrize("window,pred,index,gen", CASES)
def test_key_placed_joins_are_the_references(cluster, window, pred, index, gen, direct):
    ev = _events(**gen)
    with Client(cluster.address) as c:
        got, want, _ = _run(c, ev, window, pred, index, direct)
    assert want.shape[0] > 100
    np.testing.assert_array_equal(got, want)


def scrambled_ids(ev, seed: int = 3):
    """``ev`` with ids in no order, at both ends of int64 among them: pairs that came
    back as seqs, or mapped by the wrong stream, could not match the reference."""
    rng = np.random.default_rng(seed)
    ids = (rng.permutation(len(ev)).astype(np.int64) - len(ev) // 2) * 7_919_000_003
    ids[rng.choice(len(ev), 2, replace=False)] = [I64.min, I64.max]
    ev.id = ids
    return ev


@pytest.mark.parametrize("direct", [True, False], ids=["past-the-manager", "through-it"])
@pytest.mark.parametrize("window,pred,index,gen",
                         [c for c in CASES if c[0].startswith("count")][:4])
def test_a_client_that_numbers_its_tuples_gets_the_reference(cluster, window, pred, index,
                                                             gen, direct):
    """Client.join(seq_ids=True) on a count window: no id (nor ts) column goes to the
    manager or the workers, the pairs come back as seqs and the client maps them to
    its ids."""
    ev = scrambled_ids(_events(**gen))
    with Client(cluster.address) as c:
        jid = c.open(window, pred, index, seq_ids=True)
        assert c.columns[jid] == (True, True)  # granted; a count window
        msg = c.input_of(jid, 1, rows_of(ev, np.arange(10)))
        assert not msg.HasField("id") and not msg.HasField("ts") and msg.HasField("key")
        c.close_join(jid)
        res = c.join(ev, window, pred, index, chunk=1000, subwindow_size=256,
                     batch_size=128, direct_results=direct, seq_ids=True)
    want = reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window(window),
                          parse_predicate(pred), getattr(ev, "key2", None)).pairs
    assert want.shape[0] > 100
    np.testing.assert_array_equal(sort_pairs(np.stack([res.r_id, res.s_id], axis=1)), want)


@pytest.mark.parametrize("keys", ["extreme", "extreme-eq", "equal"])
def test_extreme_and_equal_keys(cluster, keys):
    n = 3000
    ev = _events(n)
    if keys.startswith("extreme"):  # both ends of int64, and a band that overflows there
        ev.key = np.where(ev.key % 2 == 0, I64.max - (ev.key % 7),
                          I64.min + (ev.key % 5)).astype(np.int64)
    else:
        ev.key = np.full(n, 11, np.int64)
    pred = "band:3" if keys == "extreme" else "eq"  # (extreme-eq: gathered, not offsets)
    with Client(cluster.address) as c:
        got, want, _ = _run(c, ev, "count:300,300", pred, "bisort", True)
    assert want.shape[0] > 100
    np.testing.assert_array_equal(got, want)


def test_payloads_kept_at_the_manager_come_back_on_their_pairs(cluster):
    t = generate(1500, "uniform", key_min=0, key_max=40, rate=1000, seed=21)
    t.payload = pa.array([f"{'RS'[s]}{i}" for s, i in zip(t.stream, t.id, strict=True)])
    with Client(cluster.address) as c:
        res = c.join(t, "count:150,150", "band:2", "rap", chunk=300, subwindow_size=50,
                     batch_size=40)
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:150,150"),
                         parse_predicate("band:2"))
    assert np.array_equal(sort_pairs(np.stack([res.r_id, res.s_id], axis=1)), ref.pairs)
    assert res.r_payload.to_pylist() == [f"R{i}" for i in res.r_id]
    assert res.s_payload.to_pylist() == [f"S{i}" for i in res.s_id]


def test_an_engine_over_key_pieces_answers_with_seqs():
    """The in-process engine on key-placed workers, every index, a time window with
    disorder: answers with stored seqs (probe indexes shifted per worker's rows)."""
    ev = generate(2500, "uniform", key_min=0, key_max=80, rate=1000, seed=5, disorder_ms=30)
    ws = start_workers(3)
    try:
        w = parse_window("time:200,150", 10)
        for index in ["rap", "wib", "bisort", "hash", "nested"]:
            backend = KeyPlacedBackend([x.address for x in ws])
            backend.want_seq = True
            try:
                eng = JoinEngine(w, "bands:-3,-1;2,5", index=index, subwindow_size=40,
                                 partitions=8, batch_size=64, backend=backend, n_workers=3)
                eng.push(ev.slice(0, 1200))
                eng.push(ev.slice(1200, len(ev)))
                eng.flush()
                r, s = eng.take_results()
                assert 0 < backend.bounds[0] < backend.bounds[1] < 80  # three key ranges
            finally:
                backend.close()
            ref = reference_join(ev.stream, ev.id, ev.key, ev.ts, w,
                                 parse_predicate("bands:-3,-1;2,5"))
            assert len(ref.pairs) > 100
            assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs), index
    finally:
        for x in ws:
            x.stop()


@pytest.mark.parametrize("direct", [True, False], ids=["past-the-manager", "through-it"])
def test_rounds_in_flight_keep_the_batch_only_where_the_manager_maps_pairs(direct):
    """With the pairs sent to the client by the workers, a probe round in flight holds
    nothing of its batch (the heap reuses the batch's memory); through the manager, it
    keeps the ids its pairs are mapped by."""
    ev = generate(3000, "uniform", key_min=0, key_max=500, rate=1000, seed=5)
    ws = start_workers(2)
    try:
        backend = KeyPlacedBackend([x.address for x in ws], direct=direct)
        try:
            eng = JoinEngine("count:800,800", "eq", index="bisort", subwindow_size=200,
                             batch_size=100, backend=backend, n_workers=2)
            eng.push(ev)
            assert len(eng._inflight) > 2
            for f in eng._inflight:
                assert (f.ids is None, f.answers.batch is None) == (direct, direct)
            eng.flush()
        finally:
            backend.close()
    finally:
        for x in ws:
            x.stop()


def test_key_placement_refuses_what_it_cannot_do(cluster):
    with pytest.raises(ValueError, match="replicas 1"):
        KeyPlacedBackend(["127.0.0.1:1"], replicas=2)
    with pytest.raises(ValueError, match="ranges"):
        KeyPlacedBackend(["127.0.0.1:1"], result_format="ranges")
    with Client(cluster.address) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.stub.Open(manager_pb2.OpenRequest(window="count:100,100", predicate="eq",
                                                index="bisort",
                                                result_format=worker_pb2.RESULT_FORMAT_RANGES))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "ranges" in e.value.details()
        jid = c.open("count:100,100", "eq", "bisort", subwindow_size=40, batch_size=32)
        list(c.stream(jid, [_events(500)], flush_last=False))
        st_ = c.status(jid)  # every worker holds a piece of every subwindow
        assert len(st_.workers) == 3 and st_.subwindows_r + st_.subwindows_s >= 4
        assert all(w.subwindows == st_.subwindows_r + st_.subwindows_s for w in st_.workers)
        extra = start_workers(1)
        try:
            for call, address in [(c.stub.AddWorker, extra[0].address),
                                  (c.stub.RemoveWorker, cluster.addresses[0])]:
                with pytest.raises(grpc.RpcError) as e:
                    call(manager_pb2.WorkerRef(address=address))
                assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert jid in e.value.details() and "key placement" in e.value.details()
        finally:
            extra[0].stop()
        # the join goes on, on its workers
        assert len(c.status(jid).workers) == 3


def test_the_cli_says_what_key_placement_needs(capsys):
    from panjoin.cli.main import main

    with pytest.raises(SystemExit, match="one copy"):
        main(["manager", "--workers", "127.0.0.1:1", "--placement", "key", "--replicas", "2"])
    with pytest.raises(SystemExit, match="whole BI-Sort subwindows"):
        main(["replay", "x.parquet", "--window", "count:10,10", "--predicate", "eq",
              "--workers", "2",
              "--placement", "key", "--result-format", "ranges", "--out", "o.parquet"])


@pytest.mark.parametrize("module", ["panjoin.manager.key_placement",
                                    "panjoin.subwindow.piece_ids"])
def test_doctests(module):
    import doctest
    import importlib

    res = doctest.testmod(importlib.import_module(module))
    assert res.failed == 0 and res.attempted > 0



def test_a_sealed_piece_has_merged_its_insertion_buffer():
    st_ = SubwindowStore("bisort", 4096, "int64", 64, piece=True)
    z = np.zeros(4, np.int64)
    st_.insert(np.array([1, 5, 9, 12]), z, np.array([3, 7, 8, 20]), np.array([1, 2, 3, 4]))
    assert st_.index.nbuf == 4  # a piece never fills: its buffer would stay
    lo, hi = np.array([[4]]), np.array([[10]])
    from panjoin.subwindow import WindowFilter

    before = st_.probe(lo, hi, WindowFilter.none(1))
    st_.seal()
    st_.check()
    assert st_.index.nbuf == 0
    after = st_.probe(lo, hi, WindowFilter.none(1))
    assert [a.tolist() for a in after] == [b.tolist() for b in before]
    SubwindowStore("rap", 64, "int64", 4, piece=True).seal()  # no buffer: nothing to do


def test_every_piece_of_a_complete_subwindow_is_sealed(monkeypatch):
    """The insert that completes a subwindow seals it on every worker, those without
    rows in it too (a seal alone); no other insert seals."""
    ev = generate(3000, "zipf", key_min=0, key_max=50, rate=1000, seed=3)
    ws = start_workers(3)
    sent = []
    orig = KeyPlacedBackend._send_insert

    def spy(self, w, msg, order):
        sent.append((w, msg.sub_id, msg.seal, msg.batch_id))
        return orig(self, w, msg, order)

    monkeypatch.setattr(KeyPlacedBackend, "_send_insert", spy)
    backend = KeyPlacedBackend([x.address for x in ws])
    try:
        eng = JoinEngine("count:300,300", "eq", index="bisort", subwindow_size=100,
                         partitions=8, batch_size=64, backend=backend, n_workers=3)
        eng.push(ev)
        eng.flush()
        r, s = eng.take_results()
        created = eng.rings["R"].created + eng.rings["S"].created
    finally:
        backend.close()
        for x in ws:
            x.stop()
    ref = reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window("count:300,300"),
                         parse_predicate("eq"))
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)
    sealed = {(w, sub) for w, sub, seal, _ in sent if seal}
    full = {sub for _, sub, seal, _ in sent if seal}
    assert len(full) >= created - 4  # all but the last ones of each stream (and spares)
    assert sealed == {(w, sub) for w in range(3) for sub in full}
    assert any(bid == 0 for _, _, seal, bid in sent if seal)  # zipf: some have no rows


def test_a_worker_sorts_rows_sent_in_arrival_order_and_answers_by_them():
    """A worker's own sort: it inserts its key range's rows of a batch sent in arrival
    order (row_from/row_to count them in key order), answers PAIRS probes with indexes
    of the rows as sent, and refuses BI-Sort ranges for such a batch."""
    from panjoin.backend import LocalBackend
    from panjoin.proto.panjoin.v1 import common_pb2
    from workers.server import WorkerServicer

    def batch(bid, stream, keys):
        n = len(keys)
        b = SortedBatch.of(bid, stream, np.array(keys), np.zeros(n), np.arange(n),
                           np.arange(n) + 10 * bid, predicate="eq", window="count:99,99")
        b.in_key_order = False
        return worker_pb2.Batch.FromString(codec.encode_batch(b).tobytes())

    servicer, backend, batches = WorkerServicer(1), LocalBackend(1), {}

    def run(i, **cmd):
        fb = servicer.handle(backend, worker_pb2.Command(command_id=i, **cmd), batches)
        assert not fb.error, fb.error
        return fb

    run(1, create=worker_pb2.Create(sub_id=0, stream=common_pb2.STREAM_S, index="bisort",
                                    capacity=8, key_dtype="int64", partitions=2, piece=True))
    # S keys as sent [9, 3, 5, 3]; the worker's key range is [3, 9): in key order
    # [3, 3, 5, 9] it inserts rows [0, 3), ids 11, 13, 12 (id 10, key 9, only probes)
    run(2, batch=batch(1, "S", [9, 3, 5, 3]))
    fb = run(3, insert=worker_pb2.Insert(sub_id=0, batch_id=1, seq_from=0, seq_to=4,
                                         row_from=0, row_to=3))
    assert fb.status.count == 3
    run(4, batch=batch(2, "R", [5, 7, 3]))
    fb = run(5, probe=worker_pb2.Probe(batch_id=2, sub_ids=[0], filtered=[False],
                                       seq_limit=[4], format=worker_pb2.RESULT_FORMAT_PAIRS))
    pidx, ids, _ = codec.decode_answer(fb.results[0])
    # R rows as sent: 0 (key 5) finds S id 12, 2 (key 3) finds 11 and 13
    assert sorted(zip(pidx.tolist(), ids.tolist(), strict=True)) == [(0, 12), (2, 11), (2, 13)]
    fb = servicer.handle(backend, worker_pb2.Command(command_id=6, probe=worker_pb2.Probe(
        batch_id=2, sub_ids=[0], filtered=[False], seq_limit=[4],
        format=worker_pb2.RESULT_FORMAT_RANGES)), batches)
    assert fb.code == "INVALID_ARGUMENT" and "arrival order" in fb.error


def test_replay_sizes_batches_for_the_workers_that_share_them(cluster):
    """A file's NBat (panjoin.manager.knobs) sizes each worker's share of a batch: on a
    manager that cuts every batch by key over its workers, the batch is that many shares,
    where a manager that places whole subwindows or an in-process join gets one share."""
    from types import SimpleNamespace

    from panjoin.cli.replay import _batch_sharers
    from panjoin.launch import start_manager

    def args(**kw):
        return SimpleNamespace(**{"cluster": None, "workers": None, "placement": "time", **kw})

    assert _batch_sharers(args(cluster=cluster.manager.address)) == 3
    timed = start_manager(cluster.addresses)  # the same workers, whole subwindows
    try:
        assert _batch_sharers(args(cluster=timed.address)) == 1
    finally:
        timed.stop()
    assert _batch_sharers(args(workers=2, placement="key")) == 2
    assert _batch_sharers(args(workers=2)) == _batch_sharers(args()) == 1
    assert _batch_sharers(args(cluster="127.0.0.1:1")) == 1  # no answer: the join says why
    assert _batch_sharers(args(cluster=f"{cluster.manager.address},127.0.0.1:1")) == 1
