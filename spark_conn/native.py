"""``--source native``: Spark's own ``format("kafka")``, its jars, and the check that
they are usable before the job touches Kafka.

Spark's Kafka source lives in the JVM connector ``spark-sql-kafka-0-10``, which needs
``kafka-clients``, ``commons-pool2`` and ``spark-token-provider-kafka-0-10`` beside
it; none of them ships with pyspark. ``--spark-jars a.jar,b.jar`` hands the paths to
``spark.jars`` (the driver's and executors' classpath). Before any topic is created,
:func:`check_jar_paths` checks that each path is a readable jar, and, once Spark's
session is up, :func:`check_connector` loads one class of each of the four through
the driver's class loader: a missing one is a :class:`NativeSourceError` naming the
class, its jar and how to fix it, which ``panjoin pipeline`` prints as one line.

    >>> check_jar_paths(())   # no --spark-jars: the connector may be on Spark's own path
    >>> try:
    ...     check_jar_paths(("/no/such.jar",))
    ... except NativeSourceError as e:
    ...     print(str(e).split(";")[0])
    --spark-jars: /no/such.jar: no such file
"""

from __future__ import annotations

import os
import zipfile

#: a class of each jar the Kafka source needs, and the jar it comes in
NEEDED = (
    ("org.apache.spark.sql.kafka010.KafkaSourceProvider", "spark-sql-kafka-0-10_2.13"),
    ("org.apache.kafka.clients.consumer.KafkaConsumer", "kafka-clients"),
    ("org.apache.commons.pool2.impl.GenericKeyedObjectPool", "commons-pool2"),
    ("org.apache.spark.kafka010.KafkaConfigUpdater", "spark-token-provider-kafka-0-10_2.13"),
)

_HOW = ("give the connector's jars with --spark-jars (comma-separated paths: "
        "spark-sql-kafka-0-10_2.13 and spark-token-provider-kafka-0-10_2.13 of Spark {v}, "
        "kafka-clients, commons-pool2), or use --source python (the default), which needs "
        "no jar")


class NativeSourceError(RuntimeError):
    """Spark's Kafka source cannot run here; the message says how to fix it."""


def parse_jars(text: str | None) -> tuple[str, ...]:
    """``--spark-jars``' comma-separated paths (empty items dropped)."""
    return tuple(p.strip() for p in (text or "").split(",") if p.strip())


def check_jar_paths(jars) -> None:
    """Each path a readable jar (a zip file); else :class:`NativeSourceError`."""
    for p in jars:
        if not os.path.exists(p):
            raise NativeSourceError(f"--spark-jars: {p}: no such file; give the path of "
                                    "each jar, comma-separated")
        if not os.path.isfile(p) or not os.access(p, os.R_OK):
            raise NativeSourceError(f"--spark-jars: {p}: not a readable file; give the path "
                                    "of each jar, comma-separated")
        if not zipfile.is_zipfile(p):
            raise NativeSourceError(f"--spark-jars: {p}: not a jar (not a zip archive); "
                                    "give the connector's .jar files")


def check_connector(spark) -> None:
    """Load a class of each needed jar through the driver's class loader (where
    ``spark.jars`` puts them); the first missing one is a :class:`NativeSourceError`."""
    jvm = spark._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    missing = []
    for cls, jar in NEEDED:
        try:
            jvm.java.lang.Class.forName(cls, False, loader)
        except Exception:  # py4j's Py4JJavaError wrapping ClassNotFoundException
            missing.append(f"{jar} ({cls})")
    if missing:
        raise NativeSourceError(
            "--source native needs Spark's Kafka connector, and the driver's classpath "
            f"lacks {', '.join(missing)}: " + _HOW.format(v=spark.version))
