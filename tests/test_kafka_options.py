"""librdkafka client options (``--kafka-option``, ``[kafka-option]``, Spark's ``kafka.*``):
parsing and checking, that they reach every Kafka client the project opens, and that
the librdkafka path they switch to (TLS/SASL) gives what the built-in fast path gives,
on both real brokers (noida-db and Tansu).

The brokers here are plaintext: ``sasl.mechanism=PLAIN`` with the default
``security.protocol=PLAINTEXT`` is a SASL option that librdkafka ignores on a
plaintext connection (a config warning only), so it switches the fast path off while
the clients still talk to the loopback broker."""

from __future__ import annotations

import logging
import tomllib

import confluent_kafka
import confluent_kafka.admin
import pyarrow as pa
import pytest
from kafka_helpers import topic

from panjoin.kafka import io, options, protocol
from panjoin.kafka.fetcher import SCHEMA, Fetcher
from panjoin.kafka.options import KafkaOptionError
from panjoin.kafka.writer import BatchWriter

#: switches the fast path off, harmless on a plaintext broker
SASL_OFF_PLAINTEXT = {"sasl.mechanism": "PLAIN"}


# --------------------------------------------------------------------------- parsing


def test_parse_flags_lists_and_tables():
    assert options.parse(None) == {} and options.parse([]) == {}
    assert options.parse(["a.b=1", " c = x=y ", "a.b=2"]) == {"a.b": "2", "c": "x=y"}
    assert options.parse("security.protocol=SSL") == {"security.protocol": "SSL"}
    # a config file's table: unquoted dotted keys nest in TOML, and are joined back
    conf = tomllib.loads('[kafka-option]\nsecurity.protocol = "SASL_SSL"\n'
                         '"ssl.ca.location" = "/ca.pem"\nsocket.timeout.ms = 5000\n'
                         'enable.ssl.certificate.verification = false\n')
    assert options.parse(conf["kafka-option"]) == {
        "security.protocol": "SASL_SSL", "ssl.ca.location": "/ca.pem",
        "socket.timeout.ms": "5000", "enable.ssl.certificate.verification": "false"}
    for bad in (["security.protocol"], ["=SSL"], [3]):
        with pytest.raises(KafkaOptionError, match="give KEY=VALUE"):
            options.parse(bad)
    with pytest.raises(KafkaOptionError, match="ssl.ca: give a string"):
        options.parse({"ssl": {"ca": [1, 2]}})


def test_validate_asks_librdkafka_and_refuses_what_the_project_sets():
    good = {"client.id": "x", "socket.timeout.ms": 5000, "sasl.mechanism": "PLAIN"}
    assert options.validate(good) == {"client.id": "x", "socket.timeout.ms": "5000",
                                      "sasl.mechanism": "PLAIN"}
    assert options.validate({}) == {} and options.validate(None) == {}
    with pytest.raises(KafkaOptionError, match=r"unknown Kafka option 'ssl\.ca\.locaton'.*"
                                               r"CONFIGURATION\.md"):
        options.validate({"client.id": "x", "ssl.ca.locaton": "/ca.pem"})
    with pytest.raises(KafkaOptionError, match="socket.timeout.ms"):
        options.validate({"socket.timeout.ms": "soon"})
    for name in ("bootstrap.servers", "group.id", "enable.auto.commit",
                 "enable.partition.eof", "acks", "transactional.id"):
        with pytest.raises(KafkaOptionError, match=f"{name}: the project sets it itself"):
            options.validate({name: "x"})


def test_which_options_turn_the_fast_path_off(caplog):
    on = [{}, {"client.id": "x"}, {"security.protocol": "PLAINTEXT"},
          {"security.protocol": "plaintext", "socket.timeout.ms": "100"}]
    off = [{"security.protocol": "SSL"}, {"security.protocol": "sasl_plaintext"},
           {"sasl.mechanism": "PLAIN"}, {"ssl.ca.location": "/ca.pem"}]
    assert [options.needs_librdkafka(o) for o in on] == [False] * len(on)
    assert [options.needs_librdkafka(o) for o in off] == [True] * len(off)
    # said once per client kind, with the option names and never their values
    secret = {"security.protocol": "SASL_SSL", "sasl.password": "hunter2"}
    with caplog.at_level(logging.INFO, logger="panjoin.kafka"):
        assert options.fast_path_off("test kind", secret)
        assert options.fast_path_off("test kind", secret)
        assert not options.fast_path_off("other kind", {"client.id": "x"})
    said = [r.getMessage() for r in caplog.records if "fast path" in r.getMessage()]
    assert said == ["Kafka options sasl.password, security.protocol ask for TLS/SASL: the "
                    "built-in fast path is off for the test kind, records go through "
                    "librdkafka"]


