"""The peer benchmark (issue 7) on tiny windows: every peer runs, the counts agree with
each other and with the reference, files appear."""

import json

import numpy as np

from panjoin.bench.peers import (
    Data,
    PeerConfig,
    PeerResult,
    Workload,
    _SHJOp,
    _stream,
    calibrate,
    check_counts,
    events_for,
    run_peers,
    table,
    two_d_engine_op,
)
from panjoin.generate import generate
from panjoin.reference import reference_join
from panjoin.semantics import parse_predicate, parse_window

SCANS = ("nested-loop", "sorted-list", "shj")


def _ref_count(wl: Workload, data, n: int | None = None) -> int:
    """Reference result count of the first n tuples (2-D: the y band on the x-band pairs)."""
    ev = data.events if n is None else data.events.slice(0, n)
    ref = reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window(wl.window_spec()),
                         parse_predicate(wl.predicate())).pairs
    if wl.residual is None:
        return len(ref)
    y = data.y if n is None else data.y[:n]
    yr, ys = y[ev.stream == 0], y[ev.stream == 1]
    ((_, (a, b)),) = wl.residual.items()
    d = ys[ref[:, 1]] - yr[ref[:, 0]]
    return int(((d >= a) & (d <= b)).sum())


def test_peers_bench_small_run(tmp_path):
    cfg = PeerConfig(windows=[256, 512], measure=256, nested_max=256, sorted_max=256,
                     bounded_probes=64, band2d_max=512, selectivities=(1, 64), chunk=128,
                     peers=("panjoin-bisort", "panjoin-rap") + SCANS +
                           ("duckdb", "duckdb-range", "spark"))
    recs = run_peers(cfg, progress=False, out_json=tmp_path / "r.json", plot_dir=tmp_path,
                     tag="-t", log=lambda *_: None)
    assert check_counts(recs) == []
    by = {(r.workload, r.window, r.peer): r for r in recs}
    names = {wl.name for wl in cfg.workloads()}
    assert {"band S=64 zipf", "band S=64 increasing", "band S=64 uniform time",
            "band2d handshake", "eq zipf"} <= names
    # every workload's full-file count equals the reference's, and is non-trivial
    for wl in cfg.workloads():
        data = events_for(wl, 256, cfg.seed)
        wl = calibrate(wl, data)
        want = _ref_count(wl, data)
        got = {r.results for r in recs if (r.workload, r.window) == (wl.name, wl.window)
               and r.status == "ok"}
        assert got == {want}, (wl.name, wl.window, got, want)
        assert wl.pred == "band2d" or want > 100, wl.name  # 2-D: dense data below
        if wl.window == 512 and wl.pred != "eq":
            # beyond their limit the scans run bounded: fill without joining, then 64
            # probe tuples; they count the pairs with a probe tuple in them
            fill = 2 * wl.window
            bounded = _ref_count(wl, data, fill + 64) - _ref_count(wl, data, fill)
            for p in SCANS:
                r = by[(wl.name, 512, p)]
                assert r.status == "bounded" and r.results == bounded, (wl.name, p, r)
                assert r.steady_tps > 0 and r.whole_tps is None
            # duckdb-range is offline: extrapolated from 256, flagged
            dr = by[(wl.name, 512, "duckdb-range")]
            base = by[(wl.name, 256, "duckdb-range")]
            assert dr.status == "extrapolated" and dr.results is None
            assert abs(dr.whole_tps - base.whole_tps / 2) < 1e-6 * base.whole_tps
            assert "EXTRAPOLATED" in dr.note
    assert by[("eq uniform", 512, "shj")].status == "ok"  # hash on key: no limit
    # calibrated bands: zipf keys need a much narrower band than the uniform formula
    zipf = [r for r in recs if r.workload == "band S=64 zipf" and r.peer == "panjoin-bisort"]
    assert zipf and all("calibrated" in r.note for r in zipf)
    assert {r.status for r in recs if r.peer == "spark"} <= {"skipped", "ok"}
    assert json.loads((tmp_path / "r.json").read_text())["records"]
    assert (tmp_path / "peers_window-t.png").stat().st_size > 0
    assert (tmp_path / "peers_selectivity-t.png").stat().st_size > 0
    assert "| panjoin-bisort |" in table(recs)


