"""The pipeline's per-partition watermark, bounded recovery and manager restarts, on a
real broker (Tansu), a real cluster and the job's own micro-batch path (``process``
with Spark's plans; one test runs Spark itself).

The reference follows the rule, not the code: W of micro-batch b is the least, over
every partition of both topics, of the largest ts in the batches before b (-inf while
a partition has given nothing); a tuple is late iff ts < W - L, and the output is the
brute-force join (DESIGN section 2) of the tuples that are not late."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest
from kafka_helpers import RangesFrame, topic

from panjoin.events import EventTable
from panjoin.generate import generate
from panjoin.kafka import io
from panjoin.launch import start_manager, start_workers
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window
from spark_conn.config import PipelineConfig
from spark_conn.kafka_source import plan_batch
from spark_conn.pipeline import Pipeline, run
from spark_conn.watermark import PartitionWatermarks

WINDOW, PRED = "time:200,500", "eq"


@pytest.fixture(scope="module")
def tansu(brokers):
    from panjoin.kafka.broker import start_broker

    b = brokers.get("tansu")
    if b is None or not b.alive():
        b = brokers["tansu"] = start_broker("tansu")
    return b


@pytest.fixture(scope="module")
def cluster():
    ws = start_workers(2)
    m = start_manager([w.address for w in ws])
    yield ws, m
    m.stop()
    for w in ws:
        w.stop()


def _events(n, disorder, r_fraction, seed) -> EventTable:
    """``n`` tuples ~1 ms apart, each ts up to ``disorder`` ms behind in-order (so no
    partition is more out of order than that)."""
    ev = generate(n, "uniform", key_max=60, seed=seed, rate=1000, r_fraction=r_fraction)
    rng = np.random.default_rng(seed)
    ev.ts = ev.ts - rng.integers(0, disorder + 1, len(ev)) if disorder else ev.ts
    return ev


def _setup(bootstrap, ev, partitions, tmp_path, manager, **kw):
    r, s = topic("R"), topic("S")
    io.produce_events(bootstrap, ev, r, s, partitions=partitions)
    cfg = PipelineConfig(bootstrap=bootstrap, manager=manager,
                         checkpoint=str(tmp_path / "ckpt"), window=WINDOW, predicate=PRED,
                         r_topic=r, s_topic=s, out_topic=topic("joined"),
                         late_topic=topic("late"), dead_letter_topic=topic("dead"), **kw)
    io.create_topics(bootstrap, [cfg.out_topic, cfg.late_topic, cfg.dead_letter_topic])
    ending = {t: {str(p): v[1] for p, v in io.end_offsets(bootstrap, t).items()}
              for t in (r, s)}
    return cfg, ending


def _plans(ending, limit):
    """Spark's micro-batch plans from the earliest offsets to ``ending``."""
    pos = {t: {p: 0 for p in ps} for t, ps in ending.items()}
    while pos != ending:
        rng = {t: {p: [pos[t][p], e] for p, e in ps.items() if e > pos[t][p]}
               for t, ps in plan_batch(pos, ending, limit).items()}
        rng = {t: ps for t, ps in rng.items() if ps}
        yield rng
        pos = {t: {p: rng.get(t, {}).get(p, [0, pos[t][p]])[1] for p in ps}
               for t, ps in pos.items()}


def _drive(pipe, plans, on_batch=None):
    for b, rng in enumerate(plans):
        pipe.process(RangesFrame(rng), b)
        if on_batch is not None:
            on_batch(b)