# --------------------------------------------------------------------------- same records


def _headers(bootstrap: str, t: str) -> dict:
    """``{partition: [(batch, seq, value)]}`` in offset order, read by librdkafka."""
    c = io.consumer(bootstrap, **{"enable.partition.eof": True})
    try:
        out = {}
        for p, (lo, end) in io.end_offsets(bootstrap, t).items():
            out[p] = [(int(dict(m.headers())[io.BATCH_HEADER]),
                       int(dict(m.headers())[io.SEQ_HEADER]), m.value() or b"")
                      for m in io.read_range(c, t, p, lo, end)]
        return out
    finally:
        c.close()


def test_librdkafka_path_gives_what_the_fast_path_gives(broker):
    """The same writes through the built-in path and through librdkafka land the same
    records, headers and partitions; the two readers give the same tables of every
    range (consecutive ranges, a seek back, a give-back); the end offsets agree.
    ``security.protocol=PLAINTEXT`` keeps the fast path."""
    b = broker.bootstrap
    fast_t, slow_t = topic("F"), topic("L")
    io.create_topics(b, [fast_t, slow_t], partitions=3)
    vals = pa.array([b"v%d-" % i + b"y" * (i % 300) for i in range(3000)], pa.binary())
    skip = {0, 7, 2999}
    fast = BatchWriter(b, max_batch_bytes=20_000, options={"security.protocol": "PLAINTEXT"})
    slow = BatchWriter(b, max_batch_bytes=20_000, options=SASL_OFF_PLAINTEXT)
    try:
        assert fast.brokers is not None and slow.librdkafka_only
        for w, t in ((fast, fast_t), (slow, slow_t)):
            assert w.write(t, vals.slice(5), batch=41, skip=skip) == 3000 - 5 - 2
            assert w.write(t, pa.array([b"", b"last"]), batch=42) == 2
    finally:
        fast.close()
        slow.close()
    ends = io.end_offsets(b, slow_t)
    assert ends == io.end_offsets(b, fast_t) == io.end_offsets(b, slow_t,
                                                             options=SASL_OFF_PLAINTEXT)
    assert sum(e for _, e in ends.values()) == 3000 - 5 - 2 + 2
    assert _headers(b, fast_t) == _headers(b, slow_t)

    reads = [[(slow_t, 0, 0, 100), (slow_t, 1, 0, 0)], [(slow_t, 0, 100, ends[0][1])],
             [(slow_t, 0, 10, 20), (slow_t, 1, 0, ends[1][1])],  # a seek back
             [(slow_t, 2, 0, 50)], [(slow_t, 2, 0, ends[2][1])]]
    f_fast, f_slow = Fetcher(b), Fetcher(b, options=SASL_OFF_PLAINTEXT)
    try:
        assert f_slow.end_offsets(slow_t) == ends and f_slow.brokers is None
        for i, rng in enumerate(reads):
            a, z = f_fast.read(rng), f_slow.read(rng)
            assert a.keys() == z.keys()
            for k in a:
                assert z[k].schema == SCHEMA and z[k].to_pylist() == a[k].to_pylist(), k
            if i == 3:  # a read-ahead that guessed wrong gives its records back
                f_fast.unread(a)
                f_slow.unread(z)
        assert f_fast.fell_back == 0 and f_slow.fell_back > 0
    finally:
        f_fast.close()
        f_slow.close()


def test_librdkafka_path_failures_are_clear(broker):
    """A record librdkafka refuses fails the write with the reason, and the writer goes
    on with a fresh producer (the refused write's records never arrive later); a
    missing topic is named, and not created."""
    b = broker.bootstrap
    t = topic("W")
    io.create_topics(b, [t])
    w = BatchWriter(b, options={**SASL_OFF_PLAINTEXT, "message.max.bytes": "1000"})
    try:
        with pytest.raises(protocol.ProtocolError, match=f"batch 1: writing to '{t}' failed"):
            w.write(t, pa.array([b"small", b"x" * 5000]), batch=1)
        with pytest.raises(protocol.ProtocolError, match="does not exist"):
            w.write(topic("nope"), pa.array([b"a"]), batch=2)
        assert w.write(t, pa.array([b"after"]), batch=3) == 1
    finally:
        w.close()
    got = [m.value() for m in io.read_topic(b, t)]
    assert got.count(b"after") == 1 and b"x" * 5000 not in got
    nope = topic("nope")
    with pytest.raises(io.KafkaIOError, match=f"topic '{nope}' does not exist"):
        io.end_offsets(b, nope, options=SASL_OFF_PLAINTEXT)
    with pytest.raises(io.KafkaIOError, match="does not exist"):
        io.end_offsets(b, nope)  # the built-in path: it was not created meanwhile


