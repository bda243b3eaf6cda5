"""Scale-out on emulated hosts (issue 28): does the join's rate grow with its worker hosts?

Every process is an emulated host of ``Q`` cores (:mod:`panjoin.bench.hosts`: a
cgroup v1 CPU quota per process, optionally a memory limit): the client (``panjoin
replay --cluster``), the manager (``panjoin manager --replicas 1``) and each of N
``panjoin worker``s, real processes over real gRPC on loopback; against the same
replay in-process (``--threads 1``) on one host of ``Q`` cores. Every run is warm:
the workers load their kernels in a small join first, and the replay joins the
file's first 20K tuples in a throwaway join before its timed one (``--warm-up``),
in-process and through the manager alike. What is compared is the replay's own
join time (it prints it), on one event file per workload, and the pairs (the same
in every run, or the run fails).

Reported per workload and N: throughput, speedup over in-process, per host the
CPU-seconds, the share of its quota it used over the join (``util``; the
*bottleneck* is the host with the highest), the time it was throttled and its peak
memory (the memory controller's count: RSS and page cache); bytes on the wire per
tuple (this machine's IP octets received, loopback included, from the start of
the timed join to the end of the replay, its writing of the pairs included: keep
the machine otherwise quiet). A plot shows the speedup against N with the ideal line.

With ``--lan`` the hosts do not share loopback: each is a network namespace on a
bridge (:mod:`panjoin.bench.lan`), its egress shaped to ``--lan-gbit`` x Q (a 10
Gbit/s host scaled like its CPU) and delayed by ``--lan-delay-ms`` where the kernel
has netem; the servers listen on their host's address with TLS (a throwaway CA,
:mod:`panjoin.pki`) and the manager's token, as across real hosts; the wire bytes are
what the hosts sent, counted at their veths.

    python -m benchmarks.scale_out --quick     # N = 1, 2 on a small file (CI: checks pairs)
    python -m benchmarks.scale_out             # N = 1, 2, 3, 4, 6 at Q = 0.25, 4 workloads
    python -m benchmarks.scale_out --workloads eq-1M --workers 1,2 --quota 0.5
    python -m benchmarks.scale_out --lan --lan-delay-ms 0 --workloads eq-1M  # a LAN model
    python -m benchmarks.scale_out --memory [--quick]   # item 3: largest window per N
    python -m benchmarks.scale_out --project benchmarks/results/scale_out.json  # item 5
    python -m benchmarks.scale_out --managers 2 --workloads eq-time-1M --workers 4
        # item 4: each N with one manager and with 2 (a join sharded by key over them,
        # `replay --cluster A,B`; each manager its own host, all over the same workers)

It needs root and cgroup v1 (``cpu``, ``cpuacct``, ``memory`` under /sys/fs/cgroup),
refuses with the reason otherwise, and removes every cgroup it made.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq

from panjoin.bench.hosts import Hosts, unsupported
from panjoin.bench.lan import Lan
from panjoin.bench.lan import unsupported as lan_unsupported
from panjoin.cli.options import size
from panjoin.cli.replay import WARMED
from panjoin.events import write_events
from panjoin.generate import band_for_selectivity, generate
from panjoin.launch import command, start_cluster, start_manager
from panjoin.pki import make_pki
from panjoin.security import use

TIME_RE = re.compile(r"time: ([0-9.]+) s")
CPU_RE = re.compile(r"cpu: ([0-9.]+) s in the join")
KEY_MAX = 1 << 40


@dataclass(frozen=True)
class Workload:
    name: str
    window: int  # count window per stream
    tuples: int  # in the file
    predicate: str
    key_min: int = 0
    key_max: int = KEY_MAX
    key2_max: float | None = None  # a residual on key2 (the 2-D band join)
    #: a time window of this many ms instead of the count window (``window`` is then
    #: about the tuples per stream it holds at ``rate``)
    time_ms: int | None = None
    rate: float = 1_000_000.0  # tuples/s of event time, both streams together
    #: NSub for every run (in-process, one manager, K managers alike); None: the replay's
    subwindow: int | None = None

    @property
    def window_spec(self) -> str:
        if self.time_ms is not None:
            return f"time:{self.time_ms},{self.time_ms}"
        return f"count:{self.window},{self.window}"

    def events(self, seed: int = 1):
        return generate(self.tuples, "uniform", key_min=self.key_min, key_max=self.key_max,
                        key2_max=self.key2_max, seed=seed, rate=self.rate)


def time_workload(name: str, window: int, tuples: int, key_max: int) -> Workload:
    """An equi join on a time window holding about ``window`` tuples per stream (what
    shards over several managers): 1M tuples/s, half of them per stream."""
    # NSub W/4, so that a K-th of a short file still makes subwindows on every worker
    return Workload(name, window, tuples, "eq", key_max=key_max,
                    time_ms=int(window * 1000 / 500_000), subwindow=window // 4)


def workloads(quick: bool = False) -> dict[str, Workload]:
    if quick:
        return {"eq-64K": Workload("eq-64K", 1 << 16, 1 << 18, "eq", key_max=1 << 16),
                "eq-time-64K": time_workload("eq-time-64K", 1 << 16, 1 << 18, 1 << 16)}
    m = 1 << 20
    e64 = int(band_for_selectivity(64, m, 0, KEY_MAX))
    return {
        # equi join, about one partner per tuple (W distinct keys)
        "eq-1M": Workload("eq-1M", m, 4 * m, "eq", key_max=m),
        "eq-4M": Workload("eq-4M", 4 * m, 12 * m, "eq", key_max=4 * m),
        # band join, 64 partners per tuple: result-heavy
        "band64-1M": Workload("band64-1M", m, 3 * m, f"band:{e64}"),
        # the handshake paper's 2-D band join: 21 x-candidates in 10^4 per window
        # tuple, 21 in 10^4 of those pass y: much probing, few pairs
        "band2d-256K": Workload("band2d-256K", m // 4, m, "band:10&band2:10", key_min=1,
                                key_max=10_000, key2_max=10_000.0),
        # the equi join on a time window: what shards over K managers (--managers)
        "eq-time-1M": time_workload("eq-time-1M", m, 4 * m, m),
    }


def ip_octets_in() -> int:
    """This machine's IP octets received (loopback included), from /proc/net/netstat."""
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for a, b in zip(lines, lines[1:], strict=False):
        if a.startswith("IpExt:") and b.startswith("IpExt:"):
            return int(dict(zip(a.split()[1:], b.split()[1:], strict=True))["InOctets"])
    return 0


