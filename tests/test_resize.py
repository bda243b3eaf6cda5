"""Workers added and removed while a join runs (AddWorker, RemoveWorker, ``panjoin ctl``):
real worker processes, a real manager, the result exact against the reference."""

from __future__ import annotations

import subprocess
import sys
import time

import grpc
import numpy as np
import pytest

from panjoin.client import Client
from panjoin.generate import generate
from panjoin.launch import start_manager, start_workers
from panjoin.manager.service import serve_manager
from panjoin.proto.panjoin.v1 import manager_pb2, manager_pb2_grpc, worker_pb2, worker_pb2_grpc
from panjoin.reference import reference_join, sort_pairs
from panjoin.security import channel
from panjoin.semantics import parse_predicate, parse_window

WINDOW, PRED = "count:300,300", "band:2"
CHUNK = 150


@pytest.fixture(scope="module")
def events():
    return generate(4200, "uniform", key_min=0, key_max=400, rate=1000, seed=11)


def _chunks(ev, a, b):
    return [ev.slice(i, min(i + CHUNK, b)) for i in range(a, b, CHUNK)]


def worker_status(address: str) -> worker_pb2.WorkerStatus:
    with channel(address, peer=True) as ch:
        return worker_pb2_grpc.WorkerStub(ch).Status(worker_pb2.StatusRequest(), timeout=30)


def resize(manager: str, rpc: str, address: str) -> manager_pb2.ResizeReply:
    with channel(manager, token=True) as ch:
        return getattr(manager_pb2_grpc.ManagerStub(ch), rpc)(
            manager_pb2.WorkerRef(address=address), timeout=120)


def wait_for(what, check, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"still not {what} after {timeout:g} s"
        time.sleep(0.2)


def _exact(ev, outs):
    r = np.concatenate([o.r_id for o in outs])
    s = np.concatenate([o.s_id for o in outs])
    ref = reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window(WINDOW),
                         parse_predicate(PRED))
    assert len(ref.pairs) > 1000
    got = sort_pairs(np.stack([r, s], axis=1))
    assert len(got) == len(ref.pairs)  # none doubled, none lost
    assert np.array_equal(got, ref.pairs)


@pytest.fixture
def manager(workers, request):
    """An in-process manager over the first two workers (``replicas`` by parameter)."""
    server, port = serve_manager([w.address for w in workers[:2]], 0,
                                 replicas=getattr(request, "param", 1))
    yield f"127.0.0.1:{port}"
    server.stop(None)


@pytest.mark.parametrize("direct", [False, True], ids=["via-manager", "direct"])
@pytest.mark.parametrize("manager", [1, 2], indirect=True, ids=["replicas1", "replicas2"])
def test_join_gains_a_worker_then_loses_one_exactly(workers, manager, events, direct, request):
    """(With results past the manager, granted with one replica: the added worker's
    session becomes a result source the client learns of from an output.)"""
    a, b, c = (w.address for w in workers)
    outs = []
    with Client(manager) as cl:
        jid = cl.open(WINDOW, PRED, "bisort", subwindow_size=40, batch_size=64,
                      direct_results=direct)
        direct = direct and request.node.callspec.params["manager"] == 1
        assert (jid in cl.direct) == direct
        js = cl.session(jid)
        try:
            bid = 0
            for ch in _chunks(events, 0, 1200):  # on a and b
                bid += 1
                outs.append(js.send(bid, ch))
            assert worker_status(c).subwindows == 0
            assert len(cl.status(jid).workers) == 2

            reply = resize(manager, "AddWorker", c)
            assert list(reply.workers) == [a, b, c] and reply.joins == 1
            for ch in _chunks(events, 1200, 2400):  # new subwindows reach c
                bid += 1
                outs.append(js.send(bid, ch))
            st = cl.status(jid)
            assert st.workers_alive == 3 and st.workers[2].subwindows > 0
            if direct:  # the added worker's session: a source the client was told of
                assert sorted(cl.direct[jid]._sources) == [0, 1, 2]
            assert worker_status(c).subwindows > 0 and worker_status(c).sessions == 1

            reply = resize(manager, "RemoveWorker", a)
            assert list(reply.workers) == [b, c] and reply.joins == 1
            held = worker_status(a).subwindows
            assert held > 0  # still readable: they answer probes until they expire
            for ch in _chunks(events, 2400, len(events)):  # 1800 tuples: a's expire
                bid += 1
                outs.append(js.send(bid, ch))
            st = cl.status(jid)  # answered every command: a's session is released
            assert st.workers_alive == 2 and st.workers[0].subwindows == 0
            assert st.workers[1].subwindows > 0 and st.workers[2].subwindows > 0
            wait_for("released on the removed worker",
                     lambda: worker_status(a).sessions == 0)
            assert worker_status(a).subwindows == 0
        finally:
            js.close()
    _exact(events, outs)
    # a later join gets the new list: nothing on a
    with Client(manager) as cl:
        jid = cl.open(WINDOW, PRED, "bisort", subwindow_size=40, batch_size=64)
        list(cl.stream(jid, _chunks(events, 0, 600)))
        st = cl.status(jid)
        assert len(st.workers) == 2 and all(w.subwindows > 0 for w in st.workers)
        assert worker_status(a).sessions == 0
        cl.close_join(jid)


