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
    budget = 2.0 if quick else 8.0
    out = []
    runs = [("bisort", 1)] + ([("bisort", threads)] if threads > 1 else []) + [
        ("bisort-opencl", 1)]
    # the implementations interleaved point by point: a load that comes and goes on a
    # shared machine then hits all of them alike
    for b in batches:
        for ix, thr in runs:
            out.append(("insert", IndexPoint(ix, "insert", nsub, p, b, threads=thr,
                                             repeat=1 if quick else 3, budget_s=budget)))
    for b in batches:
        for ix, thr in runs:
            out.append(("probe-eq", IndexPoint(ix, "probe", nsub, p, b, 1.0, "eq",
                                               threads=thr, repeat=3)))
    return out


def warm_up(threads: int) -> None:
    """Compile (or load) what run_point's small warm-up does not reach, so that no
    compile lands in a timed run: the Numba BI-Sort's parallel merge, and the OpenCL
    kernels in every launch shape (split merges, stash, small and large probes)."""
    import numpy as np

    from panjoin.semantics import parse_predicate, probe_bounds
    from panjoin.subwindow import make_index

    rng = np.random.default_rng(0)
    for kind, thr in (("bisort", max(2, threads)), ("bisort-opencl", 1)):
        ix = make_index(kind, 8192, "int64", 64, thr, par_merge_min=1, buffer=64)
        for a, size in ((0, 512), (512, 40), (552, 40), (592, 3000), (3592, 30)):
            k = np.sort(rng.integers(0, 1 << 20, size))
            ix.insert(k, np.zeros(size, np.int64), np.arange(a, a + size))
        for n in (8, 100, 1000):
            ix.probe(*probe_bounds(parse_predicate("eq"), "R",
                                   np.sort(rng.integers(0, 1 << 20, n))))


def label(ix: str, thr: int, meta: dict) -> str:
    if ix == "bisort":
        return f"Numba BI-Sort, {thr} thr"
    return f"OpenCL BI-Sort, {meta['device'].split(' / ')[-1]}"


def plot(rows: list[dict], meta: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, figname, title in ((axes[0], "insert", "insert"),
                               (axes[1], "probe-eq", "equi-join probe, S = 1")):
        for ix, thr in sorted({(r["index"], r["threads"]) for r in rows}):
            pts = sorted((r["batch"], r["tuples_per_s"]) for r in rows
                         if r["figure"] == figname and (r["index"], r["threads"]) == (ix, thr))
            ax.plot([b for b, _ in pts], [t for _, t in pts], marker="o",
                    label=label(ix, thr, meta))
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


def table(rows: list[dict], threads: int) -> str:
    by = {(r["figure"], r["index"], r["threads"], r["batch"]): r["tuples_per_s"] for r in rows}
    nt = [1] + ([threads] if threads > 1 else [])
    head = " | ".join(f"Numba {t} thr" for t in nt)
    ratios = " | ".join(f"OpenCL / Numba {t} thr" for t in nt)
    lines = [f"| op | NBat | {head} | OpenCL | {ratios} |",
             "|---|---:|" + "---:|" * (2 * len(nt) + 1)]
    for fig in ("insert", "probe-eq"):
        for b in sorted({r["batch"] for r in rows if r["figure"] == fig}):
            c = by.get((fig, "bisort-opencl", 1, b))
            a = [by.get((fig, "bisort", t, b)) for t in nt]
            if c and all(a):
                lines.append(f"| {fig} | {b} | " + " | ".join(f"{x:.3g}" for x in a)
                             + f" | {c:.3g} | " + " | ".join(f"{c / x:.2f}" for x in a) + " |")
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
    from panjoin.config import bisort_buffer

    dev = choose_device()
    warm_up(args.threads)
    points = plan(args.quick, args.threads)
    meta = {"machine": platform.platform(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M"),
            "quick": args.quick, "device": describe(dev),
            "compute_units": int(dev.max_compute_units), "numba_threads": args.threads,
            "nsub": points[0][1].nsub, "partitions": points[0][1].partitions,
            "mergers": 8, "probers": 8, "buffer": bisort_buffer(points[0][1].nsub),
            "gpu": "none available in this run",
            "load_before": os.getloadavg()}
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
    meta["load_after"] = os.getloadavg()
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    png = HERE / "plots" / f"opencl_bisort{suffix}.png"
    plot(rows, meta, png)
    print(f"device: {meta['device']}  ({meta['compute_units']} compute units); NSub "
          f"{meta['nsub']}, P {meta['partitions']}; load average before/after "
          f"{meta['load_before'][0]:.1f}/{meta['load_after'][0]:.1f} on {meta['cpus']} cpus")
    print(table(rows, args.threads))
    print(f"raw results: {out}\nplot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