def _replay(wl: Workload, events: str, out: str, host, extra: list[str], hosts: dict,
            wire=ip_octets_in) -> tuple[float, float, int]:
    """One warm ``panjoin replay`` in ``host``: its printed join time and its own CPU
    time in the join (its start, the file and the warm-up are outside both), in s, and
    the bytes on the wire meanwhile (``wire()``: a counter; this machine's IP octets
    received, or an emulated LAN's bytes sent). ``hosts`` start counting when the
    replay says its timed join starts."""
    net0 = None
    cmd = command(["replay", events, "--window", wl.window_spec,
                   "--predicate", wl.predicate, "--index", "bisort",
                   "--warm-up", "--out", out, "--no-progress", *extra,
                   *(["--subwindow-size", str(wl.subwindow)] if wl.subwindow else [])],
                  host=host)
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        text = []
        for line in p.stdout:
            text.append(line)
            if line.startswith(WARMED):
                for h in hosts.values():
                    h.mark()
                net0 = wire()
        if p.wait() != 0:
            err.seek(0)
            raise RuntimeError(f"replay failed ({p.returncode}): {err.read()[-3000:]}")
    net = wire() - net0
    out = "".join(text)
    return float(TIME_RE.search(out).group(1)), float(CPU_RE.search(out).group(1)), net


def pairs_digest(path: str) -> tuple[int, int]:
    """(count, order-free checksum) of the pairs in a result file, read a row group at a
    time: a band join of 64 partners a tuple writes hundreds of millions of pairs, too
    many to sort for a comparison. The checksum sums a mixed 64-bit hash per pair."""
    f = pq.ParquetFile(path)
    n, acc = 0, np.uint64(0)
    with np.errstate(over="ignore"):
        for i in range(f.num_row_groups):
            t = f.read_row_group(i, columns=["r_id", "s_id"])
            r = t["r_id"].to_numpy().astype(np.uint64)
            s = t["s_id"].to_numpy().astype(np.uint64)
            h = r * np.uint64(0x9E3779B97F4A7C15) ^ (s + np.uint64(0x632BE59BD9B4E019))
            h ^= h >> np.uint64(31)
            h *= np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(29)
            acc += h.sum(dtype=np.uint64)
            n += len(r)
    return n, int(acc)


