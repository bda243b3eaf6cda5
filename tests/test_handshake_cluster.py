"""Handshake chains of real node processes on loopback: neighbours talk over gRPC streams.

1-, 2- and 3-node chains against the reference (count and time windows, late
tuples), tiny result FIFOs that force admission control (pauses > 0, nothing lost;
also through the replay CLI's and the cluster's ``--fifo``), the replay CLI and
the `panjoin cluster --topology handshake` endpoint, and bad configurations.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import grpc
import numpy as np
import pytest

from panjoin.generate import generate
from panjoin.handshake.chain import HandshakeChain
from panjoin.launch import start_workers
from panjoin.proto.panjoin.v1 import handshake_pb2, handshake_pb2_grpc
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window


@pytest.fixture(scope="module")
def nodes():
    ns = start_workers(3, role="handshake-node")
    yield ns
    for n in ns:
        n.stop()


@pytest.fixture(scope="module")
def events():
    return generate(2500, "uniform", key_min=0, key_max=80, rate=1000, seed=8, disorder_ms=30)


def run_chain(addresses, t, window, pred, chunk=700, **kw):
    with HandshakeChain(addresses, window, pred, **kw) as ch:
        for a in range(0, len(t), chunk):
            ch.push(t.slice(a, min(len(t), a + chunk)))
        ch.flush()
        r, s = ch.take_results()
        late = ch.take_late()
        st = ch.status()
    return np.stack([r, s], axis=1), late, st


@pytest.mark.parametrize("n_nodes", [1, 2, 3])
@pytest.mark.parametrize("window", ["count:300,200", "time:250,180"])
def test_chain_of_processes_matches_reference(nodes, events, n_nodes, window):
    w = parse_window(window, 10 if window.startswith("time") else 0)
    pred = parse_predicate("band:1")
    got, late, st = run_chain([n.address for n in nodes[:n_nodes]], events, w, pred,
                              batch_size=113, max_batch=50)
    ref = reference_join(events.stream, events.id, events.key, events.ts, w, pred)
    assert len(ref.pairs) > 1000
    assert len(np.unique(got, axis=0)) == len(got), "a pair came twice"
    assert np.array_equal(sort_pairs(got), ref.pairs)
    for k in "RS":
        assert np.array_equal(np.sort(late[k]), np.sort(ref.late_ids[k]))
    if w.kind == "count":  # after the drain every R sits at the right end, every S at the left
        assert st["segments"]["R"][-1] == 300 and st["segments"]["S"][0] == 200


@pytest.mark.parametrize("n_nodes", [1, 3])
@pytest.mark.parametrize("window", ["count:300,200", "time:250,180"])
def test_fast_forwarding_chain_of_processes_matches_reference(nodes, events, n_nodes, window):
    # express runs over real links: each end fed on its own channel, nodes on their own
    # threads, so express runs reach the far end before or after its input
    w = parse_window(window, 10 if window.startswith("time") else 0)
    pred = parse_predicate("band:1")
    got, late, _ = run_chain([n.address for n in nodes[:n_nodes]], events, w, pred, chunk=97,
                             batch_size=31, max_batch=20, fast_forward=True)
    ref = reference_join(events.stream, events.id, events.key, events.ts, w, pred)
    assert len(np.unique(got, axis=0)) == len(got), "a pair came twice"
    assert np.array_equal(sort_pairs(got), ref.pairs)
    for k in "RS":
        assert np.array_equal(np.sort(late[k]), np.sort(ref.late_ids[k]))


def test_fast_forwarding_after_bulk_fill_gives_every_pair_with_a_new_tuple(nodes):
    # loaded tuples never scan (stored tuples do not, with fast forwarding), so the pairs
    # are exactly those whose later tuple was pushed
    t = generate(1200, "uniform", key_min=0, key_max=60, rate=1000, seed=3)
    w, pred, fill = parse_window("count:300,250"), parse_predicate("band:1"), 600
    with HandshakeChain([n.address for n in nodes], w, pred, batch_size=50, max_batch=30,
                        fast_forward=True) as ch:
        ch.bulk_fill(t.slice(0, fill))
        for a in range(fill, len(t), 100):
            ch.push(t.slice(a, a + 100))
        ch.flush()
        r, s = ch.take_results()
    ref = reference_join(t.stream, t.id, t.key, t.ts, w, pred).pairs
    pos = {}  # id -> arrival position, per stream (ids are numbered per stream)
    for x in (0, 1):
        m = t.stream == x
        pos[x] = np.zeros(t.id[m].max() + 1, np.int64)
        pos[x][t.id[m]] = np.flatnonzero(m)
    want = ref[np.maximum(pos[0][ref[:, 0]], pos[1][ref[:, 1]]) >= fill]
    assert 0 < len(want) < len(ref)
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), want)


@pytest.mark.parametrize("fifo", [1, 3, 8])
def test_tiny_fifos_pause_the_input_and_lose_nothing(nodes, fifo):
    # about 11 pairs per tuple, so every few tuples fill a FIFO
    t = generate(400, "uniform", key_min=0, key_max=30, rate=1000, seed=fifo)
    w, pred = parse_window("count:50,50"), parse_predicate("band:3")
    got, _, st = run_chain([n.address for n in nodes], t, w, pred, chunk=100, batch_size=2,
                           node_fifo=fifo, merger_fifo=fifo)
    ref = reference_join(t.stream, t.id, t.key, t.ts, w, pred)
    assert len(np.unique(got, axis=0)) == len(got)
    assert np.array_equal(sort_pairs(got), ref.pairs)
    assert st["pauses"] > 0
    assert max(st["fifo_high_water"]) <= fifo


def test_bad_configuration_is_rejected(nodes):
    with grpc.insecure_channel(nodes[0].address) as ch:
        stub = handshake_pb2_grpc.HandshakeNodeStub(ch)
        for cfg, why in [
            (dict(window="count:0,1"), "count:0,1"),
            (dict(predicate="band"), "band"),
            (dict(key_dtype="int32"), "key_dtype"),
            (dict(position=5), "position"),
        ]:
            base = dict(chain_id="bad", position=0, n_nodes=1, window="count:5,5",
                        predicate="eq", key_dtype="int64", result_fifo=8, max_batch=8)
            base.update(cfg)
            with pytest.raises(grpc.RpcError) as err:
                stub.Configure(handshake_pb2.ChainConfig(**base))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert why in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            stub.Status(handshake_pb2.ChainRef(chain_id="nope"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_replay_cli_handshake_topology(tmp_path, capsys):
    from panjoin.cli.main import main
    from panjoin.events import read_pairs, write_events

    t = generate(1500, "uniform", key_min=0, key_max=50, rate=1000, seed=9)
    ev = tmp_path / "ev.parquet"
    write_events(t, ev)
    out = tmp_path / "p.parquet"
    # about 10 pairs per tuple into FIFOs of 4 pairs: --fifo must reach the chain and bound
    # its FIFOs (whether admission control ever finds one full is up to the threads' timing)
    assert main(["replay", str(ev), "--window", "count:200,200", "--predicate", "band:1",
                 "--topology", "handshake", "--workers", "2", "--batch-size", "100",
                 "--fifo", "4", "--segment", "sorted", "--out", str(out),
                 "--no-progress"]) == 0
    ff = tmp_path / "ff.parquet"
    assert main(["replay", str(ev), "--window", "count:200,200", "--predicate", "band:1",
                 "--topology", "handshake", "--fast-forward", "--workers", "3", "--out",
                 str(ff), "--no-progress"]) == 0
    with pytest.raises(SystemExit, match="add --topology handshake"):
        main(["replay", str(ev), "--window", "count:200,200", "--predicate", "band:1",
              "--fast-forward", "--out", str(ff), "--no-progress"])
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:200,200"),
                         parse_predicate("band:1"))
    assert np.array_equal(sort_pairs(read_pairs(out)), ref.pairs)
    assert np.array_equal(sort_pairs(read_pairs(ff)), ref.pairs)
    printed = capsys.readouterr().out
    assert "handshake: 2 nodes  admission pauses: " in printed, printed
    # the leaves take a node's answer 4 pairs at a time: full, never fuller
    assert "FIFO high water 4 of 4 " in printed, printed


def test_cluster_command_with_handshake_topology():
    from panjoin.client import Client

    # result FIFOs of 2 pairs: the dense join below must fill them and pause its input
    proc = subprocess.Popen([sys.executable, "-m", "panjoin.cli", "cluster", "--workers", "2",
                             "--port", "0", "--topology", "handshake", "--fifo", "2"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("panjoin cluster: manager on 127.0.0.1:"), line
        assert "handshake chain" in line
        address = line.split("manager on ")[1].split(",")[0]
        t = generate(900, "uniform", key_min=0, key_max=20, rate=1000, seed=2, disorder_ms=20)
        # 3 keys, windows of 50: about 14 pairs per tuple, fed 5 tuples at a time
        u = generate(300, "uniform", key_min=0, key_max=2, rate=1000, seed=3)
        with Client(address) as c:
            r, s, late = c.join(t, "time:80,60", "eq", chunk=200, batch_size=50,
                                allowed_lateness=5)
            jid = c.open("count:50,50", "eq", batch_size=5)
            outs = list(c.stream(jid, [u.slice(a, a + 100) for a in range(0, 300, 100)]))
            st = c.status(jid)
        w = parse_window("time:80,60", 5)
        ref = reference_join(t.stream, t.id, t.key, t.ts, w, parse_predicate("eq"))
        assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)
        for k in "RS":
            assert np.array_equal(np.sort(late[k]), np.sort(ref.late_ids[k]))
        dense = reference_join(u.stream, u.id, u.key, u.ts, parse_window("count:50,50"),
                               parse_predicate("eq"))
        got = np.stack([np.concatenate([o.r_id for o in outs]),
                        np.concatenate([o.s_id for o in outs])], axis=1)
        assert len(dense.pairs) > 3000
        assert np.array_equal(sort_pairs(got), dense.pairs)
        assert st.tuples_in == 300 and st.batches == 60
        assert st.pauses > 0, "FIFOs of 2 pairs never filled: --fifo did not reach the chain"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "stopped" in out
