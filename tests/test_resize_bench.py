"""The resize-under-load benchmark (benchmarks/resize.py, issue 30 item 5): its exact
reference against the brute-force one, its time buckets on a worked example, and one
small run of the whole thing (real workers, a real manager, a worker added and one
removed while the source runs) whose pairs must equal the reference."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.resize import buckets, equi_count_reference, plot, run, summary
from panjoin.generate import generate
from panjoin.reference import reference_join
from panjoin.semantics import parse_predicate, parse_window


@pytest.mark.parametrize("n,wr,ws,key_max,dist", [
    (3000, 100, 103, 60, "zipf"), (2000, 37, 5, 20, "uniform"), (400, 1, 1, 3, "uniform")])
def test_equi_count_reference_equals_the_brute_force_one(n, wr, ws, key_max, dist):
    ev = generate(n, dist, key_max=key_max, seed=n)
    want = reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window(f"count:{wr},{ws}"),
                          parse_predicate("eq")).pairs
    got = equi_count_reference(ev.stream, ev.id, ev.key, wr, ws, block=64)
    assert len(want) > 0 and np.array_equal(got, want)


def test_buckets_count_rates_and_latency_per_quarter_second():
    pushes = np.array([[0.0, 100], [0.1, 150], [0.3, 50]])
    polls = np.array([0.05, 0.2, 0.2, 0.6])
    lat = np.array([0.010, 0.020, 0.030, 0.5])
    rows = buckets(pushes, polls, lat, 0.75)
    assert [r["t"] for r in rows] == [0.0, 0.25, 0.5]
    assert [r["in_per_s"] for r in rows] == [1000.0, 200.0, 0.0]
    assert [r["out_per_s"] for r in rows] == [12.0, 0.0, 4.0]
    assert rows[0]["p50_ms"] == pytest.approx(20.0) and rows[1]["p50_ms"] is None
    assert rows[2]["p99_ms"] == pytest.approx(500.0)


def test_a_small_run_resizes_and_its_pairs_equal_the_reference(tmp_path):
    res = run(4096, 20_000, 6.0, 2.0, 4.0, nsub=1024, echo=lambda _: None)
    assert res["exact"] and res["pairs"] > 10_000
    add, remove = res["calls"]["AddWorker"], res["calls"]["RemoveWorker"]
    w1, w2, w3 = res["workers"]
    assert add["address"] == w3 and w3 in add["workers"]
    assert remove["address"] == w1 and remove["workers"] == [w2, w3]
    new = res["new_subwindows"]
    # the added worker gets new subwindows once added; the removed one none after the
    # remove (first seen up to one poll later)
    assert any(x["worker"] == w3 for x in new)
    assert all(x["t"] >= add["asked"] for x in new if x["worker"] == w3)
    assert not [x for x in new if x["worker"] == w1 and x["t"] > remove["done"] + 1.5]
    # the removed worker is released once its subwindows expired
    assert res["held"][-1]["by_worker"].get(w1, 0) == 0
    assert len(res["buckets"]) == 24  # the last tuples may be pushed just past 6 s:
    assert 110_000 <= sum(r["in_per_s"] for r in res["buckets"]) * 0.25 <= 120_000
    assert len(summary(res)) == 5
    plot(res, tmp_path / "resize.png")
    assert (tmp_path / "resize.png").stat().st_size > 10_000
