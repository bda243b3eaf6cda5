"""The Spark peer (issue 7's hook): Spark Structured Streaming's own stream-stream join
on a small stream gives the brute-force reference's pairs (and counts them), for a
count window (the count condition on arrival numbers) and a time window with late
tuples; band joins are refused with a clear error. One local SparkSession, small
streams.

``spark_stream_join`` hands each micro-batch's pairs to ``on_pairs``, so that a
wrong pair fails the test even when the count is right."""

from __future__ import annotations

import numpy as np
import pytest

from panjoin.generate import generate
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window
from spark_conn.peer import SparkCannotJoin, count_bounds, count_columns, spark_stream_join


def _ref_pairs(ev, window, pred, lateness=0) -> np.ndarray:
    return reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window(window, lateness),
                          parse_predicate(pred)).pairs


def test_count_columns_and_bounds_cover_every_pair():
    ev = generate(3000, "zipf", key_max=50, seed=3)
    seq, opp = count_columns(ev.stream)
    n_r = int((ev.stream == 0).sum())
    assert np.array_equal(seq[ev.stream == 0], np.arange(n_r))
    assert np.array_equal(seq + opp, np.arange(len(ev)))
    w = parse_window("count:64,100")
    br, bs = count_bounds(ev.stream, w)
    ref = reference_join(ev.stream, ev.id, ev.key, ev.ts, w, parse_predicate("eq")).pairs
    pos = {(int(st), int(i)): p for p, (st, i) in enumerate(zip(ev.stream, ev.id, strict=True))}
    d = np.array([pos[(1, s)] - pos[(0, r)] for r, s in ref.tolist()])
    assert len(d) > 100 and d.max() < br and d.min() > -bs
    assert br < 4 * 64 and bs < 4 * 100  # about twice the window: state can be dropped


@pytest.fixture(scope="module")
def spark():
    from spark_conn.session import spark_session

    s = spark_session("panjoin-peer-tests")
    yield s
    s.stop()


def _pairs(batches) -> np.ndarray:
    if not batches:
        return np.zeros((0, 2), np.int64)
    return sort_pairs(np.stack([np.concatenate([r for r, _ in batches]),
                                np.concatenate([s for _, s in batches])], axis=1))


def test_spark_join_equals_reference(spark, tmp_path):
    ev = generate(6000, "uniform", key_max=400, seed=5, rate=1000, disorder_ms=40)
    batches: list = []
    count, secs = spark_stream_join(ev, "count:500,700", "eq", spark, batch=1500,
                                    workdir=str(tmp_path),
                                    on_pairs=lambda r, s: batches.append((r, s)))
    ref = _ref_pairs(ev, "count:500,700", "eq")
    got = _pairs(batches)
    assert len(ref) > 500 and secs > 0
    assert len(np.unique(got, axis=0)) == len(got), "a pair came twice"
    assert np.array_equal(got, ref)
    assert count == len(got)
    # time window with lateness 10 ms: the tuples more than 10 ms behind are late
    from panjoin.semantics import Window

    w = Window("time", 300, 200, 10)
    batches = []
    count, _ = spark_stream_join(ev, w, "eq", spark, batch=2000, workdir=str(tmp_path),
                                 on_pairs=lambda r, s: batches.append((r, s)))
    ref = _ref_pairs(ev, "time:300,200", "eq", 10)
    got = _pairs(batches)
    assert len(ref) > 500
    assert len(np.unique(got, axis=0)) == len(got), "a pair came twice"
    assert np.array_equal(got, ref)
    assert count == len(got)


def test_band_predicates_are_refused_clearly():
    ev = generate(100, "uniform", seed=1)
    with pytest.raises(SparkCannotJoin, match="needs an equality predicate"):
        spark_stream_join(ev, "count:10,10", "band:3")
