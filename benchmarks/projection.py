"""A model, not a measurement: the scale-out run's per-tuple costs projected to real hosts.

``python -m benchmarks.scale_out --project benchmarks/results/scale_out.json`` (issue 28,
item 5). From a saved run of :mod:`benchmarks.scale_out`, per workload, at the largest
N measured: the CPU-seconds a tuple costs the manager (``m``), all workers together
(``w``) and the client (``c``), and the bytes a tuple puts on the wire (``b``: every
process's IP octets received, which on a real network all cross a manager's link, one
way or the other). On ``H`` real hosts of one core each (one process a host: the
manager and the client are single-threaded Python), with ``K`` managers (key-range
shards, each with its own client), ``N = H - K`` workers and links of ``L`` bytes/s
(full duplex, so ``2 L`` a link)::

    throughput = min(K / m,        every manager's core
                     N / w,        the workers' cores
                     K / c,        every client's core
                     K * 2 L / b)  every manager's link

and the limit named is the term that gives the minimum. Assumptions, each optimistic
or pessimistic as marked: the per-tuple costs stay those measured at the largest N
(optimistic where they still grew with N: every batch probes every worker holding
the other stream, so per-command costs grow with N unless batches grow with it);
K managers split the work evenly with no cost of their own for the split (optimistic:
a band join replicates the tuples within E of a shard boundary); the client's cost is
a data source's (a Kafka pipeline on hosts of its own, not counted in H).

Example: m = 0.5 us, w = 0.9 us, c = 0.2 us, b = 170 B, H = 8, 1 Gbit/s (L = 125 MB/s):
one manager gives min(2.0M, 7.8M, 5.0M, 1.47M) = 1.47M tuples/s, the link's limit;
K = 2 (N = 6) gives min(4.0M, 6.7M, 10M, 2.9M) = 2.9M tuples/s, the links' again.
"""

from __future__ import annotations

import json

HOSTS = (8, 32, 128)
LINKS = {"1 Gbit/s": 125e6, "10 Gbit/s": 1.25e9}


def costs(rec: dict) -> dict:
    """Per-tuple costs of one workload's record (a scale_out.json entry), at its
    largest N that ran: seconds of CPU (m, w, c), wire bytes (b), and the in-process
    engine's seconds a tuple at the same quota (for comparison)."""
    n_tuples = rec["workload"]["tuples"]
    ok = [r for r in rec["cluster"] if "error" not in r]
    top = max(ok, key=lambda r: r["n"])
    hs = top["hosts"]
    return {"n": top["n"],
            "m": hs["manager"]["cpu_s"] / n_tuples,
            "w": sum(v["cpu_s"] for k, v in hs.items() if k.startswith("worker")) / n_tuples,
            "c": hs["client"]["cpu_s"] / n_tuples,
            "b": top["wire_b_per_tuple"],
            "local": rec["in_process"]["hosts"]["in-process"]["cpu_s"] / n_tuples}


def throughput(cost: dict, hosts: int, k: int, link: float) -> tuple[float, str]:
    """Tuples a second on ``hosts`` one-core hosts with ``k`` managers, links of ``link``
    bytes/s; and which term limits it."""
    n = hosts - k
    if n < 1:
        raise ValueError(f"{hosts} hosts leave no worker beside {k} managers")
    terms = {"manager": k / cost["m"], "workers": n / cost["w"], "client": k / cost["c"],
             "network": k * 2 * link / cost["b"] if cost["b"] > 0 else float("inf")}
    lim = min(terms, key=terms.get)
    return terms[lim], lim


def best_k(cost: dict, hosts: int, link: float) -> tuple[int, float, str]:
    """The number of managers (1 .. hosts/2) that gives the most throughput."""
    return max(((k, *throughput(cost, hosts, k, link)) for k in range(1, hosts // 2 + 1)),
               key=lambda t: t[1])


def table(recs: list[dict]) -> str:
    lines = ["**A model, not a measurement** (benchmarks/projection.py: "
             "min(K/m, N/w, K/c, K 2L/b) over one-core hosts)", "",
             "| workload | per tuple: m / w / c us, b B (at N) | hosts | link | one manager: "
             "M tuples/s (limit) | K managers: K, M tuples/s (limit) |",
             "|---|---|---:|---|---|---|"]
    for rec in recs:
        cost = costs(rec)
        head = (f"{cost['m'] * 1e6:.2f} / {cost['w'] * 1e6:.2f} / {cost['c'] * 1e6:.2f}, "
                f"{cost['b']:.0f} (N = {cost['n']})")
        for h in HOSTS:
            for name, link in LINKS.items():
                t1, l1 = throughput(cost, h, 1, link)
                k, tk, lk = best_k(cost, h, link)
                lines.append(f"| {rec['workload']['name']} | {head} | {h} | {name} | "
                             f"{t1 / 1e6:.2f} ({l1}) | {k}, {tk / 1e6:.2f} ({lk}) |")
                head = ""
    return "\n".join(lines)


def main(path: str) -> int:
    with open(path) as f:
        recs = json.load(f)
    print(table(recs))
    return 0
