"""Results past the manager (issue 28): workers send a join's pairs straight to its
client (``Worker.Results``), the manager's outputs name them (``JoinOutput.ref_*``).
Real worker processes and a real manager over gRPC on loopback.

The pairs are the reference's on every index, predicate (a residual included),
key type and window; the manager then carries no pair. A manager with two replicas
declines with its reason, and the pairs come through it. The worker's side holds up
against a hostile or absent client: wrong, oversized and reused tokens are refused,
a subscriber that leaves fails the join at once (not the worker), a client that never
subscribes fails it once the channel's bound is reached and its wait passes, and in
every case the session's resources go back."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest

from panjoin.client import Client
from panjoin.generate import generate
from panjoin.launch import start_cluster, start_workers
from panjoin.proto.panjoin.v1 import manager_pb2, worker_pb2, worker_pb2_grpc
from panjoin.reference import reference_join, sort_pairs
from panjoin.result_sources import ResultsLost, ResultSources
from panjoin.security import channel
from panjoin.semantics import parse_predicate, parse_window
from workers.results import END, ChannelError, ResultChannel


@pytest.fixture(scope="module")
def cluster():
    with start_cluster(2, manager_args=["--replicas", "1"]) as c:
        yield c


def _events(n=6000, *, key2=False, float_keys=False, dist="uniform", disorder_ms=0, seed=7):
    return generate(n, dist, key_min=-40, key_max=400, float_keys=float_keys, rate=1000,
                    seed=seed, disorder_ms=disorder_ms, key2_max=4.0 if key2 else None)


def _reference(ev, window: str, pred: str) -> np.ndarray:
    return reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window(window),
                          parse_predicate(pred), getattr(ev, "key2", None)).pairs


def _outputs_of(client: Client, join_id: str, ev, chunk: int = 1000):
    n = len(ev)
    return client.run_join(join_id, [_rows(ev, a, min(n, a + chunk))
                                     for a in range(0, n, chunk)])


def _rows(ev, a, b):
    from panjoin.client import rows_of

    return rows_of(ev, np.arange(a, b))


def _pairs(outs) -> np.ndarray:
    r = np.concatenate([o.r_id for o in outs])
    s = np.concatenate([o.s_id for o in outs])
    return sort_pairs(np.stack([r, s], axis=1))


CASES = [
    ("count:700,500", "eq", "bisort", {}),
    ("count:600,600", "band:3", "rap", {"dist": "zipf"}),
    ("count:800,300", "band:2", "wib", {"float_keys": True}),
    ("time:900,600", "band:1", "bisort", {"disorder_ms": 40}),
    ("count:500,500", "band:4&band2:0.5", "bisort", {"key2": True}),
    ("count:400,400", "eq", "nested", {"dist": "zipf"}),
]


@pytest.mark.parametrize("window,pred,index,gen", CASES)
def test_pairs_past_the_manager_are_the_references(cluster, window, pred, index, gen):
    ev = _events(**gen)
    with Client(cluster.address) as c:
        jid = c.open(window, pred, index, subwindow_size=256, batch_size=128,
                     direct_results=True, **({"allowed_lateness": 100}
                                             if window.startswith("time") else {}))
        assert c.why_not_direct == ""
        sources = c.direct[jid]
        assert len(sources._sources) == 2  # one per worker session
        outs = _outputs_of(c, jid, ev)
    want = reference_join(ev.stream, ev.id, ev.key, ev.ts,
                          parse_window(window, 100 if window.startswith("time") else 0),
                          parse_predicate(pred), getattr(ev, "key2", None)).pairs
    assert want.shape[0] > 100
    np.testing.assert_array_equal(_pairs(outs), want)
    # every piece the workers sent was taken, none is left over
    assert all(not s.pieces for s in sources._sources.values())


@pytest.mark.parametrize("wide", [False, True])
def test_a_workers_pairs_go_narrowed_where_they_fit(cluster, monkeypatch, wide):
    """A ResultPiece's ids as uint32 offsets when a piece's ids span < 2^32 (8 bytes a
    pair), as int64 otherwise; exact either way."""
    import panjoin.result_sources as rsrc

    seen = []
    real = rsrc.int_column

    def spy(a, base, name):
        seen.append(a.dtype)
        return real(a, base, name)

    monkeypatch.setattr(rsrc, "int_column", spy)
    ev = _events(3000)
    if wide:  # both ends of int64 among them
        ev.id = np.where(ev.id % 2 == 0, ev.id - (1 << 62), ev.id + (1 << 62)).astype(np.int64)
    with Client(cluster.address) as c:
        jid = c.open("count:500,500", "band:1", "bisort", subwindow_size=256, batch_size=128,
                     direct_results=True)
        outs = _outputs_of(c, jid, ev)
    np.testing.assert_array_equal(_pairs(outs), _reference(ev, "count:500,500", "band:1"))
    # wide: a piece whose ids all fall at one end still fits (narrowed per piece)
    assert "<i8" in seen if wide else set(seen) == {"<u4"}


def test_the_manager_sends_references_not_pairs(cluster):
    ev = _events(4000)
    with Client(cluster.address) as c:
        reply = c.stub.Open(manager_pb2.OpenRequest(
            window="count:600,600", predicate="band:2", index="bisort", subwindow_size=256,
            batch_size=128, direct_results=True))
        assert reply.direct_results and len(reply.sources) == 2
        assert sorted(s.source for s in reply.sources) == [0, 1]
        rs = ResultSources()
        rs.add(reply.sources)
        try:
            c.tokens[reply.join_id] = reply.token
            msgs = list(c.stub.Join(c._inputs(reply.join_id, [_rows(ev, 0, 2000),
                                                              _rows(ev, 2000, 4000)], 1, True)))
            assert all(not m.HasField("r_id") for m in msgs)  # no pair came this way
            refs = [m for m in msgs if m.HasField("ref_pairs")]
            assert refs
            got = [rs.take(*(np.frombuffer(getattr(m, f).data, "<i8")
                             for f in ("ref_source", "ref_command", "ref_pairs")))
                   for m in refs]
            c.close_join(reply.join_id)
        finally:
            rs.close()
    r = np.concatenate([g[0] for g in got])
    s = np.concatenate([g[1] for g in got])
    np.testing.assert_array_equal(sort_pairs(np.stack([r, s], axis=1)),
                                  _reference(ev, "count:600,600", "band:2"))


def test_replay_takes_the_pairs_from_the_workers(cluster, tmp_path, capsys):
    from panjoin.cli.main import main
    from panjoin.events import read_events, read_pairs, write_events

    ev = _events(5000)
    path = tmp_path / "ev.parquet"
    write_events(ev, str(path))
    for via in ("workers", "manager"):
        out = tmp_path / f"{via}.parquet"
        assert main(["replay", str(path), "--cluster", cluster.address, "--window",
                     "count:500,500", "--predicate", "band:2", "--out", str(out),
                     "--no-progress", "--results-via", via]) == 0
        said = capsys.readouterr().out
        assert ("pairs from the workers" if via == "workers" else
                "pairs from the manager (--results-via manager)") in said
        np.testing.assert_array_equal(
            sort_pairs(read_pairs(str(out))),
            _reference(read_events(str(path)), "count:500,500", "band:2"))


@pytest.mark.parametrize("pred,stay", [("eq", True), ("band:2", False), ("band:2", True)])
def test_replay_keeps_the_ids_with_seq_ids(cluster, tmp_path, caplog, pred, stay):
    """``--seq-ids``: the ids stay with replay and the pairs come back as seqs; the
    pairs are the reference's either way, with ids in no order."""
    import logging

    from panjoin.cli.main import main
    from panjoin.events import read_pairs, write_events

    ev = _events(5000)
    ev.id = (np.random.default_rng(2).permutation(len(ev)) - 2500) * 1_000_000_007
    path, out = tmp_path / "ev.parquet", tmp_path / "p.parquet"
    write_events(ev, str(path))
    with caplog.at_level(logging.INFO, logger="panjoin"):
        assert main(["replay", str(path), "--cluster", cluster.address, "--window",
                     "count:500,500", "--predicate", pred, "--out", str(out),
                     "--no-progress", *(["--seq-ids"] if stay else [])]) == 0
    said = [r.getMessage() for r in caplog.records if "tuple ids" in r.getMessage()]
    assert said == (["tuple ids stayed here: the join named tuples by seq"] if stay else [])
    np.testing.assert_array_equal(sort_pairs(read_pairs(str(out))),
                                  _reference(ev, "count:500,500", pred))