def test_refusals(workers, manager):
    a, b, c = (w.address for w in workers)

    def refused(rpc, address):
        with pytest.raises(grpc.RpcError) as e:
            resize(manager, rpc, address)
        return e.value.code(), e.value.details()

    code, why = refused("AddWorker", "127.0.0.1:1")
    assert code == grpc.StatusCode.UNAVAILABLE and "unreachable" in why
    code, why = refused("AddWorker", manager)  # a manager, not a worker
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "not a PanJoin worker" in why
    code, why = refused("AddWorker", a)
    assert code == grpc.StatusCode.ALREADY_EXISTS
    code, why = refused("RemoveWorker", c)
    assert code == grpc.StatusCode.NOT_FOUND
    assert list(resize(manager, "RemoveWorker", a).workers) == [b]
    code, why = refused("RemoveWorker", b)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "last worker" in why
    assert list(resize(manager, "AddWorker", a).workers) == [b, a]


def test_handshake_cannot_resize(workers):
    server, port = serve_manager([w.address for w in workers[:2]], 0, topology="handshake")
    try:
        with pytest.raises(grpc.RpcError) as e:
            resize(f"127.0.0.1:{port}", "AddWorker", workers[2].address)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "handshake" in e.value.details()
    finally:
        server.stop(None)


def _ctl(*args):
    return subprocess.run([sys.executable, "-m", "panjoin.cli", "ctl", *args],
                          capture_output=True, text=True, timeout=300)


def test_ctl_from_a_subprocess_with_a_token(workers, tmp_path):
    tok = tmp_path / "token"
    tok.write_text("s3cret-token-for-the-test\n")
    a, b, c = (w.address for w in workers)
    m = start_manager([a], args=["--auth-token-file", str(tok)])
    try:
        p = _ctl("--manager", m.address, "add-worker", b)  # no token
        assert p.returncode == 1 and "UNAUTHENTICATED" in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
        p = _ctl("--manager", m.address, "--auth-token-file", str(tok), "add-worker", b)
        assert p.returncode == 0, p.stderr
        assert b in p.stdout
        p = _ctl("--manager", m.address, "--auth-token-file", str(tok), "remove-worker", a)
        assert p.returncode == 0, p.stderr
        p = _ctl("--manager", m.address, "--auth-token-file", str(tok), "remove-worker", b)
        assert p.returncode == 1 and "FAILED_PRECONDITION" in p.stderr
        assert "last worker" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    finally:
        m.stop()


def test_replicas2_survives_a_kill_after_a_removal(events):
    ws = start_workers(3)
    try:
        a, b, c = (w.address for w in ws)
        server, port = serve_manager([a, b], 0, replicas=2)
        manager = f"127.0.0.1:{port}"
        outs = []
        try:
            with Client(manager) as cl:
                jid = cl.open(WINDOW, PRED, "bisort", subwindow_size=40, batch_size=64)
                js = cl.session(jid)
                try:
                    bid = 0
                    for ch in _chunks(events, 0, 900):
                        bid += 1
                        outs.append(js.send(bid, ch))
                    resize(manager, "AddWorker", c)
                    for ch in _chunks(events, 900, 1800):
                        bid += 1
                        outs.append(js.send(bid, ch))
                    resize(manager, "RemoveWorker", a)
                    for ch in _chunks(events, 1800, 2100):
                        bid += 1
                        outs.append(js.send(bid, ch))
                    ws[1].kill()  # kill -9 of b: a's and c's copies take over
                    for ch in _chunks(events, 2100, len(events)):
                        bid += 1
                        outs.append(js.send(bid, ch))
                    st = cl.status(jid)
                    assert st.failovers >= 1
                finally:
                    js.close()
        finally:
            server.stop(None)
    finally:
        for w in ws:
            w.stop()
    _exact(events, outs)
