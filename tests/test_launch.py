"""Processes started by :mod:`panjoin.launch` die with their starter, even a starter
killed with -9 (a killed test run leaves no worker behind), and report SERVING only
once their kernels are compiled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[1])

PARENT = """
import sys, time
from panjoin.launch import start_cluster
c = start_cluster(2, role=sys.argv[1], manager_args=["--topology", sys.argv[2]])
pids = [w.proc.pid for w in c.workers] + ([c.manager.proc.pid] if c.manager else [])
print(" ".join(map(str, pids)), flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    """Exited (a zombie not yet reaped by whoever inherited it counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("role,topology", [("worker", "ring"), ("handshake-node", "handshake")])
def test_workers_and_manager_die_with_a_parent_killed_with_9(role, topology):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, role, topology],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": ROOT})
    pids = []
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 3, "the parent did not start them"
        assert not any(_gone(p) for p in pids)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(_gone(p) for p in pids), [p for p in pids if not _gone(p)]
    finally:
        parent.kill()
        parent.wait()
        for p in pids:  # the test failed: still no process left behind
            if not _gone(p):
                os.kill(p, signal.SIGKILL)


def test_a_worker_serves_only_once_its_kernels_are_compiled():
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from panjoin.launch import READY, wait_healthy

    p = subprocess.Popen([sys.executable, "-m", "panjoin.cli", "worker", "--port", "0", "-v"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    try:
        address = p.stdout.readline()[len(READY):].strip()
        with grpc.insecure_channel(address) as ch:
            # it listens at once (the launcher learns its port), but runs some 40 small
            # joins before it serves: seconds even on a warm cache
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                     timeout=30)
        assert r.status == health_pb2.HealthCheckResponse.NOT_SERVING
        wait_healthy(address)
    finally:
        p.terminate()
        _, err = p.communicate(timeout=60)
    assert "warm-up: " in err