def _reference(bootstrap, cfg, batches):
    """Late ids and pairs by the rule (module docstring), for the given plans."""
    recs = {}
    for code, t in ((0, cfg.r_topic), (1, cfg.s_topic)):
        for m in io.read_topic(bootstrap, t):
            v = json.loads(m.value())
            recs[(t, m.partition(), m.offset())] = (code, v["id"], v["key"], v["ts"])
    parts = {(code, int(p)) for code, t in ((0, cfg.r_topic), (1, cfg.s_topic))
             for p in io.end_offsets(bootstrap, t)}
    top = dict.fromkeys(parts)
    rows, late = [], []
    lateness = cfg.allowed_lateness
    for rng in batches:
        tops = list(top.values())
        w = None if any(x is None for x in tops) else min(tops)  # from earlier batches
        for key in [(t, int(p), o) for t, ps in rng.items() for p, (a, e) in ps.items()
                    for o in range(a, e)]:
            code, i, k, ts = recs[key]
            sp = (code, key[1])
            top[sp] = ts if top[sp] is None else max(top[sp], ts)
            (late if w is not None and ts < w - lateness else rows).append((code, i, k, ts))
    a = np.array(rows, np.int64).reshape(-1, 4)
    ref = reference_join(a[:, 0].astype(np.uint8), a[:, 1], a[:, 2], a[:, 3],
                         parse_window(WINDOW, 1 << 40), parse_predicate(PRED))
    return sorted((c, i) for c, i, _, _ in late), ref.pairs


def _outputs(bootstrap, cfg):
    pairs = [json.loads(m.value()) for m in io.read_topic(bootstrap, cfg.out_topic)]
    got = np.array([[x["r_id"], x["s_id"]] for x in pairs], np.int64).reshape(-1, 2)
    late = [json.loads(m.value()) for m in io.read_topic(bootstrap, cfg.late_topic)]
    return sort_pairs(got), sorted((int(x["stream"] == "S"), x["id"]) for x in late), len(got)


@pytest.mark.parametrize("partitions,limit,r_fraction,disorder,lateness", [
    (1, 500, 0.5, 0, 0),  # in order, one partition
    (2, 500, 1 / 21, 30, 30),  # R:S = 1:20, disorder within L
    (4, 900, 0.5, 30, 40),
    (3, 2000, 1 / 21, 50, 50),
    (2, None, 0.5, 30, 30),  # everything in one micro-batch
    (2, 500, 0.5, 80, 10),  # disorder beyond L: exactly the rule's late tuples
    (4, 700, 1 / 21, 120, 20),
])
def test_watermark_late_tuples_and_output_follow_the_rule(tansu, cluster, tmp_path,
                                                         partitions, limit, r_fraction,
                                                         disorder, lateness):
    ev = _events(3000, disorder, r_fraction, seed=partitions * 7 + disorder)
    cfg, ending = _setup(tansu.bootstrap, ev, partitions, tmp_path, cluster[1].address,
                         allowed_lateness=lateness, max_offsets_per_trigger=limit)
    plans = list(_plans(ending, limit))
    pipe = Pipeline(cfg, ending)
    try:
        _drive(pipe, plans)
    finally:
        pipe.close()
    want_late, want_pairs = _reference(tansu.bootstrap, cfg, plans)
    pairs, late, n = _outputs(tansu.bootstrap, cfg)
    assert len(want_pairs) > 500
    assert n == len(pairs) and np.array_equal(pairs, want_pairs)
    assert late == want_late
    if disorder <= lateness:  # in order within L per partition: never late
        assert late == []
    elif r_fraction == 0.5:  # even rates keep W close behind: some tuples are late
        assert late


def test_the_old_rule_would_call_in_order_tuples_late():
    """Why the rule is per partition: R/0 runs ahead of R/1 in one micro-batch."""
    wm = PartitionWatermarks([(0, 0), (0, 1)])
    wm.observe(np.zeros(3, np.uint8), np.array([0, 0, 1]), np.array([900, 1000, 100]))
    assert wm.current() == 100  # not 1000: R/1's next tuple at 120 is in time
    wm.observe(np.zeros(1, np.uint8), np.array([1]), np.array([50]))
    assert wm.current() == 100  # W never moves back


def test_an_idle_partition_stops_holding_the_watermark():
    now = [0.0]
    wm = PartitionWatermarks([(0, 0), (1, 0), (1, 1)], idle_timeout=5, clock=lambda: now[0])
    wm.observe(np.array([0, 1], np.uint8), np.array([0, 0]), np.array([700, 900]))
    assert wm.current() is None  # S/1 has given nothing: W = -inf
    now[0] = 6.0
    wm.observe(np.array([0], np.uint8), np.array([0]), np.array([800]))
    assert wm.current() == 800  # S/1 idle; S/0 (900, heard at 0 s) idle too: R/0 alone
    wm.restore(wm.snapshot(), wm.w)
    assert wm.snapshot() == [[0, 0, 800], [1, 0, 900], [1, 1, None]]
    with pytest.raises(ValueError, match="positive"):
        PartitionWatermarks(idle_timeout=0)