@pytest.mark.parametrize("where", [["--window", "time:500,500"], ["--workers", "2"]])
def test_seq_ids_is_refused_where_it_cannot_apply(tmp_path, capsys, where):
    from panjoin.cli.main import main
    from panjoin.events import write_events

    path = tmp_path / "ev.parquet"
    write_events(_events(500), str(path))
    args = ["replay", str(path), "--predicate", "eq", "--out", str(tmp_path / "p.parquet"),
            "--no-progress", "--seq-ids", *where]
    if "--window" not in where:
        args += ["--window", "count:50,50"]
    if "--workers" not in where:
        args += ["--cluster", "127.0.0.1:1"]
    with pytest.raises(SystemExit) as e:
        main(args)
    assert "--seq-ids is for a count window on one --cluster manager" in str(e.value)


def test_a_manager_with_two_replicas_declines_and_relays():
    ev = _events(3000)
    with start_cluster(2) as c2, Client(c2.address) as c:  # --replicas 2, the default
        jid = c.open("count:500,500", "eq", "bisort", subwindow_size=256, batch_size=128,
                     direct_results=True)
        assert "--replicas" in c.why_not_direct
        assert jid not in c.direct
        outs = _outputs_of(c, jid, ev)
    np.testing.assert_array_equal(_pairs(outs), _reference(ev, "count:500,500", "eq"))