def _hosts_report(hosts: dict, seconds: float, quota: float, join_cpu: dict) -> dict:
    """Per host: CPU-s (the cgroup's count; for the replay's host its own count over
    the join, ``join_cpu``), throttled s, peak MiB, and ``util``, the share of its quota
    it used over the join."""
    out = {}
    for name, h in hosts.items():
        u = h.usage()
        if name in join_cpu:
            u["process_cpu_s"] = u["cpu_s"]  # with its start, the file and the warm-up
            u["cpu_s"] = join_cpu[name]
        u["util"] = u["cpu_s"] / (seconds * quota) if seconds > 0 else 0.0
        out[name] = u
    return out


def run_in_process(wl: Workload, events: str, work: str, quota: float,
                   memory_mib: float | None) -> dict:
    with Hosts(quota, memory_mib) as hs:
        h = hs.new("in-process")
        # one thread, as on a host of Q cores (a join on --cluster has no --threads:
        # its workers' is theirs), and one engine: a time window on a host of Q >= 2
        # would otherwise join in Q shards on Q threads
        t, cpu, net = _replay(wl, events, os.path.join(work, "local.parquet"), h,
                              ["--threads", "1", "--shards", "1"], {"in-process": h})
        return {"n": 0, "time_s": t, "tuples_per_s": wl.tuples / t, "wire_b_per_tuple":
                net / wl.tuples,
                "hosts": _hosts_report({"in-process": h}, t, quota, {"in-process": cpu})}


def manager_names(k: int) -> list[str]:
    """The hosts of K managers: ``manager`` (one manager, as always), ``manager1``, ..."""
    return ["manager"] + [f"manager{i}" for i in range(1, k)]


