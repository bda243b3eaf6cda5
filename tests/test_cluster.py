"""Real worker processes on loopback over real gRPC: the cluster gives the reference result.

(The first slice of the cluster issue: the worker contract, the gRPC backend,
the process launcher; the manager endpoint and fault handling come next.)
"""

from __future__ import annotations

import subprocess
import sys
import time

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
from panjoin.wire import from_array, to_array


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


def _batch(batch_id, keys, stream="R", n=None, predicate="eq", **cols):
    """A Batch message as the manager would send it (``n`` rows of ts/seq/ids)."""
    n = len(keys) if n is None else n
    return worker_pb2.Batch(
        batch_id=batch_id, stream=common_pb2.STREAM_R if stream == "R" else common_pb2.STREAM_S,
        keys=to_array(np.asarray(keys)), ts=to_array(cols.get("ts", np.zeros(n, np.int64))),
        seq=to_array(cols.get("seq", np.arange(n))), ids=to_array(cols.get("ids", np.arange(n))),
        predicate=predicate, window="count:10,10")


def test_bad_commands_get_invalid_argument_and_change_nothing(workers):
    ch, stub = _session(workers[0].address)
    create = worker_pb2.Create(sub_id=7, stream=common_pb2.STREAM_R, index="bisort",
                               capacity=10, key_dtype="int64", partitions=2)
    cmds = [
        worker_pb2.Command(command_id=1, create=create),
        # float keys for an int64 subwindow: the batch is fine, the insert is not
        worker_pb2.Command(command_id=2, batch=_batch(1, [1.0, 2.0])),
        worker_pb2.Command(command_id=3, insert=worker_pb2.Insert(
            sub_id=7, batch_id=1, seq_from=0, seq_to=2)),
        # mismatched lengths
        worker_pb2.Command(command_id=4, batch=_batch(2, [1, 2], n=3)),
        # unknown subwindow
        worker_pb2.Command(command_id=5, expire=worker_pb2.Expire(sub_id=99)),
        # unknown index
        worker_pb2.Command(command_id=6, create=worker_pb2.Create(
            sub_id=8, stream=common_pb2.STREAM_R, index="btree", capacity=10,
            key_dtype="int64", partitions=2)),
        # a batch nobody sent
        worker_pb2.Command(command_id=7, insert=worker_pb2.Insert(
            sub_id=7, batch_id=9, seq_from=0, seq_to=2)),
        # unsorted keys, an unknown predicate, a batch id of 0
        worker_pb2.Command(command_id=8, batch=_batch(3, [2, 1])),
        worker_pb2.Command(command_id=9, batch=_batch(4, [1, 2], predicate="like:3")),
        worker_pb2.Command(command_id=10, batch=_batch(0, [1, 2])),
        # an R batch probing R subwindows
        worker_pb2.Command(command_id=11, batch=_batch(5, [1, 2])),
        worker_pb2.Command(command_id=12, probe=worker_pb2.Probe(batch_id=5, sub_ids=[7])),
        # a good insert afterwards still works: state was not changed by the bad ones
        worker_pb2.Command(command_id=13, insert=worker_pb2.Insert(
            sub_id=7, batch_id=5, seq_from=0, seq_to=2)),
        # and an S batch finds what it inserted
        worker_pb2.Command(command_id=14, batch=_batch(6, [2, 3], stream="S")),
        worker_pb2.Command(command_id=15, probe=worker_pb2.Probe(batch_id=6, sub_ids=[7])),
    ]
    fbs = [f for out in stub.Session(iter([worker_pb2.Commands(commands=cmds)]))
           for f in out.feedback]
    ch.close()
    assert [f.command_id for f in fbs] == list(range(1, 16))
    assert fbs[0].error == "" and fbs[1].error == "" and fbs[12].error == ""
    assert fbs[2].code == "INVALID_ARGUMENT" and "dtype" in fbs[2].error
    assert fbs[3].code == "INVALID_ARGUMENT" and "length" in fbs[3].error
    assert fbs[4].code == "NOT_FOUND" and "99" in fbs[4].error
    assert fbs[5].code == "INVALID_ARGUMENT" and "btree" in fbs[5].error
    assert fbs[6].code == "NOT_FOUND" and "batch 9" in fbs[6].error
    assert fbs[7].code == "INVALID_ARGUMENT" and "sorted" in fbs[7].error
    assert fbs[8].code == "INVALID_ARGUMENT" and "like" in fbs[8].error
    assert fbs[9].code == "INVALID_ARGUMENT" and "batch id 0" in fbs[9].error
    assert fbs[11].code == "INVALID_ARGUMENT" and "stream" in fbs[11].error
    assert fbs[12].status.count == 2
    (res,) = fbs[14].results
    assert from_array(res.probe_idx).tolist() == [0] and from_array(res.ids).tolist() == [1]


