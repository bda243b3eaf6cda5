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


def test_a_worker_failure_reaches_the_client_with_its_cause(events):
    # a window of 10^15 tuples: each worker fails to allocate its first subwindow; the
    # probes that follow then name a subwindow the worker does not have
    with start_cluster(2) as c, Client(c.address) as cl:
        with pytest.raises(grpc.RpcError) as e:
            cl.join(events.slice(0, 200), "count:1000000000000000,1000000000000000", "eq")
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
    assert "Unable to allocate" in e.value.details()
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