def test_two_d_engine_op_and_shj_on_dense_data():
    """The 2-D band join's engine peers (x band in the engine, y band on the pairs) and
    the SHJ (both bands in its filter) against the reference, full and bounded, on
    values dense enough (x in 1..300, y in 0..3000 / 1024) for thousands of matches."""
    wl = Workload("band2d", 0, "uniform", 512)
    ev = generate(1536, "uniform", key_min=1, key_max=300, seed=3)
    data = Data(ev, np.random.default_rng(4).integers(0, 3000, len(ev)).astype(np.int64))
    want = _ref_count(wl, data)
    fill = 1024
    bounded = _ref_count(wl, data, fill + 200) - _ref_count(wl, data, fill)
    assert want > 1000 and bounded > 100
    for make in (lambda: two_d_engine_op(wl, data, "bisort", 1),
                 lambda: two_d_engine_op(wl, data, "nested", 1), lambda: _SHJOp(wl)):
        assert _stream(make(), data, fill, 128)["results"] == want
        assert _stream(make(), data.slice(0, fill + 200), fill, 128,
                       bounded=True)["results"] == bounded


def test_calibrate_hits_the_selectivity():
    """Zipf and increasing keys with a calibrated band give about as many pairs as
    uniform keys with the closed formula (both about S per probe tuple); the uniform
    formula on Zipf keys would give many times more (nearly every key in the band)."""
    w = 2048

    def pairs(wl):
        data = events_for(wl, w, 0)
        return _ref_count(calibrate(wl, data), data)

    uniform = pairs(Workload("band", 64, "uniform", w))
    for dist in ("zipf", "increasing"):
        wl = Workload("band", 64, dist, w)
        assert calibrate(wl, events_for(wl, w, 0)).band is not None
        assert 0.7 <= pairs(wl) / uniform <= 1.5, dist
    assert pairs(Workload("band", 64, "zipf", w, band=int(
        Workload("band", 64, "uniform", w).predicate().split(":")[1]))) > 5 * uniform


def test_time_window_spec_holds_about_w_tuples():
    wl = Workload("band", 64, "uniform", 1 << 14, "time")
    t = int(wl.window_spec().split(":")[1].split(",")[0])
    data = events_for(wl, 1 << 14, 0)
    ts = data.events.ts
    assert wl.name == "band S=64 uniform time"
    # tuples of one stream within T ms of event time: about W
    n = int(((ts >= ts[-1] - t) & (data.events.stream == 0)).sum())
    assert 0.9 * (1 << 14) <= n <= 1.1 * (1 << 14)


def test_count_check_reports_a_mismatch():
    recs = [PeerResult("eq uniform", 8, "shj", results=5),
            PeerResult("eq uniform", 8, "duckdb", results=6),
            PeerResult("eq uniform", 8, "nested-loop", "extrapolated"),
            PeerResult("eq uniform", 8, "sorted-list", "bounded", results=1),
            PeerResult("eq uniform", 8, "panjoin-rap", "bounded", results=2)]
    msgs = check_counts(recs)
    assert len(msgs) == 2
    assert "differ" in msgs[0] and "shj" in msgs[0] and "duckdb" in msgs[0]
    assert "bounded" in msgs[1]


def test_merge_keeps_the_later_record(tmp_path):
    from dataclasses import asdict

    from panjoin.bench.peers import load_records

    a = [PeerResult("eq uniform", 8, "shj", results=5, steady_tps=1.0),
         PeerResult("eq uniform", 8, "duckdb", results=5, whole_tps=2.0)]
    b = [PeerResult("eq uniform", 8, "shj", results=5, steady_tps=3.0),
         PeerResult("eq uniform", 16, "shj", "bounded", results=1, steady_tps=4.0)]
    for name, recs in (("a.json", a), ("b.json", b)):
        (tmp_path / name).write_text(json.dumps({"records": [asdict(r) for r in recs]}))
    got = load_records([tmp_path / "a.json", tmp_path / "b.json"])
    assert [(r.peer, r.window, r.steady_tps or r.whole_tps) for r in got] == [
        ("shj", 8, 3.0), ("duckdb", 8, 2.0), ("shj", 16, 4.0)]
    assert check_counts(got) == []