# --------------------------------------------------------------------------- the CLI


def _no_kafka_no_spark(monkeypatch):
    """Make anything past option checking fail loudly: no client, no Spark."""
    import spark_conn.session

    def boom(*_a, **_k):
        raise AssertionError("got past option checking")

    monkeypatch.setattr(spark_conn.session, "spark_session", boom)
    for name in ("create_topics", "end_offsets", "produce_events", "consume_to_parquet"):
        monkeypatch.setattr(io, name, boom)


PIPELINE = ["--bootstrap-servers", "127.0.0.1:1", "--manager", "127.0.0.1:2",
            "--window", "time:100,100", "--predicate", "band:1"]


def test_a_bad_option_stops_the_pipeline_before_spark_starts(monkeypatch, tmp_path, capsys):
    from panjoin.cli.main import main, parse
    from spark_conn import cli

    _no_kafka_no_spark(monkeypatch)
    ck = ["--checkpoint", str(tmp_path / "ck")]
    assert main(["pipeline", *PIPELINE, *ck, "--kafka-option", "client.id=ok",
                 "--kafka-option", "sasl.mechansim=PLAIN"]) == 2
    err = capsys.readouterr().err
    assert "panjoin pipeline: error: unknown Kafka option 'sasl.mechansim'" in err
    with pytest.raises(SystemExit) as e:  # no '=': argparse's own error
        main(["pipeline", *PIPELINE, *ck, "--kafka-option", "security.protocol"])
    assert e.value.code == 2 and "give KEY=VALUE" in capsys.readouterr().err
    # python -m spark_conn.cli
    with pytest.raises(KafkaOptionError, match="group.id: the project sets it itself"):
        cli.main([*PIPELINE, *ck, "--kafka-option", "group.id=mine"])
    # a config file's table, and a flag over the file's list
    conf = tmp_path / "job.toml"
    conf.write_text('[kafka-option]\nsecurity.protocol = "SASL_SSL"\nbogus.name = 1\n')
    assert main(["pipeline", *PIPELINE, *ck, "--config", str(conf)]) == 2
    assert "unknown Kafka option 'bogus.name'" in capsys.readouterr().err
    conf.write_text('kafka-option = ["client.id=a", "socket.timeout.ms=500"]\n')
    args = parse(["pipeline", *PIPELINE, *ck, "--config", str(conf),
                   "--kafka-option", "client.id=b"])
    assert cli.config_from_args(args).kafka_options == {
        "client.id": "b", "socket.timeout.ms": "500"}
    assert cli.config_from_args(parse(["pipeline", *PIPELINE, *ck])).kafka_options == {}


# --------------------------------------------------------------------------- every client


@pytest.fixture
def made(monkeypatch):
    """The config of every librdkafka client constructed (the real client is still
    made and used): ``[(kind, config)]``, the throwaway ones of validate() left out."""
    got = []

    def note(kind, conf):
        if "bootstrap.servers" in conf:
            got.append((kind, dict(conf)))

    def recording(make, kind):
        def made(conf, *a, **k):
            note(kind, conf)
            return make(conf, *a, **k)

        return made

    def admin_init(self, conf, **k):
        note("admin", conf)
        init(self, conf, **k)

    # Consumer and Producer are C types: wrapped where the code looks them up;
    # AdminClient's __init__ names its class (super(AdminClient, self)): wrapped there
    monkeypatch.setattr(confluent_kafka, "Consumer", recording(confluent_kafka.Consumer,
                                                               "consumer"))
    monkeypatch.setattr(confluent_kafka, "Producer", recording(confluent_kafka.Producer,
                                                               "producer"))
    init = confluent_kafka.admin.AdminClient.__init__
    monkeypatch.setattr(confluent_kafka.admin.AdminClient, "__init__", admin_init)
    return got


