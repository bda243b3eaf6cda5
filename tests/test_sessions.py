"""Every join ends, belongs to its client, and fits its limits (issue 29, items 1, 4, 5).

Real worker processes and a real manager process (``panjoin.launch``) with short idle
timeouts: the workers end a session idle for 3 s, the manager closes a join with no
stream and no call for 2 s. The tests throw bad, abandoned and hostile joins at them,
then check that a good join is still exact and that every worker holds nothing.
"""

import queue
import threading
import time

import grpc
import numpy as np
import pytest

from panjoin.client import Client, join_input
from panjoin.generate import generate
from panjoin.launch import start_manager, start_workers
from panjoin.manager.grpc_backend import SESSION_METHOD
from panjoin.proto.panjoin.v1 import manager_pb2, worker_pb2, worker_pb2_grpc
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window

WORKER_IDLE_S = "3"
MANAGER_IDLE_S = "2"
#: each worker's budget: a small join fits, a big one does not
MEMORY = str(8 << 20)


@pytest.fixture(scope="module")
def cluster():
    ws = start_workers(2, worker_args=[["--idle-timeout", WORKER_IDLE_S,
                                        "--memory-limit", MEMORY]] * 2)
    ms = []
    try:
        for replicas in ("2", "1"):
            ms.append(start_manager([w.address for w in ws],
                                    args=["--idle-timeout", MANAGER_IDLE_S,
                                          "--replicas", replicas]))
        yield ws, ms[0].address, ms[1].address
    finally:
        for p in [*ms, *ws]:
            p.stop()


@pytest.fixture(scope="module")
def events():
    return generate(1500, "zipf", key_min=0, key_max=60, rate=1000, seed=7, disorder_ms=30)


def worker_status(address: str) -> worker_pb2.WorkerStatus:
    with grpc.insecure_channel(address) as ch:
        return worker_pb2_grpc.WorkerStub(ch).Status(worker_pb2.StatusRequest(), timeout=30)


def wait_workers_empty(workers, deadline_s: float = 90.0) -> None:
    """Poll every worker's Status until it holds no session, subwindow or reservation."""
    end = time.monotonic() + deadline_s
    while True:
        sts = [worker_status(w.address) for w in workers]
        if all(s.sessions == 0 and s.subwindows == 0 and s.memory_reserved == 0 for s in sts):
            return
        if time.monotonic() > end:
            raise AssertionError(f"workers still hold sessions: {sts}")
        time.sleep(0.25)


def good_join(address: str, events) -> float:
    """A join that must be exact; returns its seconds."""
    t0 = time.monotonic()
    with Client(address) as c:
        r, s, _ = c.join(events, "count:200,200", "band:2", "bisort", chunk=300,
                         batch_size=64, subwindow_size=50)
    took = time.monotonic() - t0
    ref = reference_join(events.stream, events.id, events.key, events.ts,
                         parse_window("count:200,200"), parse_predicate("band:2"))
    assert len(ref.pairs) > 0
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)
    return took


def raw_session(address: str):
    """A Session stream on a worker that never sends anything; (channel, call)."""
    ch = grpc.insecure_channel(address)
    block: queue.Queue = queue.Queue()
    call = ch.stream_stream(SESSION_METHOD, request_serializer=None,
                            response_deserializer=worker_pb2.Feedbacks.FromString)(
        iter(block.get, None))
    return ch, call


def big_time_join(c: Client):
    """A time window join that outgrows the workers' 8 MiB budget mid-join (RaP-Table
    subwindows of 1K tuples and 1K partitions, each about 220 KB): a worker refuses a
    Create with RESOURCE_EXHAUSTED."""
    ev = generate(120_000, "uniform", key_min=0, key_max=1000, rate=100_000, seed=3)
    jid = c.open("time:100000000", "eq", "rap", subwindow_size=1024, partitions=1024,
                 batch_size=4096)
    chunks = [ev.slice(a, a + 20_000) for a in range(0, len(ev), 20_000)]
    with pytest.raises(grpc.RpcError) as e:
        list(c.stream(jid, chunks))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
    assert "--memory-limit" in e.value.details()
    return jid


BAD_OPENS = [
    dict(window="count:100,100", predicate="eq", index="nope"),
    dict(window="count:100,100", predicate="eq", subwindow_size=-1),
    dict(window="count:100,100", predicate="eq", batch_size=-1),
    dict(window="count:100,100", predicate="eq", key_dtype="float32"),
    dict(window="count:" + "1" + "0" * 30, predicate="eq"),
    dict(window="count:1000000000000000", predicate="eq"),
    dict(window="count:100,100", predicate="eq", partitions=-5),
    dict(window="count:100,100", predicate="eq", index="rap", partitions=1 << 24),
    dict(window="count:100,100", predicate="eq", index="rap", subwindow_size=100,
         partitions=1000),
    dict(window="count:100,100", predicate="eq", max_lag=-5),
    dict(window="count:100,100", predicate="eq", max_collect_ms=float("nan")),
    dict(window="count:100,100", predicate="eq", max_collect_ms=-1),
    dict(window="count:100,100", predicate="eq", max_latency_ms=float("nan")),
    dict(window="count:100,100", predicate="eq", subwindow_size=1 << 40),
    dict(window="count:100,100", predicate="eq", batch_size=1 << 40),
    dict(window="count:100,100", predicate="eq", result_format=7),
]


