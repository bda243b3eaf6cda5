"""Per-index microbenchmark sweeps: the shape of the PanJoin paper's Figures 10-13.

For each index: insert throughput over the batch size NBat and over the
partition count P; probe throughput over NBat, over P and over the selectivity
S (eq and band); and probe throughput over the subwindow size NSub (with the
nested loop, for the >= 1000x claim). Raw results go to
``benchmarks/results/index_sweep[-quick].json``; ``benchmarks/plot_index.py``
draws the PNGs; the targets of issue 2 are printed at the end.

    python -m benchmarks.index_sweep --quick      # about a minute, small sizes (CI-sized)
    python -m benchmarks.index_sweep              # the paper's sizes (NSub = 8M, P = 64K)
    python -m benchmarks.index_sweep --targets-only   # re-measure the targets, keep the sweep
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from panjoin.bench.index import IndexPoint, run_point

HERE = Path(__file__).parent
INDEXES = ["rap", "wib", "bisort"]


def plan(quick: bool) -> list[tuple[str, IndexPoint]]:
    """(figure, point) pairs of the sweep."""
    K, M = 1 << 10, 1 << 20
    nsub = 1 * M if quick else 8 * M
    p = 8 * K if quick else 64 * K
    batches = [1 * K, 32 * K, 256 * K] if quick else [1 * K, 4 * K, 32 * K, 256 * K, 1 * M]
    parts = [1 * K, 8 * K] if quick else [1 * K, 4 * K, 16 * K, 64 * K]
    sels = [1, 64, 1024] if quick else [1, 16, 64, 256, 1024]
    nsubs = [64 * K, 1 * M] if quick else [64 * K, 1 * M, 8 * M]
    budget = 2.0 if quick else 10.0
    rep = 1 if quick else 3
    out = []
    for ix in INDEXES:
        for b in batches + [nsub]:
            out.append(("insert-vs-batch", IndexPoint(ix, "insert", nsub, p, b, repeat=rep,
                                                      budget_s=budget)))
        for pp in parts:
            out.append(("insert-vs-partitions", IndexPoint(ix, "insert", nsub, pp, 32 * K,
                                                           repeat=rep, budget_s=budget)))
        for b in batches:
            out.append(("probe-vs-batch", IndexPoint(ix, "probe", nsub, p, b, 1.0, "band",
                                                     repeat=rep)))
        for pp in parts:
            out.append(("probe-vs-partitions", IndexPoint(ix, "probe", nsub, pp, 32 * K, 1.0,
                                                          "band", repeat=rep)))
        for pred in ("eq", "band"):
            for s in sels:
                out.append((f"probe-vs-selectivity-{pred}",
                            IndexPoint(ix, "probe", nsub, p, 32 * K, float(s), pred,
                                       repeat=rep)))
    for ix in INDEXES + ["nested"]:
        for n in nsubs:
            out.append(("probe-vs-nsub", IndexPoint(ix, "probe", n, max(1, n // 128), 32 * K,
                                                    1.0, "band", repeat=1 if ix == "nested"
                                                    else rep)))
    return out


def targets(quick: bool) -> list[tuple[str, IndexPoint]]:
    """The issue's target points (at the paper's sizes unless --quick)."""
    M, K = 1 << 20, 1 << 10
    nsub = 1 * M if quick else 8 * M
    p = 8 * K if quick else 64 * K
    out = [
        ("rap-insert-one-batch", IndexPoint("rap", "insert", nsub, p, nsub, threads=1,
                                            repeat=5)),
        ("rap-insert-one-batch-cold", IndexPoint("rap", "insert", nsub, p, nsub, threads=1,
                                                 repeat=5, warm_memory=False)),
        ("bisort-band-probe-1t", IndexPoint("bisort", "probe", nsub, p, 32 * K, 1.0, "band",
                                            threads=1)),
        ("bisort-band-probe-2t", IndexPoint("bisort", "probe", nsub, p, 32 * K, 1.0, "band",
                                            threads=2)),
    ]
    for ix in INDEXES + ["nested"]:
        out.append((f"{ix}-probe-nsub", IndexPoint(ix, "probe", nsub, p, 32 * K, 1.0, "band",
                                                   threads=2, repeat=1 if ix == "nested" else 3)))
        if ix != "nested":
            out.append((f"{ix}-insert-32k", IndexPoint(ix, "insert", nsub, p, 32 * K,
                                                       budget_s=10.0)))
    return out


def run(points, desc: str) -> list[dict]:
    rows = []
    for fig, pt in tqdm(points, desc=desc, unit="point", file=sys.stderr):
        t0 = time.perf_counter()
        res = run_point(pt)
        rows.append({"figure": fig, **asdict(pt), "tuples_per_s": res.tuples_per_s,
                     "seconds": res.seconds, "results_per_tuple": res.results_per_tuple,
                     "bytes_per_tuple": res.bytes_per_tuple,
                     "wall_s": time.perf_counter() - t0})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one repetition")
    ap.add_argument("--targets-only", action="store_true", help="skip the sweeps")
    args = ap.parse_args(argv)
    suffix = "-quick" if args.quick else ""
    meta = {"machine": platform.platform(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M"), "quick": args.quick}
    rows = None if args.targets_only else run(plan(args.quick), "sweep")
    trows = run(targets(args.quick), "targets")
    out = HERE / "results" / f"index_sweep{suffix}.json"
    write_results(out, meta, rows, trows)
    print(f"raw results: {out}")
    print_targets(trows)
    return 0


def write_results(out: Path, meta: dict, rows: list[dict] | None, trows: list[dict]) -> None:
    """Write the raw results; ``rows=None`` (``--targets-only``) keeps the sweep rows (and
    their meta, as ``sweep_meta``) already in ``out``, so the plots still have a sweep."""
    doc = {"meta": meta, "sweep": rows or [], "targets": trows}
    if rows is None and out.exists():
        old = json.loads(out.read_text())
        doc["sweep"] = old.get("sweep", [])
        doc["sweep_meta"] = old.get("sweep_meta", old.get("meta", {}))
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))


def print_targets(trows: list[dict]) -> None:
    by = {r["figure"]: r for r in trows}
    print("| target point | tuples/s | results/probe | bytes/tuple |")
    print("|---|---:|---:|---:|")
    for r in trows:
        print(f"| {r['figure']} (NSub {r['nsub']}, P {r['partitions']}, NBat {r['batch']}, "
              f"{r['threads']} thr) | {r['tuples_per_s']:.4g} | {r['results_per_tuple']:.2f} "
              f"| {r['bytes_per_tuple']:.1f} |")
    nested = by.get("nested-probe-nsub")
    if nested:
        for ix in INDEXES:
            r = by.get(f"{ix}-probe-nsub")
            if r:
                print(f"{ix} probe / nested loop probe at NSub {r['nsub']}: "
                      f"{r['tuples_per_s'] / nested['tuples_per_s']:.0f}x")


if __name__ == "__main__":
    sys.exit(main())
