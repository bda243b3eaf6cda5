"""The peer benchmark (issue 7) on tiny windows: every peer runs, its result pairs agree
with the reference's (as sorted pairs where a test holds them, as pair digests where the
runner folded them), a wrong pair fails the check, files appear."""

import json

import numpy as np
import pytest

from panjoin.bench.peers import (
    Data,
    PairDigest,
    PeerConfig,
    PeerResult,
    PeerRunner,
    Workload,
    _SHJOp,
    _stream,
    calibrate,
    check_results,
    engine_op,
    events_for,
    pair_digest,
    run_peers,
    table,
    two_d_engine_op,
)
from panjoin.bench.peers import runner as peers_runner
from panjoin.generate import generate
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window

SCANS = ("nested-loop", "sorted-list", "shj")


def _ref_pairs(wl: Workload, data, n: int | None = None) -> np.ndarray:
    """Reference (r_id, s_id) pairs of the first n tuples, sorted (2-D: the y band on
    the x-band pairs)."""
    ev = data.events if n is None else data.events.slice(0, n)
    ref = reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window(wl.window_spec()),
                         parse_predicate(wl.predicate())).pairs
    if wl.residual is None:
        return ref
    y = data.y if n is None else data.y[:n]
    yr, ys = y[ev.stream == 0], y[ev.stream == 1]
    ((_, (a, b)),) = wl.residual.items()
    d = ys[ref[:, 1]] - yr[ref[:, 0]]
    return ref[(d >= a) & (d <= b)]


def _ref_count(wl: Workload, data, n: int | None = None) -> int:
    return len(_ref_pairs(wl, data, n))


def _bounded_pairs(wl: Workload, data, fill: int, probes: int) -> np.ndarray:
    """The reference pairs a bounded run finds: those with one of the ``probes`` tuples
    after the fill in them (the pairs of the longer prefix less those of the fill)."""
    old = {tuple(p) for p in _ref_pairs(wl, data, fill).tolist()}
    new = [p for p in _ref_pairs(wl, data, fill + probes).tolist() if tuple(p) not in old]
    return sort_pairs(np.array(new, np.int64).reshape(-1, 2))


def _ident(pairs: np.ndarray) -> tuple[int, str]:
    """(count, pair digest) of a pair array: what a record's (results, pair_digest) is."""
    d = pair_digest(pairs)
    return d.count, d.hex()


def _pairs_of(op, data, fill: int, chunk: int, bounded: bool = False) -> np.ndarray:
    """Drive an adapter as the runner does (chunks; a bounded run fills first) and keep
    every pair it hands back, sorted."""
    start = 0
    if bounded:
        op.fill(data.slice(0, fill))
        start = fill
    out = [op.push(data.slice(a, min(len(data), a + chunk)))
           for a in range(start, len(data), chunk)] + [op.finish()]
    return sort_pairs(np.stack([np.concatenate([r for r, _ in out]),
                                np.concatenate([s for _, s in out])], axis=1))


def test_peers_bench_small_run(tmp_path):
    cfg = PeerConfig(windows=[256, 512], measure=256, nested_max=256, sorted_max=256,
                     bounded_probes=64, band2d_max=512, selectivities=(1, 64), chunk=128,
                     peers=("panjoin-bisort", "panjoin-rap") + SCANS +
                           ("duckdb", "duckdb-range", "spark"))
    recs = run_peers(cfg, progress=False, out_json=tmp_path / "r.json", plot_dir=tmp_path,
                     tag="-t", log=lambda *_: None)
    assert check_results(recs) == []
    by = {(r.workload, r.window, r.peer): r for r in recs}
    names = {wl.name for wl in cfg.workloads()}
    assert {"band S=64 zipf", "band S=64 increasing", "band S=64 uniform time",
            "band2d handshake", "eq zipf"} <= names
    # every workload's full-file pairs are the reference's (count and pair digest; Spark's
    # hook hands its pairs too), and they are non-trivial
    for wl in cfg.workloads():
        data = events_for(wl, 256, cfg.seed)
        wl = calibrate(wl, data)
        want = _ident(_ref_pairs(wl, data))
        ran = [r for r in recs if (r.workload, r.window) == (wl.name, wl.window)
               and r.status == "ok"]
        assert {r.peer for r in ran} >= {"panjoin-bisort", "panjoin-rap", "duckdb"}, [
            r for r in recs if (r.workload, r.window) == (wl.name, wl.window)
            and r.status != "ok"]
        for r in ran:
            got = (r.results, r.pair_digest)
            assert got == want, (wl.name, wl.window, r.peer, got, want)
        assert wl.pred == "band2d" or want[0] > 100, wl.name  # 2-D: dense data below
        if wl.window == 512 and wl.pred != "eq":
            # beyond their limit the scans run bounded: fill without joining, then 64
            # probe tuples; they find the pairs with a probe tuple in them
            fill = 2 * wl.window
            bounded = _ident(_bounded_pairs(wl, data, fill, 64))
            for p in SCANS:
                r = by[(wl.name, 512, p)]
                assert r.status == "bounded", (wl.name, p, r)
                assert (r.results, r.pair_digest) == bounded, (wl.name, p, r, bounded)
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
    assert (tmp_path / "peers_whole-t.png").stat().st_size > 0  # duckdb is offline
    assert "| panjoin-bisort |" in table(recs)


