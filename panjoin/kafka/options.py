"""librdkafka client properties (TLS, SASL, anything else) for every Kafka client we open.

Users of a secured Kafka give librdkafka's own property names (its CONFIGURATION.md),
as they would to any librdkafka client: on the command line, repeatable::

    panjoin pipeline ... --kafka-option security.protocol=SASL_SSL \\
        --kafka-option sasl.mechanism=PLAIN --kafka-option sasl.username=joiner ...

in a ``--config`` file, either as a list of ``KEY=VALUE`` strings,
``kafka-option = ["security.protocol=SSL", "ssl.ca.location=/etc/kafka/ca.pem"]``, or
as a table (TOML nests unquoted dotted keys; they are joined back into property
names)::

    [kafka-option]
    security.protocol = "SSL"
    "ssl.ca.location" = "/etc/kafka/ca.pem"

or, to Spark's ``format("panjoin_kafka")``, as ``.option("kafka.<property>", value)``.

This module owns them: :func:`parse` (strings or a table -> ``{name: value}``),
:func:`validate` (librdkafka itself checks names and values, offline; the properties
the project sets itself are refused with the reason) and :func:`needs_librdkafka`;
:func:`panjoin.kafka.librdkafka.client_config` puts them into every client's config.

The built-in fast path (:mod:`panjoin.kafka.fetcher`, :mod:`panjoin.kafka.writer`)
speaks the Kafka protocol over plain TCP: no TLS, no SASL. Options that ask for
either (``security.protocol`` other than PLAINTEXT, any ``ssl.*`` or ``sasl.*``)
turn it off, records then go through librdkafka, and :func:`fast_path_off` logs so
once per client kind. Other options (``client.id``, ``socket.timeout.ms``, ...)
reach every librdkafka client; the fast path has no use for them.

    >>> opts = parse(["security.protocol=SASL_SSL", "sasl.mechanism=PLAIN"])
    >>> needs_librdkafka(opts), needs_librdkafka({"security.protocol": "plaintext"})
    (True, False)
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("panjoin.kafka")

#: the librdkafka reference that property names come from
REFERENCE = "https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md"

_GROUP = ("reads go by the offsets Spark planned, never through a consumer group, and "
          "the offsets live in the Spark checkpoint")
_EXACTLY_ONCE = ("the output is written by an idempotent producer (acks=all) and kept "
                 "exactly once by the panjoin.batch/panjoin.seq headers")
#: properties the project sets itself, and why: giving one is an error, not a silent
#: override (a user who sets acks=1 or isolation.level expects it to matter)
RESERVED = {
    "bootstrap.servers": "give the brokers with --bootstrap-servers (Spark: the "
                         "kafka.bootstrap.servers option)",
    "metadata.broker.list": "give the brokers with --bootstrap-servers",
    "group.id": _GROUP,
    "enable.auto.commit": _GROUP,
    "auto.commit.enable": _GROUP,
    "enable.auto.offset.store": _GROUP,
    "auto.offset.reset": "ranges are read from exact offsets (--starting-offsets picks "
                         "where the job starts)",
    "enable.partition.eof": "the readers set it where they stop at a partition's end",
    "isolation.level": "records are read as committed, as the built-in reader reads them",
    "enable.idempotence": _EXACTLY_ONCE,
    "acks": _EXACTLY_ONCE,
    "request.required.acks": _EXACTLY_ONCE,
    "transactional.id": _EXACTLY_ONCE + ", not by Kafka transactions",
}

_SECURE_PREFIXES = ("ssl.", "sasl.")


class KafkaOptionError(ValueError):
    """A Kafka client option that cannot be used: the message says which and why."""


def _text(name: str, v) -> str:
    if isinstance(v, bool):  # TOML true/false: librdkafka spells them in lower case
        return "true" if v else "false"
    if isinstance(v, str | int | float):
        return str(v)
    raise KafkaOptionError(f"Kafka option {name}: give a string, number or boolean, "
                           f"not {type(v).__name__} {v!r}")


def _flatten(table: dict, prefix: str = "") -> dict[str, str]:
    """A TOML table's keys as property names: ``{"ssl": {"ca": {"location": x}}}`` (what
    unquoted ``ssl.ca.location = x`` parses to) -> ``{"ssl.ca.location": x}``."""
    out = {}
    for k, v in table.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, name + "."))
        else:
            out[name] = _text(name, v)
    return out


def parse(given) -> dict[str, str]:
    """``{name: value}`` from what a user gave: None, one ``"KEY=VALUE"`` string, a list
    of them (``--kafka-option``, a config file's list), or a table (a config file's
    ``[kafka-option]``, a dict). Later entries win. Names are checked by
    :func:`validate`, not here."""
    if not given:
        return {}
    if isinstance(given, dict):
        return _flatten(given)
    if isinstance(given, str):
        given = [given]
    out = {}
    for item in given:
        if isinstance(item, dict):  # a list of tables in TOML
            out.update(_flatten(item))
            continue
        if not isinstance(item, str):
            raise KafkaOptionError(f"Kafka option {item!r}: give KEY=VALUE, e.g. "
                                   f"security.protocol=SASL_SSL")
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise KafkaOptionError(f"Kafka option {item!r}: give KEY=VALUE (a librdkafka "
                                   f"property), e.g. security.protocol=SASL_SSL")
        out[key] = value.strip()
    return out


def secure_names(options: dict) -> list[str]:
    """The option names that ask for TLS or SASL, which the built-in path cannot speak."""
    return sorted(k for k, v in options.items()
                  if k.startswith(_SECURE_PREFIXES)
                  or (k == "security.protocol" and str(v).strip().lower() != "plaintext"))


def needs_librdkafka(options: dict | None) -> bool:
    """True when ``options`` ask for TLS or SASL: ``security.protocol`` other than
    PLAINTEXT (any case), or any ``ssl.*``/``sasl.*`` property."""
    return bool(options) and bool(secure_names(options))


def validate(options: dict | None) -> dict[str, str]:
    """``options`` as librdkafka takes them, or :class:`KafkaOptionError` naming the
    option and the fix: a property the project sets itself (:data:`RESERVED`), a name
    librdkafka does not know, a value it refuses. librdkafka judges by building a
    throwaway producer handle with no brokers: nothing is contacted."""
    options = {str(k): _text(str(k), v) for k, v in (options or {}).items()}
    for name in sorted(options):
        if name in RESERVED:
            raise KafkaOptionError(f"Kafka option {name}: the project sets it itself "
                                   f"({RESERVED[name]}); drop it")
    if not options:
        return options
    from panjoin.kafka.librdkafka import confluent

    ck = confluent()
    # log_level 0: librdkafka would warn about the missing bootstrap.servers
    try:
        ck.Producer({**options, "log_level": 0})
    except ck.KafkaException as e:
        err = e.args[0] if e.args else e
        text = err.str() if hasattr(err, "str") else str(err)
        if "No such configuration property" in text:
            name = text.split('"')[1] if text.count('"') >= 2 else text
            raise KafkaOptionError(
                f"unknown Kafka option {name!r}: not a librdkafka property; check the "
                f"spelling against {REFERENCE} (Java client names such as "
                f"sasl.jaas.config or ssl.truststore.location have librdkafka "
                f"counterparts there)") from None
        raise KafkaOptionError(f"Kafka options {', '.join(sorted(options))}: librdkafka "
                               f"refuses them: {text}") from None
    except TypeError as e:  # the Python client's own keys (callbacks) given as text
        raise KafkaOptionError(f"Kafka options: {e}") from None
    return options


_told: set = set()
_told_lock = threading.Lock()


def fast_path_off(kind: str, options: dict | None) -> bool:
    """True when ``options`` need librdkafka (see :func:`needs_librdkafka`); the first
    time for each client ``kind`` in this process, log that the built-in path is off.
    Only names are logged: values may be secrets."""
    names = secure_names(options) if options else []
    if not names:
        return False
    with _told_lock:
        first = kind not in _told
        _told.add(kind)
    if first:
        log.warning("Kafka options %s ask for TLS/SASL: the built-in fast path is off for "
                    "the %s, records go through librdkafka", ", ".join(names), kind)
    return True


def add_option_arg(parser) -> None:
    """``--kafka-option KEY=VALUE`` (repeatable) on an argparse parser or group: the
    values gather into a dict over whatever a ``--config`` file gave (a list or a
    table), a later one winning; :func:`parse` reads the result either way."""
    import argparse

    class Collect(argparse.Action):
        def __call__(self, ap, namespace, value, option_string=None):
            try:
                got = parse(getattr(namespace, self.dest, None))
                got.update(parse([value]))
            except KafkaOptionError as e:
                ap.error(str(e))
            setattr(namespace, self.dest, got)

    parser.add_argument(
        "--kafka-option", action=Collect, metavar="KEY=VALUE", default=None,
        help="a librdkafka client property for every Kafka client, repeatable, e.g. "
             "security.protocol=SASL_SSL, sasl.mechanism=PLAIN, sasl.username=U, "
             "sasl.password=P, ssl.ca.location=/etc/kafka/ca.pem; TLS or SASL turn the "
             "built-in fast path off (records go through librdkafka). In --config: "
             "kafka-option = [\"KEY=VALUE\", ...] or a [kafka-option] table")


def from_args(args) -> dict[str, str]:
    """The ``--kafka-option`` values (and a config file's) of parsed ``args``, checked
    by librdkafka (:func:`validate`): a ValueError names a bad one."""
    return validate(parse(getattr(args, "kafka_option", None)))