def test_backend_raises_worker_errors(workers):
    backend = GrpcBackend([workers[0].address])
    try:
        backend.where[5] = 0
        backend.expire(5)  # pipelined: the error comes back with the feedback
        with pytest.raises(WorkerError, match="unknown subwindow"):
            backend.sync()
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


@pytest.fixture(scope="module")
def manager(workers):
    from panjoin.manager.service import serve_manager

    server, port = serve_manager([w.address for w in workers[:2]], 0)
    yield f"127.0.0.1:{port}"
    server.stop(grace=1).wait()


def test_manager_endpoint_gives_the_reference(manager, events):
    from panjoin.client import Client

    w = parse_window("time:160,120", 10)
    with Client(manager) as c:
        r, s, late = c.join(events, "time:160,120", "band:1", "rap", chunk=400,
                            allowed_lateness=10, subwindow_size=50, partitions=8, batch_size=64)
        r2, s2, _ = c.join(events, "time:160,120", "band:1", "bisort", chunk=400,
                           allowed_lateness=10, subwindow_size=50, partitions=8, batch_size=64,
                           result_format=1)  # BI-Sort ranges through the manager's mirror
    assert np.array_equal(sort_pairs(np.stack([r2, s2], axis=1)),
                          sort_pairs(np.stack([r, s], axis=1)))
    ref = reference_join(events.stream, events.id, events.key, events.ts, w,
                         parse_predicate("band:1"))
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)
    for k in "RS":
        assert np.array_equal(np.sort(late[k]), np.sort(ref.late_ids[k]))


def test_manager_in_its_own_process_gives_the_reference(events):
    """launch.start_cluster: workers and `panjoin manager` over them, each a process,
    as the pipeline's demo and benchmark run them."""
    from panjoin.client import Client
    from panjoin.launch import start_cluster

    cluster = start_cluster(2)
    try:
        with Client(cluster.address) as c:
            r, s, _ = c.join(events, "time:160,120", "band:1", "bisort", chunk=400,
                             allowed_lateness=10, subwindow_size=50, batch_size=64)
    finally:
        cluster.stop()
    assert not any(p.alive() for p in [cluster.manager, *cluster.workers])
    ref = reference_join(events.stream, events.id, events.key, events.ts,
                         parse_window("time:160,120", 10), parse_predicate("band:1"))
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)


def test_manager_rejects_bad_specs_and_replays_are_not_applied_twice(manager, events):
    from panjoin.client import Client

    with Client(manager) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.open("count:0,5", "eq")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "count:0,5" in err.value.details()
        jid = c.open("count:100,100", "eq", "bisort", batch_size=32)
        chunk = events.slice(0, 300)
        first = list(c.stream(jid, [chunk], first_batch_id=5))
        again = list(c.stream(jid, [chunk], first_batch_id=5))  # a replay of batch 5
        assert len(first[0][1]) > 0 and len(again[0][1]) == 0
        st = c.stub.Close(c.ref(jid))
        assert st.tuples_in == 300 and st.last_batch_id == 5


