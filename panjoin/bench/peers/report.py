"""What a run leaves behind: the Markdown table, the JSON records, the plots.

:func:`table` prints every record with PanJoin's best in-process index over the peer
(:func:`ratios`); :func:`save_records` and :func:`load_records` write and read a run's
JSON (records and the config, with the result check's verdict); :func:`plot` draws
throughput against W and against the selectivity.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from panjoin.bench.peers.results import PeerResult, check_results


def ratios(records: list[PeerResult]) -> dict[tuple, dict]:
    """PanJoin's best in-process index per workload, steady and whole-file."""
    best: dict[tuple, dict] = {}
    for r in records:
        if r.peer.startswith("panjoin-") and r.peer != "panjoin-cluster" and r.status == "ok":
            b = best.setdefault((r.workload, r.window), {"steady": 0.0, "whole": 0.0, "peer": ""})
            if r.steady_tps > b["steady"]:
                b["steady"], b["peer"] = r.steady_tps, r.peer
            b["whole"] = max(b["whole"], r.whole_tps)
    return best


def _g(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def table(records: list[PeerResult]) -> str:
    """Markdown table: rates, memory, and PanJoin-best / peer (steady; whole-file for DuckDB)."""
    best = ratios(records)
    lines = ["| workload | W | peer | steady tuples/s | whole-file tuples/s | memory MB | "
             "PanJoin best / peer | results | note |",
             "|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in records:
        b = best.get((r.workload, r.window))
        ratio = None
        if b and r.steady_tps:
            ratio = b["steady"] / r.steady_tps
        elif b and r.whole_tps:
            ratio = b["whole"] / r.whole_tps
        mem = None if r.memory_bytes is None else r.memory_bytes / 2**20
        note = r.note if r.status in ("ok", "bounded") else f"{r.status}: {r.note}"
        lines.append(f"| {r.workload} | {r.window} | {r.peer} | {_g(r.steady_tps)} | "
                     f"{_g(r.whole_tps)} | {_g(mem)} | {_g(ratio)} | "
                     f"{'' if r.results is None else r.results} | {note} |")
    return "\n".join(lines)


def _save(plt, fig, ax, path, paths: list) -> None:
    """Write a plot to ``path`` (appended to ``paths``) unless it has no line: a run
    without band S = 64 on uniform keys has nothing to draw."""
    if ax.lines:
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
        paths.append(path)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(records: list[PeerResult], out_dir: Path, tag: str) -> list[Path]:
    """Throughput vs window size (band S=64 uniform) and vs selectivity (largest W), log scale."""
    import matplotlib

    out_dir.mkdir(parents=True, exist_ok=True)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def rate(r):
        return r.steady_tps or r.whole_tps

    paths = []
    peers = sorted({r.peer for r in records if rate(r)})
    whole = {r.peer for r in records if r.whole_tps and not r.steady_tps}

    def label(p):
        return f"{p} (whole file)" if p in whole else p

    def style(pts):
        st = {s for *_, s in pts}
        return "--" if "extrapolated" in st else ":" if "bounded" in st else "-"

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in peers:
        pts = sorted((r.window, rate(r), r.status) for r in records
                     if r.peer == p and r.workload == "band S=64 uniform" and rate(r))
        if pts:
            ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], marker="o", label=label(p),
                    linestyle=style(pts))
    ax.set(xscale="log", yscale="log", xlabel="window size W per stream (tuples)",
           ylabel="input tuples/s",
           title="Band join, S = 64, uniform keys\n(dotted: bounded probe runs at large W; "
                 "dashed: extrapolated)")
    _save(plt, fig, ax, out_dir / f"peers_window{tag}.png", paths)

    def sel_ws(w):
        return {r.workload for r in records if r.window == w and r.workload.startswith("band S=")
                and r.workload.endswith(" uniform")}

    # the largest W that has the most selectivities; one selectivity is no curve
    wmax = max({r.window for r in records}, key=lambda w: (len(sel_ws(w)), w))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    curve = records if len(sel_ws(wmax)) > 1 else []
    for p in peers:
        pts = []
        for r in curve:
            if r.peer == p and r.window == wmax and r.workload.startswith("band S=") \
                    and r.workload.endswith(" uniform") and rate(r):
                s = float(r.workload.split("=")[1].split()[0])
                pts.append((s, rate(r), r.status))
        pts.sort()
        if pts:
            ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], marker="o", label=label(p),
                    linestyle=style(pts))
    ax.set(xscale="log", yscale="log", xlabel="selectivity S (matches per probe tuple)",
           ylabel="input tuples/s", title=f"Band join, W = {wmax} per stream, uniform keys")
    _save(plt, fig, ax, out_dir / f"peers_selectivity{tag}.png", paths)
    path = _plot_whole(plt, records, out_dir / f"peers_whole{tag}.png")
    if path is not None:
        paths.append(path)
    return paths


def _plot_whole(plt, records: list[PeerResult], path: Path) -> Path | None:
    """Whole-file tuples/s, a group of bars per (workload, W) and a bar per peer: the
    one figure in which the offline peers and PanJoin are timed alike (issue 20)."""
    recs = [r for r in records if r.whole_tps]
    if not any(not r.steady_tps for r in recs):  # no offline peer: the lines say it all
        return None
    groups = sorted({(r.workload, r.window) for r in recs}, key=lambda g: (g[1], g[0]))
    peers = sorted({r.peer for r in recs})
    at = {(r.workload, r.window, r.peer): r.whole_tps for r in recs}
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(groups)), 4.5))
    width = 0.8 / len(peers)
    for k, p in enumerate(peers):
        xs = [g + (k - (len(peers) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [at.get((w, n, p), 0) / 1e6 for w, n in groups], width, label=p)
    ax.set_xticks(range(len(groups)), [f"{w}\nW = {n}" for w, n in groups], fontsize=8)
    ax.set(ylabel="input tuples/s (millions), whole file",
           title="Whole event file, one thread: PanJoin against the offline engines")
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def save_records(out_json: Path, cfg, recs: list[PeerResult]) -> None:
    """A run's records and its config (a :class:`~panjoin.bench.peers.config.PeerConfig`)
    as JSON, with the result check's verdict."""
    out_json.parent.mkdir(parents=True, exist_ok=True)
    meta = {"config": {k: (list(v) if isinstance(v, tuple) else v)
                       for k, v in asdict(cfg).items()},
            "count_check": check_results(recs) or "all peers that ran agree"}
    out_json.write_text(json.dumps({"meta": meta, "records": [asdict(r) for r in recs]},
                                   indent=1, default=_jsonable))


def load_records(paths) -> list[PeerResult]:
    """Records of several runs' JSON files (e.g. to plot them together); where two files
    hold the same (workload, W, peer), the later file's record counts."""
    out: dict[tuple, PeerResult] = {}
    for p in paths:
        for r in json.loads(Path(p).read_text())["records"]:
            rec = PeerResult(**r)
            out[(rec.workload, rec.window, rec.peer)] = rec
    return list(out.values())


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(type(x))