@pytest.mark.parametrize("req", BAD_OPENS, ids=lambda r: ",".join(
    f"{k}={v}" for k, v in r.items() if k not in ("predicate",))[:60])
def test_every_number_is_checked_at_open_before_any_worker_is_asked(cluster, req):
    ws, manager, _ = cluster
    before = [worker_status(w.address).commands for w in ws]
    with Client(manager) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.stub.Open(manager_pb2.OpenRequest(**req), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    # refused before any session was opened: no worker saw a session or a command
    sts = [worker_status(w.address) for w in ws]
    assert [s.sessions for s in sts] == [0, 0]
    assert [s.commands for s in sts] == before


def test_a_join_beyond_the_memory_budget_is_refused_at_open(cluster):
    ws, manager, _ = cluster
    with Client(manager) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.open("count:1000000000", "eq", "bisort")
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--memory-limit" in e.value.details() and "GiB" in e.value.details()
    wait_workers_empty(ws)


def test_a_subwindow_beyond_the_budget_fails_its_join_and_releases_it(cluster):
    ws, manager, manager1 = cluster
    for address in (manager, manager1):  # replicas 2 and 1
        with Client(address) as c:
            jid = big_time_join(c)
            with pytest.raises(grpc.RpcError) as e:
                c.status(jid)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND  # closed by the failure
        wait_workers_empty(ws, 30)


def test_too_many_tuples_in_one_message_are_refused(cluster, events):
    from panjoin.manager.service import serve_manager

    ws, _, _ = cluster
    server, port = serve_manager([w.address for w in ws], 0, max_input_tuples=1000)
    try:
        with Client(f"127.0.0.1:{port}") as c:
            jid = c.open("count:100,100", "eq")
            with pytest.raises(grpc.RpcError) as e:
                list(c.stream(jid, [events.slice(0, 1001)]))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "at most 1000" in e.value.details()
            assert c.status(jid).tuples_in == 0  # nothing of it was taken
            outs = list(c.stream(jid, [events.slice(0, 1000)]))  # the join goes on
            assert outs[-1].batch_id == 1
            c.close_join(jid)
    finally:
        server.stop(0).wait()
    wait_workers_empty(ws)


def test_a_full_worker_refuses_a_session_at_once(tmp_path):
    ws = start_workers(1, worker_args=[["--max-sessions", "2", "--idle-timeout", "2"]])
    m = start_manager([ws[0].address])
    held = []
    try:
        held = [raw_session(ws[0].address) for _ in range(2)]
        end = time.monotonic() + 30
        while worker_status(ws[0].address).sessions < 2 and time.monotonic() < end:
            time.sleep(0.1)
        with Client(m.address) as c:
            t0 = time.monotonic()
            with pytest.raises(grpc.RpcError) as e:
                c.open("count:100,100", "eq")
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-sessions" in e.value.details()
            assert time.monotonic() - t0 < 30  # fails fast, no 60 s wait
            wait_workers_empty(ws, 60)  # the idle raw sessions were ended
            for _, call in held:  # and their callers told why
                with pytest.raises(grpc.RpcError) as e:
                    next(call)
                assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            jid = c.open("count:100,100", "eq")  # room again
            c.close_join(jid)
    finally:
        for ch, call in held:
            call.cancel()
            ch.close()
        m.stop()
        ws[0].stop()


def test_bad_and_abandoned_joins_leave_nothing_behind(cluster, events):
    ws, manager, manager1 = cluster
    good_join(manager, events)  # warm: the kernels are compiled
    held = []  # raw idle sessions and cut streams, cleaned up at the end
    try:
        with Client(manager) as c:
            # 50 bad joins: refused at Open, or failed by a worker mid-join
            for i in range(48):
                with pytest.raises(grpc.RpcError) as e:
                    c.stub.Open(manager_pb2.OpenRequest(**BAD_OPENS[i % len(BAD_OPENS)]),
                                timeout=30)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with Client(manager1) as c1:
                big_time_join(c1)  # --replicas 1
            big_time_join(c)
            # 50 abandoned: opened and never joined
            for _ in range(15):
                c.open("count:100,100", "eq", batch_size=16)
            # joined, the stream cut (cancelled) without Close
            for _ in range(12):
                jid = c.open("count:100,100", "eq", batch_size=16)
                inputs: queue.Queue = queue.Queue()
                inputs.put(join_input(jid, 1, events.slice(0, 100), token=c.token(jid)))
                call = c.stub.Join(iter(inputs.get, None))
                next(call)
                call.cancel()
            # joined, the stream half-closed without Close
            for _ in range(12):
                jid = c.open("count:100,100", "eq", batch_size=16)
                list(c.stream(jid, [events.slice(0, 100)], flush_last=False))
            # raw idle Session streams on the workers
            for i in range(11):
                held.append(raw_session(ws[i % 2].address))
        took = good_join(manager, events)
        assert took < 30, f"the join took {took:.1f} s"
        wait_workers_empty(ws)
    finally:
        for ch, call in held:
            call.cancel()
            ch.close()


def test_a_join_belongs_to_its_client(cluster, events):
    ws, manager, _ = cluster
    ref = reference_join(events.stream, events.id, events.key, events.ts,
                         parse_window("count:300,300"), parse_predicate("eq"))
    with Client(manager) as owner, Client(manager) as intruder:
        jid = owner.open("count:300,300", "eq", batch_size=32)
        outs = list(owner.stream(jid, [events.slice(0, 700)], flush_last=False))
        real = owner.token(jid)
        # one character off: the last one changed, never to itself (tokens are random)
        near = real[:-1] + ("x" if real[-1] != "x" else "y")
        for token in ("", "wrong", near):
            intruder.tokens[jid] = token
            for call in (lambda: intruder.status(jid), lambda: intruder.close_join(jid),
                         lambda: list(intruder.stream(jid, [events.slice(700, 1500)],
                                                      first_batch_id=2))):
                with pytest.raises(grpc.RpcError) as e:
                    call()
                assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # an intruder's stream that disconnects does not close the owner's join
        inputs: queue.Queue = queue.Queue()
        inputs.put(join_input(jid, 2, events.slice(700, 1500), token="wrong"))
        call = intruder.stub.Join(iter(inputs.get, None))
        threading.Timer(0.5, call.cancel).start()
        with pytest.raises(grpc.RpcError):
            list(call)
        assert owner.status(jid).last_batch_id == 1  # nothing was fed by the intruder
        more = list(owner.stream(jid, [events.slice(700, 1500)], first_batch_id=2))
        assert not more[-1].duplicate
        st = owner.close_join(jid)
    assert st.tuples_in == 1500
    r = np.concatenate([o.r_id for o in outs + more])
    s = np.concatenate([o.s_id for o in outs + more])
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)
    wait_workers_empty(ws)