def test_a_join_input_goes_narrowed_and_bad_narrowing_is_refused(manager):
    """The client sends int64 id, key and ts columns of span < 2^32 as uint32 offsets
    (13 bytes a tuple instead of 25); the manager widens them back, and refuses a
    narrowing it cannot take (INVALID_ARGUMENT, nothing applied)."""
    import queue

    from panjoin.client import Client, join_input

    chunk = generate(300, "uniform", key_min=0, key_max=60, rate=1000, seed=3)
    msg = join_input("j", 1, chunk)
    assert msg.id.dtype == msg.key.dtype == msg.ts.dtype == "<u4"
    assert (msg.id_base, msg.key_base, msg.ts_base) == (
        int(chunk.id.min()), int(chunk.key.min()), int(chunk.ts.min()))
    assert msg.ByteSize() < 14 * len(chunk.id)
    wide = chunk.slice(0, 300)
    wide.key = np.where(np.arange(300) % 2 == 0, -(1 << 40), 1 << 40).astype(np.int64)
    wide.id = wide.id * (1 << 33)
    back = join_input("j", 1, wide)
    assert back.key.dtype == back.id.dtype == "<i8" and back.key_base == back.id_base == 0

    with Client(manager) as c:
        jid = c.open("count:100,100", "eq", "bisort", batch_size=32)

        def bad(change):
            m = join_input(jid, 1, chunk, token=c.token(jid))
            change(m)
            inputs: queue.Queue = queue.Queue()
            inputs.put(m)
            inputs.put(None)
            with pytest.raises(grpc.RpcError) as e:
                list(c.stub.Join(iter(inputs.get, None)))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            return e.value.details()

        assert "overflows" in bad(lambda m: setattr(m, "id_base", (1 << 63) - 2))
        assert "id: a base" in bad(lambda m: (m.id.CopyFrom(to_array(chunk.id)),
                                              setattr(m, "id_base", 5)))
        assert "key: a base" in bad(lambda m: (m.key.CopyFrom(to_array(chunk.key)),
                                               setattr(m, "key_base", 5)))
        assert "overflows" in bad(lambda m: setattr(m, "ts_base", (1 << 63) - 2))
        assert c.status(jid).tuples_in == 0  # nothing applied
        outs = list(c.stream(jid, [chunk]))
    ref = reference_join(chunk.stream, chunk.id, chunk.key, chunk.ts,
                         parse_window("count:100,100"), parse_predicate("eq"))
    r = np.concatenate([o.r_id for o in outs])
    s = np.concatenate([o.s_id for o in outs])
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)


def test_seq_ids_keep_the_ids_at_the_client_and_only_count_windows_get_them(manager, events):
    """A client that numbers its tuples (OpenRequest.seq_ids) sends no id column; the
    manager grants it for count windows only, and refuses ids on such a join; time
    placement's sorted batches give the reference with ids in no order."""
    import queue

    from panjoin.client import Client, rows_of

    ev = events.slice(0, len(events))
    rng = np.random.default_rng(11)
    ev.id = (rng.permutation(len(ev)).astype(np.int64) - 700) * -9_000_000_011
    with Client(manager) as c:
        jid = c.open("time:160,120", "band:1", seq_ids=True)
        assert c.columns[jid] == (False, False)  # a time window: the client sends its ids
        c.close_join(jid)
        jid = c.open("count:150,110", "eq", seq_ids=True)
        assert c.columns[jid] == (True, True)
        m = c.input_of(jid, 1, rows_of(ev, np.arange(50)))
        m.id.CopyFrom(to_array(np.arange(50)))  # ids on a join whose ids are seqs
        inputs: queue.Queue = queue.Queue()
        for msg in (m, None):
            inputs.put(msg)
        with pytest.raises(grpc.RpcError) as e:
            list(c.stub.Join(iter(inputs.get, None)))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "seq_ids" in e.value.details()
        res = {idx: c.join(ev, "count:150,110", "bands:-3,-1;2,5", idx, chunk=400,
                           subwindow_size=30, batch_size=64, seq_ids=True)
               for idx in ("bisort", "rap")}
    ref = reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window("count:150,110"),
                         parse_predicate("bands:-3,-1;2,5"))
    assert len(ref.pairs) > 100
    for r, s, _ in res.values():
        assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)