def test_two_d_engine_op_and_shj_on_dense_data():
    """The 2-D band join's engine peers (x band in the engine, y band on the pairs) and
    the SHJ (both bands in its filter) against the reference, full and bounded, on
    values dense enough (x in 1..300, y in 0..3000 / 1024) for thousands of matches."""
    wl = Workload("band2d", 0, "uniform", 512)
    ev = generate(1536, "uniform", key_min=1, key_max=300, seed=3)
    data = Data(ev, np.random.default_rng(4).integers(0, 3000, len(ev)).astype(np.int64))
    want = _ref_pairs(wl, data)
    fill = 1024
    bdata = data.slice(0, fill + 200)
    bounded = _bounded_pairs(wl, data, fill, 200)
    assert len(want) > 1000 and len(bounded) > 100
    for make in (lambda: two_d_engine_op(wl, data, "bisort", 1),
                 lambda: two_d_engine_op(wl, data, "nested", 1), lambda: _SHJOp(wl)):
        np.testing.assert_array_equal(_pairs_of(make(), data, fill, 128), want)
        np.testing.assert_array_equal(_pairs_of(make(), bdata, fill, 128, True), bounded)
        out = _stream(make(), data, fill, 128)
        assert (out["results"], out["pair_digest"]) == _ident(want)
        out = _stream(make(), bdata, fill, 128, bounded=True)
        assert (out["results"], out["pair_digest"]) == _ident(bounded)


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
    msgs = check_results(recs)
    assert len(msgs) == 2
    assert "differ" in msgs[0] and "shj" in msgs[0] and "duckdb" in msgs[0]
    assert "bounded" in msgs[1]


def test_check_reports_a_wrong_pair_with_the_right_count():
    """Same counts, one peer's pairs differ: the check fails; a count-only peer (no
    digest) is checked by its count; matching digests pass."""
    ok = pair_digest(np.array([[0, 1], [2, 3]])).hex()
    bad = pair_digest(np.array([[0, 1], [2, 4]])).hex()
    recs = [PeerResult("eq uniform", 8, "panjoin-rap", results=2, pair_digest=ok),
            PeerResult("eq uniform", 8, "duckdb", results=2, pair_digest=ok),
            PeerResult("eq uniform", 8, "spark", results=2),
            PeerResult("eq uniform", 16, "panjoin-rap", "bounded", results=2, pair_digest=ok),
            PeerResult("eq uniform", 16, "shj", "bounded", results=2, pair_digest=bad)]
    msgs = check_results(recs)
    assert len(msgs) == 1
    assert "pairs differ" in msgs[0] and "bounded" in msgs[0] and "shj" in msgs[0]
    assert check_results(recs[:3]) == []
    recs[2].results = 3
    assert "counts differ" in check_results(recs[:3])[0]


def test_pair_digest_is_order_free_and_catches_every_kind_of_wrong_pair():
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, 1 << 20, (1000, 2))
    want = pair_digest(pairs)
    # any order, any chunking: the same digest
    shuffled = pairs[rng.permutation(len(pairs))]
    d = PairDigest()
    for a in range(0, len(pairs), 97):
        d.add(shuffled[a:a + 97, 0], shuffled[a:a + 97, 1])
    assert (d.count, d.hex()) == (want.count, want.hex())
    assert pair_digest(sort_pairs(pairs)).hex() == want.hex()
    # the same count, one pair wrong in each way: every digest differs
    wrong = []
    for i, j, v in ((0, 1, 1), (5, 0, 1), (7, 1, -1)):  # an s_id or r_id off by one
        w = pairs.copy()
        w[i, j] += v
        wrong.append(w)
    w = pairs.copy()
    w[[3, 4], 1] = w[[4, 3], 1]  # two s_ids swapped: the same ids on each side
    wrong.append(w)
    w = pairs.copy()
    w[9] = w[10]  # a pair duplicated in place of another
    wrong.append(w)
    wrong.append(pairs[:, ::-1])  # (s_id, r_id)
    for w in wrong:
        assert pair_digest(w).count == want.count
        assert pair_digest(w).hex() != want.hex()
    assert pair_digest(pairs[1:]).hex() != want.hex()
    assert pair_digest(np.zeros((0, 2), np.int64)).hex() == "0" * 16


