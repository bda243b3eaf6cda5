"""Hostile input against every rpc of the manager, the worker and the handshake node
(issue 29).

Random bytes, truncated messages and random field values go to each rpc of a real
``panjoin manager`` process, of real worker processes and of real ``panjoin
handshake-node`` processes, over real gRPC. Every answer must be a client's error
(INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED, ...) or a success; never INTERNAL,
UNKNOWN or a dead server. Afterwards the processes' memory has not grown without
bound, the workers hold no session, the nodes no chain and no stream, and a known
join (and a known handshake chain) is exact against the reference.
"""

from __future__ import annotations

import queue
import time

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from panjoin.client import Client
from panjoin.generate import generate
from panjoin.handshake.chain import HandshakeChain
from panjoin.handshake.transport import CHAIN_KEY
from panjoin.launch import start_manager, start_workers
from panjoin.proto.panjoin.v1 import (
    common_pb2,
    handshake_pb2,
    handshake_pb2_grpc,
    manager_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window

C = grpc.StatusCode
#: what a hostile request may get back: a client's error (or, for one that happens to
#: be valid, success)
CLIENT_ERRORS = {C.INVALID_ARGUMENT, C.NOT_FOUND, C.RESOURCE_EXHAUSTED, C.PERMISSION_DENIED,
                 C.FAILED_PRECONDITION, C.ALREADY_EXISTS, C.OUT_OF_RANGE, C.UNAUTHENTICATED}
#: the manager's unary rpcs and their request types
UNARY = {"Open": manager_pb2.OpenRequest, "Status": manager_pb2.JoinRef,
         "Close": manager_pb2.JoinRef, "ClusterStatus": manager_pb2.ClusterStatusRequest,
         "AddWorker": manager_pb2.WorkerRef, "RemoveWorker": manager_pb2.WorkerRef}
#: at most this growth of a process's resident memory over the whole fuzzing
RSS_GROWTH = 400 << 20
FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@pytest.fixture(scope="module")
def manager(workers):
    m = start_manager([w.address for w in workers], args=["--replicas", "1"])
    yield m
    m.stop()


@pytest.fixture(scope="module")
def channel(manager):
    with grpc.insecure_channel(manager.address) as ch:
        yield ch


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    return 0


@pytest.fixture(scope="module")
def nodes():
    """Two handshake nodes; a chain left behind is released after 5 s."""
    ns = start_workers(2, role="handshake-node",
                       worker_args=[["--idle-timeout", "5", "--max-chains", "8"]] * 2)
    yield ns
    for n in ns:
        n.stop()


@pytest.fixture(scope="module")
def node_channel(nodes):
    with grpc.insecure_channel(nodes[0].address) as ch:
        yield ch


@pytest.fixture(scope="module")
def baseline(manager, workers, nodes):
    """Resident memory of the manager, the workers and the nodes before any fuzzing."""
    return {p.proc.pid: rss(p.proc.pid) for p in [manager, *workers, *nodes]}


def open_joins(address: str) -> list[tuple]:
    """(join id, tuples in, last batch id) of the manager's open joins."""
    with grpc.insecure_channel(address) as ch:
        cs = ch.unary_unary("/panjoin.v1.Manager/ClusterStatus", request_serializer=None,
                            response_deserializer=manager_pb2.ClusterStatusReply.FromString)(
            b"", timeout=60)
    return [(j.status.join_id, j.status.tuples_in, j.status.last_batch_id) for j in cs.joins]


def check_answer(call, allowed=CLIENT_ERRORS):
    """Run ``call()``; a gRPC error must be one of ``allowed``. Returns the answer or None."""
    try:
        return call()
    except grpc.RpcError as e:
        assert e.code() in allowed, (e.code(), e.details())
        return None


def close_if_opened(channel, reply) -> None:
    if reply is not None and reply.join_id:
        ref = manager_pb2.JoinRef(join_id=reply.join_id, token=reply.token)
        channel.unary_unary("/panjoin.v1.Manager/Close", request_serializer=None,
                            response_deserializer=None)(ref.SerializeToString(), timeout=60)


# ------------------------------------------------------------------------- strategies

ints = st.one_of(st.integers(-2**63, 2**63 - 1), st.sampled_from([0, 1, -1, 2**31, 2**40]))
floats = st.floats(allow_nan=True, allow_infinity=True)
words = st.one_of(st.text(max_size=20), st.sampled_from(
    ["count:100,100", "count:0,0", "count:-5,3", "time:10,10", "time:1e400", "count:1" + "0" * 30,
     "eq", "band:3", "band:-1", "bands:1,2;3", "eq&band2:1", "rap", "wib", "bisort", "nested",
     "int64", "float64", "float32", ""]))


def arrays():
    return st.builds(lambda dt, data, shape: common_pb2.Array(dtype=dt, data=data, shape=shape),
                     st.sampled_from(["<i8", "<f8", "|u1", "<u8", "|b1", ">i8", "<i4", "x", ""]),
                     st.binary(max_size=64), st.lists(st.integers(-3, 9), max_size=2))


open_requests = st.builds(
    manager_pb2.OpenRequest, window=words, predicate=words, index=words,
    allowed_lateness=ints, subwindow_size=ints, partitions=ints, batch_size=ints,
    key_dtype=words, max_latency_ms=floats)


#: a JoinInput's join id and token: the open join's own, none, or another's
OWN = "<own>"
join_inputs = st.builds(
    manager_pb2.JoinInput, join_id=st.sampled_from([OWN, "", "nope"]),
    token=st.sampled_from([OWN, "", "forged"]), batch_id=st.integers(0, 2**64 - 1),
    stream=arrays(), id=arrays(), key=arrays(), ts=arrays(), key2=arrays(), flush=st.booleans())


def valid_bytes(msg_type) -> bytes:
    """A valid message of the type, serialised (for truncation)."""
    if msg_type is manager_pb2.OpenRequest:
        return manager_pb2.OpenRequest(window="count:100,100", predicate="eq",
                                       index="bisort").SerializeToString()
    if msg_type is manager_pb2.JoinRef:
        return manager_pb2.JoinRef(join_id="x" * 20, token="y" * 30).SerializeToString()
    if msg_type is manager_pb2.WorkerRef:
        return manager_pb2.WorkerRef(address="127.0.0.1:9").SerializeToString()
    return msg_type().SerializeToString()


# ---------------------------------------------------------------------------- tests


@FUZZ
@given(method=st.sampled_from(sorted(UNARY)), raw=st.binary(max_size=300),
       cut=st.integers(0, 400), truncate=st.booleans())
def test_random_and_truncated_bytes_to_every_manager_rpc(channel, baseline, method, raw, cut,
                                                         truncate):
    data = valid_bytes(UNARY[method])[:cut] if truncate else raw
    allowed = CLIENT_ERRORS | ({C.UNAVAILABLE} if method == "AddWorker" else set())
    reply = check_answer(lambda: channel.unary_unary(
        f"/panjoin.v1.Manager/{method}", request_serializer=None,
        response_deserializer=UNARY_REPLY[method].FromString)(data, timeout=60), allowed)
    if method == "Open":
        close_if_opened(channel, reply)
    if method == "AddWorker" and reply is not None:  # a random address that is a worker
        pytest.fail(f"AddWorker accepted {data!r}")


UNARY_REPLY = {"Open": manager_pb2.OpenReply, "Status": manager_pb2.JoinStatus,
               "Close": manager_pb2.JoinStatus, "ClusterStatus": manager_pb2.ClusterStatusReply,
               "AddWorker": manager_pb2.ResizeReply, "RemoveWorker": manager_pb2.ResizeReply}


@FUZZ
@given(req=open_requests)
def test_random_open_settings(channel, baseline, req):
    stub = channel.unary_unary("/panjoin.v1.Manager/Open", request_serializer=None,
                               response_deserializer=manager_pb2.OpenReply.FromString)
    reply = check_answer(lambda: stub(req.SerializeToString(), timeout=120))
    close_if_opened(channel, reply)


@FUZZ
@given(msgs=st.lists(join_inputs, min_size=1, max_size=4), cut=st.integers(-1, 400))
def test_random_join_inputs_on_an_open_join(manager, channel, baseline, msgs, cut):
    # everything drawn before the join opens: a draw that stops the example midway
    # (hypothesis does, while it shrinks) would leave the join open
    with Client(manager.address) as c:
        jid = c.open("count:100,100", "eq", "bisort")
        for m in msgs:
            m.join_id = jid if m.join_id == OWN else m.join_id
            m.token = c.token(jid) if m.token == OWN else m.token
        raw = [m.SerializeToString() for m in msgs]
        if cut >= 0:  # a truncated last message
            raw[-1] = raw[-1][:min(cut, max(0, len(raw[-1]) - 1))]
        try:
            check_answer(lambda: list(channel.stream_stream(
                "/panjoin.v1.Manager/Join", request_serializer=None,
                response_deserializer=manager_pb2.JoinOutput.FromString)(iter(raw),
                                                                         timeout=120)))
        finally:
            check_answer(lambda: c.close_join(jid))


def worker_session(address: str, frames: list[bytes]):
    """Send raw Commands frames on a worker Session and read its answers; returns the
    Feedbacks (the call's status checked by the caller)."""
    with grpc.insecure_channel(address) as ch:
        q: queue.Queue = queue.Queue()
        for f in frames:
            q.put(f)
        q.put(None)
        call = ch.stream_stream("/panjoin.v1.Worker/Session", request_serializer=None,
                                response_deserializer=worker_pb2.Feedbacks.FromString)(
            iter(q.get, None), timeout=120)
        return list(call)


commands = st.builds(
    worker_pb2.Command, command_id=st.integers(0, 2**64 - 1),
    create=st.builds(worker_pb2.Create, sub_id=ints, stream=st.integers(0, 3), index=words,
                     capacity=ints, key_dtype=words, partitions=ints, splitters=arrays()),
) | st.builds(
    worker_pb2.Command, command_id=st.integers(0, 2**64 - 1),
    probe=st.builds(worker_pb2.Probe, sub_ids=st.lists(ints, max_size=3),
                    filtered=st.lists(st.booleans(), max_size=3), format=st.integers(0, 5),
                    batch_id=ints),
) | st.builds(
    worker_pb2.Command, command_id=st.integers(0, 2**64 - 1),
    batch=st.builds(worker_pb2.Batch, batch_id=ints, stream=st.integers(0, 3), keys=arrays(),
                    ts=arrays(), seq=arrays(), ids=arrays(), predicate=words, window=words),
) | st.builds(
    worker_pb2.Command, command_id=st.integers(0, 2**64 - 1),
    insert=st.builds(worker_pb2.Insert, sub_id=ints, batch_id=ints, seq_from=ints,
                     seq_to=ints),
) | st.builds(worker_pb2.Command, expire=st.builds(worker_pb2.Expire, sub_id=ints))


@FUZZ
@given(cmds=st.lists(commands, min_size=1, max_size=5), junk=st.binary(max_size=100),
       mode=st.sampled_from(["commands", "junk", "truncated"]))
def test_random_commands_to_a_worker(workers, baseline, cmds, junk, mode):
    frame = worker_pb2.Commands(commands=cmds).SerializeToString()
    frames = {"commands": [frame], "junk": [junk],
              "truncated": [frame[:max(0, len(frame) - 1 - len(junk) % max(1, len(frame)))]]}
    fbs = check_answer(lambda: worker_session(workers[0].address, frames[mode]))
    for fb in (f for fbs_ in fbs or [] for f in fbs_.feedback):
        # a command the worker cannot take is answered with an error, not a crash
        assert not fb.error or fb.code in {"INVALID_ARGUMENT", "NOT_FOUND",
                                           "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION"}, fb
    check_answer(lambda: worker_pb2_grpc.WorkerStub(grpc.insecure_channel(
        workers[0].address)).Status(worker_pb2.StatusRequest(), timeout=60))


# ------------------------------------------------------------------ handshake nodes

#: the node's rpcs: (request type, reply type, kind)
NODE_RPCS = {
    "Configure": (handshake_pb2.ChainConfig, handshake_pb2.NodeStatus, "unary"),
    "Status": (handshake_pb2.ChainRef, handshake_pb2.NodeStatus, "unary"),
    "Release": (handshake_pb2.ChainRef, handshake_pb2.NodeStatus, "unary"),
    "Load": (handshake_pb2.LoadRequest, handshake_pb2.NodeStatus, "unary"),
    "Outbox": (handshake_pb2.ChainRef, handshake_pb2.ChainMessage, "out"),
    "Results": (handshake_pb2.ChainRef, handshake_pb2.ResultBatch, "out"),
    "Link": (handshake_pb2.ChainMessage, handshake_pb2.LinkSummary, "in"),
}
#: a stream on a live chain runs until the caller's deadline: that ends it
STREAM_END = CLIENT_ERRORS | {C.DEADLINE_EXCEEDED}
#: neighbour addresses a random config may name (none of them resolves names: a
#: random host would be looked up in DNS)
ADDRESSES = ["", "127.0.0.1:1", "nonsense:::", "[::1]:0", "h" * 300]


def node_call(channel, method: str, data, timeout: float = 60):
    """Call the node's ``method`` with raw bytes (a list of frames for Link); returns
    the reply (a list for a server stream)."""
    _, reply, kind = NODE_RPCS[method]
    path = f"/panjoin.v1.HandshakeNode/{method}"
    if kind == "unary":
        return channel.unary_unary(path, request_serializer=None,
                                   response_deserializer=reply.FromString)(data, timeout=timeout)
    if kind == "out":
        return list(channel.unary_stream(path, request_serializer=None,
                                         response_deserializer=reply.FromString)(
            data, timeout=timeout))
    return channel.stream_unary(path, request_serializer=None,
                                response_deserializer=reply.FromString)(iter(data),
                                                                        timeout=timeout)


def release_if_configured(channel, reply) -> None:
    if reply is not None and reply.chain_id:
        check_answer(lambda: node_call(channel, "Release", handshake_pb2.ChainRef(
            chain_id=reply.chain_id).SerializeToString()), CLIENT_ERRORS)


def valid_node_bytes(method: str) -> bytes:
    if method == "Configure":
        return handshake_pb2.ChainConfig(chain_id="fz", n_nodes=1, window="count:5,5",
                                         predicate="eq", key_dtype="int64", result_fifo=8,
                                         max_batch=8).SerializeToString()
    if method == "Link":
        return handshake_pb2.ChainMessage(chain_id="fz", side=1, kind=1).SerializeToString()
    return NODE_RPCS[method][0](chain_id="fz").SerializeToString()


@FUZZ
@given(method=st.sampled_from(sorted(NODE_RPCS)), raw=st.binary(max_size=300),
       cut=st.integers(0, 400), truncate=st.booleans())
def test_random_and_truncated_bytes_to_every_node_rpc(node_channel, baseline, method, raw, cut,
                                                      truncate):
    data = valid_node_bytes(method)[:cut] if truncate else raw
    reply = check_answer(lambda: node_call(node_channel, method,
                                           [data] if method == "Link" else data, timeout=5),
                         STREAM_END)
    if method == "Configure":
        release_if_configured(node_channel, reply)


chain_configs = st.builds(
    handshake_pb2.ChainConfig, chain_id=st.one_of(st.text(max_size=10), st.just("x" * 200)),
    position=st.integers(-2**31, 2**31 - 1) | st.integers(-1, 3),
    n_nodes=st.integers(-2**31, 2**31 - 1) | st.integers(-1, 4),
    left=st.sampled_from(ADDRESSES), right=st.sampled_from(ADDRESSES), index=words,
    window=words, predicate=words, allowed_lateness=ints, key_dtype=words,
    result_fifo=ints, max_batch=ints, fast_forward=st.booleans())


@FUZZ
@given(cfg=chain_configs)
def test_random_chain_configs(node_channel, baseline, cfg):
    reply = check_answer(lambda: handshake_pb2_grpc.HandshakeNodeStub(node_channel).Configure(
        cfg, timeout=60))
    release_if_configured(node_channel, reply)


chain_messages = st.builds(
    handshake_pb2.ChainMessage, chain_id=st.sampled_from([OWN, "", "nope"]),
    side=st.integers(0, 3), kind=st.integers(0, 8), stream=st.integers(0, 3),
    n=st.integers(-2**63, 2**63 - 1) | st.integers(-2, 50),
    size=st.integers(-2**63, 2**63 - 1) | st.integers(-2, 50),
    received=st.integers(-2**63, 2**63 - 1) | st.integers(-2, 50),
    id=arrays(), key=arrays(), ts=arrays(), seq=arrays(), opp=arrays())
load_requests = st.builds(
    handshake_pb2.LoadRequest, chain_id=st.sampled_from([OWN, "", "nope"]),
    r=chain_messages, s=chain_messages, left_s=ints, right_r=ints, fed_r=ints, fed_s=ints)


@FUZZ
@given(msgs=st.lists(chain_messages, min_size=1, max_size=4),
       named=st.sampled_from([None, OWN, "nope"]), load=load_requests,
       ref=st.sampled_from([OWN, "", "nope"]), cut=st.integers(-1, 200),
       calls=st.lists(st.sampled_from(["Link", "Load", "Outbox", "Results", "Status"]),
                      min_size=1, max_size=4))
def test_random_calls_on_a_configured_chain(nodes, node_channel, baseline, msgs, named, load,
                                            ref, cut, calls):
    # everything drawn before the chain is configured (see the join inputs' test)
    chain = f"fz-{time.monotonic_ns()}"

    def own(v: str) -> str:
        return chain if v == OWN else v

    for m in [*msgs, load.r, load.s]:
        m.chain_id = own(m.chain_id)
    load.chain_id = own(load.chain_id)
    frames = [m.SerializeToString() for m in msgs]
    if cut >= 0:
        frames[-1] = frames[-1][:min(cut, max(0, len(frames[-1]) - 1))]
    stub = handshake_pb2_grpc.HandshakeNodeStub(node_channel)
    stub.Configure(handshake_pb2.ChainConfig(
        chain_id=chain, n_nodes=1, window="count:20,20", predicate="band:1",
        key_dtype="int64", result_fifo=64, max_batch=8), timeout=60)
    try:
        path = "/panjoin.v1.HandshakeNode/Link"
        meta = () if named is None else ((CHAIN_KEY, own(named)),)
        for method in calls:
            if method == "Link":
                check_answer(lambda: node_channel.stream_unary(
                    path, request_serializer=None,
                    response_deserializer=handshake_pb2.LinkSummary.FromString)(
                    iter(frames), timeout=10, metadata=meta))
            elif method == "Load":
                check_answer(lambda: stub.Load(load, timeout=60))
            else:  # a live chain's streams run until the deadline
                data = handshake_pb2.ChainRef(chain_id=own(ref)).SerializeToString()
                check_answer(lambda m=method, d=data: node_call(node_channel, m, d, timeout=1),
                             STREAM_END)
    finally:
        check_answer(lambda: stub.Release(handshake_pb2.ChainRef(chain_id=chain), timeout=60))


def test_after_the_node_fuzzing_a_chain_is_exact_and_nothing_is_held(nodes, baseline):
    for p in nodes:
        assert p.alive(), "a node died"
        grown = rss(p.proc.pid) - baseline[p.proc.pid]
        assert grown < RSS_GROWTH, f"pid {p.proc.pid} grew {grown >> 20} MiB"
    ev = generate(2000, "uniform", key_min=0, key_max=80, rate=1000, seed=12)
    w, pred = parse_window("count:300,300"), parse_predicate("band:1")
    with HandshakeChain([n.address for n in nodes], w, pred, batch_size=100,
                        max_batch=40) as ch:
        for a in range(0, len(ev), 500):
            ch.push(ev.slice(a, a + 500))
        ch.flush()
        r, s = ch.take_results()
    ref = reference_join(ev.stream, ev.id, ev.key, ev.ts, w, pred)
    assert len(ref.pairs) > 0
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)
    end = time.monotonic() + 60  # released, or left idle by a fuzzed call: 5 s
    while True:
        sts = [handshake_pb2_grpc.HandshakeNodeStub(grpc.insecure_channel(n.address)).Status(
            handshake_pb2.ChainRef(), timeout=30) for n in nodes]
        if all(st.chains == 0 and st.streams == 0 for st in sts):
            break
        if time.monotonic() > end:
            raise AssertionError(f"the nodes still hold chains or streams: {sts}")
        time.sleep(0.5)


def test_after_the_fuzzing_servers_are_up_bounded_and_exact(manager, workers, baseline):
    """Runs last in this module (pytest keeps the file's order)."""
    for p in [manager, *workers]:
        assert p.alive(), "a server died"
        grown = rss(p.proc.pid) - baseline[p.proc.pid]
        assert grown < RSS_GROWTH, f"pid {p.proc.pid} grew {grown >> 20} MiB"
    end = time.monotonic() + 120
    while True:
        sts = [worker_pb2_grpc.WorkerStub(grpc.insecure_channel(w.address)).Status(
            worker_pb2.StatusRequest(), timeout=30) for w in workers]
        if all(s.sessions == 0 for s in sts):
            break
        if time.monotonic() > end:
            raise AssertionError(f"sessions left on the workers: {sts}; the manager's "
                                 f"joins: {open_joins(manager.address)}")
        time.sleep(0.5)
    ev = generate(3000, "zipf", key_min=0, key_max=200, rate=1000, seed=11)
    with Client(manager.address) as c:
        r, s, _ = c.join(ev, "count:400,400", "band:2", "bisort", chunk=700)
    ref = reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window("count:400,400"),
                         parse_predicate("band:2"))
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)