def test_a_streaming_join_pushes_references(cluster):
    """A latency bound: the pushed outputs name the pairs as they complete; exact."""
    ev = _events(3000, disorder_ms=20)
    with Client(cluster.address) as c:
        jid = c.open("time:400,300", "band:1", "bisort", allowed_lateness=30,
                     subwindow_size=128, max_latency_ms=5, direct_results=True)
        assert jid in c.direct
        with c.live(jid, linger_ms=0) as live:
            outs = []
            for a in range(0, len(ev), 100):
                live.push(_rows(ev, a, min(len(ev), a + 100)))
                outs.append(live.poll())
                time.sleep(0.002)
            live.flush()
            outs.append(live.poll())
        assert jid not in c.direct  # closed with the join
    want = reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window("time:400,300", 30),
                          parse_predicate("band:1")).pairs
    assert want.shape[0] > 100
    np.testing.assert_array_equal(_pairs(outs), want)


def _results(address: str, token: str):
    return worker_pb2_grpc.WorkerStub(channel(address)).Results(
        worker_pb2.ResultsRequest(token=token))


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        next(iter(call))
    return e.value.code()


def test_a_worker_refuses_wrong_oversized_and_reused_tokens(cluster):
    w = cluster.workers[0].address
    assert _code(_results(w, "x" * 32)) == grpc.StatusCode.NOT_FOUND
    assert _code(_results(w, "x" * 129)) == grpc.StatusCode.INVALID_ARGUMENT
    assert _code(_results(w, "")) == grpc.StatusCode.INVALID_ARGUMENT
    with Client(cluster.address) as c:
        jid = c.open("count:500,500", "eq", "bisort", direct_results=True)
        mine = c.direct[jid]
        # the client holds both subscriptions: a second subscriber gets none of it
        reply_tokens = {s.address: s for s in mine._sources.values()}
        assert set(reply_tokens) == {x.address for x in cluster.workers}
        c.close_join(jid)
    # after the join, its tokens open nothing
    assert _code(_results(w, "x" * 32)) == grpc.StatusCode.NOT_FOUND


def test_a_second_subscriber_is_refused(cluster):
    with Client(cluster.address) as c:
        reply = c.stub.Open(manager_pb2.OpenRequest(window="count:500,500", predicate="eq",
                                                    index="bisort", direct_results=True))
        src = reply.sources[0]
        first = _results(src.address, src.token)
        first.initial_metadata()
        assert _code(_results(src.address, src.token)) == grpc.StatusCode.ALREADY_EXISTS
        first.cancel()
        c.stub.Close(manager_pb2.JoinRef(join_id=reply.join_id, token=reply.token))


def _heavy(n=3000):
    """All-equal keys: every tuple pairs with the whole other window (MiBs of pairs)."""
    ev = generate(n, "uniform", key_min=5, key_max=5, seed=2)
    return ev


