"""Real worker processes on loopback over real gRPC: the cluster gives the reference result.

(The first slice of the cluster issue: the worker contract, the gRPC backend,
the process launcher; the manager endpoint and fault handling come next.)
"""

from __future__ import annotations

import subprocess
import sys

import grpc
import numpy as np
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from panjoin.generate import generate
from panjoin.launch import start_workers
from panjoin.manager.engine import JoinEngine
from panjoin.manager.grpc_backend import GrpcBackend, WorkerError
from panjoin.proto.panjoin.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window
from panjoin.subwindow import INDEX_KINDS
from panjoin.wire import to_array


@pytest.fixture(scope="module")
def workers():
    ws = start_workers(3)
    yield ws
    for w in ws:
        w.stop()


@pytest.fixture(scope="module")
def events():
    return generate(1500, "zipf", key_min=0, key_max=60, rate=1000, seed=5, disorder_ms=30)


@pytest.mark.parametrize("n_workers", [1, 2, 3])
@pytest.mark.parametrize("window", ["count:150,110", "time:160,120"])
@pytest.mark.parametrize("index", INDEX_KINDS)
def test_cluster_matches_reference(workers, events, index, window, n_workers):
    pred = "bands:-3,-1;2,5"
    w = parse_window(window, 10 if window.startswith("time") else 0)
    backend = GrpcBackend([w.address for w in workers[:n_workers]])
    try:
        eng = JoinEngine(w, pred, index=index, subwindow_size=30,
                         partitions=8, batch_size=64, backend=backend, n_workers=n_workers)
        eng.push(events.slice(0, 700))
        eng.push(events.slice(700, len(events)))
        eng.flush()
        r, s = eng.take_results()
    finally:
        backend.close()
    ref = reference_join(events.stream, events.id, events.key, events.ts,
                         w, parse_predicate(pred))
    assert len(ref.pairs) > 0
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)
    # several subwindows per worker, spread round-robin
    assert eng.rings["R"].created >= 2 * n_workers


def _session(address):
    ch = grpc.insecure_channel(address)
    return ch, worker_pb2_grpc.WorkerStub(ch)


def test_bad_commands_get_invalid_argument_and_change_nothing(workers):
    ch, stub = _session(workers[0].address)
    create = worker_pb2.Create(sub_id=7, stream=common_pb2.STREAM_R, index="bisort",
                               capacity=10, key_dtype="int64", partitions=2)
    cmds = [
        worker_pb2.Command(command_id=1, create=create),
        # wrong dtype
        worker_pb2.Command(command_id=2, insert=worker_pb2.Insert(
            sub_id=7, keys=to_array(np.array([1.0, 2.0])), ts=to_array(np.zeros(2, np.int64)),
            seq=to_array(np.arange(2)))),
        # mismatched lengths
        worker_pb2.Command(command_id=3, insert=worker_pb2.Insert(
            sub_id=7, keys=to_array(np.array([1, 2])), ts=to_array(np.zeros(3, np.int64)),
            seq=to_array(np.arange(2)))),
        # unknown subwindow
        worker_pb2.Command(command_id=4, expire=worker_pb2.Expire(sub_id=99)),
        # unknown index
        worker_pb2.Command(command_id=5, create=worker_pb2.Create(
            sub_id=8, stream=common_pb2.STREAM_R, index="btree", capacity=10,
            key_dtype="int64", partitions=2)),
        # a good insert afterwards still works: state was not changed by the bad ones
        worker_pb2.Command(command_id=6, insert=worker_pb2.Insert(
            sub_id=7, keys=to_array(np.array([1, 2])), ts=to_array(np.zeros(2, np.int64)),
            seq=to_array(np.arange(2)))),
    ]
    fbs = list(stub.Session(iter(cmds)))
    ch.close()
    assert [f.command_id for f in fbs] == [1, 2, 3, 4, 5, 6]
    assert fbs[0].error == "" and fbs[5].error == ""
    assert fbs[1].code == "INVALID_ARGUMENT" and "dtype" in fbs[1].error
    assert fbs[2].code == "INVALID_ARGUMENT" and "length" in fbs[2].error
    assert fbs[3].code == "NOT_FOUND" and "99" in fbs[3].error
    assert fbs[4].code == "INVALID_ARGUMENT" and "btree" in fbs[4].error
    assert fbs[5].status.count == 2


def test_backend_raises_worker_errors(workers):
    backend = GrpcBackend([workers[0].address])
    try:
        with pytest.raises(WorkerError, match="unknown subwindow"):
            backend.where[5] = 0
            backend.expire(5)
    finally:
        backend.close()


def test_reflection_lists_the_services(workers):
    ch = grpc.insecure_channel(workers[0].address)
    stub = reflection_pb2_grpc.ServerReflectionStub(ch)
    req = reflection_pb2.ServerReflectionRequest(list_services="")
    names = {s.name for r in stub.ServerReflectionInfo(iter([req]))
             for s in r.list_services_response.service}
    ch.close()
    assert {"panjoin.v1.Worker", "grpc.health.v1.Health"} <= names


def test_generated_code_is_fresh():
    run = subprocess.run([sys.executable, "scripts/gen_proto.py", "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