class Clients:
    """Which clients each step made, each checked for the option."""

    def __init__(self, made, tag: str):
        self.made, self.tag, self.seen = made, tag, 0

    def step(self, *kinds):
        new = self.made[self.seen:]
        self.seen = len(self.made)
        assert sorted({k for k, _ in new}) == sorted(kinds), new
        assert all(c.get("client.id") == self.tag for _, c in new), new


def test_options_reach_every_client(broker, made, tmp_path, capsys):
    from panjoin.cli.main import main
    from panjoin.events import write_events
    from panjoin.generate import generate
    from spark_conn import kafka_source
    from spark_conn.config import PipelineConfig
    from spark_conn.pipeline import BatchOutput, Pipeline

    tag = topic("panjoin-test")
    opts = {"client.id": tag, **SASL_OFF_PLAINTEXT}
    seen = Clients(made, tag)
    b = broker.bootstrap
    r, s, t = topic("R"), topic("S"), topic("T")

    # panjoin.kafka.io
    io.create_topics(b, [t], partitions=2, options=opts)
    seen.step("admin")
    ev = generate(200, "uniform", seed=1)
    io.produce_events(b, ev, r, s, partitions=2, options=opts)
    seen.step("admin", "producer")
    ends = io.end_offsets(b, r, options=opts)
    seen.step("consumer")
    assert sum(e for _, e in ends.values()) == ev.counts()[0]
    assert len(io.read_topic(b, r, options=opts)) == ev.counts()[0]
    seen.step("consumer")
    assert io.consume_to_parquet(b, s, str(tmp_path / "s.parquet"), options=opts) == \
        ev.counts()[1]
    seen.step("consumer")

    # the CLI, flags and a config file
    path = tmp_path / "ev.parquet"
    write_events(ev, path)
    assert main(["kafka", "produce", str(path), "--bootstrap-servers", b, "--r-topic",
                 topic("R"), "--s-topic", topic("S"), "--kafka-option", f"client.id={tag}",
                 "--kafka-option", "sasl.mechanism=PLAIN"]) == 0
    seen.step("admin", "producer")
    conf = tmp_path / "c.toml"
    conf.write_text(f'[kafka-option]\nclient.id = "{tag}"\nsasl.mechanism = "PLAIN"\n')
    assert main(["kafka", "consume", r, "--bootstrap-servers", b, "--config", str(conf),
                 "--out", str(tmp_path / "r.parquet")]) == 0
    seen.step("consumer")
    assert f"{ev.counts()[0]:,} records of {r}" in capsys.readouterr().out

    # the bulk path: reader and writer through librdkafka
    f = Fetcher(b, options=opts)
    w = BatchWriter(b, options=opts)
    try:
        assert f.brokers is None and w.brokers is None  # no plain TCP connection at all
        assert w.write(t, pa.array([b"x", b"y", b"z"]), batch=5) == 3
        seen.step("producer")
        got = f.read([(t, p, 0, e) for p, (_, e) in f.end_offsets(t).items()])
        assert sorted(v for x in got.values() for v in x.column("value").to_pylist()) == \
            [b"x", b"y", b"z"]
        seen.step("consumer")
    finally:
        f.close()
        w.close()
    # the fast path's own fallback to librdkafka (compressed batches) gets them too
    plain = {"client.id": tag}
    c = topic("C")
    io.create_topics(b, [c], options=plain)
    p = io.producer(b, plain, **{"compression.type": "lz4"})
    for i in range(50):
        p.produce(c, b"c%d" % i)
    assert p.flush(30) == 0
    seen.step("admin", "producer")
    f = Fetcher(b, options=plain)
    try:
        assert f.brokers is not None  # client.id alone keeps the fast path
        got = f.read([(c, 0, 0, 50)])[(c, 0)]
        assert got.num_rows == 50 and f.fell_back == 1
        seen.step("consumer")
    finally:
        f.close()

    # Spark's source and sink, without Spark: the driver's reader, a task's read and write
    so = {"kafka.bootstrap.servers": b, "subscribe": f"{r},{s}", "kafka.client.id": tag,
          "kafka.sasl.mechanism": "PLAIN"}
    src = kafka_source.KafkaStreamReader(so)
    try:
        start = src.initialOffset()
        end = src.latestOffset(start, src.getDefaultReadLimit())
        seen.step("consumer")
        assert end == {x: {str(p): e for p, (_, e) in io.end_offsets(b, x).items()}
                       for x in (r, s)}
        seen.step()  # that end_offsets had no options: the fast path, no client
        rows = [batch for part in src.partitions(start, end) for batch in src.read(part)]
        assert sum(x.num_rows for x in rows) == len(ev)
        seen.step("consumer")
    finally:
        src.close_probe()  # stop() is Spark's: test_a_stopped_source_runner_hangs_up_quietly
    out = topic("sink")
    io.create_topics(b, [out], options=opts)
    seen.step("admin")
    row = type("Row", (), {"asDict": lambda self: {"value": "v"}})
    assert kafka_source.write_rows({**so, "topic": out}, [row()]).count == 1
    seen.step("producer")
    with pytest.raises(kafka_source.KafkaOptionError, match="unknown Kafka option 'typo'"):
        kafka_source.KafkaStreamReader({**so, "kafka.typo": "1"})
    with pytest.raises(kafka_source.KafkaOptionError, match="unknown Kafka option 'typo'"):
        kafka_source.KafkaStreamWriter({**so, "kafka.typo": "1"})

    # the pipeline's own clients: reader, writer, output ends, what a restart reads back
    cfg = PipelineConfig(b, "127.0.0.1:1", str(tmp_path / "ck"), "time:100,100", "band:1",
                         r_topic=r, s_topic=s, out_topic=topic("J"), late_topic=topic("L"),
                         dead_letter_topic=topic("D"), kafka_options=opts)
    io.create_topics(b, [cfg.out_topic, cfg.late_topic, cfg.dead_letter_topic], options=opts)
    seen.step("admin")
    pipe = Pipeline(cfg)
    try:
        recs = pipe.fetch({r: {str(p): [0, e] for p, (_, e) in ends.items()}})
        assert len(recs.value) == ev.counts()[0]
        seen.step("consumer")
        pipe.write(3, BatchOutput([b"j0", b"j1"], [], [b"d0"]), None)
        seen.step("producer")
        assert pipe.out_ends()[cfg.out_topic] != {}
        seen.step("consumer")
        since = {x: {} for x in pipe.out_topics()}
        assert pipe.written(3, since) == {cfg.out_topic: {0, 1}, cfg.late_topic: set(),
                                          cfg.dead_letter_topic: {0}}
        seen.step("consumer")
    finally:
        pipe.close()
    _run_until_spark(cfg, seen)