def test_replay_cli_on_a_local_cluster(tmp_path):
    from panjoin.cli.main import main
    from panjoin.events import read_pairs, write_events

    t = generate(2000, "uniform", key_min=0, key_max=50, rate=1000, seed=9)
    ev = tmp_path / "ev.parquet"
    write_events(t, ev)
    out = tmp_path / "p.parquet"
    assert main(["replay", str(ev), "--window", "count:200,200", "--predicate", "band:1",
                 "--index", "wib", "--subwindow-size", "64", "--batch-size", "100",
                 "--workers", "2", "--out", str(out), "--no-progress"]) == 0
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:200,200"),
                         parse_predicate("band:1"))
    assert np.array_equal(sort_pairs(read_pairs(out)), ref.pairs)


def test_cluster_command_starts_and_stops_cleanly(tmp_path):
    import signal

    from panjoin.client import Client

    proc = subprocess.Popen([sys.executable, "-m", "panjoin.cli", "cluster", "--workers", "2",
                             "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("panjoin cluster: manager on 127.0.0.1:"), line
        address = line.split("manager on ")[1].split(",")[0]
        t = generate(500, "uniform", key_min=0, key_max=20, rate=1000, seed=2)
        with Client(address) as c:
            r, s, _ = c.join(t, "count:50,50", "eq", "bisort", batch_size=64)
        ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:50,50"),
                             parse_predicate("eq"))
        assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "stopped" in out


@pytest.mark.parametrize("index", ["rap", "bisort"])
def test_killing_a_worker_mid_replay_loses_and_doubles_nothing(events, index):
    ws = start_workers(3)
    backend = GrpcBackend([w.address for w in ws], deadline=20)
    try:
        eng = JoinEngine("count:150,110", "band:2", index=index, subwindow_size=30,
                         partitions=8, batch_size=64, backend=backend, n_workers=3)
        eng.push(events.slice(0, 800))
        ws[1].kill()  # a crash: SIGKILL, no goodbye
        eng.push(events.slice(800, len(events)))
        eng.flush()
        r, s = eng.take_results()
        assert backend.failovers >= 1 and backend.alive_workers() == [0, 2]
        # and once every worker is gone, the join fails with a clear error: at the latest
        # when its rounds are collected (a loaded host may not see the workers die
        # before the pushes' commands are queued, and expiries no longer drain them)
        ws[0].kill()
        ws[2].kill()
        with pytest.raises(WorkerError, match="every worker is down"):
            eng.push(events.slice(0, 300))
            eng.flush()
            eng.take_results()
    finally:
        backend.close()
        for w in ws:
            w.stop()
    ref = reference_join(events.stream, events.id, events.key, events.ts,
                         parse_window("count:150,110"), parse_predicate("band:2"))
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)


