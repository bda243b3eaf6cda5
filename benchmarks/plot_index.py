"""Draw the per-index sweep results as PNGs (log-scale throughput, like the paper).

    python -m benchmarks.plot_index [benchmarks/results/index_sweep.json]
"""

from __future__ import annotations

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
    argv = sys.argv[1:] if argv is None else argv
    src = Path(argv[0]) if argv else HERE / "results" / "index_sweep.json"
    data = json.loads(src.read_text())
    rows = data["sweep"]
    figs = defaultdict(list)
    for r in rows:
        figs[r["figure"]].append(r)
    names = [f for f in X_OF if f in figs]
    cols = 3
    nrows = (len(names) + cols - 1) // cols
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
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    meta = data.get("meta", {})
    fig.suptitle(f"PanJoin subwindow indexes ({'quick' if meta.get('quick') else 'full'} "
                 f"sweep, {meta.get('date', '')})")
    fig.tight_layout()
    out = HERE / "plots" / (src.stem + ".png")
    out.parent.mkdir(exist_ok=True)
    fig.savefig(out, dpi=90)
    print(f"plot: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
