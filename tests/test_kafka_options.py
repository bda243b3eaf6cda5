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

import pyarrow as pa
import pytest
from kafka_fixtures import broker, brokers, topic  # noqa: F401

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


def test_librdkafka_path_gives_what_the_fast_path_gives(broker):  # noqa: F811
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


def test_librdkafka_path_failures_are_clear(broker):  # noqa: F811
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