def test_system_benchmark_command_prints_the_rate():
    run = subprocess.run([sys.executable, "-m", "panjoin.cli", "bench", "system", "--workers",
                          "2", "--window", "8K", "--measure", "16K", "--batch", "1K",
                          "--no-progress"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    last = run.stdout.strip().splitlines()[-1].split()
    assert last[0] == "tuples/s:" and float(last[1]) > 0
    assert last[2] == "overhead-vs-in-process:" and float(last[3]) > 0


def test_a_client_that_disconnects_releases_its_join(manager, events):

    from panjoin.client import Client

    with Client(manager) as c:
        jid = c.open("count:100,100", "eq", "bisort", batch_size=32)
        gen = c.stream(jid, [events.slice(0, 200), events.slice(200, 400)])
        next(gen)  # one answer, then the client goes away mid-stream
        gen.close()
        token = c.token(jid)
    with Client(manager) as c:
        c.tokens[jid] = token  # the owner, on a new connection
        wait_join_released(c, jid)
        with pytest.raises(grpc.RpcError):
            c.stub.Close(c.ref(jid))


def test_a_hung_worker_is_detected_by_its_deadline(events):
    import os
    import signal

    ws = start_workers(2)
    join = dict(index="wib", subwindow_size=40, partitions=4, batch_size=64, n_workers=2)
    # the same join once without the deadline, so the workers' kernels are compiled (or
    # loaded) before the 8 s run: a fresh checkout has no Numba cache, and compiling on
    # a loaded machine outlasts the deadline
    warm = GrpcBackend([w.address for w in ws])
    try:
        eng = JoinEngine("time:160,120", "eq", backend=warm, **join)
        eng.push(events)
        eng.flush()
        eng.take_results()
    finally:
        warm.close()
    backend = GrpcBackend([w.address for w in ws], deadline=8)
    try:
        eng = JoinEngine("time:160,120", "eq", backend=backend, **join)
        eng.push(events.slice(0, 600))
        os.kill(ws[0].proc.pid, signal.SIGSTOP)  # alive but silent
        eng.push(events.slice(600, len(events)))
        eng.flush()
        r, s = eng.take_results()
        assert backend.failovers >= 1 and backend.alive_workers() == [1]
    finally:
        os.kill(ws[0].proc.pid, signal.SIGCONT)
        backend.close()
        for w in ws:
            w.stop()
    ref = reference_join(events.stream, events.id, events.key, events.ts,
                         parse_window("time:160,120"), parse_predicate("eq"))
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)


def test_a_busy_worker_answers_its_heartbeat_and_is_not_declared_dead(workers, caplog):
    # nested-loop probes of 16K tuples over a 40K window take longer than the deadline
    # (5 ms: on a quiet host two threads finish such a probe within 50 ms, and a deadline
    # that never passed made this test fail there): without the heartbeat (its own
    # timeout is HEARTBEAT_S) both workers would be declared dead mid-join
    t = generate(100_000, "uniform", key_min=0, key_max=1 << 20, rate=1000, seed=3)
    backend = GrpcBackend([w.address for w in workers[:2]], deadline=0.005)
    try:
        eng = JoinEngine("count:40K,40K", "band:2", index="nested", batch_size=16384,
                         backend=backend, n_workers=2)
        with caplog.at_level("WARNING", logger="panjoin.manager"):
            eng.push(t)
            eng.flush()
            r, s = eng.take_results()
        assert backend.failovers == 0 and backend.alive_workers() == [0, 1]
        assert "answers its heartbeat" in caplog.text  # the deadline did pass
    finally:
        backend.close()
    # the same pairs as in-process (the reference itself would take an hour here)
    local = JoinEngine("count:40K,40K", "band:2", index="nested", batch_size=16384)
    local.push(t)
    local.flush()
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)),
                          sort_pairs(np.stack(local.take_results(), axis=1)))


@pytest.mark.parametrize("window", ["count:150,110", "time:160,120"])
def test_bisort_range_results_through_the_managers_mirror(workers, events, window):
    backend = GrpcBackend([w.address for w in workers[:2]], result_format="ranges")
    try:
        eng = JoinEngine(window, "band:3", index="bisort", subwindow_size=40, partitions=4,
                         batch_size=64, backend=backend, n_workers=2,
                         index_opts={"buffer": 16})
        eng.push(events)
        eng.flush()
        r, s = eng.take_results()
        assert backend.ranges_expanded > 0, "the ranges path did not run"
    finally:
        backend.close()
    ref = reference_join(events.stream, events.id, events.key, events.ts,
                         parse_window(window), parse_predicate("band:3"))
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)