def test_bounded_recovery_replays_only_the_window(tansu, cluster, tmp_path):
    """40 micro-batches, a window of about 3 of them: the join log is compacted as
    batches leave the window, and a restart replays only the batches the window still
    needs, with the same output (exactly once) as the uninterrupted reference."""
    ev = _events(8000, 20, 0.5, seed=11)
    cfg, ending = _setup(tansu.bootstrap, ev, 2, tmp_path, cluster[1].address,
                         allowed_lateness=20, max_offsets_per_trigger=200)
    plans = list(_plans(ending, 200))
    assert len(plans) == 40
    first = Pipeline(cfg, ending)
    try:
        _drive(first, plans[:30])
    finally:
        first.close()
    assert first.stats["log_compactions"] >= 1
    kept = first.log.read()
    assert len(kept) < 20 and max(kept) == 29
    # a new job (a crash after batch 29 was logged and written): Spark replays 29
    second = Pipeline(cfg, ending)
    try:
        for b in range(29, 40):
            second.process(RangesFrame(plans[b]), b)
    finally:
        second.close()
    assert 0 < second.stats["replayed_batches"] <= 6  # about the window, not 29
    assert second.stats["skipped_records"] > 0  # batch 29's output was already there
    want_late, want_pairs = _reference(tansu.bootstrap, cfg, plans)
    pairs, late, n = _outputs(tansu.bootstrap, cfg)
    assert n == len(pairs) and np.array_equal(pairs, want_pairs)
    assert late == want_late


def test_manager_killed_and_restarted_mid_run(tansu, cluster, tmp_path):
    """kill -9 of the manager process mid-run; a new one starts on the same port a
    second later: the job reconnects, rebuilds its window from the join log, and the
    output has no loss and no duplicate."""
    ws, _ = cluster
    m = start_manager([w.address for w in ws])
    port = m.address.rsplit(":", 1)[1]
    ev = _events(4000, 20, 0.5, seed=12)
    cfg, ending = _setup(tansu.bootstrap, ev, 2, tmp_path, m.address,
                         allowed_lateness=20, max_offsets_per_trigger=400)
    plans = list(_plans(ending, 400))
    restarted = []

    def kill_at(b):
        if b == 4:
            m.kill()

            def again():
                time.sleep(1.0)
                restarted.append(start_manager([w.address for w in ws],
                                               args=["--port", port]))

            threading.Thread(target=again, daemon=True).start()

    pipe = Pipeline(cfg, ending)
    try:
        _drive(pipe, plans, kill_at)
    finally:
        pipe.close()
        for x in restarted:
            x.stop()
    assert pipe.stats["manager_reconnects"] >= 1 and restarted
    want_late, want_pairs = _reference(tansu.bootstrap, cfg, plans)
    pairs, late, n = _outputs(tansu.bootstrap, cfg)
    assert n == len(pairs) and np.array_equal(pairs, want_pairs)
    assert late == want_late


def test_spark_run_with_uneven_partitions_has_no_late_tuples(tansu, cluster, tmp_path):
    """The issue's case through Spark itself: R:S = 1:20, 2 partitions each, data in
    order within L: nothing is late and the output equals the reference, whatever Spark
    cuts into micro-batches."""
    from spark_conn.session import spark_session

    ev = _events(3000, 10, 1 / 21, seed=13)
    cfg, ending = _setup(tansu.bootstrap, ev, 2, tmp_path, cluster[1].address,
                         allowed_lateness=10, max_offsets_per_trigger=500)
    spark = spark_session("panjoin-watermark-tests")
    try:
        st = run(cfg, spark)
    finally:
        spark.stop()
    assert st["batches"] == 6 and st["late"] == 0
    plans = list(_plans(ending, 500))
    _, want_pairs = _reference(tansu.bootstrap, cfg, plans)
    pairs, late, n = _outputs(tansu.bootstrap, cfg)
    assert late == [] and n == len(pairs) and np.array_equal(pairs, want_pairs)
    assert os.path.exists(os.path.join(cfg.checkpoint, "panjoin", "join.log"))
