"""OpenCL BI-Sort against the Numba BI-Sort over the batch size NBat (PanJoin paper, Figure 14).

Insert throughput (a fresh subwindow filled with sorted batches of NBat) and equi-join
probe throughput at selectivity S = 1 (Figure 14b), over NBat, for the Numba
BI-Sort (``bisort``, on ``--threads`` threads) and the OpenCL one (``bisort-opencl``,
8 mergers and 8 probers as in the paper, on the device that ``--device`` /
``$PANJOIN_OPENCL_DEVICE`` names: the pocl CPU device by default), in one run, so
that the ratios compare like with like. Every point is one
:func:`panjoin.bench.index.run_point` (warm-up, then the median of repeats).
Results go to ``benchmarks/results/opencl_bisort[-quick].json`` and the plot to
``benchmarks/plots/opencl_bisort[-quick].png``.

    python -m benchmarks.opencl_bisort --quick     # a few minutes on 2 cores
    python -m benchmarks.opencl_bisort             # NSub = 2M, NBat 256 .. 1M
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).parent
K, M = 1 << 10, 1 << 20


def plan(quick: bool, threads: int) -> list[tuple[str, object]]:
    from panjoin.bench.index import IndexPoint

    nsub = 256 * K if quick else 2 * M
    p = nsub // 128  # partitions of NP = 128 tuples
    batches = [1 * K, 8 * K, 64 * K, 256 * K] if quick else [
        256, 1 * K, 4 * K, 16 * K, 64 * K, 256 * K, 1 * M]
    rep = 1 if quick else 3
    budget = 2.0 if quick else 8.0
    out = []
    for ix, thr in (("bisort", threads), ("bisort-opencl", 1)):
        for b in batches:
            out.append(("insert", IndexPoint(ix, "insert", nsub, p, b, threads=thr, repeat=rep,
                                             budget_s=budget)))
        for b in batches:
            out.append(("probe-eq", IndexPoint(ix, "probe", nsub, p, b, 1.0, "eq",
                                               threads=thr, repeat=rep)))
    return out


def plot(rows: list[dict], meta: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, figname, title in ((axes[0], "insert", "insert"),
                               (axes[1], "probe-eq", "equi-join probe, S = 1")):
        for ix, label in (("bisort", f"Numba BI-Sort ({meta['numba_threads']} thr)"),
                          ("bisort-opencl", f"OpenCL BI-Sort ({meta['device']})")):
            pts = sorted((r["batch"], r["tuples_per_s"]) for r in rows
                         if r["figure"] == figname and r["index"] == ix)
            ax.plot([b for b, _ in pts], [t for _, t in pts], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size NBat")
        ax.set_ylabel("tuples / s")
        ax.set_title(f"{title} (NSub {meta['nsub']})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(exist_ok=True)
    fig.savefig(path, dpi=110)


def table(rows: list[dict]) -> str:
    by = {(r["figure"], r["index"], r["batch"]): r["tuples_per_s"] for r in rows}
    lines = ["| op | NBat | Numba BI-Sort tuples/s | OpenCL BI-Sort tuples/s | OpenCL / Numba |",
             "|---|---:|---:|---:|---:|"]
    for fig in ("insert", "probe-eq"):
        for b in sorted({r["batch"] for r in rows if r["figure"] == fig}):
            a, c = by.get((fig, "bisort", b)), by.get((fig, "bisort-opencl", b))
            if a and c:
                lines.append(f"| {fig} | {b} | {a:.4g} | {c:.4g} | {c / a:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="NSub 256K, 4 batch sizes, 1 repeat")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="Numba BI-Sort threads (default: all cores, as pocl uses)")
    ap.add_argument("--device", help="OpenCL device spec (default: $PANJOIN_OPENCL_DEVICE, "
                                     "else the pocl CPU device)")
    args = ap.parse_args(argv)
    if args.device:
        os.environ["PANJOIN_OPENCL_DEVICE"] = args.device  # make_index reads it
    from tqdm import tqdm

    from opencl.device import choose_device, describe
    from panjoin.bench.index import run_point

    dev = choose_device()
    points = plan(args.quick, args.threads)
    meta = {"machine": platform.platform(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M"),
            "quick": args.quick, "device": describe(dev),
            "compute_units": int(dev.max_compute_units), "numba_threads": args.threads,
            "nsub": points[0][1].nsub, "partitions": points[0][1].partitions,
            "mergers": 8, "probers": 8, "buffer": 1024, "gpu": "none available in this run"}
    rows = []
    for fig, pt in tqdm(points, desc="opencl-bisort", unit="point", file=sys.stderr):
        t0 = time.perf_counter()
        res = run_point(pt)
        rows.append({"figure": fig, **asdict(pt), "tuples_per_s": res.tuples_per_s,
                     "seconds": res.seconds, "results_per_tuple": res.results_per_tuple,
                     "wall_s": time.perf_counter() - t0})
    suffix = "-quick" if args.quick else ""
    out = HERE / "results" / f"opencl_bisort{suffix}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    png = HERE / "plots" / f"opencl_bisort{suffix}.png"
    plot(rows, meta, png)
    print(f"device: {meta['device']}  ({meta['compute_units']} compute units); Numba on "
          f"{args.threads} threads; NSub {meta['nsub']}, P {meta['partitions']}")
    print(table(rows))
    print(f"raw results: {out}\nplot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
