"""Every handshake chain ends, fits its node's limits, and starves no join (issue 29).

The handshake nodes' side of tests/test_sessions.py: real ``panjoin handshake-node``
processes with short idle timeouts (a chain that gets no message and no call for 3 s
is released) and a real ``panjoin manager --topology handshake`` over them. The tests
throw bad, abandoned and idle chains and streams at the nodes, then check that a
handshake join through the manager is exact at normal speed and that every node holds
no chain and no stream after.
"""

import queue
import time

import grpc
import numpy as np
import pytest

from panjoin import limits
from panjoin.client import Client
from panjoin.generate import generate
from panjoin.handshake.chain import HandshakeChain
from panjoin.launch import start_manager, start_workers
from panjoin.proto.panjoin.v1 import handshake_pb2, handshake_pb2_grpc
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window

NODE_IDLE_S = 3.0
MAX_CHAINS = 8
#: idle Links opened on each node: more than the 32 threads a node had before issue 29
IDLE_LINKS = 36
LINK = "/panjoin.v1.HandshakeNode/Link"


@pytest.fixture(scope="module")
def nodes():
    ns = start_workers(2, role="handshake-node", worker_args=[[
        "--idle-timeout", str(NODE_IDLE_S), "--max-chains", str(MAX_CHAINS)]] * 2)
    yield ns
    for n in ns:
        n.stop()


@pytest.fixture(scope="module")
def manager(nodes):
    m = start_manager([n.address for n in nodes], args=["--topology", "handshake"])
    yield m
    m.stop()


@pytest.fixture(scope="module")
def events():
    return generate(1500, "uniform", key_min=0, key_max=60, rate=1000, seed=5, disorder_ms=20)


def stub(address: str):
    ch = grpc.insecure_channel(address)
    return ch, handshake_pb2_grpc.HandshakeNodeStub(ch)


def node_status(address: str) -> handshake_pb2.NodeStatus:
    """The node's own totals (Status with an empty chain id)."""
    ch, s = stub(address)
    with ch:
        return s.Status(handshake_pb2.ChainRef(), timeout=30)


def wait_nodes_empty(nodes, deadline_s: float = 60.0) -> None:
    """Poll every node until it holds no chain and no stream."""
    end = time.monotonic() + deadline_s
    while True:
        sts = [node_status(n.address) for n in nodes]
        if all(s.chains == 0 and s.streams == 0 for s in sts):
            return
        if time.monotonic() > end:
            raise AssertionError(f"nodes still hold chains or streams: {sts}")
        time.sleep(0.25)


def config(name: str, **kw) -> handshake_pb2.ChainConfig:
    """A valid one-node chain's config named ``name``, changed by ``kw``."""
    base = dict(chain_id=name, position=0, n_nodes=1, window="count:50,50",
                predicate="eq", key_dtype="int64", result_fifo=64, max_batch=16)
    base.update(kw)
    return handshake_pb2.ChainConfig(**base)


def handshake_join(address: str, events, chunk: int = 300) -> float:
    """A handshake join through the manager that must be exact; returns its seconds."""
    t0 = time.monotonic()
    with Client(address) as c:
        r, s, _ = c.join(events, "count:200,200", "band:1", chunk=chunk, batch_size=64)
    took = time.monotonic() - t0
    ref = reference_join(events.stream, events.id, events.key, events.ts,
                         parse_window("count:200,200"), parse_predicate("band:1"))
    assert len(ref.pairs) > 0
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)
    return took


def raw_link(address: str):
    """A Link stream that never sends a message; (channel, call)."""
    ch = grpc.insecure_channel(address)
    block: queue.Queue = queue.Queue()
    call = ch.stream_unary(LINK, request_serializer=None,
                           response_deserializer=handshake_pb2.LinkSummary.FromString).future(
        iter(block.get, None))
    return ch, call


