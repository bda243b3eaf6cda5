"""Proof of scale on one machine: manager on core 0 + one worker on core 1 vs in-process on core 0.

A user's run, as the CLI does it: ``panjoin replay`` of a generated event file
(uniform keys, count window W per stream, a band join with about one match per
tuple, BI-Sort), in-process with ``--threads 1`` pinned to core 0 (``taskset``),
and through ``panjoin manager`` (core 0, ``--replicas 1``: one worker has no
second host for a backup) over one ``panjoin worker`` (core 1), the client on
core 0 as well. Every process starts cold (kernels load from Numba's disk cache
inside the timed join, on both sides). It reports the join's time as the replay
prints it, throughput, CPU-seconds and peak RSS per process, checks that both
runs wrote the same pairs, and projects the measured per-tuple costs to N
worker hosts.

The projection (a model, not a promise): the worker's CPU per tuple is the
index work, which the ring splits over N workers (each holds 1/N of the
subwindows and probes its own); the manager's per-tuple CPU does not shrink
with N. So one manager core feeds ``min(1/m, N/w)`` tuples/s, m and w their
CPU-s per tuple. The client (here ``panjoin replay``, whose CPU includes
starting Python and reading and writing Parquet) is the user's and scales
apart from the cluster (more Spark tasks, more clients); its own rate is
listed beside.

    python -m benchmarks.scaling --quick       # W = 256K: a minute
    python -m benchmarks.scaling               # W = 1M and 4M
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow.parquet as pq

from panjoin.bench.proc import cpu_seconds, status_mib
from panjoin.events import write_events
from panjoin.generate import band_for_selectivity, generate
from panjoin.launch import pinned, start_cluster
from panjoin.reference import sort_pairs

KEY_MAX = 1 << 40
TIME_RE = re.compile(r"time: ([0-9.]+) s")


def _replay(events: str, w: int, e: int, out: str, extra: list[str],
            cpus: set[int] | None) -> dict:
    """One ``panjoin replay`` (on ``cpus``): its printed join time, CPU-s and peak RSS."""
    cmd = pinned([sys.executable, "-m", "panjoin.cli", "replay", events, "--window",
                  f"count:{w},{w}", "--predicate", f"band:{e}", "--index", "bisort",
                  "--out", out, "--no-progress", *extra], cpus)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, ru = os.wait4(p.pid, 0)
    text = p.stdout.read()
    if status != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.read()[-2000:]}")
    m = TIME_RE.search(text)
    return {"time_s": float(m.group(1)), "cpu_s": ru.ru_utime + ru.ru_stime,
            "rss_mib": ru.ru_maxrss / 1024}


def _pairs(path: str) -> np.ndarray:
    t = pq.read_table(path)
    return sort_pairs(np.stack([t["r_id"].to_numpy(), t["s_id"].to_numpy()], axis=1))


def one_window(w: int, work: str, n: int, config: str = "pinned") -> dict:
    """``config``: "pinned" (manager and client on core 0, one worker on core 1, one
    replica: a single worker has no second host for a backup) or "default" (what
    ``panjoin cluster --workers 2`` starts: unpinned, each subwindow on two workers)."""
    events = os.path.join(work, f"events-{w}.parquet")
    if not os.path.exists(events):
        write_events(generate(n, "uniform", key_min=0, key_max=KEY_MAX, seed=1), events)
    e = int(band_for_selectivity(1.0, w, 0, KEY_MAX))
    pin = config == "pinned"
    local = _replay(events, w, e, os.path.join(work, "local.parquet"), ["--threads", "1"], {0})
    with start_cluster(1 if pin else 2, 1, cpus={1} if pin else None,
                       manager_args=["--replicas", "1" if pin else "2"],
                       manager_cpus={0} if pin else None) as c:
        pids = {"manager": c.manager.proc.pid}
        pids.update({f"worker{i}" if not pin else "worker": x.proc.pid
                     for i, x in enumerate(c.workers)})
        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
        rss0 = {k: status_mib(p, "VmRSS") for k, p in pids.items()}
        client = _replay(events, w, e, os.path.join(work, "cluster.parquet"),
                         ["--cluster", c.address], {0} if pin else None)
        procs = {k: {"cpu_s": cpu_seconds(p) - cpu0[k], "rss_mib": status_mib(p, "VmHWM"),
                     "rss_start_mib": rss0[k]} for k, p in pids.items()}
    same = np.array_equal(_pairs(os.path.join(work, "local.parquet")),
                          _pairs(os.path.join(work, "cluster.parquet")))
    if not pin:  # one line per role in the report: the workers together
        ww = [procs.pop(k) for k in sorted(procs) if k.startswith("worker")]
        procs["worker"] = {"cpu_s": sum(x["cpu_s"] for x in ww),
                           "rss_mib": sum(x["rss_mib"] for x in ww),
                           "rss_start_mib": sum(x["rss_start_mib"] for x in ww)}
    procs["client"] = client
    total = sum(p["cpu_s"] for p in procs.values())
    return {"config": config, "window": w, "tuples": n, "band": e, "same_pairs": bool(same),
            "in_process": {**local, "tuples_per_s": n / local["time_s"]},
            "cluster": {"time_s": client["time_s"], "tuples_per_s": n / client["time_s"],
                        "processes": procs, "cpu_s": total},
            "speedup": local["time_s"] / client["time_s"],
            "cpu_ratio": total / local["cpu_s"],
            "manager_share": procs["manager"]["cpu_s"] / (total - client["cpu_s"])}


def projection(rec: dict, hosts=(1, 2, 4, 8, 16, 32)) -> list[dict]:
    n = rec["tuples"]
    p = rec["cluster"]["processes"]
    m, w = (p[k]["cpu_s"] / n for k in ("manager", "worker"))
    return [{"workers": h, "tuples_per_s": min(1 / m, h / w),
             "bound": min((1 / m, "manager"), (h / w, "workers"))[1]}
            for h in hosts]


def report(recs: list[dict]) -> str:
    lines = ["| cluster | W per stream | tuples | in-process (core 0) | cluster | speedup | "
             "CPU-s in-process | CPU-s manager / workers / client | cluster CPU / in-process "
             "| manager share (of manager + workers) | peak RSS in-process / manager / workers "
             "/ client (MiB) | same pairs |", "|" + "---|" * 12]
    for r in recs:
        p = r["cluster"]["processes"]
        name = ("manager+client core 0, 1 worker core 1" if r["config"] == "pinned"
                else "2 workers, 2 replicas, unpinned")
        lines.append(
            f"| {name} | {r['window']:,} | {r['tuples']:,} | {r['in_process']['time_s']:.2f} s "
            f"({r['in_process']['tuples_per_s'] / 1e6:.2f} M/s) | {r['cluster']['time_s']:.2f} s "
            f"({r['cluster']['tuples_per_s'] / 1e6:.2f} M/s) | {r['speedup']:.2f}x | "
            f"{r['in_process']['cpu_s']:.2f} | {p['manager']['cpu_s']:.2f} / "
            f"{p['worker']['cpu_s']:.2f} / {p['client']['cpu_s']:.2f} | "
            f"{r['cpu_ratio']:.2f}x | {r['manager_share']:.0%} | "
            f"{r['in_process']['rss_mib']:.0f} / "
            f"{p['manager']['rss_mib']:.0f} / {p['worker']['rss_mib']:.0f} / "
            f"{p['client']['rss_mib']:.0f} | {r['same_pairs']} |")
    lines += ["", "Projection of the measured per-tuple CPU to N worker hosts "
              "(one manager; a model):", "",
              "| W | " + " | ".join(f"N={x['workers']}" for x in projection(recs[0]))
              + " | one replay client's own rate |",
              "|---|" + "---|" * (len(projection(recs[0])) + 1)]
    for r in recs:
        if r["config"] != "pinned":
            continue
        c = r["cluster"]["processes"]["client"]["cpu_s"] / r["tuples"]
        lines.append(f"| {r['window']:,} | " + " | ".join(
            f"{x['tuples_per_s'] / 1e6:.1f} M/s ({x['bound']})" for x in projection(r))
            + f" | {1 / c / 1e6:.1f} M/s |")
    return "\n".join(lines)


def plot(recs: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    pinned = [r for r in recs if r["config"] == "pinned"]
    dflt = {r["window"]: r for r in recs if r["config"] != "pinned"}
    x = np.arange(len(pinned))
    a.bar(x - 0.27, [r["in_process"]["tuples_per_s"] / 1e6 for r in pinned], 0.27,
          label="in-process, core 0")
    a.bar(x, [r["cluster"]["tuples_per_s"] / 1e6 for r in pinned], 0.27,
          label="manager core 0 + 1 worker core 1")
    a.bar(x + 0.27, [dflt[r["window"]]["cluster"]["tuples_per_s"] / 1e6
                     if r["window"] in dflt else 0 for r in pinned], 0.27,
          label="2 workers, 2 replicas")
    a.set_xticks(x, [f"W={r['window'] // 1024}K" for r in pinned])
    a.set_ylabel("M tuples/s")
    a.set_title("measured (BI-Sort, band S=1)")
    a.legend()
    for r in pinned:
        pr = projection(r)
        b.plot([p["workers"] for p in pr], [p["tuples_per_s"] / 1e6 for p in pr], "o-",
               label=f"W={r['window'] // 1024}K")
    b.set_xscale("log", base=2)
    b.set_xlabel("worker hosts N")
    b.set_ylabel("M tuples/s (projected)")
    b.set_title("measured per-tuple CPU projected to N hosts")
    b.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)


def rewrite(path: str, plot_path: str) -> None:
    """Report and plot again from a saved run (``--from-json``)."""
    with open(path) as f:
        recs = json.load(f)
    print(report(recs))
    plot(recs, plot_path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="W = 256K only")
    ap.add_argument("--windows", default="1M,4M", help="count windows per stream")
    ap.add_argument("--configs", default="pinned,default",
                    help="pinned: manager core 0 + one worker core 1; default: 2 workers, "
                         "2 replicas, unpinned")
    ap.add_argument("--tuples-per-window", type=int, default=4,
                    help="tuples in the file, in windows (default 4: fill both, then as many)")
    ap.add_argument("--out", default="benchmarks/results/scaling.json")
    ap.add_argument("--plot", default="benchmarks/plots/scaling.png")
    ap.add_argument("--from-json", metavar="FILE", help="report and plot a saved run again")
    args = ap.parse_args(argv)
    if args.from_json:
        rewrite(args.from_json, args.plot)
        return 0
    if len(os.sched_getaffinity(0)) < 2:
        print("scaling: needs two cores (taskset -c 0 and -c 1)", file=sys.stderr)
        return 2
    from panjoin.cli.options import size as _size

    sizes = [1 << 18] if args.quick else [_size(x) for x in args.windows.split(",")]
    recs = []
    with tempfile.TemporaryDirectory() as work:
        for w in sizes:
            for config in args.configs.split(","):
                t0 = time.perf_counter()
                recs.append(one_window(w, work, args.tuples_per_window * w, config))
                print(f"W={w:,} {config}: speedup {recs[-1]['speedup']:.2f}x "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
    print(report(recs))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(recs, f, indent=1)
    plot(recs, args.plot)
    return 0 if all(r["same_pairs"] for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
