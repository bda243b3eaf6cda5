"""Draw the per-index sweep results as PNGs (log-scale throughput, like the paper).

One panel per sweep figure (throughput against NBat, P, S or NSub, one line per
index), plus one bar panel of the target points; a file written by
``index_sweep --targets-only`` with no earlier sweep has only the target panel.

    python -m benchmarks.plot_index [benchmarks/results/index_sweep.json] [--out PNG]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent
COLORS = {"rap": "tab:orange", "wib": "tab:green", "bisort": "tab:blue", "nested": "tab:red"}
X_OF = {
    "insert-vs-batch": ("batch", "batch size NBat"),
    "insert-vs-partitions": ("partitions", "partition count P"),
    "probe-vs-batch": ("batch", "batch size NBat"),
    "probe-vs-partitions": ("partitions", "partition count P"),
    "probe-vs-selectivity-eq": ("selectivity", "selectivity S (eq)"),
    "probe-vs-selectivity-band": ("selectivity", "selectivity S (band)"),
    "probe-vs-nsub": ("nsub", "subwindow size NSub"),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", nargs="?", type=Path, default=HERE / "results" / "index_sweep.json",
                    help="raw results of benchmarks.index_sweep (default: %(default)s)")
    ap.add_argument("--out", type=Path, help="PNG (default: benchmarks/plots/<src stem>.png)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    src = args.src
    data = json.loads(src.read_text())
    rows = data.get("sweep", [])
    trows = data.get("targets", [])
    if not rows and not trows:
        print(f"plot_index: {src} holds no sweep and no target rows; run "
              "python -m benchmarks.index_sweep [--quick] first", file=sys.stderr)
        return 1
    figs = defaultdict(list)
    for r in rows:
        figs[r["figure"]].append(r)
    names = [f for f in X_OF if f in figs]
    cols = 3
    panels = len(names) + (1 if trows else 0)
    nrows = (panels + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        key, label = X_OF[name]
        series = defaultdict(list)
        for r in figs[name]:
            series[r["index"]].append((r[key], r["tuples_per_s"]))
        for ix, pts in sorted(series.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=ix,
                    color=COLORS.get(ix))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("tuples/s")
        ax.set_title(name)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    if trows:
        _targets_panel(list(axes.flat)[len(names)], trows)
    for ax in list(axes.flat)[panels:]:
        ax.axis("off")
    meta = data.get("sweep_meta", data.get("meta", {})) if rows else data.get("meta", {})
    fig.suptitle(f"PanJoin subwindow indexes ({'quick' if meta.get('quick') else 'full'} "
                 f"sweep, {meta.get('date', '')})")
    fig.tight_layout()
    out = args.out or HERE / "plots" / (src.stem + ".png")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    print(f"plot: {out}")
    return 0


def _targets_panel(ax, trows: list[dict]) -> None:
    """The target points as horizontal bars, coloured by index."""
    ys = range(len(trows))
    ax.barh(list(ys), [r["tuples_per_s"] for r in trows],
            color=[COLORS.get(r["index"], "tab:gray") for r in trows])
    ax.set_yticks(list(ys), [f"{r['figure']} ({r['threads']} thr)" for r in trows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("tuples/s")
    ax.set_title("targets")
    ax.grid(True, axis="x", which="both", alpha=0.3)


if __name__ == "__main__":
    sys.exit(main())
