"""The peer benchmark (issue 7) on tiny windows: every peer runs, the counts agree, files appear."""

import json

from panjoin.bench.peers import PeerConfig, PeerResult, check_counts, run_peers, table


def test_peers_bench_small_run(tmp_path):
    cfg = PeerConfig(windows=[512, 1024], measure=512, nested_max=512, sorted_max=1024,
                     selectivities=(1, 64), chunk=256,
                     peers=("panjoin-bisort", "panjoin-rap", "nested-loop", "sorted-list", "shj",
                            "duckdb", "duckdb-range", "spark"))
    recs = run_peers(cfg, progress=False, out_json=tmp_path / "r.json", plot_dir=tmp_path,
                     tag="-t", log=lambda *_: None)
    assert check_counts(recs) == []
    by = {(r.workload, r.window, r.peer): r for r in recs}
    # the scans run only up to nested_max and are extrapolated beyond (cost linear in W)
    nl = by[("band S=64 uniform", 1024, "nested-loop")]
    assert nl.status == "extrapolated" and nl.results is None
    base = by[("band S=64 uniform", 512, "nested-loop")]
    assert abs(nl.steady_tps - base.steady_tps / 2) < 1e-6 * base.steady_tps
    assert by[("band S=64 uniform", 1024, "shj")].status == "extrapolated"
    assert by[("eq uniform", 1024, "shj")].status == "ok"  # hash on key: no limit
    assert by[("band S=1 uniform", 1024, "duckdb-range")].status == "extrapolated"
    assert by[("band S=1 uniform", 512, "duckdb-range")].status == "ok"
    # the peers that ran the whole file found the same, non-trivial result
    counts = {r.results for r in recs if r.workload == "band S=64 uniform" and r.window == 1024
              and r.status == "ok"}
    assert len(counts) == 1 and counts.pop() > 1024
    assert {r.status for r in recs if r.peer == "spark"} <= {"skipped", "ok"}
    assert json.loads((tmp_path / "r.json").read_text())["records"]
    assert (tmp_path / "peers_window-t.png").stat().st_size > 0
    assert (tmp_path / "peers_selectivity-t.png").stat().st_size > 0
    assert "| panjoin-bisort |" in table(recs)


def test_count_check_reports_a_mismatch():
    recs = [PeerResult("eq uniform", 8, "shj", results=5),
            PeerResult("eq uniform", 8, "duckdb", results=6),
            PeerResult("eq uniform", 8, "nested-loop", "extrapolated")]
    (msg,) = check_counts(recs)
    assert "differ" in msg and "shj" in msg and "duckdb" in msg
