"""Issue 27's in-process figures in one run: small batches against large, and latency.

Two parts, each side by side in one run (the machine is shared and noisy: only the
ratios within a run are the figures):

1. ``batches``: ``panjoin replay`` of one generated file (uniform keys, equi join,
   count window W per stream, BI-Sort, ``--threads 1``) at NBat 1K, 4K and the
   large batches (32K .. 256K), each at the engine's default NSub and at NSub = W;
   rounds interleaved, the best of each kept. Prints each NBat's throughput as a
   share of the best large-batch one (targets: 1K >= 50%, 4K >= 70%).
2. ``latency``: ``panjoin bench latency`` in-process at a count window of 1M per
   stream: ``--max-latency 5`` (and 50) over a rate sweep, against fixed batches
   (32K, no deadline: the engine's old default); the highest rate with p99 <= 50 ms
   as a share of the large-batch throughput of part 1 at the same window.

    python -m benchmarks.latency --quick         # W = 256K, short runs: a few minutes
    python -m benchmarks.latency                 # W = 1M, the issue's sizes
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from panjoin.events import write_events
from panjoin.generate import generate

TP_RE = re.compile(r"throughput: ([0-9,]+) tuples/s")
HERE = Path(__file__).resolve().parent


def _replay(path: str, w: int, nbat: int, nsub: int | None, out: str) -> float:
    cmd = [sys.executable, "-m", "panjoin.cli", "replay", path, "--window", f"count:{w},{w}",
           "--predicate", "eq", "--index", "bisort", "--threads", "1", "--batch-size",
           str(nbat), "--out", out, "--no-progress"]
    if nsub:
        cmd += ["--subwindow-size", str(nsub)]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(TP_RE.search(p.stdout).group(1).replace(",", ""))


def batches(w: int, n: int, rounds: int, large: list[int]) -> dict:
    """Replay throughput per (NBat, NSub), best of ``rounds`` interleaved rounds."""
    sizes = [1024, 4096, *large]
    best: dict[tuple[int, int | None], float] = {}
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/events.parquet"
        write_events(generate(n, "uniform", seed=1), path)
        for r in range(rounds):
            for nbat in sizes:
                for nsub in (None, w):
                    tp = _replay(path, w, nbat, nsub, f"{d}/out.parquet")
                    key = (nbat, nsub)
                    best[key] = max(best.get(key, 0.0), tp)
                    print(f"round {r + 1}: NBat {nbat:>7} NSub {nsub or 'default':>8}: "
                          f"{tp:,.0f} tuples/s", flush=True)
    top = max(v for (nb, _), v in best.items() if nb in large)
    rows = []
    for nbat in sizes:
        tp = max(best[(nbat, None)], best[(nbat, w)])
        rows.append({"nbat": nbat, "default_nsub": best[(nbat, None)], "nsub_w": best[(nbat, w)],
                     "best": tp, "share_of_large": tp / top})
    return {"window": w, "tuples": n, "rounds": rounds, "best_large": top, "rows": rows}


def latency(w: int, rates: str, seconds: float, runs: list[tuple[str, list[str]]]) -> list:
    out = []
    for label, extra in runs:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [sys.executable, "-m", "panjoin.cli", "bench", "latency", "--window",
                   f"count:{w},{w}", "--rates", rates, "--seconds", str(seconds), "--json",
                   f.name, "--label", label, "--no-progress", *extra]
            p = subprocess.run(cmd, capture_output=True, text=True, check=True)
            print(p.stdout, end="", flush=True)
            out += json.load(open(f.name))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="W = 256K, short runs")
    ap.add_argument("--part", choices=["batches", "latency", "both"], default="both")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--tag", default=None, help="suffix of the result and plot files")
    a = ap.parse_args(argv)
    w = 1 << 18 if a.quick else 1 << 20
    tag = a.tag or ("quick" if a.quick else "full")
    res: dict = {}
    if a.part in ("batches", "both"):
        res["batches"] = batches(w, 8 * w, a.rounds or (1 if a.quick else 2),
                                 [32768, 262144] if a.quick else [32768, 131072, 262144])
        print("\n| NBat | NSub default | NSub W | share of the best large batch |")
        print("|---:|---:|---:|---:|")
        for r in res["batches"]["rows"]:
            print(f"| {r['nbat']:,} | {r['default_nsub'] / 1e6:.2f}M | {r['nsub_w'] / 1e6:.2f}M | "
                  f"{100 * r['share_of_large']:.0f}% |")
    if a.part in ("latency", "both"):
        rates = "200K,500K,1M" if a.quick else "200K,500K,1M,1.5M,2M"
        secs = 1.5 if a.quick else 3.0
        res["latency"] = latency(w, rates, secs, [
            ("max-latency 5", ["--max-latency", "5"]),
            ("max-latency 50", ["--max-latency", "50"]),
            ("NBat 32K", ["--batch-size", "32K"]),
        ])
        from panjoin.bench.latency import LatencyResult, max_sustainable, plot

        rs = [LatencyResult(**r) for r in res["latency"]]
        plot(rs, HERE / "plots" / f"latency-inprocess-{tag}.png",
             f"in-process, count window {w:,} per stream, equi, uniform keys")
        best = max_sustainable(rs, 50.0)
        print(f"highest rate with p99 <= 50 ms: {best:,.0f} tuples/s")
        if "batches" in res:
            print(f"  = {best / res['batches']['best_large']:.0%} of the best large-batch "
                  "replay throughput of this run")
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / f"latency-inprocess-{tag}.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
