"""The memory a process may use (its cgroup's limit, the host's MemAvailable), the
in-process engine's refusal of a window that does not fit, and a worker's default
budget under a real cgroup memory limit (issue 28, item 3)."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from panjoin.bench.hosts import Hosts, unsupported
from panjoin.limits import MEMORY_SHARE, WindowTooLarge
from panjoin.manager.engine import JoinEngine
from panjoin.memory import cgroup_memory, memory_budget

WHY = unsupported()
needs_hosts = pytest.mark.skipif(WHY is not None, reason=f"no emulated hosts here: {WHY}")
MIB = 1 << 20

V1 = "32 31 0:29 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"


def test_the_group_with_the_least_left_wins_over_its_ancestors():
    files = {"/sys/fs/cgroup/memory/a/memory.limit_in_bytes": str(1024 * MIB),
             "/sys/fs/cgroup/memory/a/memory.usage_in_bytes": str(900 * MIB),
             "/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes": str(512 * MIB),
             "/sys/fs/cgroup/memory/a/b/memory.usage_in_bytes": str(100 * MIB)}
    m = cgroup_memory("4:memory:/a/b\n", V1, files.get)
    # b has 412 MiB left, but its parent a only 124 MiB: a's limit binds b too
    assert m.left == 124 * MIB and m.source.endswith("/a/memory.limit_in_bytes")
    # a container's view: the hierarchy mounted from its own group, paths below it
    inner = "32 31 0:29 /a /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    got = cgroup_memory("4:memory:/a/b\n", inner, {
        "/sys/fs/cgroup/memory/b/memory.limit_in_bytes": str(64 * MIB),
        "/sys/fs/cgroup/memory/b/memory.usage_in_bytes": "0"}.get)
    assert got.limit == 64 * MIB
    assert cgroup_memory("4:memory:/a\n", V1, {}.get) is None  # no files: no limit
    assert cgroup_memory("4:memory:/a\n", V1, {
        "/sys/fs/cgroup/memory/a/memory.limit_in_bytes": "9223372036854771712"}.get) is None


def test_the_budget_is_at_most_what_the_host_has_available():
    b = memory_budget()
    assert 0 < b.left <= b.available and "MemAvailable" in b.why


def test_the_engine_refuses_a_count_window_that_does_not_fit_before_it_starts():
    # window_tuples: the most the window will hold (a replay knows it from its file)
    with pytest.raises(WindowTooLarge) as e:
        JoinEngine("count:1000000,1000000", "eq", index="bisort", memory_limit=10 * MIB,
                   window_tuples=1_000_000)
    msg = str(e.value)
    # the numbers and the ways out
    assert "needs about" in msg and "10.0 MiB" in msg
    assert "--memory-limit" in msg and "--workers" in msg and "smaller window" in msg
    JoinEngine("count:1000000,1000000", "eq", index="bisort", memory_limit=1 << 30,
               window_tuples=1_000_000)
    # a count window larger than its input holds only the input (here one subwindow a
    # stream, about 50 MiB, against 110 MiB full): not refused
    with pytest.raises(WindowTooLarge):
        JoinEngine("count:1000000,1000000", "eq", index="bisort", memory_limit=80 * MIB,
                   window_tuples=1_000_000)
    JoinEngine("count:1000000,1000000", "eq", index="bisort", memory_limit=80 * MIB,
               window_tuples=10_000)
    # a time window of a known rate: estimated at construction too
    with pytest.raises(WindowTooLarge):
        JoinEngine("time:1000,1000", "eq", index="bisort", memory_limit=10 * MIB,
                   window_tuples=1_000_000)


@pytest.mark.parametrize("window", ["time:1000000,1000000", "count:1000000,1000000"])
def test_a_window_of_unknown_size_is_refused_as_it_fills(window):
    # no window_tuples: a stream of unknown length (the API); a count window of 2^40 over
    # a few tuples is fine, so the check waits for the subwindows
    eng = JoinEngine(window, "eq", index="bisort", memory_limit=3 * MIB,
                     subwindow_size=4096, batch_size=1024)
    with pytest.raises(WindowTooLarge, match="subwindow"):
        for i in range(0, 400_000, 1024):
            m = np.arange(i, i + 1024)
            eng.push_arrays((m % 2).astype(np.uint8), m, m % 100, m)
    # refused before the subwindow that would pass the limit was made
    assert 0 < eng.memory_bytes() <= 3 * MIB


def _events(tmp_path, n=200_000):
    from panjoin.events import write_events
    from panjoin.generate import generate

    path = tmp_path / "ev.parquet"
    write_events(generate(n, "uniform", key_min=0, key_max=n, seed=1), str(path))
    return str(path)


def _replay(events, out, *extra, host=None):
    from panjoin.launch import command

    return subprocess.run(command(["replay", events, "--window", "count:100000,100000",
                                   "--predicate", "eq", "--index", "bisort", "--out", out,
                                   "--no-progress", *extra], host=host),
                          capture_output=True, text=True, timeout=600)


def test_replay_refuses_with_an_explicit_limit_and_writes_nothing(tmp_path):
    out = tmp_path / "pairs.parquet"
    p = _replay(_events(tmp_path), str(out), "--memory-limit", "1M")
    assert p.returncode == 2, p.stderr[-2000:]
    assert "needs about" in p.stderr and "1.0 MiB" in p.stderr and not out.exists()
    ok = _replay(_events(tmp_path), str(out), "--memory-limit", "1G")
    assert ok.returncode == 0 and out.exists(), ok.stderr[-2000:]


@needs_hosts
def test_replay_under_a_real_cgroup_limit_is_refused_not_oom_killed(tmp_path):
    # subwindows of 16M tuples (about 3.3 GiB for the two the file starts); the window
    # holds only the file's 100K a stream, but each subwindow is made at its capacity
    events = _events(tmp_path)
    big = ["--window", "count:20000000,20000000", "--subwindow-size", "16M"]
    with Hosts(memory_mib=400) as hs:
        h = hs.new("small")
        p = _replay(events, str(tmp_path / "p.parquet"), *big, host=h)
        assert p.returncode == 2, p.stderr[-2000:]
        # the budget is what the 400 MiB group leaves, not the host's MemAvailable
        may = re.search(r"may use ([0-9.]+) (\w+)", p.stderr)
        assert may and may.group(2) == "MiB" and float(may.group(1)) < 400, p.stderr
        assert h.oom_kills() == 0


@needs_hosts
def test_a_worker_default_budget_follows_its_cgroup_limit():
    import grpc

    from panjoin.launch import start_workers
    from panjoin.proto.panjoin.v1 import worker_pb2, worker_pb2_grpc

    with Hosts(memory_mib=600) as hs:
        ws = start_workers(1, hosts=[hs.new("w")])
        try:
            with grpc.insecure_channel(ws[0].address) as ch:
                st = worker_pb2_grpc.WorkerStub(ch).Status(worker_pb2.StatusRequest(),
                                                           timeout=60)
        finally:
            for w in ws:
                w.stop()
    # 80% of what the 600 MiB group had left once the worker was up (its interpreter
    # and libraries hold some of it), never the host's gigabytes
    assert 0 < st.memory_limit <= MEMORY_SHARE * 600 * MIB


def test_without_a_limit_a_worker_budget_is_a_share_of_the_host():
    code = ("from panjoin.limits import default_memory_limit as d; "
            "from panjoin.memory import memory_budget as b; print(d(), b().left)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True)
    d, left = map(int, p.stdout.split())
    assert abs(d - MEMORY_SHARE * left) < 0.05 * left  # MemAvailable moves a little
