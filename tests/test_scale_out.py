"""Emulated hosts (cgroup CPU quota and memory limit per process) and the scale-out
benchmark's quick run (issue 28): real processes, real gRPC, the same pairs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from panjoin.bench.hosts import CONTROLLERS, Hosts, unsupported
from panjoin.bench.lan import Lan
from panjoin.bench.lan import unsupported as lan_unsupported

WHY = unsupported()
needs_hosts = pytest.mark.skipif(WHY is not None, reason=f"no emulated hosts here: {WHY}")

BUSY = "import time\nt = time.time()\nwhile time.time() - t < 1.0: pass"


def _left(parent: str) -> list[str]:
    return [c for c in CONTROLLERS if os.path.exists(f"/sys/fs/cgroup/{c}/{parent}")]


@needs_hosts
def test_a_host_gets_its_cpu_quota_and_is_removed_after():
    with Hosts(quota=0.05) as hs:
        h = hs.new("busy")
        free = hs.new("free", quota=2.0)
        subprocess.run(h.wrap([sys.executable, "-c", BUSY]), check=True)
        subprocess.run(free.wrap([sys.executable, "-c", BUSY]), check=True)
        slow, fast = h.usage(), free.usage()
        parent = hs.parent
        assert _left(parent) == list(CONTROLLERS)
    # one second of wall time at 0.05 core: about 0.05 CPU-s, most of it throttled; the
    # same loop without a quota gets what the machine gives it (at least a few times
    # more, even beside other tests on 2 cores)
    assert 0.01 < slow["cpu_s"] < 0.15 and slow["throttled_s"] > 0.5
    assert fast["cpu_s"] > 2 * slow["cpu_s"] and fast["throttled_s"] < 0.1
    assert _left(parent) == []


@needs_hosts
def test_a_memory_limit_kills_inside_the_host_only():
    with Hosts(memory_mib=96) as hs:
        h = hs.new("small")
        p = subprocess.run(h.wrap([sys.executable, "-c", "b = b'x' * (400 << 20)"]))
        assert p.returncode != 0 and h.oom_kills() >= 1
        ok = subprocess.run(h.wrap([sys.executable, "-c", "b = bytearray(16 << 20)"]))
        assert ok.returncode == 0


@needs_hosts
def test_processes_left_in_a_host_are_moved_out_not_lost():
    with Hosts(quota=1.0) as hs:
        h = hs.new("sleeper")
        p = subprocess.Popen(h.wrap(["sleep", "30"]))
        try:
            for _ in range(100):
                if h.pids():
                    break
                import time
                time.sleep(0.02)
            assert h.pids() == [p.pid]
            parent = hs.parent
        finally:
            hs.close()
            assert _left(parent) == []
            p.kill()
            p.wait()


def test_without_cgroups_it_says_why(tmp_path):
    why = unsupported(str(tmp_path))
    assert why is not None and ("root" in why or "cgroup v1" in why)
    if os.geteuid() == 0:
        with pytest.raises(RuntimeError, match="cgroup v1 'cpu' controller"):
            Hosts(0.5, root=str(tmp_path))
    with pytest.raises((ValueError, RuntimeError)):
        Hosts(quota=0)


@needs_hosts
def test_the_quick_benchmark_gives_the_same_pairs(tmp_path):
    out, png = tmp_path / "so.json", tmp_path / "so.png"
    p = subprocess.run([sys.executable, "-m", "benchmarks.scale_out", "--quick", "--out",
                        str(out), "--plot", str(png)], capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    recs = json.loads(out.read_text())
    assert [r["n"] for r in recs[0]["cluster"]] == [1, 2]
    for r in recs[0]["cluster"]:
        assert r["same_pairs"] and r["speedup"] > 0 and r["wire_b_per_tuple"] > 10
        assert set(r["hosts"]) == {"manager", "client", *(f"worker{i}" for i in range(r["n"]))}
        assert r["bottleneck"] in r["hosts"]
    assert recs[0]["pairs"] > 1000 and png.stat().st_size > 1000
    assert not [d for d in os.listdir("/sys/fs/cgroup/cpu") if d.startswith("panjoin-hosts")]


def _quick(tmp_path, *args):
    """``scale_out --quick ARGS``, exit 0: the process and its JSON records."""
    out, png = tmp_path / "so.json", tmp_path / "so.png"
    p = subprocess.run([sys.executable, "-m", "benchmarks.scale_out", "--quick", *args,
                        "--out", str(out), "--plot", str(png)], capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p, json.loads(out.read_text())


@needs_hosts
def test_two_managers_give_the_same_pairs(tmp_path):
    """--managers 2: each N with one manager and with a join sharded over two."""
    p, recs = _quick(tmp_path, "--managers", "2", "--workers", "2")
    assert recs[0]["workload"]["time_ms"] is not None
    assert [(r["n"], r["managers"]) for r in recs[0]["cluster"]] == [(2, 1), (2, 2)]
    for r in recs[0]["cluster"]:
        assert r["same_pairs"]
    assert set(recs[0]["cluster"][1]["hosts"]) == {"manager", "manager1", "client",
                                                   "worker0", "worker1"}
    assert "2 (K 2)" in p.stdout
    assert not [d for d in os.listdir("/sys/fs/cgroup/cpu") if d.startswith("panjoin-hosts")]


@needs_hosts
def test_both_placements_give_the_same_pairs(tmp_path):
    """--placement both: each N with whole subwindows and with key pieces."""
    p, recs = _quick(tmp_path, "--placement", "both", "--workers", "2")
    assert [(r["n"], r["placement"]) for r in recs[0]["cluster"]] == [(2, "time"), (2, "key")]
    assert all(r["same_pairs"] for r in recs[0]["cluster"])
    assert "| 2 key |" in p.stdout
    assert not [d for d in os.listdir("/sys/fs/cgroup/cpu") if d.startswith("panjoin-hosts")]


def test_managers_refuse_a_count_window_workload():
    p = subprocess.run([sys.executable, "-m", "benchmarks.scale_out", "--managers", "2",
                        "--workloads", "eq-1M"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "needs a time window" in p.stderr, p.stderr


def test_the_pairs_digest_is_order_free_and_sees_a_changed_pair(tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.scale_out import pairs_digest

    r, s = np.arange(1000), np.arange(1000)[::-1].copy()
    perm = np.random.default_rng(1).permutation(1000)
    s2 = s.copy()
    s2[5] += 1
    for name, (a, b, rg) in {"a": (r, s, 100), "b": (r[perm], s[perm], 300),
                             "c": (r, s2, 1000)}.items():
        pq.write_table(pa.table({"r_id": a, "s_id": b}), tmp_path / f"{name}.parquet",
                       row_group_size=rg)
    d = {k: pairs_digest(str(tmp_path / f"{k}.parquet")) for k in "abc"}
    assert d["a"] == d["b"] and d["a"][0] == 1000
    assert d["a"] != d["c"]


@needs_hosts
def test_groups_of_a_killed_run_are_removed_by_the_next():
    from panjoin.bench.hosts import CGROUP

    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid: a run that was killed -9 and left its groups
    stale = [os.path.join(CGROUP, c, f"panjoin-hosts-{dead.pid}") for c in CONTROLLERS]
    for d in stale:
        os.makedirs(os.path.join(d, "worker0"))
    with Hosts(0.5) as hs:
        hs.new("client")
        assert not any(os.path.exists(d) for d in stale)


LAN_WHY = WHY or lan_unsupported(1000.0, 0.0)
needs_lan = pytest.mark.skipif(LAN_WHY is not None, reason=f"no emulated LAN here: {LAN_WHY}")


def _our_netns() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.startswith("pj-")]


@needs_lan
def test_a_host_on_the_lan_sends_at_its_rate_only():
    """Two hosts' namespaces on the bridge, the sender's egress shaped to 40 Mbit/s:
    4 MB between them take at least 0.6 s (unshaped: a few ms), so the bytes really
    cross the emulated link; everything is gone after."""
    recv = ("import socket,sys\ns=socket.socket()\ns.bind((sys.argv[1],5555))\ns.listen()\n"
            "print('up',flush=True)\nc,_=s.accept()\nn=0\n"
            "while (b:=c.recv(1<<16)): n+=len(b)\nprint(n)")
    send = ("import socket,sys,time\nc=socket.create_connection((sys.argv[1],5555))\n"
            "t=time.perf_counter()\nc.sendall(b'x'*(4<<20))\nc.close()\n"
            "print(time.perf_counter()-t)")
    with Hosts() as hs, Lan(rate_mbit=40.0) as lan:
        a, b = hs.new("a"), hs.new("b")
        lan.attach(a)
        lan.attach(b)
        assert a.ip != b.ip and a.netns != b.netns
        r = subprocess.Popen(b.wrap([sys.executable, "-c", recv, b.ip]),
                             stdout=subprocess.PIPE, text=True)
        try:
            assert r.stdout.readline().strip() == "up"
            t0 = time.perf_counter()
            subprocess.run(a.wrap([sys.executable, "-c", send, b.ip]), check=True,
                           capture_output=True, timeout=120)
            got = int(r.stdout.readline())
            took = time.perf_counter() - t0
        finally:
            r.kill()
            r.wait()
        assert got == 4 << 20
        assert took >= 0.6, f"4 MB in {took:.2f} s: faster than 40 Mbit/s, not shaped"
        assert lan.sent_bytes() >= 4 << 20
    assert not _our_netns()


@needs_lan
def test_the_quick_benchmark_on_a_lan_gives_the_same_pairs(tmp_path):
    """--lan: every host in its own namespace, servers off loopback with TLS and the
    manager's token; same pairs, bytes counted on the LAN, nothing left behind."""
    out, png = tmp_path / "so.json", tmp_path / "so.png"
    p = subprocess.run([sys.executable, "-m", "benchmarks.scale_out", "--quick", "--workers",
                        "1", "--workloads", "eq-64K", "--lan", "--lan-delay-ms", "0",
                        "--out", str(out), "--plot", str(png)],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    (run,) = json.loads(out.read_text())[0]["cluster"]
    assert run["same_pairs"] and run["wire_b_per_tuple"] > 10
    assert run["lan"] == {"rate_mbit": 5000.0, "delay_ms": 0.0}  # 10 Gbit/s x Q 0.5
    assert not _our_netns()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "pjb" not in links and "pjv" not in links


@pytest.mark.skipif(WHY is not None or lan_unsupported(1000.0, 0.1) is None,
                    reason="this kernel can delay packets (netem)")
def test_a_delay_without_netem_is_refused_with_the_way_out():
    p = subprocess.run([sys.executable, "-m", "benchmarks.scale_out", "--quick", "--lan"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--lan-delay-ms 0" in p.stderr, p.stderr


@needs_hosts
def test_cluster_args_reach_the_clusters_replay(tmp_path):
    """--cluster-args: flags of the cluster's replays alone, in the records and the table;
    the pairs stay the in-process replay's (which keeps its own knobs)."""
    p, recs = _quick(tmp_path, "--workers", "1", "--cluster-args", "--batch-size 8K")
    [r] = recs[0]["cluster"]
    assert r["cluster_args"] == ["--batch-size", "8K"] and r["same_pairs"]
    assert "| 1 --batch-size 8K |" in p.stdout
    assert not [d for d in os.listdir("/sys/fs/cgroup/cpu") if d.startswith("panjoin-hosts")]


@needs_hosts
def test_cluster_args_are_the_replays_own(tmp_path):
    """A flag the replay does not know fails the cluster's run, which the record says
    (so --cluster-args reach the replay, not a list kept beside it)."""
    out, png = tmp_path / "so.json", tmp_path / "so.png"
    p = subprocess.run([sys.executable, "-m", "benchmarks.scale_out", "--quick", "--workers",
                        "1", "--cluster-args", "--no-such-knob 3", "--out", str(out),
                        "--plot", str(png)], capture_output=True, text=True, timeout=900)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    [r] = json.loads(out.read_text())[0]["cluster"]
    assert "--no-such-knob" in r["error"] and not r["same_pairs"]
    assert r["cluster_args"] == ["--no-such-knob", "3"]
    assert not [d for d in os.listdir("/sys/fs/cgroup/cpu") if d.startswith("panjoin-hosts")]
