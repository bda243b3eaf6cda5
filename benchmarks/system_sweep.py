"""The system benchmark swept over NBat and the three indexes (issue 3).

For each index and batch size: end-to-end input tuples/s of a local cluster
(manager + worker processes over gRPC on 127.0.0.1) and of the in-process
engine on the same data in the same run, for a band join with about one match
per tuple over count windows of W tuples per stream (filled first, untimed).
The ratio in-process / cluster is the cluster's overhead. Raw results go to
``benchmarks/results/system_sweep[-quick].json`` and the plot to
``benchmarks/plots/system_sweep[-quick].png``.

    python -m benchmarks.system_sweep --quick     # W = 1M, 1M timed tuples per point
    python -m benchmarks.system_sweep             # W = 8M, the issue's size
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict
from pathlib import Path

from panjoin.bench.system import SystemPoint, run_system, system_events
from panjoin.launch import start_cluster

HERE = Path(__file__).parent
INDEXES = ["rap", "wib", "bisort"]


def plan(quick: bool, workers: int) -> list[SystemPoint]:
    K, M = 1 << 10, 1 << 20
    window = 1 * M if quick else 8 * M
    measure = 1 * M if quick else 2 * M
    return [SystemPoint(workers=workers, window=window, batch=b, index=ix, measure=measure)
            for ix in INDEXES for b in (8 * K, 32 * K, 128 * K)]


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"rap": "tab:orange", "wib": "tab:green", "bisort": "tab:blue"}
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for ix in INDEXES:
        pts = sorted((r for r in rows if r["index"] == ix), key=lambda r: r["batch"])
        xs = [r["batch"] for r in pts]
        ax.plot(xs, [r["cluster"] for r in pts], "o-", color=colors[ix],
                label=f"{ix}: {pts[0]['workers']}-worker cluster")
        ax.plot(xs, [r["local"] for r in pts], "s--", color=colors[ix], alpha=0.6,
                label=f"{ix}: in-process")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size NBat")
    ax.set_ylabel("input tuples/s")
    ax.set_title(f"band join, S about 1, W = {rows[0]['window']:,} per stream")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="W = 1M instead of 8M")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default: 2)")
    args = ap.parse_args(argv)
    points = plan(args.quick, args.workers)
    events = system_events(points[0])
    rows = []
    with start_cluster(args.workers, manager=False) as workers:
        for i, pt in enumerate(points, 1):
            t0 = time.perf_counter()
            cluster, local = run_system(pt, events=events, addresses=workers.addresses)
            row = {**asdict(pt), "cluster": cluster, "local": local,
                   "overhead": local / cluster, "seconds": time.perf_counter() - t0}
            rows.append(row)
            print(f"[{i}/{len(points)}] {pt.index:6s} NBat {pt.batch:>7,}  in-process "
                  f"{local:>12,.0f}  cluster {cluster:>12,.0f} tuples/s  overhead "
                  f"{local / cluster:.2f}x", flush=True)
    tag = "-quick" if args.quick else ""
    out = HERE / "results" / f"system_sweep{tag}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "when": time.ctime(),
                               "rows": rows}, indent=1))
    plot(rows, HERE / "plots" / f"system_sweep{tag}.png")
    print(f"results: {out}")
    best = max(rows, key=lambda r: r["cluster"])
    print(f"best cluster point: {best['index']} NBat {best['batch']:,}: "
          f"{best['cluster']:,.0f} tuples/s (overhead {best['overhead']:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
