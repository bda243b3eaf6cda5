"""Streaming joins on the manager endpoint (issue 27): real worker processes (and handshake
nodes) over real gRPC on loopback.

A latency bound changes when pairs come out, never which: the pushed outputs together
with the answers give the reference for every index, count and time windows. Pairs are
pushed without another input (one chunk, nothing else sent, all its pairs within a
second). Close and disconnect end the join's loop and its reader thread. Without a
bound each input still gets exactly one output.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from panjoin.client import Client
from panjoin.generate import generate
from panjoin.launch import start_workers
from panjoin.manager.service import OUTPUT_PAIRS, serve_manager
from panjoin.proto.panjoin.v1 import manager_pb2
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window
from panjoin.subwindow import INDEX_KINDS
from tests.test_cluster import wait_join_released


@pytest.fixture(scope="module")
def manager(workers):
    server, port = serve_manager([w.address for w in workers], 0)
    address = f"127.0.0.1:{port}"
    with Client(address) as c:  # kernels compiled or loaded before anything is timed
        for index in INDEX_KINDS:
            if index in ("rap", "wib", "bisort", "nested"):
                c.join(generate(2000, seed=3), "count:500,500", "eq", index, chunk=500)
    yield address
    server.stop(grace=1).wait()


@pytest.fixture(scope="module")
def events():
    return generate(1500, "zipf", key_min=0, key_max=60, rate=1000, seed=5, disorder_ms=30)


def _pairs(outs) -> np.ndarray:
    r = np.concatenate([o.r_id for o in outs])
    s = np.concatenate([o.s_id for o in outs])
    return sort_pairs(np.stack([r, s], axis=1))


def _input_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("join-input-")]


def _wait_no_input_threads(timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while _input_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _input_threads(), "a streaming join's reader thread outlived its stream"


@pytest.mark.parametrize("window", ["count:150,110", "time:160,120"])
@pytest.mark.parametrize("index", ["rap", "wib", "bisort", "nested"])
def test_a_bound_changes_when_pairs_come_out_not_which(manager, events, index, window):
    lateness = 10 if window.startswith("time") else 0
    w = parse_window(window, lateness)
    pred = "bands:-3,-1;2,5"
    with Client(manager) as c:
        jid = c.open(window, pred, index, allowed_lateness=lateness, subwindow_size=30,
                     partitions=8, max_latency_ms=5)
        with c.live(jid, linger_ms=0) as live:
            outs = []
            for a in range(0, len(events), 100):  # a source pushing as it goes
                live.push(events.slice(a, min(len(events), a + 100)))
                outs.append(live.poll())
                time.sleep(0.002)
            live.flush()
            outs.append(live.poll())
    ref = reference_join(events.stream, events.id, events.key, events.ts, w,
                         parse_predicate(pred))
    assert len(ref.pairs) > 0
    assert np.array_equal(_pairs(outs), ref.pairs)
    ls = np.concatenate([o.late_stream for o in outs])
    li = np.concatenate([o.late_id for o in outs])
    for x, k in enumerate("RS"):
        assert np.array_equal(np.sort(li[ls == x]), np.sort(ref.late_ids[k]))
    _wait_no_input_threads()


def test_pairs_are_pushed_without_another_input(manager):
    """One JoinInput on a raw stream that then stays open and silent: the answer comes at
    once, and every pair of the chunk follows in pushed outputs within a second (a
    manager that only answered inputs would send nothing more)."""
    from panjoin.client import join_input, output_of

    t = generate(4000, "uniform", key_min=0, key_max=40, rate=1000, seed=7)
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:1K,1K"),
                         parse_predicate("eq"))
    hold = threading.Event()
    with Client(manager) as c:
        jid = c.open("count:1K,1K", "eq", "bisort", max_latency_ms=5)

        def inputs():
            yield join_input(jid, 1, t, token=c.token(jid))
            hold.wait(30)  # the client's stream stays open, with nothing more on it

        call = c.stub.Join(inputs())
        outs, t0 = [], time.monotonic()
        try:
            for pb in call:
                outs.append(output_of(pb))
                if sum(o.r_id.size for o in outs) >= len(ref.pairs):
                    break
        finally:
            elapsed = time.monotonic() - t0
            hold.set()
            call.cancel()
    assert outs[0].batch_id == 1 and not outs[0].pushed  # the answer, at once
    assert all(o.pushed and o.batch_id == 0 for o in outs[1:])
    assert sum(o.r_id.size for o in outs[1:]) > 0
    assert np.array_equal(_pairs(outs), ref.pairs)
    assert elapsed < 1.0, f"the pairs took {elapsed:.2f} s"
    _wait_no_input_threads()


def test_pushed_outputs_are_marked_and_folded_into_the_answer(manager, events):
    """A raw stream sees pushed outputs (batch_id 0) between the answers;
    JoinSession.send folds those that come before its answer into it."""
    with Client(manager) as c:
        jid = c.open("count:300,300", "eq", "bisort", max_latency_ms=5)
        sess = c.session(jid)
        # unflushed sends: the pairs of each arrive pushed, before or with a later answer
        outs = [sess.send(i + 1, events.slice(i * 300, i * 300 + 300), flush=False)
                for i in range(4)]
        time.sleep(0.3)  # the rest is pushed meanwhile; the flushed send folds it in
        outs.append(sess.send(5, events.slice(1200, 1500), flush=True))
        sess.close()
        assert [o.batch_id for o in outs] == [1, 2, 3, 4, 5]
        assert not any(o.pushed for o in outs)
        ref = reference_join(events.stream, events.id, events.key, events.ts,
                             parse_window("count:300,300"), parse_predicate("eq"))
        assert np.array_equal(_pairs(outs), ref.pairs)
        raw = [o for o in c.stream(c.open("count:300,300", "eq", max_latency_ms=5),
                                   [events.slice(0, 750), events.slice(750, 1500)])]
    assert any(o.pushed and o.batch_id == 0 for o in raw) or len(raw) == 2
    assert [o.batch_id for o in raw if not o.pushed] == [1, 2]
    assert np.array_equal(_pairs(raw), ref.pairs)


def test_without_a_bound_each_input_gets_one_output(manager, events):
    with Client(manager) as c:
        jid = c.open("count:300,300", "eq", "bisort", batch_size=64)
        outs = list(c.stream(jid, [events.slice(a, a + 300) for a in range(0, 1500, 300)]))
        st = c.stub.Close(c.ref(jid))
    # an answer of more pairs than one message holds goes out as full pushed parts
    # first (this zipf join's later inputs find over 100K pairs): no other pushes
    assert [o.batch_id for o in outs if not o.pushed] == [1, 2, 3, 4, 5]
    assert all(o.batch_id == 0 and len(o.r_id) == OUTPUT_PAIRS for o in outs if o.pushed)
    assert st.tuples_in == 1500
    assert not _input_threads()


def test_wait_returns_when_pairs_arrive(manager, events):
    """LiveJoin.wait blocks until an output arrives (a caller takes its pairs the moment
    they come, not at its next poll), and times out with nothing left to arrive."""
    ref = reference_join(events.stream, events.id, events.key, events.ts,
                         parse_window("count:300,300"), parse_predicate("eq"))
    with Client(manager) as c:
        jid = c.open("count:300,300", "eq", max_latency_ms=5)
        with c.live(jid, linger_ms=0) as live:
            assert live.wait(0.05) is False  # nothing pushed, nothing to wait for
            live.push(events)
            t = time.monotonic()
            assert live.wait(60) is True
            assert time.monotonic() - t < 30
            outs = [live.poll()]
            assert len(outs[0].r_id) or outs[0].batch_id  # pairs, or the input's answer
            live.flush()
            outs.append(live.poll())
            assert live.wait(0.05) is False  # everything polled: it waited, then False
    assert np.array_equal(_pairs(outs), ref.pairs)
    _wait_no_input_threads()


def test_close_and_disconnect_end_the_streaming_loop(manager, events):
    with Client(manager) as c:
        # Close from another call while the stream is open: the stream ends, no thread
        jid = c.open("count:300,300", "eq", max_latency_ms=5)
        live = c.live(jid)
        live.push(events.slice(0, 500))
        live.flush()
        assert _input_threads()
        with Client(manager) as other:
            other.stub.Close(c.ref(jid))
        _wait_no_input_threads()
        live.close()
        # the client goes away mid-stream (its call cancelled): the join is released
        jid = c.open("count:300,300", "eq", max_latency_ms=5)
        live = c.live(jid)
        live.push(events.slice(0, 500))
        live.flush()
        live._call.cancel()
        _wait_no_input_threads()
        wait_join_released(c, jid)
        live.close()


def test_the_managers_default_bound_and_opting_out(workers, events):
    server, port = serve_manager([w.address for w in workers[:2]], 0, max_latency_ms=7)
    try:
        with Client(f"127.0.0.1:{port}") as c:
            on = c.stub.Open(manager_pb2.OpenRequest(window="count:300,300", predicate="eq"))
            off = c.stub.Open(manager_pb2.OpenRequest(window="count:300,300", predicate="eq",
                                                      max_latency_ms=-1))
            assert on.settings.max_latency_ms == 7 and off.settings.max_latency_ms == 0
            with c.live(c.adopt(on)) as live:
                live.push(events.slice(0, 900))
                deadline = time.monotonic() + 2
                while not (out := live.poll()).r_id.size and time.monotonic() < deadline:
                    time.sleep(0.005)
            assert out.r_id.size > 0  # pushed, never flushed
            outs = list(c.stream(c.adopt(off), [events.slice(0, 500), events.slice(500, 900)]))
            # pushed only as full parts of an answer too big for one message
            assert [o.batch_id for o in outs if not o.pushed] == [1, 2]
            assert all(len(o.r_id) == OUTPUT_PAIRS for o in outs if o.pushed)
    finally:
        server.stop(grace=1).wait()


@pytest.mark.parametrize("fast_forward", [False, True])
def test_a_handshake_chain_streams_its_pairs(fast_forward):
    t = generate(2000, "uniform", key_min=0, key_max=80, rate=1000, seed=8)
    nodes = start_workers(2, role="handshake-node")

    def wait_pairs(live, since=0):
        """The next poll with a pair of a tuple pushed at ``since`` or later."""
        # the nodes' kernels may compile first (a cold cache on a busy machine)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            out = live.poll()
            if out.r_id.size and max(new_r(out.r_id).max(), new_s(out.s_id).max()) >= since:
                return out
            got.append(out)
            time.sleep(0.005)
        raise AssertionError(f"no pair of a tuple from {since} on pushed without a flush")

    pos = [np.flatnonzero(t.stream == x) for x in (0, 1)]  # arrival positions by id

    def new_r(ids):
        return pos[0][ids]

    def new_s(ids):
        return pos[1][ids]

    got = []
    try:
        server, port = serve_manager([n.address for n in nodes], 0, topology="handshake",
                                     fast_forward=fast_forward)
        try:
            with Client(f"127.0.0.1:{port}") as c:
                jid = c.open("count:300,200", "band:1", max_latency_ms=5, batch_size=100)
                with c.live(jid) as live:
                    live.push(t.slice(0, 1000))  # fed at once: batch_size is reached
                    got.append(wait_pairs(live))
                    # fewer than batch_size tuples: fed when the collect deadline passes
                    live.push(t.slice(1000, 1040))
                    got.append(wait_pairs(live, since=1000))
                    live.push(t.slice(1040, 2000))
                    live.flush()
                    got.append(live.poll())
        finally:
            server.stop(grace=1).wait()
    finally:
        for n in nodes:
            n.stop()
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:300,200"),
                         parse_predicate("band:1"))
    assert np.array_equal(_pairs(got), ref.pairs)
    _wait_no_input_threads()


def test_the_latency_bench_on_a_cluster(tmp_path):
    """`panjoin bench latency --workers N`: a local cluster, each rate a streaming join."""
    out = tmp_path / "lat.json"
    p = subprocess.run([sys.executable, "-m", "panjoin.cli", "bench", "latency", "--workers",
                        "1", "--replicas", "1", "--window", "count:4K,4K", "--rates", "20K",
                        "--seconds", "0.3", "--max-latency", "20", "--json", str(out),
                        "--no-progress"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())
    assert rows[0]["mode"] == "cluster" and rows[0]["pairs"] > 0
    assert rows[0]["settings"]["workers"] == 1