class _OneWrongPair:
    """An engine adapter that hands back one wrong pair (s_id + 1) in place of a right
    one: the count stays right, the pairs do not."""

    def __init__(self, op):
        self.op, self.done = op, False

    def __getattr__(self, name):
        return getattr(self.op, name)

    def _spoil(self, r, s):
        if len(s) and not self.done:
            s = s.copy()
            s[0] += 1
            self.done = True
        return r, s

    def push(self, data):
        return self._spoil(*self.op.push(data))

    def finish(self):  # a batch not yet full at the last push is joined here
        return self._spoil(*self.op.finish())


@pytest.mark.parametrize("bounded", [False, True])
def test_runner_fails_a_peer_with_a_wrong_pair(monkeypatch, bounded):
    """A nested loop that finds one wrong pair (and the right count) is caught by the
    runner's check, whole-file and bounded."""
    real = peers_runner.engine_op

    def engine_op_with_a_bug(wl, data, index, *a, **k):
        op = real(wl, data, index, *a, **k)
        return _OneWrongPair(op) if index == "nested" else op

    monkeypatch.setattr(peers_runner, "engine_op", engine_op_with_a_bug)
    cfg = PeerConfig(windows=[256], measure=256, nested_max=128 if bounded else 256,
                     bounded_probes=64, chunk=128, repeat=1,
                     peers=("panjoin-bisort", "nested-loop", "shj"))
    recs = PeerRunner(cfg, progress=False, log=lambda *_: None).run_workload(
        Workload("band", 64, "uniform", 256))
    by = {r.peer: r for r in recs}
    status = "bounded" if bounded else "ok"
    assert by["nested-loop"].status == status and by["shj"].status == status
    assert by["nested-loop"].results == by["shj"].results > 0
    msgs = check_results(recs)
    assert len(msgs) == 1 and "pairs differ" in msgs[0] and "nested-loop" in msgs[0], msgs
    assert check_results([r for r in recs if r.peer != "nested-loop"]) == []


def test_offline_peers_run_in_a_child_process_with_the_same_pairs():
    """By default DuckDB joins in the offline child (another pid, so its malloc_trim
    leaves PanJoin's heap alone); in-process (``isolate=False``) it finds the same pairs."""
    import os

    assert peers_runner.offline_pool().submit(os.getpid).result() != os.getpid()
    wl = Workload("band", 64, "uniform", 256)
    recs = {}
    for isolate in (True, False):
        cfg = PeerConfig(windows=[256], measure=256, chunk=128, repeat=1, isolate=isolate,
                         peers=("panjoin-bisort", "duckdb"))
        recs[isolate] = {r.peer: r for r in PeerRunner(
            cfg, progress=False, log=lambda *_: None).run_workload(wl)}
    a, b = recs[True]["duckdb"], recs[False]["duckdb"]
    assert a.status == b.status == "ok" and "PanJoin's process" in b.note
    assert (a.results, a.pair_digest) == (b.results, b.pair_digest) == (
        recs[True]["panjoin-bisort"].results, recs[True]["panjoin-bisort"].pair_digest)
    assert a.results > 0


def test_engine_op_pairs_are_the_reference_pairs():
    """The adapters hand back exactly the reference's pairs (band and eq, one index
    each way), not only as many."""
    for wl in (Workload("band", 64, "uniform", 256), Workload("eq", 1, "zipf", 256)):
        data = events_for(wl, 256, 1)
        wl = calibrate(wl, data)
        want = _ref_pairs(wl, data)
        assert len(want) > 100
        for op in (engine_op(wl, data, "rap", 1), _SHJOp(wl)):
            np.testing.assert_array_equal(_pairs_of(op, data, 512, 64), want)


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
    assert check_results(got) == []