def test_payloads_travel_through_the_manager_and_status_has_the_feedback_bits(manager):
    import pyarrow as pa

    from panjoin.client import Client

    t = generate(900, "uniform", key_min=0, key_max=30, rate=1000, seed=21)
    t.payload = pa.array([f"{'RS'[s]}{i}|{'x' * (i % 5)}" for s, i in zip(t.stream, t.id,
                                                                          strict=True)])
    with Client(manager) as c:
        res = c.join(t, "count:120,120", "band:1", "bisort", chunk=250, subwindow_size=40,
                     batch_size=32)
        jid = c.open("count:120,120", "eq", "rap", subwindow_size=40, batch_size=32)
        list(c.stream(jid, [t.slice(0, 500)], flush_last=False))
        st = c.status(jid)
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:120,120"),
                         parse_predicate("band:1"))
    assert np.array_equal(sort_pairs(np.stack([res.r_id, res.s_id], axis=1)), ref.pairs)
    # strings in, strings out, as in-process
    assert res.r_payload.type == pa.large_string()
    assert res.r_payload.to_pylist() == [f"R{i}|{'x' * (i % 5)}" for i in res.r_id]
    assert res.s_payload.to_pylist() == [f"S{i}|{'x' * (i % 5)}" for i in res.s_id]
    # the workers' status bits, as of their last feedback: each subwindow twice, as a
    # primary on one worker and a backup (a log of its inserts) on the other
    assert len(st.workers) == 2 and st.workers_alive == 2
    assert sum(w.tuples for w in st.workers) == 2 * (st.window_r + st.window_s) > 0
    assert sum(w.subwindows for w in st.workers) == 2 * (st.subwindows_r + st.subwindows_s)
    assert all(w.nbytes > 0 for w in st.workers)
    assert st.memory_bytes >= sum(w.nbytes for w in st.workers)


def test_a_client_join_hands_its_pairs_out_as_they_arrive(manager):
    """``Client.join(out=...)``: each answer's pairs go to the writer as the manager
    sends them (several writes, payloads looked up per answer), the Result keeps only
    the late ids, and the pairs written are the reference's."""
    import pyarrow as pa

    from panjoin.client import Client
    from panjoin.events import EventTable

    t = generate(3000, "uniform", key_min=0, key_max=100, rate=1000, seed=5)
    ev = EventTable(t.stream, t.id, t.key, t.ts,
                    payload=pa.array([f"{'RS'[a]}{b}" for a, b in zip(t.stream, t.id,
                                                                     strict=True)]))

    class Writes:
        def __init__(self):
            self.calls = []

        def write(self, r, s, rp, sp):
            self.calls.append((r, s, rp, sp))

    out = Writes()
    with Client(manager) as c:
        res = c.join(ev, "count:400,400", "band:1", "bisort", chunk=500, out=out,
                     batch_size=128, subwindow_size=100)
    assert len(res.r_id) == 0 and len(res.s_id) == 0 and set(res.late) == {"R", "S"}
    assert len([w for w in out.calls if len(w[0])]) >= 4
    r = np.concatenate([w[0] for w in out.calls])
    s = np.concatenate([w[1] for w in out.calls])
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:400,400"),
                         parse_predicate("band:1"))
    assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)
    for rr, ss, rp, sp in out.calls:
        assert rp.to_pylist() == [f"R{i}" for i in rr]
        assert sp.to_pylist() == [f"S{i}" for i in ss]


