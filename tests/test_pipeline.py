"""The Spark pipeline end to end on real brokers (noida-db and Tansu), a real local
cluster and local Spark: the output topic equals the brute-force reference;
malformed and late records land in their topics; a killed job, restarted, leaves
the output topics exactly as an uninterrupted run would (no loss, no duplicate).

Spark is slow to start on a small machine: one SparkSession for the module, small
streams, and the restart logic is also tested without Spark (same code path)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pytest
from kafka_helpers import RangesFrame, topic
from metrics_helpers import one, scrape

from panjoin.events import EventTable
from panjoin.generate import generate
from panjoin.kafka import io
from panjoin.launch import start_workers
from panjoin.manager.service import serve_manager
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window
from spark_conn.config import PipelineConfig
from spark_conn.kafka_source import plan_batch
from spark_conn.pipeline import BatchOutput, Pipeline, run
from spark_conn.records import parse_batch

LATENESS = 2000  # ms: covers the event-time skew between partitions in one micro-batch
MALFORMED = [
    (b"not json at all", "not JSON"),
    (b"\xff\xfe binary", "not JSON"),
    (b"[1, 2, 3]", "not a JSON object"),
    (b'{"id": 900001, "ts": 1700000000500}', "field 'key' is None, not a number"),
    (b'{"id": 900002, "key": "abc", "ts": 1700000000500}', "not a number"),
    (b'{"id": 900003, "key": 1.5, "ts": 1700000000500}', "not an integer"),
    (b'{"key": 4, "ts": 1700000000500}', "field 'id' is missing"),
    (b'{"id": 900004, "key": 4, "ts": "yesterday"}', "field 'ts' is 'yesterday'"),
]


@pytest.fixture(scope="module")
def manager(spark):
    # Spark's session first, before this process serves gRPC (see conftest.py)
    ws = start_workers(2)
    srv, port = serve_manager([w.address for w in ws], 0)
    yield f"127.0.0.1:{port}"
    srv.stop(0)
    for w in ws:
        w.stop()


@pytest.fixture(scope="module")
def spark():
    from spark_conn.session import spark_session

    s = spark_session("panjoin-tests")
    yield s
    s.stop()


def _events(n: int, seed: int, key_max: int, late: int = 3) -> EventTable:
    """``n`` tuples 1 ms apart in event time, then ``late`` R tuples far behind."""
    ev = generate(n, "uniform", key_max=key_max, seed=seed, rate=1000, payload=True)
    if not late:
        return ev
    ids = np.arange(late, dtype=np.int64) + ev.id.max() + 1000
    tail = EventTable(np.zeros(late, np.uint8), ids, np.arange(late, dtype=np.int64) * 7,
                      np.full(late, ev.ts.min() - 100_000, np.int64),
                      pa.array([f"late{i}" for i in range(late)]))
    return EventTable.concat([ev, tail])


def _produce(bootstrap: str, ev: EventTable, r: str, s: str, malformed=True, late=3) -> None:
    """Good records, then the malformed ones (into R), then the ``late`` last rows of
    ``ev``: they arrive after everything else, so both the pipeline and the
    reference see them behind the watermark."""
    n = len(ev) - late
    io.produce_events(bootstrap, ev.slice(0, n), r, s, partitions=2)
    if malformed:
        p = io.producer(bootstrap)
        for v, _ in MALFORMED:
            p.produce(r, v)
        assert p.flush(30) == 0
    if late:
        io.produce_events(bootstrap, ev.slice(n, len(ev)), r, s, create=False)


def _config(bootstrap, manager, tmp_path, window="time:400,400", predicate="band:3",
            **kw) -> PipelineConfig:
    return PipelineConfig(
        bootstrap=bootstrap, manager=manager, checkpoint=str(tmp_path / "ckpt"),
        window=window, predicate=predicate, r_topic=kw.pop("r"), s_topic=kw.pop("s"),
        out_topic=topic("joined"), late_topic=topic("late"),
        dead_letter_topic=topic("dead"), allowed_lateness=LATENESS, **kw)


def _joined(bootstrap, t) -> np.ndarray:
    recs = [json.loads(m.value()) for m in io.read_topic(bootstrap, t)]
    return np.array([[x["r_id"], x["s_id"]] for x in recs], np.int64).reshape(-1, 2)


def _reference(ev: EventTable, cfg: PipelineConfig):
    return reference_join(ev.stream, ev.id, ev.key, ev.ts,
                          parse_window(cfg.window, cfg.allowed_lateness),
                          parse_predicate(cfg.predicate))


def _check_outputs(bootstrap, cfg, ev, malformed=True) -> None:
    ref = _reference(ev, cfg)
    got = _joined(bootstrap, cfg.out_topic)
    assert len(np.unique(got, axis=0)) == len(got), "duplicate output records"
    assert np.array_equal(sort_pairs(got), sort_pairs(ref.pairs))
    late = [json.loads(m.value()) for m in io.read_topic(bootstrap, cfg.late_topic)]
    assert sorted(x["id"] for x in late) == sorted(ref.late_ids["R"].tolist())
    assert not len(ref.late_ids["S"])
    assert all(x["stream"] == "R" and x["record"]["payload"].startswith("late") for x in late)
    dead = [json.loads(m.value()) for m in io.read_topic(bootstrap, cfg.dead_letter_topic)]
    if malformed:
        for d in dead:  # records that are not UTF-8 travel as base64
            if "record_base64" in d:
                d["record"] = base64.b64decode(d["record_base64"]).decode("latin-1")
        text = [v.decode("latin-1") for v, _ in MALFORMED]
        dead.sort(key=lambda d: text.index(d["record"]))
        assert [d["record"] for d in dead] == text
        for d, (_, why) in zip(dead, MALFORMED, strict=True):
            assert why in d["reason"] and d["topic"] == cfg.r_topic
    else:
        assert dead == []


def test_band_join_equals_reference_with_late_and_malformed(broker, manager, spark,
                                                            tmp_path):
    ev = _events(1200, seed=1, key_max=3000)
    r, s = topic("R"), topic("S")
    _produce(broker.bootstrap, ev, r, s)
    cfg = _config(broker.bootstrap, manager, tmp_path, r=r, s=s, max_offsets_per_trigger=500,
                  metrics_port=0)
    scrapes = []  # the job's /metrics after each micro-batch: (before, samples, after)

    def on_batch(_b, pipe):
        t0 = time.time()
        scrapes.append((t0, scrape(f"127.0.0.1:{pipe.metrics_port}"), time.time()))

    started = time.time()
    stats = run(cfg, spark, on_batch=on_batch)
    assert stats["batches"] == 3  # 1210 records, at most 500 per micro-batch
    # batch 0 was read while Spark started, 1 and 2 while the one before joined
    assert (stats["read_ahead_hits"], stats["read_ahead_misses"]) == (3, 0)
    # batch 0 was joined while Spark started, 1 and 2 while the one before wrote
    assert (stats["joined_ahead"], stats["joined_ahead_wrong"]) == (3, 0)
    # batches 1 and 2 took their ranges from Spark's offset log, batch 0 from its frame;
    # together they tile every partition from its first offset to its end, once
    assert stats["ranges_from_log"] == 2
    pipe = Pipeline(cfg)
    logged = pipe.log.read()
    pipe.close()
    for t in (r, s):
        for p, (_, end) in io.end_offsets(broker.bootstrap, t).items():
            spans = [logged[b]["ranges"].get(t, {}).get(str(p)) for b in range(3)]
            spans = [x for x in spans if x]
            assert spans[0][0] == 0 and spans[-1][1] == end
            assert all(x[1] == y[0] for x, y in zip(spans, spans[1:], strict=False))
    _check_outputs(broker.bootstrap, cfg, ev)
    _check_metrics(broker.bootstrap, cfg, started, scrapes, logged)
    # both sides' fields travel with each pair
    m = io.read_topic(broker.bootstrap, cfg.out_topic)[0]
    rec = json.loads(m.value())
    assert rec["r"]["id"] == rec["r_id"] and rec["s"]["id"] == rec["s_id"]
    assert rec["r"]["payload"] == f"R{rec['r_id']}" and rec["s"]["payload"] == f"S{rec['s_id']}"
    assert abs(rec["r"]["key"] - rec["s"]["key"]) <= 3
    # a second run on the same checkpoint finds nothing new and writes nothing
    again = run(cfg, spark)
    assert again["batches"] == 0
    _check_outputs(broker.bootstrap, cfg, ev)


def _check_metrics(bootstrap, cfg, started: float, scrapes: list, logged: dict) -> None:
    """The job's Prometheus metrics (issue 30, item 1), scraped after each of its three
    micro-batches, against the topics: records in per stream = what was produced
    (malformed and late ones included), pairs, late and dead letters = what the output
    topics hold, offsets read and committed = the input's ends, the watermark = the
    one the join log gives the last batch, and one latency per pair."""
    assert len(scrapes) == 3
    for (_, a, _), (_, b, _) in zip(scrapes, scrapes[1:], strict=False):
        for k, v in a.items():  # counters and histograms never go down
            if k[0].endswith(("_total", "_count", "_bucket")):
                assert b[k] >= v, k
    t0, m, t1 = scrapes[-1]
    for name, t in (("R", cfg.r_topic), ("S", cfg.s_topic)):
        ends = io.end_offsets(bootstrap, t)
        assert one(m, "panjoin_pipeline_records_in_total", stream=name) == \
            sum(e - lo for lo, e in ends.values())
        for q, (_, e) in ends.items():
            assert one(m, "panjoin_pipeline_offset_read", topic=t, partition=str(q)) == e
            assert one(m, "panjoin_pipeline_offset_committed", topic=t, partition=str(q)) == e
    joined = [json.loads(x.value()) for x in io.read_topic(bootstrap, cfg.out_topic)]
    assert one(m, "panjoin_pipeline_pairs_out_total") == len(joined) > 0
    assert one(m, "panjoin_pipeline_late_total") == \
        len(io.read_topic(bootstrap, cfg.late_topic)) == 3
    assert one(m, "panjoin_pipeline_dead_letters_total") == \
        len(io.read_topic(bootstrap, cfg.dead_letter_topic)) == len(MALFORMED)
    assert one(m, "panjoin_pipeline_batches_total") == 3
    assert one(m, "panjoin_pipeline_batch_seconds_count") == 3
    assert one(m, "panjoin_pipeline_batch_seconds_bucket", le="+Inf") == 3
    assert 0 < one(m, "panjoin_pipeline_batch_seconds_sum") < t1 - started
    # a pair's latency: written (during the run) minus the event time of its later tuple
    later = np.array([max(x["r"]["ts"], x["s"]["ts"]) for x in joined]) / 1000.0
    assert one(m, "panjoin_pipeline_pair_latency_seconds_count") == len(joined)
    assert one(m, "panjoin_pipeline_pair_latency_seconds_bucket", le="+Inf") == len(joined)
    lat = one(m, "panjoin_pipeline_pair_latency_seconds_sum")
    assert (started - later).sum() <= lat <= (t1 - later).sum()
    w = logged[max(logged)]["watermark"] / 1000.0
    assert one(m, "panjoin_pipeline_watermark_seconds") == w
    assert t0 - w <= one(m, "panjoin_pipeline_watermark_lag_seconds") <= t1 - w


def test_equi_join_equals_reference(manager, spark, brokers, tmp_path):
    from panjoin.kafka.broker import start_broker

    b = brokers.get("noida") or brokers.setdefault("noida", start_broker("noida"))
    ev = _events(1000, seed=2, key_max=150, late=0)
    r, s = topic("R"), topic("S")
    _produce(b.bootstrap, ev, r, s, malformed=False, late=0)
    cfg = _config(b.bootstrap, manager, tmp_path, predicate="eq", r=r, s=s)
    run(cfg, spark)  # no admission limit: one micro-batch
    ref = _reference(ev, cfg)
    assert len(ref.pairs) > 100
    assert np.array_equal(sort_pairs(_joined(b.bootstrap, cfg.out_topic)), ref.pairs)


def test_native_source_without_the_connector_is_a_clear_error(manager, spark, tmp_path):
    from spark_conn.pipeline import source_frame

    cfg = _config("127.0.0.1:9", manager, tmp_path, r="R", s="S", source="native")
    with pytest.raises(RuntimeError, match="--source native needs Spark's Kafka connector"):
        source_frame(spark, cfg, None)


def test_native_source_checks_its_jars_before_any_topic_and_says_how_to_fix_it(brokers,
                                                                              tmp_path):
    """``--source native`` without a usable connector: one line saying how to fix it,
    exit 1, no traceback, and not one topic created, whether a --spark-jars path is
    missing (checked before Spark starts) or the jars given lack the connector (checked
    in the driver's JVM, before Kafka is touched)."""
    import glob

    import pyspark

    from panjoin.kafka.broker import start_broker
    from panjoin.kafka.librdkafka import admin

    b = brokers.get("noida") or brokers.setdefault("noida", start_broker("noida"))
    # a real jar, but not the connector: Spark starts with it, the class check fails
    (other,) = glob.glob(os.path.join(pyspark.__path__[0], "jars", "commons-pool-1*.jar"))[:1]
    cases = [(str(tmp_path / "no-such.jar"), "--spark-jars: " + str(tmp_path / "no-such.jar")
              + ": no such file"),
             (other, "--source native needs Spark's Kafka connector")]
    for k, (jars, said) in enumerate(cases):
        names = {f: topic(f"{f}{k}") for f in ("R", "S", "joined", "late", "dead")}
        p = subprocess.run(
            [sys.executable, "-m", "panjoin.cli", "pipeline", "--bootstrap-servers",
             b.bootstrap, "--manager", "127.0.0.1:9", "--checkpoint", str(tmp_path / f"c{k}"),
             "--window", "count:10,10", "--predicate", "eq", "--source", "native",
             "--spark-jars", jars, "--r-topic", names["R"], "--s-topic", names["S"],
             "--out-topic", names["joined"], "--late-topic", names["late"],
             "--dead-letter-topic", names["dead"]],
            capture_output=True, text=True, timeout=600)
        assert p.returncode == 1, p.stderr
        assert "Traceback" not in p.stderr, p.stderr
        last = p.stderr.strip().splitlines()[-1]
        assert last.startswith("panjoin pipeline: " + said), p.stderr
        assert "--spark-jars" in last and ("spark-sql-kafka" in last or k == 0)
        have = set(admin(b.bootstrap).list_topics(timeout=30).topics)
        assert not have & set(names.values()), have & set(names.values())


def _micro_batches(bootstrap, topics, per_partition: int) -> list[pa.Table]:
    """The topics cut into micro-batches the way Spark would hand them over."""
    ends = {t: io.end_offsets(bootstrap, t) for t in topics}
    c = io.consumer(bootstrap, **{"enable.partition.eof": True})
    out = []
    try:
        pos = {(t, p): lo for t in topics for p, (lo, _) in ends[t].items()}
        while any(pos[(t, p)] < ends[t][p][1] for t, p in pos):
            msgs = []
            for (t, p), a in pos.items():
                e = min(ends[t][p][1], a + per_partition)
                msgs += io.read_range(c, t, p, a, e)
                pos[(t, p)] = e
            out.append(pa.table({
                "topic": [m.topic() for m in msgs], "partition": [m.partition() for m in msgs],
                "offset": [m.offset() for m in msgs],
                "value": pa.array([m.value() for m in msgs], pa.binary())}))
    finally:
        c.close()
    return out


def test_restart_mid_batch_writes_the_rest_exactly_once(broker, manager, tmp_path):
    """Without Spark: a job dies after writing part of batch 2's output; a new job on
    the same checkpoint rebuilds the window from the join log, is handed batch 2
    again (as Spark would), writes only the missing records and goes on."""
    ev = _events(900, seed=3, key_max=2000)
    r, s = topic("R"), topic("S")
    _produce(broker.bootstrap, ev, r, s)
    cfg = _config(broker.bootstrap, manager, tmp_path, r=r, s=s)
    io.create_topics(broker.bootstrap, [cfg.out_topic, cfg.late_topic, cfg.dead_letter_topic])
    batches = _micro_batches(broker.bootstrap, [r, s], 50)
    assert len(batches) >= 4

    first = Pipeline(cfg)
    for b in range(2):
        first.process_table(batches[b], b)
    # batch 2 dies after 10 of its joined records reached the broker
    p2 = parse_batch(batches[2], cfg)  # what process_table does, up to the crash
    first.log.append({"batch": 2, "ranges": p2.ranges, "out_start": first.out_ends()})
    out = first.apply(2, p2)
    assert len(out.joined) > 20
    first.write(2, BatchOutput(out.joined[:10], [], []), None)
    first.session.close()  # the connection drops: the manager forgets this join

    second = Pipeline(cfg)
    for b in range(2, len(batches)):
        second.process_table(batches[b], b)
    second.close()
    assert second.stats["replayed_batches"] == 2
    assert second.stats["skipped_records"] == 10
    _check_outputs(broker.bootstrap, cfg, ev)
    # a replay of the last batch after it was fully written writes nothing more
    last = len(batches) - 1
    n_last = sum(dict(m.headers())[io.BATCH_HEADER] == str(last).encode()
                 for t in (cfg.out_topic, cfg.late_topic, cfg.dead_letter_topic)
                 for m in io.read_topic(broker.bootstrap, t))
    third = Pipeline(cfg)
    third.process_table(batches[last], last)
    third.close()
    assert third.stats["skipped_records"] == n_last > 0
    _check_outputs(broker.bootstrap, cfg, ev)


def _pipeline_cmd(cfg: PipelineConfig) -> list[str]:
    return [sys.executable, "-m", "spark_conn.cli", "--bootstrap-servers", cfg.bootstrap,
            "--manager", cfg.manager, "--checkpoint", cfg.checkpoint, "--window", cfg.window,
            "--predicate", cfg.predicate, "--allowed-lateness", str(cfg.allowed_lateness),
            "--r-topic", cfg.r_topic, "--s-topic", cfg.s_topic, "--out-topic", cfg.out_topic,
            "--late-topic", cfg.late_topic, "--dead-letter-topic", cfg.dead_letter_topic,
            "--max-offsets-per-trigger", str(cfg.max_offsets_per_trigger), "-v"]


def test_kill_and_restart_gives_the_same_output(broker, manager, tmp_path):
    """The job as its own process, killed (SIGKILL) mid-stream and started again."""
    ev = _events(1500, seed=4, key_max=3000)
    r, s = topic("R"), topic("S")
    _produce(broker.bootstrap, ev, r, s)
    cfg = _config(broker.bootstrap, manager, tmp_path, r=r, s=s, max_offsets_per_trigger=300)
    log_path = os.path.join(cfg.checkpoint, "panjoin", "join.log")
    env = dict(os.environ)
    proc = subprocess.Popen(_pipeline_cmd(cfg), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, env=env)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(log_path) and len(open(log_path).readlines()) >= 3:
                break
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM, mid-stream
        proc.wait(30)
    n_before = len(_joined(broker.bootstrap, cfg.out_topic))
    assert len(open(log_path).readlines()) >= 3, proc.stdout.read().decode()[-3000:]
    done = subprocess.run(_pipeline_cmd(cfg), capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "batches replayed into the join" in done.stdout
    assert 0 < n_before
    _check_outputs(broker.bootstrap, cfg, ev)


@pytest.mark.parametrize("key_type", ["int64", "float64"])
def test_parse_fast_path_equals_record_by_record(key_type, monkeypatch):
    from panjoin.kafka import json_fields
    from panjoin.kafka.io import event_records

    ev = generate(3000, "zipf", float_keys=key_type == "float64", seed=9, payload=True,
                  disorder_ms=20)
    vals = event_records(ev, np.arange(len(ev)))
    table = pa.table({"topic": ["R" if x == 0 else "S" for x in ev.stream],
                      "partition": pa.array(np.arange(len(ev)) % 2, pa.int32()),
                      "offset": np.arange(len(ev)) // 2, "value": pa.array(vals, pa.binary())})
    cfg = PipelineConfig("", "", "", "time:1,1", "eq", key_type=key_type)
    real = json_fields.read_fields
    calls = []

    def spy(*a):
        calls.append(real(*a))
        return calls[-1]

    monkeypatch.setattr(json_fields, "read_fields", spy)
    fast = parse_batch(table, cfg)
    assert calls[0][2].all()  # the Numba pass vouched for every record
    monkeypatch.setattr(json_fields, "read_fields",  # it vouches for none: Python's json
                        lambda *a: (*real(*a)[:2], np.zeros(len(table), bool)))
    slow = parse_batch(table, cfg)
    for f in ("stream", "id", "ts"):
        assert np.array_equal(getattr(fast, f), getattr(slow, f))
    assert fast.key.dtype == slow.key.dtype == np.dtype(key_type)
    assert np.array_equal(fast.key.view(np.int64), slow.key.view(np.int64))
    assert fast.records.take(fast.row) == slow.records.take(slow.row)
    assert fast.ranges == slow.ranges
    assert np.all(np.diff(fast.ts) >= 0)  # event-time order


def test_share_limit_is_proportional_and_exact():
    from spark_conn.kafka_source import share_limit

    assert share_limit({"a": 25, "b": 10, "c": 5, "d": 0}, 10) == {"a": 6, "b": 3, "c": 1, "d": 0}
    assert share_limit({"a": 3, "b": 4}, 100) == {"a": 3, "b": 4}
    rng = np.random.default_rng(1)
    for _ in range(200):
        waiting = {i: int(w) for i, w in enumerate(rng.integers(0, 50, rng.integers(1, 6)))}
        limit = int(rng.integers(1, 120))
        take = share_limit(waiting, limit)
        assert sum(take.values()) == min(limit, sum(waiting.values()))
        assert all(0 <= take[p] <= waiting[p] for p in waiting)


def test_source_and_sink_round_trip(broker, spark):
    """Batch and streaming reads (startingOffsets, maxOffsetsPerTrigger) and the sink."""
    t, out = topic("src"), topic("sink")
    io.create_topics(broker.bootstrap, [t, out], partitions=2)
    p = io.producer(broker.bootstrap)
    for i in range(40):
        p.produce(t, b"v%d" % i, partition=i % 2, timestamp=1000 + i)
    assert p.flush(30) == 0
    opts = {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": t}
    rows = spark.read.format("panjoin_kafka").options(**opts).load().collect()
    assert sorted(r.value for r in rows) == sorted(b"v%d" % i for i in range(40))
    assert all(r.timestamp == 1000 + int(r.value[1:]) and r.offset == int(r.value[1:]) // 2
               for r in rows)
    # from offset 15 of partition 1 on (its values v31, v33, ..., v39), at most 4 a batch
    seen = []
    q = (spark.readStream.format("panjoin_kafka").options(**opts)
         .option("startingOffsets", json.dumps({t: {"0": 20, "1": 15}}))
         .option("maxOffsetsPerTrigger", 4).load()
         .writeStream.foreachBatch(lambda df, b: seen.append(sorted(
             r.value for r in df.collect())))
         .option("checkpointLocation", f"/tmp/{t}-ckpt").trigger(processingTime="0 seconds")
         .start())
    deadline = time.monotonic() + 180
    while sum(map(len, seen)) < 5 and time.monotonic() < deadline:
        time.sleep(0.2)
    q.stop()
    assert sorted(v for b in seen for v in b) == [b"v%d" % i for i in (31, 33, 35, 37, 39)]
    assert max(map(len, seen)) <= 4
    # the sink
    df = spark.createDataFrame([(f"w{i}",) for i in range(25)], "value string")
    df.write.format("panjoin_kafka").options(**opts).option("topic", out).mode("append").save()
    got = sorted(m.value() for m in io.read_topic(broker.bootstrap, out))
    assert got == sorted(f"w{i}".encode() for i in range(25))


def test_demo_runs_the_whole_kafka_path(spark, capsys):
    """`make demo` (spark_conn.demo) on a small stream: its own broker, cluster and job."""
    from spark_conn import demo

    assert demo.main(["--n", "3000", "--per-trigger", "1500", "--window-ms", "200"]) == 0
    out = capsys.readouterr().out
    assert "micro-batches, 3,000 records" in out and "records/s Kafka to Kafka" in out
    joined = int(out.split(" joined records -> topic joined")[0].split()[-1].replace(",", ""))
    assert joined > 0 and "output topic copied to" in out


def test_source_stops_asking_the_broker_once_its_ends_reach_the_ending_offsets(
        broker, tmp_path):
    """With ``endingOffsets`` the source's plans are capped there: once the broker's
    ends reach them, ``latestOffset`` plans the same batches without asking again
    (here the broker is made unreachable), while ends short of them are asked anew."""
    from spark_conn.kafka_source import KafkaStreamReader

    r, s = topic("R"), topic("S")
    io.produce_events(broker.bootstrap, generate(400, "uniform", key_max=50, seed=2,
                                                 rate=1000), r, s, partitions=2)
    ending = {t: {str(p): v[1] for p, v in io.end_offsets(broker.bootstrap, t).items()}
              for t in (r, s)}
    short = {t: {p: e - 1 for p, e in ps.items()} for t, ps in ending.items()}
    more = dict(ending, **{r: {p: e + 5 for p, e in ending[r].items()}})  # not there yet

    def reader(end):
        return KafkaStreamReader({"kafka.bootstrap.servers": broker.bootstrap,
                                  "subscribe": f"{r},{s}", "maxOffsetsPerTrigger": "150",
                                  "endingOffsets": json.dumps(end)})

    for end, cached in ((ending, True), (short, True), (more, False)):
        src = reader(end)
        try:
            start = src.initialOffset()
            plans = [src.latestOffset(start, src.getDefaultReadLimit())]
            src._probe.close()
            src._probe, src.bootstrap = None, "127.0.0.1:1"  # nothing listens there
            if cached:
                plans.append(src.latestOffset(start, src.getDefaultReadLimit()))
                assert plans[0] == plans[1]
                assert sum(e - start[t][p] for t, ps in plans[1].items()
                           for p, e in ps.items()) == 150
            else:
                with pytest.raises(Exception):  # noqa: B017 (whatever the failed dial raises)
                    src.latestOffset(start, src.getDefaultReadLimit())
        finally:
            src.stop()


@pytest.mark.parametrize("limits,first_ahead,ahead,replayed", [
    ([500, 500, 100, 500], False, 2, 2),  # batch 2 is short: batches 0, 1 replayed
    ([100, 500, 500, 500], True, 3, 0),  # batch 0, joined while Spark started, is short
])
def test_a_batch_joined_ahead_on_a_wrong_guess_is_undone(broker, manager,
                                                         tmp_path, limits, first_ahead,
                                                         ahead, replayed):
    """Batches whose ranges the read-ahead guessed right are joined ahead; when Spark
    hands other ranges (here a short batch), the batch joined ahead is undone (the
    join is rebuilt from the log) and the output still equals the reference: no
    pair lost, none twice, late and malformed records where they belong."""
    ev = _events(1200, seed=4, key_max=3000)
    r, s = topic("R"), topic("S")
    _produce(broker.bootstrap, ev, r, s)
    cfg = _config(broker.bootstrap, manager, tmp_path, r=r, s=s, max_offsets_per_trigger=500)
    io.create_topics(broker.bootstrap, [cfg.out_topic, cfg.late_topic, cfg.dead_letter_topic])
    ending = {t: {str(p): v[1] for p, v in io.end_offsets(broker.bootstrap, t).items()}
              for t in (r, s)}
    pipe = Pipeline(cfg, ending)
    try:
        pos = {t: {p: 0 for p in ps} for t, ps in ending.items()}
        if first_ahead:
            pipe.join_first_ahead(pos)
        for b, limit in enumerate(limits):  # Spark's plans
            rng = {t: {p: [pos[t][p], e] for p, e in ps.items() if e > pos[t][p]}
                   for t, ps in plan_batch(pos, ending, limit).items()}
            rng = {t: ps for t, ps in rng.items() if ps}
            pipe.process(RangesFrame(rng), b)
            pos = {t: {p: rng.get(t, {}).get(p, [0, pos[t][p]])[1] for p in ps}
                   for t, ps in pos.items()}
        assert pos == ending
    finally:
        pipe.close()
    _check_outputs(broker.bootstrap, cfg, ev)
    assert (pipe.stats["joined_ahead"], pipe.stats["joined_ahead_wrong"]) == (ahead, 1)
    assert pipe.stats["replayed_batches"] == replayed  # into a new join


def test_read_ahead_guesses_the_next_batch_and_gives_back_a_wrong_guess(broker,
                                                                        tmp_path):
    """The read-ahead reads the batch the source will plan next (same planner, same
    ending offsets); when Spark hands other ranges, the records read for the guess go
    back to the reader and every batch still gets exactly its records."""
    r, s = topic("R"), topic("S")
    ev = generate(900, "uniform", key_max=100, seed=3, rate=1000, payload=True)
    io.produce_events(broker.bootstrap, ev, r, s, partitions=2)
    ending = {t: {str(p): v[1] for p, v in io.end_offsets(broker.bootstrap, t).items()}
              for t in (r, s)}
    cfg = PipelineConfig(broker.bootstrap, "127.0.0.1:1", str(tmp_path), "time:10,10", "eq",
                         r_topic=r, s_topic=s, max_offsets_per_trigger=200)

    def ranges(begin, end):
        return {t: {p: [begin[t][p], e] for p, e in ps.items() if e > begin[t][p]}
                for t, ps in end.items()}

    def truth(rng):  # the values of rng, read by librdkafka, ranges in fetch order
        c = io.consumer(broker.bootstrap, **{"enable.partition.eof": True})
        try:
            return [m.value() for t in sorted(rng) for p, (a, e) in sorted(
                rng[t].items(), key=lambda x: int(x[0])) for m in io.read_range(c, t, int(p), a, e)]
        finally:
            c.close()

    pipe = Pipeline(cfg, ending)
    try:
        pos = {t: {p: 0 for p in ps} for t, ps in ending.items()}
        b0 = ranges(pos, plan_batch(pos, ending, 200))
        assert pipe.fetch(b0).value.to_pylist() == truth(b0)
        pipe.read_ahead.start(pipe.reader(), b0)
        pos = {t: {p: e for p, (_, e) in ps.items()} for t, ps in b0.items()}
        b1 = ranges(pos, plan_batch(pos, ending, 200))
        rec, parsed = pipe.read_ahead.take(pipe.reader(), b1)  # the guess was b1
        assert rec.value.to_pylist() == truth(b1)
        assert parsed.id.tolist() == parse_batch(rec, cfg).id.tolist()
        pipe.read_ahead.start(pipe.reader(), b1)  # guesses b2 = the next 200
        pos = {t: {p: e for p, (_, e) in ps.items()} for t, ps in b1.items()}
        short = ranges(pos, plan_batch(pos, ending, 50))  # but Spark hands 50 records
        assert pipe.read_ahead.take(pipe.reader(), short) is None
        assert pipe.fetch(short).value.to_pylist() == truth(short)
        pos = {t: {p: e for p, (_, e) in ps.items()} for t, ps in short.items()}
        rest = ranges(pos, ending)  # then everything left: nothing lost, nothing twice
        assert pipe.fetch(rest).value.to_pylist() == truth(rest)
        assert len(truth(rest)) == len(ev) - 450
        assert (pipe.read_ahead.hits, pipe.read_ahead.misses) == (1, 1)
    finally:
        pipe.close()


def test_local_spark_session_imports_compiled_pyspark_and_checkpoints_without_shell(spark):
    """In local mode Spark's Python processes import the venv's pyspark, not the
    sources in pyspark.zip (compiled anew by every process Spark starts), and the
    checkpoint manager renames without Hadoop's shell commands (spark_conn.session)."""
    from spark_conn.session import local_spark_home

    home = local_spark_home()
    assert home is not None and os.path.isfile(os.path.join(home, "bin", "spark-submit"))
    assert not os.path.exists(os.path.join(home, "python", "lib", "pyspark.zip"))
    where = spark.sparkContext.parallelize([0], 1).map(
        lambda _: __import__("pyspark").__file__).collect()[0]
    assert ".zip" not in where and where.endswith(".py"), where
    assert spark.conf.get("spark.sql.streaming.checkpointFileManagerClass").endswith(
        "FileSystemBasedCheckpointFileManager")


#: a binary record a broker takes (about 1 MiB each), whose dead letter in full would
#: not be: base64 and the reason make it 1.2 MB
HUGE = bytes(range(256)) * 3515 + b"\xff" * 160  # 900,000 bytes, not UTF-8


def _huge_dead_letter_run(bootstrap, manager, tmp_path):
    """Events with the HUGE record and a small malformed one in R, joined without Spark
    (the job's code path, as above); returns (config, events, dead letters, stats)."""
    ev = _events(400, seed=4, key_max=800, late=0)
    r, s = topic("R"), topic("S")
    io.produce_events(bootstrap, ev, r, s, partitions=2)
    p = io.producer(bootstrap)
    for v in (HUGE, b"not json at all"):
        p.produce(r, v)
    assert p.flush(60) == 0
    cfg = _config(bootstrap, manager, tmp_path, r=r, s=s)
    io.create_topics(bootstrap, [cfg.out_topic, cfg.late_topic, cfg.dead_letter_topic])
    pipe = Pipeline(cfg)
    for b, t in enumerate(_micro_batches(bootstrap, [r, s], 150)):
        pipe.process_table(t, b)
    pipe.close()
    assert np.array_equal(sort_pairs(_joined(bootstrap, cfg.out_topic)),
                          _reference(ev, cfg).pairs)
    dead = [json.loads(m.value()) for m in io.read_topic(bootstrap, cfg.dead_letter_topic)]
    return cfg, dead, pipe.stats


def test_a_record_too_large_for_the_dead_letter_topic_goes_there_truncated(broker, manager,
                                                                          tmp_path):
    from spark_conn.records import DEAD_LETTER_KEEP

    cfg, dead, _ = _huge_dead_letter_run(broker.bootstrap, manager, tmp_path)
    assert len(dead) == 2
    big = next(d for d in dead if d.get("truncated"))
    assert big["original_bytes"] == len(HUGE) and big["reason"].startswith("not JSON")
    assert base64.b64decode(big["record_base64"]) == HUGE[:DEAD_LETTER_KEEP]
    c = io.consumer(broker.bootstrap, **{"enable.partition.eof": True})
    try:  # its topic, partition and offset name the record
        (m,) = io.read_range(c, big["topic"], big["partition"], big["offset"],
                             big["offset"] + 1)
    finally:
        c.close()
    assert big["topic"] == cfg.r_topic and m.value() == HUGE


def test_a_dead_letter_the_broker_refuses_is_logged_and_the_job_goes_on(
        brokers, manager, tmp_path, monkeypatch, caplog):
    import spark_conn.records
    from panjoin.kafka.broker import start_broker

    # noida-db refuses a record over about 1 MiB (MESSAGE_TOO_LARGE); Tansu takes it
    b = brokers.get("noida") or brokers.setdefault("noida", start_broker("noida"))
    monkeypatch.setattr(spark_conn.records, "DEAD_LETTER_KEEP", 1 << 30)  # no cap
    _, dead, stats = _huge_dead_letter_run(b.bootstrap, manager, tmp_path)
    assert [d["record"] for d in dead] == ["not json at all"]
    assert stats["dead_dropped"] == 1
    assert "is dropped" in caplog.text
