"""panjoin.cpus: the default thread count from the affinity mask and the cgroup quota.

The parsing runs on file texts (v1, v2, "max", nested groups, a container's mount
root, missing files); the real reading runs in subprocesses placed in real v1
cgroups with CPU quotas (panjoin.bench.hosts) and under taskset.
"""

from __future__ import annotations

import doctest
import os
import shutil
import subprocess
import sys

import pytest

import panjoin.cpus as cpus_mod
from panjoin.bench.hosts import Hosts, unsupported
from panjoin.cpus import Quota, cgroup_quota, threads_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

V1 = ("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
      "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
      "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
V2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def v1_files(groups: dict[str, tuple[int, int]], base="/sys/fs/cgroup/cpu,cpuacct"):
    out = {}
    for g, (q, p) in groups.items():
        d = base + g.rstrip("/")
        out[d + "/cpu.cfs_quota_us"] = f"{q}\n"
        out[d + "/cpu.cfs_period_us"] = f"{p}\n"
    return out


def test_doctests():
    assert doctest.testmod(cpus_mod).failed == 0


def test_rounding_up():
    assert threads_for(2, 0.25) == 1
    assert threads_for(2, 1.5) == 2
    assert threads_for(4, 1.0) == 1
    assert threads_for(4, 2.01) == 3
    assert threads_for(2, 16.0) == 2  # the affinity caps it
    assert threads_for(0, None) == 1
    assert threads_for(3, None) == 3


def test_v1_combined_controllers_and_no_quota():
    pc = "4:memory:/x\n2:cpu,cpuacct:/\n"
    assert cgroup_quota(pc, V1, v1_files({"/": (-1, 100000)}).get) is None
    got = cgroup_quota("2:cpu,cpuacct:/job\n", V1,
                       v1_files({"/": (-1, 100000), "/job": (25000, 100000)}).get)
    assert got == Quota(0.25, "/sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_quota_us")


def test_v1_nested_parent_limits():
    files = v1_files({"/": (-1, 100000), "/a": (150000, 100000), "/a/b": (-1, 100000),
                      "/a/b/c": (400000, 100000)})
    got = cgroup_quota("2:cpu,cpuacct:/a/b/c\n", V1, files.get)
    assert got.cores == 1.5 and got.source.endswith("/a/cpu.cfs_quota_us")
    # and the child's own when it is the smaller one, whatever the periods
    files.update(v1_files({"/a/b/c": (5000, 10000)}))
    assert cgroup_quota("2:cpu,cpuacct:/a/b/c\n", V1, files.get).cores == 0.5


def test_v2_max_nested_and_hybrid():
    files = {"/sys/fs/cgroup/cpu.max": "max 100000\n",
             "/sys/fs/cgroup/a/cpu.max": "max 100000\n",
             "/sys/fs/cgroup/a/b/cpu.max": "max 100000\n"}
    assert cgroup_quota("0::/a/b\n", V2, files.get) is None
    files["/sys/fs/cgroup/a/cpu.max"] = "150000 100000\n"
    assert cgroup_quota("0::/a/b\n", V2, files.get) == Quota(1.5, "/sys/fs/cgroup/a/cpu.max")
    # hybrid: a v1 cpu quota and a v2 group without cpu.max (no controller there)
    got = cgroup_quota("2:cpu,cpuacct:/j\n0::/j\n", V1, v1_files({"/j": (50000, 100000)}).get)
    assert got.cores == 0.5


def test_container_mount_root():
    # a container sees its own group mounted as the hierarchy's root
    mi = "50 40 0:29 /docker/abc /sys/fs/cgroup/cpu ro - cgroup cgroup rw,cpu\n"
    files = v1_files({"/": (200000, 100000)}, base="/sys/fs/cgroup/cpu")
    assert cgroup_quota("3:cpu:/docker/abc\n", mi, files.get).cores == 2.0
    # a group outside the mount's root cannot be read: no limit known
    assert cgroup_quota("3:cpu:/other\n", mi, files.get) is None


def test_missing_and_garbage():
    assert cgroup_quota("", "", {}.get) is None
    assert cgroup_quota("2:cpu,cpuacct:/j\n", V1, {}.get) is None  # files missing
    bad = {"/sys/fs/cgroup/cpu,cpuacct/j/cpu.cfs_quota_us": "junk\n",
           "/sys/fs/cgroup/cpu,cpuacct/j/cpu.cfs_period_us": "0\n"}
    assert cgroup_quota("2:cpu,cpuacct:/j\n", V1, bad.get) is None
    assert cgroup_quota("0::/\n", V2, {"/sys/fs/cgroup/cpu.max": "\n"}.get) is None
    # a path with a space, escaped in mountinfo
    mi = r"32 31 0:29 / /mnt/cg\040x rw - cgroup cgroup rw,cpu" + "\n"
    files = v1_files({"/": (100000, 100000)}, base="/mnt/cg x")
    assert cgroup_quota("1:cpu:/\n", mi, files.get).cores == 1.0


def test_panjoin_threads_env_wins(monkeypatch):
    from panjoin.config import default_threads, thread_budget

    monkeypatch.setenv("PANJOIN_THREADS", "3")
    assert default_threads() == 3 and "PANJOIN_THREADS" in thread_budget()[1]
    monkeypatch.delenv("PANJOIN_THREADS")
    assert default_threads() == cpus_mod.available_cpus()


# ------------------------------------------------------------------ real cgroups

PRINT = "from panjoin.cpus import available_cpus; print(available_cpus())"


def _run(cmd: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("PANJOIN_THREADS", None)
    return subprocess.run(cmd, capture_output=True, text=True, check=True, env=env,
                          timeout=120).stdout.strip()


def test_real_affinity():
    assert _run([sys.executable, "-c", PRINT]) == str(len(os.sched_getaffinity(0)))


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset (util-linux) is missing")
def test_real_taskset_one_cpu():
    cpu = min(os.sched_getaffinity(0))
    assert _run(["taskset", "-c", str(cpu), sys.executable, "-c", PRINT]) == "1"


WHY = unsupported()


@pytest.mark.skipif(WHY is not None, reason=f"no cgroups with CPU quotas here: {WHY}")
@pytest.mark.parametrize("quota,expect", [(0.25, 1), (1.5, 2), (None, None)])
def test_real_cgroup_quota(quota, expect):
    n = len(os.sched_getaffinity(0))
    if expect is not None and n < expect:
        pytest.skip(f"a {quota}-core quota needs {expect} CPUs in the affinity, have {n}")
    with Hosts(quota=quota) as hosts:
        h = hosts.new("probe")
        out = _run(h.wrap([sys.executable, "-c", PRINT]))
    assert out == str(expect if expect is not None else n)


@pytest.mark.skipif(WHY is not None, reason=f"no cgroups with CPU quotas here: {WHY}")
def test_real_nested_parent_quota():
    # the quota on the parent group only: the child inherits the limit
    with Hosts() as hosts:
        h = hosts.new("child")
        parent = os.path.dirname(h.dirs["cpu"])
        with open(os.path.join(parent, "cpu.cfs_period_us")) as f:
            period = int(f.read())
        with open(os.path.join(parent, "cpu.cfs_quota_us"), "w") as f:
            f.write(str(period // 4))
        try:
            out = _run(h.wrap([sys.executable, "-c", PRINT]))
        finally:
            # the parent's quota must not outlive it (removing the group drops it anyway)
            with open(os.path.join(parent, "cpu.cfs_quota_us"), "w") as f:
                f.write("-1")
    assert out == "1"


def test_a_file_join_lets_openmp_threads_sleep_a_stream_with_a_bound_does_not(
        tmp_path, monkeypatch):
    """``panjoin replay`` of a file without ``--max-latency`` asks Numba's OpenMP threads
    to wait passively (set before its kernels load; a user's own setting kept); with a
    latency bound they keep spinning, so small batches do not wait for a thread to wake."""
    from panjoin.cli.main import main
    from panjoin.config import wait_passively

    ev = tmp_path / "ev.parquet"
    assert main(["gen", str(ev), "--n", "2000", "--no-progress"]) == 0
    replay = ["replay", str(ev), "--window", "count:500,500", "--predicate", "eq",
              "--out", str(tmp_path / "o.parquet"), "--no-progress"]
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert main([*replay, "--max-latency", "5"]) == 0
    assert "OMP_WAIT_POLICY" not in os.environ
    assert main(replay) == 0
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    wait_passively()
    assert main(replay) == 0
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


@pytest.mark.parametrize("cpus,pred,extra,expect", [
    (2, "eq", [], 1),                           # the pairs writer takes the other CPU
    (4, "band:3", [], 3),
    (1, "eq", [], 1),
    (2, "band:2&band2:1", [], 2),               # a residual's probes take them all
    (2, "eq", ["--threads", "2"], 2),           # given: kept
])
def test_a_file_join_leaves_the_pairs_writer_a_cpu(tmp_path, monkeypatch, cpus, pred, extra,
                                                   expect):
    """``panjoin replay`` in process, no --threads: its kernels take every CPU the process
    may use but one (the pairs writer's thread), all of them for a residual, and the
    same pairs as the reference whatever the count; --threads and PANJOIN_THREADS win."""
    import numpy as np

    import panjoin.manager.engine as engine_mod
    from panjoin.cli.main import main
    from panjoin.events import read_events, read_pairs
    from panjoin.reference import reference_join, sort_pairs
    from panjoin.semantics import parse_predicate, parse_window

    ev = tmp_path / "ev.parquet"
    assert main(["gen", str(ev), "--n", "3000", "--key-max", "60", "--key2-max", "4",
                 "--no-progress"]) == 0
    monkeypatch.delenv("PANJOIN_THREADS", raising=False)
    monkeypatch.setattr("panjoin.config.thread_budget", lambda: (cpus, f"{cpus} CPUs"))
    seen = []
    real = engine_mod.JoinEngine.__init__

    def spy(self, *a, **kw):
        seen.append(kw.get("threads"))
        real(self, *a, **kw)

    monkeypatch.setattr(engine_mod.JoinEngine, "__init__", spy)
    out = tmp_path / "o.parquet"
    assert main(["replay", str(ev), "--window", "count:400,300", "--predicate", pred,
                 "--out", str(out), "--no-progress", *extra]) == 0
    assert seen and set(seen) == {expect}  # the warm-up's join and the file's alike
    t = read_events(ev)
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:400,300"),
                         parse_predicate(pred), t.key2)
    assert np.array_equal(sort_pairs(read_pairs(out)), ref.pairs)
    monkeypatch.setenv("PANJOIN_THREADS", "2")
    seen.clear()
    assert main(["replay", str(ev), "--window", "count:400,300", "--predicate", pred,
                 "--out", str(out), "--no-progress", *extra]) == 0
    assert set(seen) == {int(extra[1]) if extra else None}  # the engine reads it itself
