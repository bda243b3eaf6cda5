"""The per-index sweep's raw results and plot after ``--targets-only``."""

from __future__ import annotations

import json

from benchmarks import plot_index
from benchmarks.index_sweep import run, write_results
from panjoin.bench.index import IndexPoint


def _targets():
    return run([("bisort-probe-tiny", IndexPoint("bisort", "probe", 4096, 64, 1024, repeat=1)),
                ("rap-expire-tiny", IndexPoint("rap", "expire", 4096, 64, 1024, repeat=1))],
               "targets")


def test_targets_only_keeps_the_sweep_and_plots(tmp_path):
    out = tmp_path / "index_sweep.json"
    sweep = run([("insert-vs-batch", IndexPoint("wib", "insert", 4096, 64, b, repeat=1))
                 for b in (256, 1024)], "sweep")
    write_results(out, {"date": "then", "quick": True}, sweep, _targets())
    write_results(out, {"date": "now", "quick": True}, None, _targets())  # --targets-only
    doc = json.loads(out.read_text())
    assert [r["batch"] for r in doc["sweep"]] == [256, 1024]
    assert doc["sweep_meta"]["date"] == "then" and doc["meta"]["date"] == "now"
    png = tmp_path / "p.png"
    assert plot_index.main([str(out), "--out", str(png)]) == 0
    assert png.stat().st_size > 0


def test_plot_of_a_targets_only_file_without_a_sweep(tmp_path, capsys):
    out = tmp_path / "index_sweep.json"
    write_results(out, {"date": "now", "quick": True}, None, _targets())
    png = tmp_path / "p.png"
    assert plot_index.main([str(out), "--out", str(png)]) == 0
    assert png.stat().st_size > 0
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"meta": {}, "sweep": [], "targets": []}))
    assert plot_index.main([str(empty), "--out", str(png)]) == 1
    assert "index_sweep" in capsys.readouterr().err