BAD_CONFIGS = [
    (dict(n_nodes=0), "n_nodes"),
    (dict(n_nodes=limits.MAX_CHAIN_NODES + 1), str(limits.MAX_CHAIN_NODES)),
    (dict(result_fifo=0), "result_fifo"),
    (dict(result_fifo=1 << 40), str(limits.MAX_RESULT_FIFO)),
    (dict(max_batch=-1), "max_batch"),
    (dict(max_batch=1 << 30), str(limits.MAX_CHAIN_MESSAGE)),
    (dict(position=-1), "position"),
    (dict(position=3, n_nodes=2), "position"),
    (dict(chain_id=""), "chain_id"),
    (dict(chain_id="x" * 1000), str(limits.MAX_CHAIN_ID)),
    (dict(position=1, n_nodes=2, left=""), "left"),
    (dict(n_nodes=2, right="h" * 1000), str(limits.MAX_ADDRESS)),
    (dict(window="count:" + "1" + "0" * 30), "count"),
    (dict(window="count:1000000000000000"), str(limits.MAX_WINDOW)),
    (dict(key_dtype="float32"), "key_dtype"),
    (dict(index="btree"), "btree"),
]


@pytest.mark.parametrize("change,names", BAD_CONFIGS, ids=[str(c)[:40] for c, _ in BAD_CONFIGS])
def test_every_chain_config_size_is_checked_before_anything_is_built(nodes, change, names):
    ch, s = stub(nodes[0].address)
    with ch:
        with pytest.raises(grpc.RpcError) as e:
            s.Configure(config("bad", **change), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert names in e.value.details()
    st = node_status(nodes[0].address)
    assert st.chains == 0


def test_a_full_node_refuses_a_chain_at_once_and_frees_idle_ones():
    ns = start_workers(1, role="handshake-node",
                       worker_args=[["--max-chains", "2", "--idle-timeout", "2"]])
    m = start_manager([ns[0].address], args=["--topology", "handshake"])
    ch, s = stub(ns[0].address)
    try:
        for i in range(2):
            s.Configure(config(f"held{i}"), timeout=30)
        held = s.Outbox(handshake_pb2.ChainRef(chain_id="held0"), timeout=120)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            s.Configure(config("one-more"), timeout=30)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-chains" in e.value.details()
        # through the manager: its join is refused with the node's code and reason
        with Client(m.address) as c:
            with pytest.raises(grpc.RpcError) as e:
                c.open("count:100,100", "eq", key_dtype="int64")
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-chains" in e.value.details()
        assert time.monotonic() - t0 < 30  # at once, no wait
        # the two chains get no message and no call: released, their streams ended
        with pytest.raises(grpc.RpcError) as e:
            next(held)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "--idle-timeout" in e.value.details()
        wait_nodes_empty(ns)
        s.Configure(config("room-again"), timeout=30)
        s.Release(handshake_pb2.ChainRef(chain_id="room-again"), timeout=30)
        t = generate(400, "uniform", key_min=0, key_max=20, rate=1000, seed=1)
        handshake_join(m.address, t, chunk=100)
        wait_nodes_empty(ns)
    finally:
        ch.close()
        m.stop()
        ns[0].stop()


def test_a_stream_whose_client_goes_away_gives_its_place_back(nodes):
    ch, s = stub(nodes[1].address)
    with ch:
        s.Configure(config("watched"), timeout=30)
        ref = handshake_pb2.ChainRef(chain_id="watched")
        calls = [s.Outbox(ref), s.Results(ref), s.Outbox(ref), s.Results(ref)]
        end = time.monotonic() + 30
        while node_status(nodes[1].address).streams < 4 and time.monotonic() < end:
            time.sleep(0.05)
        assert node_status(nodes[1].address).streams == 4
        # a fifth stream of one chain is refused (a Link from each side, Outbox, Results)
        with pytest.raises(grpc.RpcError) as e:
            next(s.Outbox(ref, timeout=30))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "4 streams" in e.value.details()
        more = []
        for call in calls + more:
            call.cancel()
        end = time.monotonic() + 30
        while node_status(nodes[1].address).streams and time.monotonic() < end:
            time.sleep(0.05)
        assert node_status(nodes[1].address).streams == 0  # before the chain's idle end
        assert node_status(nodes[1].address).chains == 1
        s.Release(handshake_pb2.ChainRef(chain_id="watched"), timeout=30)
    wait_nodes_empty(nodes)


def test_bad_and_abandoned_chains_leave_nothing_behind(nodes, manager, events):
    handshake_join(manager.address, events)  # warm
    a, b = (n.address for n in nodes)
    held = []  # channels and calls, cleaned up at the end
    try:
        chs = [stub(a), stub(b)]
        for ch, _ in chs:
            held.append((ch, None))
        # 32 bad chains: refused before anything is built
        for i in range(32):
            change, _ = BAD_CONFIGS[i % len(BAD_CONFIGS)]
            with pytest.raises(grpc.RpcError) as e:
                chs[i % 2][1].Configure(config(f"bad{i}", **change), timeout=30)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # configured and never linked: three on each node, two of them two-node chains
        for i in range(3):
            for pos, (_, s) in enumerate(chs):
                s.Configure(config(f"lonely{i}", position=pos, n_nodes=2, left=a, right=b)
                            if i else config(f"lonely{i}"), timeout=30)
        # a chain fed, its driver's connections cut without Release (a driver that died)
        t = events.slice(0, 400)
        cut = HandshakeChain([a, b], "count:100,100", "band:1", key_dtype="int64",
                             batch_size=50, max_batch=20)
        cut.push(t)
        cut.stop.set()  # its threads end, quietly
        for link in cut.links.values():
            link.channel.close()
        for c in cut.channels:
            c.close()
        # idle streams: an Outbox and a Results nobody reads, and more Links that never
        # send than a node has threads (32 before issue 29): the node keeps MAX_CHAINS
        # of them waiting for their first message and refuses the others at once
        _, s = chs[0]
        held.append((None, s.Outbox(handshake_pb2.ChainRef(chain_id="lonely0"))))
        held.append((None, s.Results(handshake_pb2.ChainRef(chain_id="lonely0"))))
        links = [raw_link((a, b)[i % 2]) for i in range(2 * IDLE_LINKS)]
        held += links
        end = time.monotonic() + 60
        while time.monotonic() < end and sum(call.done() for _, call in links) < 2 * (
                IDLE_LINKS - MAX_CHAINS):
            time.sleep(0.05)
        refused = [call.exception() for _, call in links if call.done()]
        assert len(refused) == 2 * (IDLE_LINKS - MAX_CHAINS)
        assert {e.code() for e in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert "--max-chains" in refused[0].details()
        assert [node_status(x).chains for x in (a, b)] == [4, 4]
        took = handshake_join(manager.address, events)
        assert took < 30, f"the join took {took:.1f} s"
        wait_nodes_empty(nodes)
        # the idle streams were ended, and their callers told why
        for ch, call in held[2:]:
            if ch is not None and call.done() and call.exception().code() == \
                    grpc.StatusCode.RESOURCE_EXHAUSTED:
                continue
            with pytest.raises(grpc.RpcError) as e:
                call.result(timeout=30) if ch is not None else next(call)
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        cut.stop.set()
        for ch, call in held:
            if call is not None:
                call.cancel()
            if ch is not None:
                ch.close()


def test_a_join_that_pauses_longer_than_the_idle_timeout_keeps_its_chain(nodes, manager,
                                                                         events):
    ref = reference_join(events.stream, events.id, events.key, events.ts,
                         parse_window("count:200,200"), parse_predicate("band:1"))
    with Client(manager.address) as c:
        jid = c.open("count:200,200", "band:1", batch_size=64)
        outs = list(c.stream(jid, [events.slice(0, 700)], flush_last=False))
        time.sleep(3 * NODE_IDLE_S)  # no input: the driver's keep-alive holds the chain
        assert [node_status(n.address).chains for n in nodes] == [1, 1]
        outs += list(c.stream(jid, [events.slice(700, 1500)], first_batch_id=2))
        c.close_join(jid)
    r = np.concatenate([o.r_id for o in outs])
    s = np.concatenate([o.s_id for o in outs])
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)
    wait_nodes_empty(nodes)