def test_a_subscriber_that_leaves_fails_the_join_not_the_worker(cluster):
    ev = _heavy()
    with Client(cluster.address) as c:
        reply = c.stub.Open(manager_pb2.OpenRequest(
            window="count:1000,1000", predicate="eq", index="bisort", subwindow_size=512,
            batch_size=256, direct_results=True))
        calls = [_results(s.address, s.token) for s in reply.sources]
        for call in calls:
            call.initial_metadata()
        calls[0].cancel()  # one worker's pairs have nowhere to go now
        time.sleep(0.5)
        c.tokens[reply.join_id] = reply.token
        with pytest.raises(grpc.RpcError) as e:
            list(c.stub.Join(c._inputs(reply.join_id, [_rows(ev, 0, len(ev))], 1, True)))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "left" in e.value.details()
        for call in calls[1:]:
            call.cancel()
        # the workers serve the next join as before
        jid = c.open("count:500,500", "eq", "bisort", direct_results=True)
        ev2 = _events(2000)
        outs = _outputs_of(c, jid, ev2)
    np.testing.assert_array_equal(_pairs(outs), _reference(ev2, "count:500,500", "eq"))


def _open_heavy(c: Client):
    """A join with its pairs past the manager, opened by hand (the client subscribes to
    nothing); a ``_heavy(6000)`` input gives it about 6M pairs, 90 MiB: past a
    worker channel's 64 MiB."""
    reply = c.stub.Open(manager_pb2.OpenRequest(
        window="count:2000,2000", predicate="eq", index="bisort", subwindow_size=1024,
        batch_size=512, direct_results=True))
    c.tokens[reply.join_id] = reply.token
    return reply


def _fails(c: Client, reply, ev) -> str:
    """Run the join to its failure (FAILED_PRECONDITION, within a minute): its details."""
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        list(c.stub.Join(c._inputs(reply.join_id, [_rows(ev, 0, len(ev))], 1, True)))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert time.monotonic() - t0 < 60
    return e.value.details()


def test_a_client_that_never_subscribes_fails_the_join_in_bounded_memory():
    ev = _heavy(6000)
    ws = start_workers(1, worker_args=[["--idle-timeout", "3"]])
    try:
        with _manager_over(ws) as m, Client(m.manager.address) as c:
            reply = _open_heavy(c)
            assert "never subscribed" in _fails(c, reply, ev)
            # the session ends (the manager releases a failed join's sessions at once;
            # the worker sees the stream end a moment later): its channel (and its
            # queued pairs) go with it
            _wait_no_sessions(ws[0].address)
            with pytest.raises(grpc.RpcError) as gone:
                next(iter(_results(ws[0].address, reply.sources[0].token)))
            assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        for w in ws:
            w.stop()


def test_a_subscriber_that_never_reads_is_cut_not_waited_on():
    """A client that opens its Results stream and reads nothing holds the worker's
    serving thread in gRPC's send: the worker cancels that call once the channel gives
    up on it (the join fails, the thread is free), instead of holding it until the
    client disconnects."""
    ev = _heavy(6000)
    ws = start_workers(1, worker_args=[["--idle-timeout", "3"]])
    try:
        with _manager_over(ws) as m, Client(m.manager.address) as c:
            reply = _open_heavy(c)
            call = _results(ws[0].address, reply.sources[0].token)  # never read
            assert "took none" in _fails(c, reply, ev)
            _wait_no_sessions(ws[0].address)
            # the worker cancelled the call while it was unread: reading it now gets what
            # gRPC had buffered, then CANCELLED (a held call would go on sending the
            # channel's queued pieces and end OK)
            with pytest.raises(grpc.RpcError) as cut:
                for _ in call:
                    pass
            assert cut.value.code() == grpc.StatusCode.CANCELLED
    finally:
        for w in ws:
            w.stop()


def test_a_reader_held_back_reads_on_when_no_reference_comes(monkeypatch):
    """The client holds a worker's reader back once it is READ_AHEAD_BYTES ahead of the
    references; but the references may wait for a probe round that waits for this very
    worker's pairs (one input, flushed: the manager answers it once every round is in,
    and the worker's channel is full). The reader reads on after HOLD_S without a
    reference taken: the join completes, exact (a reader that waited for references
    would leave the worker's probe waiting until it failed the join)."""
    import panjoin.result_sources as rsrc

    monkeypatch.setattr(rsrc, "READ_AHEAD_BYTES", 1 << 20)
    monkeypatch.setattr(rsrc, "HOLD_S", 0.2)
    ev = _heavy(6000)  # about 6M pairs on the one worker: past its channel's 64 MiB
    ws = start_workers(1, worker_args=[["--idle-timeout", "5"]])  # gives up after 5 s
    try:
        with _manager_over(ws) as m, Client(m.manager.address) as c:
            jid = c.open("count:2000,2000", "eq", "bisort", subwindow_size=1024,
                         batch_size=512, direct_results=True)
            assert jid in c.direct
            outs = c.run_join(jid, [_rows(ev, 0, len(ev))])
    finally:
        for w in ws:
            w.stop()
    got = _pairs(outs)
    want = _reference(ev, "count:2000,2000", "eq")
    assert want.shape[0] > 5_000_000
    np.testing.assert_array_equal(got, want)