@pytest.mark.parametrize("kind", ["string", "binary"])
def test_replay_on_a_cluster_writes_the_in_process_payload_types(manager, tmp_path, kind,
                                                                 capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from panjoin.cli.main import main

    t = generate(1200, "uniform", key_min=0, key_max=200, rate=1000, seed=3)
    pays = [f"{'RS'[s]}{i}" for s, i in zip(t.stream, t.id, strict=True)]
    ev = tmp_path / "ev.parquet"
    pq.write_table(pa.table({"stream": np.array(["R", "S"])[t.stream], "id": t.id,
                             "key": t.key, "ts": t.ts,
                             "payload": pa.array(pays if kind == "string" else
                                                 [p.encode() for p in pays])}), ev)
    tables = {}
    for where in ([], ["--cluster", manager]):
        out = tmp_path / f"p{len(where)}.parquet"
        assert main(["replay", str(ev), "--window", "count:300,300", "--predicate", "band:2",
                     "--with-payload", "--batch-size", "64", "--subwindow-size", "100",
                     "--out", str(out), "--no-progress", *where]) == 0
        tables[bool(where)] = pq.read_table(out).sort_by([("r_id", "ascending"),
                                                          ("s_id", "ascending")])
        # where the wall time went, in-process and on a cluster
        wall = capsys.readouterr().out.strip().splitlines()[-1]
        assert wall.startswith("wall ") and "read " in wall and "join " in wall \
            and "write " in wall, wall
    local, cluster = tables[False], tables[True]
    want = pa.large_string() if kind == "string" else pa.large_binary()
    assert local.schema.field("r_payload").type == want
    assert cluster.schema == local.schema
    assert cluster.equals(local) and local.num_rows > 0


def test_an_answer_too_big_for_one_message_comes_in_parts(manager, monkeypatch):
    # a 1M-tuple input of a band join with 64 partners a tuple answered 1.3 GB in one
    # message; the parts are capped by pairs and by payload bytes
    import pyarrow as pa

    from panjoin.client import Client, join_input
    from panjoin.manager import service
    from panjoin.proto.panjoin.v1 import manager_pb2

    monkeypatch.setattr(service, "OUTPUT_PAIRS", 500)
    monkeypatch.setattr(service, "OUTPUT_BYTES", 4000)
    t = generate(900, "uniform", key_min=0, key_max=30, rate=1000, seed=21)
    t.payload = pa.array([f"{'RS'[s]}{i}|{'x' * (i % 50)}" for s, i in zip(t.stream, t.id,
                                                                           strict=True)])
    with Client(manager) as c:
        res = c.join(t, "count:120,120", "band:1", "bisort", chunk=900)
        jid = c.open("count:120,120", "band:1", "bisort")
        outs = list(c.stub.Join(iter([join_input(jid, 1, t, flush=True, token=c.token(jid))])))
        c.stub.Close(c.ref(jid))
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:120,120"),
                         parse_predicate("band:1"))
    assert np.array_equal(sort_pairs(np.stack([res.r_id, res.s_id], axis=1)), ref.pairs)
    assert res.r_payload.to_pylist() == [f"R{i}|{'x' * (i % 50)}" for i in res.r_id]
    assert len(outs) > len(ref.pairs) // 500  # cut by bytes too, not only by pairs
    assert [o.pushed for o in outs] == [True] * (len(outs) - 1) + [False]
    assert [o.batch_id for o in outs] == [0] * (len(outs) - 1) + [1]
    sizes = [len(from_array(o.r_id, "<i8")) for o in outs]
    assert max(sizes) <= 500 and sum(sizes) == len(ref.pairs)
    assert all(isinstance(o, manager_pb2.JoinOutput) for o in outs)


def test_output_parts_cut_by_pairs_and_bytes():
    import pyarrow as pa

    from panjoin.manager.service import output_parts

    assert output_parts(0) == [(0, 0)]
    assert output_parts(5, max_pairs=2) == [(0, 2), (2, 4), (4, 5)]
    big = pa.array([b"x" * 10, b"y" * 100, b"z" * 10, b"w" * 10], pa.large_binary())
    # 25 bytes a part at most, but never an empty part: the 100-byte row goes alone
    assert output_parts(4, (big, None), max_pairs=10, max_bytes=25) == [(0, 1), (1, 2),
                                                                         (2, 4)]