def run_cluster(wl: Workload, n: int, events: str, work: str, quota: float,
                memory_mib: float | None, managers: int = 1, lan: dict | None = None,
                via: str = "workers", placement: str = "time",
                cluster_args: tuple = ()) -> dict:
    """N worker hosts, ``managers`` manager hosts over all of them (more than one: the
    replay shards the join by key over them) and the client's host; with ``lan``
    (``{"rate_mbit": R, "delay_ms": D}``), each host in its own network namespace on
    an emulated LAN (:mod:`panjoin.bench.lan`), its servers on its address with TLS;
    ``via``: where the pairs go to the client (replay's ``--results-via``: straight
    from the workers, or through the manager); ``placement``: the managers'
    ``--placement`` (whole subwindows on workers, or every subwindow cut by key);
    ``cluster_args``: more flags of the cluster's replay (``--batch-size 64K``)."""
    margs = ["--replicas", "1", "--placement", placement]
    with Hosts(quota, memory_mib) as hs, \
            (Lan(**lan) if lan is not None else contextlib.nullcontext()) as net:
        workers = [hs.new(f"worker{i}") for i in range(n)]
        mhosts = {name: hs.new(name) for name in manager_names(managers)}
        client = hs.new("client")
        all_hosts = {**mhosts, **{f"worker{i}": w for i, w in enumerate(workers)},
                     "client": client}
        sec, wire = None, ip_octets_in
        if net is not None:
            for h in all_hosts.values():
                net.attach(h)
            # off loopback: TLS both ways and the manager's token, as on real hosts
            sec = make_pki(work, ips=[net.gateway, *(h.ip for h in all_hosts.values())])
            wire = net.sent_bytes
        with contextlib.ExitStack() as stack:
            c = stack.enter_context(start_cluster(
                n, 1, hosts=workers, worker_args=[["--host", w.ip] for w in workers],
                manager_host=mhosts["manager"], security=sec,
                manager_args=[*margs, "--host", mhosts["manager"].ip]))
            # manager i lists the workers from the (i N / K)-th on: the rings of the K
            # shards, which advance in step, put their newest subwindows on different ones
            more = [start_manager(c.addresses[i * n // managers:] +
                                  c.addresses[:i * n // managers], host=mhosts[name],
                                  args=[*margs, "--host", mhosts[name].ip],
                                  security=sec)
                    for i, name in enumerate(manager_names(managers)) if i > 0]
            for m in more:
                stack.callback(m.stop)
            old = use(sec) if sec is not None else None
            try:
                c.warm_up("bisort")
            finally:
                if old is not None:
                    use(old)
            where = ",".join([c.address, *(m.address for m in more)])
            t, cpu, net_bytes = _replay(
                wl, events, os.path.join(work, f"cluster{n}.parquet"), client,
                ["--cluster", where, "--results-via", via, *cluster_args,
                 *(sec.argv() if sec is not None else [])], all_hosts, wire)
            rep = _hosts_report(all_hosts, t, quota, {"client": cpu})
    return {"n": n, "managers": managers, "placement": placement,
            "cluster_args": list(cluster_args), "time_s": t,
            "tuples_per_s": wl.tuples / t,
            "wire_b_per_tuple": net_bytes / wl.tuples, "hosts": rep, "lan": lan}


def bottleneck(rec: dict) -> str:
    return max(rec["hosts"], key=lambda k: rec["hosts"][k]["util"])


def run_workload(wl: Workload, ns: list[int], quota: float, memory_mib: float | None,
                 work: str, echo=print, managers: int = 1, lan: dict | None = None,
                 via: str = "workers", placements: tuple = ("time",),
                 cluster_args: tuple = ()) -> dict:
    """In-process, then each N (with one manager, and with ``managers`` if more; with
    each of ``placements``, alternated); ``cluster_args``: more flags of the cluster's
    replays (the in-process one keeps replay's own knobs)."""
    events = os.path.join(work, f"{wl.name}.parquet")
    write_events(wl.events(), events)
    local = run_in_process(wl, events, work, quota, memory_mib)
    echo(f"{wl.name}: in-process {local['time_s']:.2f} s "
         f"({local['tuples_per_s'] / 1e6:.2f} M/s)")
    ref = pairs_digest(os.path.join(work, "local.parquet"))
    runs = []
    for n, k, pl in [(n, k, pl) for n in ns for k in sorted({1, managers})
                     for pl in placements]:
        try:
            r = run_cluster(wl, n, events, work, quota, memory_mib, k, lan, via, pl,
                            cluster_args)
        except Exception as e:  # reported, and the sweep goes on
            echo(f"{wl.name}: N={n} K={k} {pl} FAILED: {str(e)[-800:]}")
            runs.append({"n": n, "managers": k, "placement": pl,
                         "cluster_args": list(cluster_args), "error": str(e)[-3000:],
                         "same_pairs": False})
            continue
        r["speedup"] = local["time_s"] / r["time_s"]
        got = os.path.join(work, f"cluster{n}.parquet")
        r["same_pairs"] = pairs_digest(got) == ref
        os.remove(got)
        r["bottleneck"] = bottleneck(r)
        runs.append(r)
        echo(f"{wl.name}: N={n} K={k} {pl} {r['time_s']:.2f} s speedup {r['speedup']:.2f}x "
             f"bottleneck {r['bottleneck']} ({r['hosts'][r['bottleneck']]['util']:.0%} of its "
             f"quota) wire {r['wire_b_per_tuple']:.0f} B/tuple same pairs {r['same_pairs']}")
    return {"workload": wl.__dict__, "quota": quota, "memory_mib": memory_mib,
            "pairs": ref[0], "in_process": local, "cluster": runs}


def report(recs: list[dict]) -> str:
    lines = ["| workload | N | join s | M tuples/s | speedup | ideal 0.75 N | bottleneck "
             "(util) | CPU-s manager / workers (sum) / client | peak MiB manager / worker "
             "(max) / client | wire B/tuple | same pairs |", "|" + "---|" * 11]
    for rec in recs:
        loc = rec["in_process"]
        h = loc["hosts"]["in-process"]
        lines.append(f"| {rec['workload']['name']} | in-process | {loc['time_s']:.2f} | "
                     f"{loc['tuples_per_s'] / 1e6:.2f} | 1x | | in-process ({h['util']:.0%}) | "
                     f"{h['cpu_s']:.1f} | {h['peak_mib']:.0f} | {loc['wire_b_per_tuple']:.0f} "
                     f"| |")
        for r in rec["cluster"]:
            if "error" in r:
                lines.append(f"| {rec['workload']['name']} | {r['n']} | failed: "
                             f"{r['error'].splitlines()[-1][:120]} |" + " |" * 8)
                continue
            hs = r["hosts"]
            ws = [v for k, v in hs.items() if k.startswith("worker")]
            ms = [v for k, v in hs.items() if k.startswith("manager")]
            k = r.get("managers", 1)
            pl = r.get("placement", "time")
            lines.append(
                f"| {rec['workload']['name']} | {r['n']}{f' (K {k})' if k > 1 else ''}"
                f"{' key' if pl == 'key' else ''}"
                f"{' ' + ' '.join(r['cluster_args']) if r.get('cluster_args') else ''} | "
                f"{r['time_s']:.2f} | "
                f"{r['tuples_per_s'] / 1e6:.2f} | {r['speedup']:.2f}x | {0.75 * r['n']:.2f}x | "
                f"{r['bottleneck']} ({hs[r['bottleneck']]['util']:.0%}) | "
                f"{sum(m['cpu_s'] for m in ms):.1f} / {sum(w['cpu_s'] for w in ws):.1f} / "
                f"{hs['client']['cpu_s']:.1f} | {max(m['peak_mib'] for m in ms):.0f} / "
                f"{max(w['peak_mib'] for w in ws):.0f} / {hs['client']['peak_mib']:.0f} | "
                f"{r['wire_b_per_tuple']:.0f} | {r['same_pairs']} |")
    return "\n".join(lines)


def plot(recs: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = max(r["n"] for rec in recs for r in rec["cluster"])
    ax.plot([0, top], [0, top], ":", color="gray", label="ideal (N x)")
    ax.plot([0, top], [0, 0.75 * top], "--", color="gray", alpha=0.6, label="target 0.75 N")
    for rec in recs:
        for k, pl in sorted({(r.get("managers", 1), r.get("placement", "time"))
                             for r in rec["cluster"]}):
            ok = [r for r in rec["cluster"] if "error" not in r and r.get("managers", 1) == k
                  and r.get("placement", "time") == pl]
            ax.plot([r["n"] for r in ok], [r["speedup"] for r in ok], "o-",
                    label=rec["workload"]["name"] + (f", {k} managers" if k > 1 else "")
                    + (", key placement" if pl == "key" else ""))
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xlabel("worker hosts N")
    ax.set_ylabel("speedup over one in-process host")
    q = recs[0]["quota"]
    ax.set_title(f"emulated hosts of {q:g} core each (client, manager, N workers)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="N = 1, 2 on one small equi file (Q 0.5): checks the pairs")
    ap.add_argument("--workers", help="worker hosts to sweep (default: 1,2,3,4,6)")
    ap.add_argument("--quota", type=float, help="cores per host (default: 0.25)")
    ap.add_argument("--memory-mib", type=float, help="memory limit per host (default: none)")
    ap.add_argument("--workloads", help="comma-separated (default: all): " + ", ".join(
        workloads()))
    ap.add_argument("--managers", type=int, default=1, metavar="K",
                    help="also run each N with K managers, a join sharded by key over them "
                         "(time windows only: e.g. --workloads eq-time-1M; default: 1)")
    ap.add_argument("--lan", action="store_true",
                    help="each host in its own network namespace on an emulated LAN (a veth "
                         "on a bridge, its egress shaped by tc; servers on its address with "
                         "TLS and the manager's token), instead of loopback")
    ap.add_argument("--lan-gbit", type=float, default=10.0,
                    help="with --lan: a whole host's link in Gbit/s, scaled by the quota Q "
                         "like its CPU (default: 10, so 2.5 Gbit/s at Q = 0.25)")
    ap.add_argument("--lan-delay-ms", type=float, default=0.1,
                    help="with --lan: one-way delay per host (default: 0.1; needs the "
                         "kernel's netem, else say 0 to model the rate alone)")
    ap.add_argument("--results-via", choices=["workers", "manager"], default="workers",
                    help="where the pairs go to the client (replay's flag): straight from "
                         "the workers (results past the manager) or through the manager "
                         "(default: workers)")
    ap.add_argument("--placement", choices=["time", "key", "both"], default="time",
                    help="the managers' --placement: whole subwindows on workers (time, "
                         "default), every subwindow cut by key over them (key), or each N "
                         "with both, alternated (both)")
    ap.add_argument("--cluster-args", metavar="FLAGS", default="",
                    help="more flags of the cluster's replays, as one string (e.g. "
                         "\"--batch-size 64K\": the cluster's knobs against the in-process "
                         "replay's own; default: none)")
    ap.add_argument("--tuples", type=size, metavar="N",
                    help="the workloads' files of N tuples instead of their own (e.g. 2M: "
                         "a 2-D band join past its window's fill)")
    ap.add_argument("--out", help="JSON of the runs (default: "
                    "benchmarks/results/scale_out[-quick].json)")
    ap.add_argument("--plot", help="PNG (default: benchmarks/plots/scale_out[-quick].png)")
    ap.add_argument("--from-json", metavar="FILE", help="report and plot a saved run again")
    ap.add_argument("--memory", action="store_true",
                    help="item 3: the largest window held per N under --memory-mib a host "
                         "(default 512: a worker's interpreter and libraries take about "
                         "200 of it; --quick: W 128K and 256K only; "
                         "benchmarks/scale_out_memory.py)")
    ap.add_argument("--project", metavar="FROM_JSON",
                    help="item 5: the model's projection to 8-128 hosts from a saved run's "
                         "per-tuple costs (benchmarks/projection.py)")
    args = ap.parse_args(argv)
    if args.project:
        from benchmarks.projection import main as project

        return project(args.project)
    tag = "-quick" if args.quick else ""
    out = args.out or f"benchmarks/results/scale_out{tag}.json"
    png = args.plot or f"benchmarks/plots/scale_out{tag}.png"
    if args.from_json:
        with open(args.from_json) as f:
            recs = json.load(f)
        print(report(recs))
        plot(recs, png)
        return 0
    wls = workloads(args.quick)
    if args.workloads:
        all_wls = {**workloads(), **workloads(True)}
        unknown = [w for w in args.workloads.split(",") if w not in all_wls]
        if unknown:
            ap.error(f"unknown workload(s) {', '.join(unknown)}; choose from "
                     f"{', '.join(all_wls)}")
        wls = {w: all_wls[w] for w in args.workloads.split(",")}
    else:  # the sweep of one manager as before; with several, what shards
        wls = {k: v for k, v in wls.items() if (v.time_ms is not None) == (args.managers > 1)}
    if args.tuples:
        wls = {k: dataclasses.replace(v, tuples=args.tuples) for k, v in wls.items()}
    if args.managers > 1 and any(w.time_ms is None for w in wls.values()):
        ap.error("--managers shards by key, which needs a time window: choose time "
                 "workloads (--workloads " + ",".join(
                     k for k, v in {**workloads(), **workloads(True)}.items()
                     if v.time_ms is not None) + ")")
    why = unsupported()
    if why is not None:
        print(f"scale_out: cannot emulate hosts here: {why}", file=sys.stderr)
        return 2
    if args.memory:
        from benchmarks import scale_out_memory as mem

        return mem.main([int(x) for x in (args.workers or ("1,2" if args.quick else "1,2,4")
                                          ).split(",")],
                        args.memory_mib or 512, args.quota,
                        w0=(1 << 17) if args.quick else (1 << 18),
                        steps=0 if args.quick else 2, max_doublings=1 if args.quick else 64,
                        out_json=args.out or f"benchmarks/results/scale_out_memory{tag}.json")
    ns = [int(x) for x in (args.workers or ("1,2" if args.quick else "1,2,3,4,6")).split(",")]
    quota = args.quota or (0.5 if args.quick else 0.25)
    lan = None
    if args.lan:
        lan = {"rate_mbit": args.lan_gbit * 1000 * quota, "delay_ms": args.lan_delay_ms}
        why = lan_unsupported(**lan)
        if why is not None:
            print(f"scale_out: cannot emulate the LAN here: {why}", file=sys.stderr)
            return 2
    recs = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        for wl in wls.values():
            recs.append(run_workload(wl, ns, quota, args.memory_mib, work,
                                     managers=args.managers, lan=lan, via=args.results_via,
                                     placements=(("time", "key") if args.placement == "both"
                                                 else (args.placement,)),
                                     cluster_args=tuple(shlex.split(args.cluster_args))))
    print(report(recs))
    print(f"({time.perf_counter() - t0:.0f} s)")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(recs, f, indent=1)
    plot(recs, png)
    return 0 if all(r["same_pairs"] for rec in recs for r in rec["cluster"]) else 1


if __name__ == "__main__":
    sys.exit(main())