def test_an_input_read_after_the_clients_deadline_is_not_applied(cluster, events):
    """The client's deadline passes while its input waits for the join (held busy here
    by its lock, as by another of the owner's streams with a long batch): the client
    gets DEADLINE_EXCEEDED, and the manager, reading the input late, does not apply it;
    the client went away, so the join closes (manager.proto) with only the inputs that
    were applied."""
    from panjoin.manager.service import serve_manager

    ws, _, _ = cluster
    server, port = serve_manager([w.address for w in ws], 0)
    try:
        with Client(f"127.0.0.1:{port}") as c:
            jid = c.open("count:200,200", "band:2", batch_size=64)
            first = list(c.stream(jid, [events.slice(0, 700)]))
            j = server.servicer.joins[jid]
            with j.lock:
                call = c.stub.Join(iter([join_input(jid, 2, events.slice(700, 1500),
                                                    flush=True, token=c.token(jid))]),
                                   timeout=1.0)
                with pytest.raises(grpc.RpcError) as e:
                    list(call)
                assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                end = time.monotonic() + 30  # the manager has read the input by now
                while j.attached == 0 and time.monotonic() < end:
                    time.sleep(0.05)
                assert j.attached == 1
                # and its deadline, the client's as it reached the server (a moment
                # later than the client's own clock says), has passed too
                time.sleep(1.0)
            end = time.monotonic() + 60  # the late input's stream ends, closing the join
            while jid in server.servicer.joins and time.monotonic() < end:
                time.sleep(0.05)
            assert jid not in server.servicer.joins
            assert j.engine.stats.tuples_in == 700, "the input after the deadline was applied"
            assert j.last_batch_id == 1
    finally:
        server.stop(0).wait()
    head = events.slice(0, 700)
    ref = reference_join(head.stream, head.id, head.key, head.ts, parse_window("count:200,200"),
                         parse_predicate("band:2"))
    r = np.concatenate([o.r_id for o in first])
    s = np.concatenate([o.s_id for o in first])
    assert len(ref.pairs) > 0
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)
    wait_workers_empty(ws)
