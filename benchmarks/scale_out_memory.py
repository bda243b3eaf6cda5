"""Memory scale-out on emulated hosts (issue 28, item 3): the largest window per N.

``python -m benchmarks.scale_out --memory``. Every host has a memory limit of M MiB
(a cgroup, :mod:`panjoin.bench.hosts`): the in-process replay's one host, and in the
cluster the manager and each of N workers. The client (``panjoin replay --cluster``)
is a host without a limit: it stands for the data source (a Kafka pipeline reads as
it goes), while this replay holds the whole file and every pair. For each of
in-process and N = 1, 2, 4 workers, the largest count window W (per stream) that is
*held*: the replay ends well, no process of a host was OOM-killed, and its pairs are
those of a reference run without limits. Found by doubling W from ``w0`` until a
run is not held, then bisecting (geometric midpoints, rounded to 16K) ``steps``
times. A run that is not held must be a clean refusal (the in-process engine's
``WindowTooLarge`` before it starts, a worker's RESOURCE_EXHAUSTED), never an OOM
kill; the report says which it was.

Workload: equi join, keys uniform in [0, W] (about one partner a tuple), 2.5 W
tuples (each stream fills its window and slides a quarter of it), the replay's
knobs for the file (NSub W up to 512K, W/2 beyond), BI-Sort, chunks of 64K tuples.
Measured at M = 512 MiB (benchmarks/RESULTS.md, issue 28, item 3): in-process holds
W = 1M, one worker 1.25M, two 2.5M, four 3.5M; every larger window was refused before
its join started. A worker's interpreter and libraries take about 110 MB of its host
and its batches in flight some 160 MB (:data:`panjoin.limits.WORKER_IN_FLIGHT`), so
hosts much below 512 MiB hold little window.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

from panjoin.bench.hosts import Hosts
from panjoin.events import write_events
from panjoin.generate import generate
from panjoin.launch import command, start_cluster

GRAIN = 1 << 14


def _say(line: str) -> None:
    print(line, flush=True)


CHUNK = 1 << 16
#: what a clean refusal prints: the engine's WindowTooLarge, a worker's budget
REFUSALS = ("needs about", "RESOURCE_EXHAUSTED", "budget left")


def events_for(w: int, work: str) -> str:
    path = os.path.join(work, f"eq-{w}.parquet")
    if not os.path.exists(path):
        write_events(generate(int(2.5 * w), "uniform", key_min=0, key_max=w, seed=1), path)
    return path


def _replay_args(w: int, events: str, out: str) -> list[str]:
    return ["replay", events, "--window", f"count:{w},{w}", "--predicate", "eq", "--index",
            "bisort", "--chunk", str(CHUNK), "--out", out, "--no-progress"]


def reference(w: int, work: str, cache: dict) -> tuple[int, int]:
    """The pairs of W's file joined in-process without limits (count, checksum)."""
    from benchmarks.scale_out import pairs_digest

    if w not in cache:
        out = os.path.join(work, "ref.parquet")
        subprocess.run(command([*_replay_args(w, events_for(w, work), out), "--memory-limit",
                                str(1 << 40)]), check=True, capture_output=True, timeout=1800)
        cache[w] = pairs_digest(out)
        os.remove(out)
    return cache[w]


def try_window(w: int, n: int, memory_mib: float, quota: float | None, work: str,
               refs: dict) -> dict:
    """One run at window ``w`` on ``n`` workers (0: in-process): held, refused, oom or
    wrong, with each host's peak MiB."""
    from benchmarks.scale_out import pairs_digest

    events, out = events_for(w, work), os.path.join(work, "got.parquet")
    t0 = time.perf_counter()
    with Hosts(quota, memory_mib) as hs:
        if n == 0:
            hosts = {"in-process": hs.new("in-process")}
            p = subprocess.run(command(_replay_args(w, events, out), host=hosts["in-process"]),
                               capture_output=True, text=True, timeout=1800)
        else:
            workers = [hs.new(f"worker{i}") for i in range(n)]
            manager = hs.new("manager")
            client = hs.new("client", memory_mib=1 << 30)  # the data source: see above
            hosts = {"manager": manager, **{f"worker{i}": h for i, h in enumerate(workers)}}
            try:
                with start_cluster(n, 1, hosts=workers, manager_host=manager,
                                   manager_args=["--replicas", "1"]) as c:
                    p = subprocess.run(command([*_replay_args(w, events, out), "--cluster",
                                                c.address], host=client),
                                       capture_output=True, text=True, timeout=1800)
            except Exception as e:  # a host killed while it starts (OOM) ends here
                p = subprocess.CompletedProcess([], 1, "", str(e))
        oom = sum(h.oom_kills() for h in hosts.values())
        peak = {k: round(h.usage()["peak_mib"]) for k, h in hosts.items()}
    rec = {"window": w, "n": n, "seconds": round(time.perf_counter() - t0, 1), "oom": oom,
           "peak_mib": peak, "rc": p.returncode}
    if oom:
        rec["outcome"] = "oom"
    elif p.returncode != 0:
        err = (p.stderr or "").strip().splitlines()
        rec["outcome"] = "refused" if any(r in p.stderr for r in REFUSALS) else "failed"
        rec["error"] = err[-1][:400] if err else ""
    else:
        rec["outcome"] = "held" if pairs_digest(out) == reference(w, work, refs) else "wrong"
    if os.path.exists(out):
        os.remove(out)
    return rec


