"""Errors a user can act on (issue 29, item 8), as a client and a shell user meet them.

- a worker's failure reaches the client with its real cause and a fitting status
  (RESOURCE_EXHAUSTED "out of memory: Unable to allocate 1.78 PiB ...", not UNKNOWN
  "unknown subwindow 0");
- a ``--replicas 1`` join whose worker died is DATA_LOSS (its tuples are gone), not
  UNAVAILABLE (which says "try again");
- the CLI answers a gRPC error with one line, code and detail, and exit status 1;
- a flag that does not apply to the chosen mode is an error that says why.

Real processes throughout: ``panjoin`` commands, workers and a manager on loopback.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import grpc
import pytest

from panjoin.client import Client
from panjoin.generate import generate
from panjoin.launch import start_cluster


@pytest.fixture(scope="module")
def events():
    return generate(1200, "uniform", key_min=0, key_max=40, rate=1000, seed=5)


def _chunk(ev, a, b):
    return SimpleNamespace(stream=ev.stream[a:b], id=ev.id[a:b], key=ev.key[a:b],
                           ts=ev.ts[a:b], key2=None)


#: a worker budget that a time window outgrows mid-join: no estimate at Open can refuse
#: a time window (its tuples are not known), so a worker refuses a Create
SMALL_BUDGET = ["--memory-limit", str(8 << 20)]
BIG_TIME_JOIN = dict(window="time:100000000", predicate="eq", index="rap",
                     subwindow_size=1024, partitions=1024, batch_size=4096)


def test_a_worker_failure_reaches_the_client_with_its_cause():
    # RaP-Table subwindows of 1K tuples and 1K partitions, some 220 KB each: a worker
    # refuses a Create beyond its budget; the probes that follow would then name a
    # subwindow the worker does not have, which must not be what the client reads
    ev = generate(120_000, "uniform", key_min=0, key_max=1000, rate=100_000, seed=3)
    with start_cluster(2, worker_args=[SMALL_BUDGET] * 2) as c, Client(c.address) as cl:
        with pytest.raises(grpc.RpcError) as e:
            cl.join(ev, BIG_TIME_JOIN["window"], BIG_TIME_JOIN["predicate"],
                    BIG_TIME_JOIN["index"], chunk=20_000,
                    **{k: v for k, v in BIG_TIME_JOIN.items()
                       if k not in ("window", "predicate", "index")})
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
    assert "--memory-limit" in e.value.details()
    assert "unknown subwindow" not in e.value.details()


def test_a_lost_single_replica_join_is_data_loss(events):
    with start_cluster(2, manager_args=["--replicas", "1", "--worker-timeout", "30"]) as c, \
            Client(c.address) as cl:
        jid = cl.open("count:200,200", "eq", "bisort", subwindow_size=40, partitions=4,
                      batch_size=32)
        sess = cl.session(jid)
        sess.send(1, _chunk(events, 0, 600))
        c.workers[0].kill()
        with pytest.raises(grpc.RpcError) as e:
            sess.send(2, _chunk(events, 600, 1200))
        sess.close()
    assert e.value.code() == grpc.StatusCode.DATA_LOSS, e.value.details()
    assert "--replicas 2" in e.value.details()


def _panjoin(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "panjoin.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def event_file(tmp_path_factory, events):
    from panjoin.events import write_events

    path = tmp_path_factory.mktemp("ev") / "events.parquet"
    write_events(events, path)
    return path


def test_the_cli_answers_a_grpc_error_with_one_line_and_exit_1(tmp_path):
    from panjoin.events import write_events

    path = tmp_path / "big.parquet"
    write_events(generate(120_000, "uniform", key_min=0, key_max=1000, rate=100_000, seed=3),
                 path)
    with start_cluster(1, worker_args=[SMALL_BUDGET]) as c:
        p = _panjoin("replay", str(path), "--cluster", c.address, "--window",
                     BIG_TIME_JOIN["window"], "--predicate", "eq", "--index", "rap",
                     "--subwindow-size", "1024", "--partitions", "1024", "--batch-size",
                     "4096", "--chunk", "20000", "--out", str(tmp_path / "p.parquet"),
                     "--no-progress")
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("panjoin replay: RESOURCE_EXHAUSTED: "), lines[0]
    assert "--memory-limit" in lines[0]


# (mode's flags, the flag it would ignore, what the error says)
IGNORED = [
    (["--cluster", "127.0.0.1:1"], ["--topology", "ring"], "manager's setting"),
    (["--cluster", "127.0.0.1:1"], ["--fifo", "4"], "manager's setting"),
    (["--cluster", "127.0.0.1:1"], ["--segment", "sorted"], "manager's setting"),
    (["--cluster", "127.0.0.1:1"], ["--replicas", "1"], "manager's setting"),
    (["--cluster", "127.0.0.1:1"], ["--threads", "2"], "workers' setting"),
    (["--topology", "handshake"], ["--index", "rap"], "--segment"),
    (["--topology", "handshake"], ["--result-format", "ranges"], "answers with pairs"),
    (["--topology", "handshake"], ["--replicas", "1"], "no failover"),
    (["--workers", "2"], ["--fifo", "4"], "add --topology handshake"),
]


@pytest.mark.parametrize("mode,flag,why", IGNORED, ids=[" ".join(m[:1] + f) for m, f, _ in IGNORED])
def test_a_flag_the_mode_would_ignore_is_an_error(event_file, tmp_path, mode, flag, why):
    p = _panjoin("replay", str(event_file), "--window", "count:100,100", "--predicate", "eq",
                 "--out", str(tmp_path / "p.parquet"), "--no-progress", *mode, *flag)
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr
    assert flag[0] in p.stderr and why in p.stderr, p.stderr
    assert not (tmp_path / "p.parquet").exists()


PIPELINE = ["pipeline", "--bootstrap-servers", "127.0.0.1:1", "--manager", "127.0.0.1:1",
            "--checkpoint", "ckpt", "--window", "time:100,100", "--predicate", "eq"]


def test_pipeline_threads_is_an_error_and_max_lag_goes_to_the_join():
    from panjoin.cli.main import parse
    from spark_conn.cli import config_from_args, job_argv

    p = _panjoin(*PIPELINE, "--threads", "2")
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and "--threads is the workers' setting" in p.stderr
    cfg = config_from_args(parse([*PIPELINE, "--max-lag", "64"]))
    assert cfg.open_settings()["max_lag"] == 64
    assert config_from_args(parse(["pipeline", *job_argv(cfg)])) == cfg