def _wait_no_sessions(address: str, timeout: float = 30.0) -> None:
    stub = worker_pb2_grpc.WorkerStub(channel(address, peer=True))
    end = time.monotonic() + timeout
    while stub.Status(worker_pb2.StatusRequest(), timeout=30).sessions:
        assert time.monotonic() < end, "the failed join's session outlived it"
        time.sleep(0.1)


def _manager_over(ws):
    from panjoin.launch import LocalCluster, start_manager

    return LocalCluster([], start_manager([w.address for w in ws], args=["--replicas", "1"]))


def test_a_channel_waits_for_its_client_then_gives_up():
    ch = ResultChannel(cap=100, wait_s=0.3)
    ch.put(1, np.arange(8), np.arange(8))  # 128 bytes: one piece always fits
    t0 = time.monotonic()
    with pytest.raises(ChannelError, match="never subscribed"):
        ch.put(2, np.arange(2), np.arange(2))
    assert 0.25 <= time.monotonic() - t0 < 5
    # a client that takes pieces keeps a waiting put alive past wait_s
    ch2 = ResultChannel(cap=100, wait_s=0.5)
    ch2.subscribe()
    ch2.put(1, np.arange(6), np.arange(6))

    def slow_client():
        for _ in range(4):
            time.sleep(0.2)
            ch2.take(1.0)

    t = threading.Thread(target=slow_client)
    t.start()
    for k in range(3):
        ch2.put(2 + k, np.arange(6), np.arange(6))
    t.join()
    ch2.leave()
    with pytest.raises(ChannelError, match="left"):
        ch2.put(9, np.arange(1), np.arange(1))
    assert ch2.nbytes == 0


def test_a_source_that_ends_early_fails_the_take():
    rs = ResultSources()

    class _Src:
        address = "w:1"
        pieces: dict = {}
        ended = True
        why = "UNAVAILABLE: worker lost"

    rs._sources[0] = _Src()
    with pytest.raises(ResultsLost, match="worker lost"):
        rs.take(np.array([0]), np.array([3]), np.array([5]))
    with pytest.raises(ResultsLost, match="never announced"):
        rs.take(np.array([1]), np.array([3]), np.array([5]))


def test_a_channel_cuts_a_subscriber_that_takes_nothing():
    """The call of a subscriber that takes nothing is cancelled when a put gives up on
    it, and when pieces are still queued ``wait_s`` after the session ended; one that
    keeps taking is not."""
    cut = []
    ch = ResultChannel(cap=100, wait_s=0.3)
    ch.subscribe()
    ch.attach(lambda: cut.append("put"))
    ch.put(1, np.arange(8), np.arange(8))
    with pytest.raises(ChannelError, match="took none"):
        ch.put(2, np.arange(2), np.arange(2))
    assert cut == ["put"]

    ch = ResultChannel(cap=1 << 20, wait_s=0.3)
    ch.subscribe()
    ch.attach(lambda: cut.append("close"))
    for k in range(3):
        ch.put(k, np.arange(4), np.arange(4))
    ch.close()  # queued pieces, nothing taken: cut after wait_s
    end = time.monotonic() + 10
    while cut == ["put"]:
        assert time.monotonic() < end, "the idle subscriber was not cut"
        time.sleep(0.05)
    assert cut == ["put", "close"]

    # a slow reader (a take every 0.1 s; the wait is 20 times that, for a loaded
    # machine) that takes everything is never cut
    ch = ResultChannel(cap=1 << 20, wait_s=2.0)
    ch.subscribe()
    ch.attach(lambda: cut.append("reader"))
    for k in range(4):
        ch.put(k, np.arange(4), np.arange(4))
    ch.close()
    for _ in range(4):
        time.sleep(0.1)
        assert ch.take(1.0) is not None
    assert ch.take(1.0) is END
    time.sleep(2.5)  # past the watchdog's wait: it saw the channel drained
    assert cut == ["put", "close"]