def largest(n: int, memory_mib: float, quota: float | None, work: str, refs: dict,
            w0: int, steps: int, echo=_say, max_doublings: int = 64) -> dict:
    """Double W from ``w0`` while it is held (at most ``max_doublings`` times; then the
    largest is a lower bound), then bisect ``steps`` times."""
    runs = []

    def run(w):
        r = try_window(w, n, memory_mib, quota, work, refs)
        echo(f"  {'in-process' if n == 0 else f'N={n}'} W={w}: {r['outcome']} "
             f"({r['seconds']} s, peak MiB {r['peak_mib']}"
             + (f", {r['error'][:160]}" if "error" in r else "") + ")")
        runs.append(r)
        return r["outcome"] == "held"

    lo, hi = 0, w0
    while run(hi):
        lo, hi = hi, 2 * hi
        if len(runs) > max_doublings:
            break
    for _ in range(steps):
        if lo == 0:
            break
        mid = int(round(math.sqrt(lo * hi) / GRAIN)) * GRAIN
        if not lo < mid < hi:
            break
        if run(mid):
            lo = mid
        else:
            hi = mid
    first_bad = next((r for r in runs if r["window"] == hi), {"outcome": "not tried"})
    return {"n": n, "largest": lo, "not_held": hi, "why_not": first_bad["outcome"],
            "error": first_bad.get("error", ""),
            "peak_mib": next((r["peak_mib"] for r in runs if r["window"] == lo), {}),
            "runs": runs}


def sweep(ns: list[int], memory_mib: float, quota: float | None, w0: int, steps: int,
          work: str, echo=_say, max_doublings: int = 64) -> dict:
    refs: dict = {}
    out = []
    for n in [0, *ns]:
        echo(f"{'in-process' if n == 0 else f'N = {n}'} at {memory_mib:g} MiB a host:")
        out.append(largest(n, memory_mib, quota, work, refs, w0, steps, echo, max_doublings))
    return {"memory_mib": memory_mib, "quota": quota, "w0": w0, "steps": steps,
            "results": out}


def report(rec: dict) -> str:
    base = rec["results"][0]["largest"] or 1
    lines = [f"memory limit {rec['memory_mib']:g} MiB a host"
             + (f", {rec['quota']:g} core" if rec["quota"] else ""),
             "", "| hosts | largest window held (per stream) | x in-process | next size tried: "
             "outcome | peak MiB at the largest |", "|---|---:|---:|---|---|"]
    for r in rec["results"]:
        name = "in-process" if r["n"] == 0 else f"{r['n']} worker{'s' * (r['n'] > 1)}"
        peaks = ", ".join(f"{k} {v}" for k, v in r["peak_mib"].items())
        lines.append(f"| {name} | {r['largest']:,} | {r['largest'] / base:.1f}x | "
                     f"{r['not_held']:,}: {r['why_not']} | {peaks} |")
    return "\n".join(lines)


def ok(rec: dict) -> bool:
    """Every run that was not held was a clean refusal; in-process's too."""
    return all(r["outcome"] in ("held", "refused") for x in rec["results"] for r in x["runs"])


def main(ns: list[int], memory_mib: float, quota: float | None, w0: int, steps: int,
         out_json: str, max_doublings: int = 64) -> int:
    import json
    import tempfile

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        rec = sweep(ns, memory_mib, quota, w0, steps, work, max_doublings=max_doublings)
    rec["seconds"] = round(time.perf_counter() - t0)
    print(report(rec))
    print(f"({rec['seconds']} s)")
    os.makedirs(os.path.dirname(out_json) or ".", exist_ok=True)
    with open(out_json, "w") as f:
        json.dump(rec, f, indent=1)
    if not ok(rec):
        print("scale_out --memory: a run that was not held was not a clean refusal (OOM "
              "kill, wrong pairs or a failure): see the runs above", file=sys.stderr)
        return 1
    return 0