def test_a_probes_answer_leaves_before_the_inserts_after_it(workers):
    """A message carries a batch's Batch, Probe and Insert: the manager waits for the
    probe's pairs, so they go back in a message of their own, before the insert runs."""
    ch, stub = _session(workers[0].address)
    keys = np.arange(64, dtype=np.int64)

    def create(sub_id, stream):
        return worker_pb2.Create(sub_id=sub_id, stream=stream, index="bisort", capacity=64,
                                 key_dtype="int64", partitions=2)

    cmds = [
        worker_pb2.Command(command_id=1, create=create(1, common_pb2.STREAM_R)),
        worker_pb2.Command(command_id=2, create=create(2, common_pb2.STREAM_S)),
        worker_pb2.Command(command_id=3, batch=_batch(1, keys)),
        worker_pb2.Command(command_id=4, insert=worker_pb2.Insert(
            sub_id=1, batch_id=1, seq_from=0, seq_to=64)),
        worker_pb2.Command(command_id=5, batch=_batch(2, keys, stream="S")),
        worker_pb2.Command(command_id=6, probe=worker_pb2.Probe(batch_id=2, sub_ids=[1])),
        worker_pb2.Command(command_id=7, insert=worker_pb2.Insert(
            sub_id=2, batch_id=2, seq_from=0, seq_to=64)),
    ]
    outs = list(stub.Session(iter([worker_pb2.Commands(commands=cmds)])))
    ch.close()
    assert [[f.command_id for f in o.feedback] for o in outs] == [[1, 2, 3, 4, 5, 6], [7]]
    assert all(f.error == "" for o in outs for f in o.feedback)
    (res,) = outs[0].feedback[-1].results
    assert from_array(res.probe_idx).size == 64  # every key once
    # the session's status comes once per message of commands, after the last answer
    assert outs[1].feedback[-1].HasField("load") and outs[1].feedback[-1].load.tuples == 128


def test_feedback_carries_the_status_bits(workers):
    from panjoin.backend import CreateSpec, SortedBatch

    backend = GrpcBackend([workers[0].address])
    try:
        backend.create(CreateSpec(0, "R", "bisort", 4, "int64", 2))
        backend.create(CreateSpec(1, "S", "bisort", 4, "int64", 2))
        backend.sync()
        load = backend.loads()[0]
        assert load.subwindows == 2 and load.tuples == 0
        assert load.oldest_r_empty and load.oldest_s_empty
        assert not load.newest_r_full
        k = np.array([1, 2, 3, 4], np.int64)
        backend.insert(0, SortedBatch.of(1, "R", k, k, np.arange(4), 10 + np.arange(4),
                                         predicate="eq", window="count:4,4"), 0, 4)
        backend.sync()
        load = backend.loads()[0]
        assert load.tuples == 4 and load.newest_r_full and not load.oldest_r_empty
        assert load.oldest_s_empty and not load.newest_s_full
        assert backend.sizes[0] > 0
        backend.expire(0)
        backend.sync()
        assert backend.loads()[0].subwindows == 1 and backend.loads()[0].oldest_r_empty
    finally:
        backend.close()


def test_ranges_stay_exact_when_inserts_merge_into_the_main_array(workers):
    """Batches larger than BI-Sort's insertion buffer merge into the main array and move
    its rows; a round still in flight must be expanded on the mirror as it was."""
    t = generate(24_000, "uniform", key_min=0, key_max=1 << 20, seed=3)
    backend = GrpcBackend([w.address for w in workers[:2]], result_format="ranges")
    try:
        eng = JoinEngine("count:4096,4096", "band:64", index="bisort", batch_size=2048,
                         subwindow_size=4096, backend=backend, n_workers=2)
        rs, ss = [], []
        for a in range(0, len(t), 12000):  # several rounds in flight within a push
            eng.push(t.slice(a, min(len(t), a + 12000)))
            r, s = eng.take_results()
            rs.append(r)
            ss.append(s)
        eng.flush()
        r, s = eng.take_results()
        assert backend.ranges_expanded > 0
    finally:
        backend.close()
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:4096,4096"),
                         parse_predicate("band:64"))
    got = sort_pairs(np.stack([np.concatenate([*rs, r]), np.concatenate([*ss, s])], axis=1))
    assert len(ref.pairs) > 0
    assert np.array_equal(got, ref.pairs)


def wait_join_released(client, join_id: str) -> None:
    """Wait (up to 30 s: on a loaded machine the manager ends the batch in hand first)
    until the manager no longer knows ``join_id``: its client went away."""
    for _ in range(300):
        try:
            client.status(join_id)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.NOT_FOUND
            return
        time.sleep(0.1)
    raise AssertionError("the join outlived its client")
