"""A local SparkSession bound to loopback, with Python workers on this venv's python.

Facts measured here (DESIGN section 5): Spark's Python workers fail unless
``PYSPARK_PYTHON`` names the venv's interpreter, and Spark binds a non-loopback
address unless ``SPARK_LOCAL_IP=127.0.0.1`` and ``spark.driver.host=127.0.0.1``.
"""

from __future__ import annotations

import os
import sys


def _check_java() -> None:
    import shutil

    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return
    if shutil.which("java"):
        return
    raise RuntimeError("Spark needs a Java runtime (17 or 21): install one (e.g. apt-get "
                       "install openjdk-17-jre-headless) or set JAVA_HOME to it")


def spark_session(app: str = "panjoin", master: str = "local[2]", conf: dict | None = None):
    """The (one per process) SparkSession, with the Kafka data source registered."""
    _check_java()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master(master).appName(app)
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.execution.arrow.pyspark.enabled", "true")
         .config("spark.python.worker.reuse", "true")
         .config("spark.driver.memory", "1g")
         .config("spark.sql.streaming.noDataMicroBatches.enabled", "false"))
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from spark_conn.kafka_source import KafkaDataSource

    spark.dataSource.register(KafkaDataSource)
    return spark
