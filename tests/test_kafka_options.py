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

import pytest

from panjoin.kafka import options
from panjoin.kafka.options import KafkaOptionError

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