class _SparkStop(Exception):
    pass


class _FakeReadStream:
    """``spark.readStream``: records the source's format and options, then stops."""

    def __init__(self):
        self.opts = {}

    def format(self, name):
        self.name = name
        return self

    def option(self, k, v):
        self.opts[k] = v
        return self

    def load(self):
        raise _SparkStop("stopped before Spark")


def _run_until_spark(cfg, seen) -> None:
    """``pipeline.run`` up to the query's start: the topics it creates, the ends it
    takes, then the options Spark's source is given."""
    from spark_conn import pipeline

    spark = type("Spark", (), {})()
    spark.readStream = _FakeReadStream()
    cfg.starting_offsets = "latest"  # no batch joined ahead: no manager here
    with pytest.raises(_SparkStop):
        pipeline.run(cfg, spark)
    seen.step("admin", "consumer")
    opts = spark.readStream.opts
    assert spark.readStream.name == "panjoin_kafka"
    assert {k: v for k, v in opts.items() if k.startswith("kafka.")} == {
        "kafka.bootstrap.servers": cfg.bootstrap, "kafka.client.id": seen.tag,
        "kafka.sasl.mechanism": "PLAIN"}
    cfg.source = "native"  # Spark's own source gets them too (Java's client reads kafka.*)
    spark.readStream = _FakeReadStream()
    with pytest.raises(RuntimeError, match="connector"):
        pipeline.source_frame(spark, cfg, None)
    assert spark.readStream.opts["kafka.client.id"] == seen.tag


QUIET_RUNNER = """
import sys
from spark_conn import kafka_source
kafka_source.KafkaStreamReader.stop(type("R", (), {"close_probe": lambda self: None})())
raise ERROR
"""


@pytest.mark.parametrize("error, printed", [
    ("BrokenPipeError(32, 'Broken pipe') from EOFError()", False),
    ("ConnectionResetError(104, 'reset')", False),
    ("ValueError('a real failure')", True),
])
def test_a_stopped_source_runner_hangs_up_quietly(error, printed):
    """After Spark stops the stream reader, the runner's write of the closed socket's
    error to that same socket (BrokenPipeError, chained on the EOFError) ends the
    process without a traceback on the job's terminal; any other error still prints."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", QUIET_RUNNER.replace("ERROR", error)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert ("Traceback" in p.stderr) == printed, p.stderr
