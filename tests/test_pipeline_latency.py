"""``panjoin bench latency --pipeline`` at a tiny size on a real broker (noida-db), a
real local cluster and the Spark job in a process of its own: every joined record is
matched to the due times of its two input records (the ``due_us`` they carry), every
latency is positive, and the pairs read from the output topic are the brute-force
reference's for the tuples produced (the markers included). One Spark start (about
half a minute on 2 cores), a few seconds of input."""

from __future__ import annotations

import json

import numpy as np

from panjoin.bench.latency_pipeline import PipelineLatencyConfig, due_by_id, pipeline_latency
from panjoin.kafka import io
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window


def test_pipeline_latency_pairs_and_due_times(brokers, tmp_path):
    from panjoin.kafka.broker import start_broker

    b = brokers.get("noida") or brokers.setdefault("noida", start_broker("noida"))
    cfg = PipelineLatencyConfig(rates=[1000, 2000], window="time:500,500", predicate="band:1",
                                seconds=1.0, warm=0.5, trigger="200 milliseconds")
    run = pipeline_latency(cfg, echo=print, work=str(tmp_path), bootstrap=b.bootstrap)
    assert [r.rate for r in run.results] == [1000, 2000]
    assert all(r.pairs > 100 and r.p50_ms > 0 for r in run.results)
    t, r, s = run.reads
    # the pairs read equal the reference's for everything produced, markers included
    ev = run.events()
    ref = reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window(cfg.window),
                         parse_predicate(cfg.predicate))
    got = np.stack([r, s], axis=1)
    assert len(np.unique(got, axis=0)) == len(got), "a pair came out twice"
    assert np.array_equal(sort_pairs(got), sort_pairs(ref.pairs))
    # every pair but the markers' is matched to its tuples' due times: latency > 0
    due_r, due_s, _, _ = due_by_id(run.phases)
    m = r > 0
    assert (~m).sum() == len(run.markers)  # each marker pairs with its other half only
    later = np.fmax(due_r[r[m]], due_s[s[m]])
    assert np.isfinite(later).all() and (t[m] - later > 0).all()
    # the due times the records carry through the job are the producer's
    us_r = np.concatenate([ph.due_us[ph.stream == 0] for ph in run.phases])
    id_r = np.concatenate([ph.id[ph.stream == 0] for ph in run.phases])
    us_s = np.concatenate([ph.due_us[ph.stream == 1] for ph in run.phases])
    id_s = np.concatenate([ph.id[ph.stream == 1] for ph in run.phases])
    by_r = dict(zip(id_r.tolist(), us_r.tolist(), strict=True))
    by_s = dict(zip(id_s.tolist(), us_s.tolist(), strict=True))
    recs = [json.loads(m.value()) for m in io.read_topic(b.bootstrap, run.out_topic)]
    assert len(recs) == len(got)
    for x in recs:
        if x["r_id"] > 0:
            assert x["r"]["due_us"] == by_r[x["r_id"]] and x["s"]["due_us"] == by_s[x["s_id"]]
            assert x["r"]["ts"] == x["r"]["due_us"] // 1000


def test_job_argv_round_trips_and_max_latency_goes_with_the_join():
    """The job's flags give back its config; ``--max-latency`` reaches the join's settings,
    and a bound that is not positive is refused before Spark starts."""
    import argparse

    import pytest

    from panjoin.cli.options import add_common, add_join_opts
    from spark_conn.cli import add_pipeline_opts, config_from_args, job_argv
    from spark_conn.config import PipelineConfig

    ap = argparse.ArgumentParser()
    add_pipeline_opts(ap)
    add_join_opts(ap)
    add_common(ap)
    cfg = PipelineConfig("127.0.0.1:9", "127.0.0.1:8", "ck", "time:500,500", "band:1",
                         r_topic="R1", subwindow_size=4096, max_offsets_per_trigger=1000,
                         trigger="100 milliseconds", kafka_options={"client.id": "x"})
    assert config_from_args(ap.parse_args(job_argv(cfg))) == cfg
    args = ap.parse_args(job_argv(cfg) + ["--max-latency", "20"])
    assert config_from_args(args).open_settings()["max_latency_ms"] == 20.0
    with pytest.raises(ValueError, match="positive"):
        config_from_args(ap.parse_args(job_argv(cfg) + ["--max-latency", "0"]))


def test_a_phase_after_one_that_fell_behind_did_not_keep_up():
    """A phase keeps up only if the job caught up after it and the phase before kept up: a
    phase that starts with the last one's backlog hands its pairs out in a burst as the job
    drains it (its latency trend about -1 s/s), which once read as "kept up"."""
    import doctest

    from panjoin.bench import latency_pipeline
    from panjoin.bench.latency import LatencyResult
    from panjoin.bench.latency_pipeline import kept_up

    assert doctest.testmod(latency_pipeline).failed == 0
    fine = LatencyResult("pipeline", 1e5, 1e5, 10, 10, 1, 2, 3, 4, 0, 0, True)
    late = LatencyResult("pipeline", 1e5, 1e5, 10, 10, 1, 2, 3, 4, 900, 900, False)
    assert kept_up(fine, True, True)
    assert not kept_up(fine, False, True)  # its marker never came out
    assert not kept_up(fine, True, False)  # the phase before fell behind
    assert not kept_up(late, True, True)
