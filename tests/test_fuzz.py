"""Hostile input against every rpc of the manager and the worker (issue 29).

Random bytes, truncated messages and random field values go to each rpc of a real
``panjoin manager`` process and of real worker processes, over real gRPC. Every
answer must be a client's error (INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED, ...)
or a success; never INTERNAL, UNKNOWN or a dead server. Afterwards the processes'
memory has not grown without bound, the workers hold no session, and a known join
is exact against the reference.
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
from panjoin.launch import start_manager
from panjoin.proto.panjoin.v1 import common_pb2, manager_pb2, worker_pb2, worker_pb2_grpc
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
def baseline(manager, workers):
    """Resident memory of the manager and the workers before any fuzzing."""
    return {p.proc.pid: rss(p.proc.pid) for p in [manager, *workers]}


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
