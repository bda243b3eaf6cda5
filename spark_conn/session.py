"""A local SparkSession bound to loopback, with Python workers on this venv's python.

Facts measured here (DESIGN section 5): Spark's Python workers fail unless
``PYSPARK_PYTHON`` names the venv's interpreter, and Spark binds a non-loopback
address unless ``SPARK_LOCAL_IP=127.0.0.1`` and ``spark.driver.host=127.0.0.1``.

Spark starts every Python process of its own (a streaming source's runner at each
query start, the planner of a Python data source, the worker daemon) with
``$SPARK_HOME/python/lib/pyspark.zip`` first on its path. That zip holds sources
only, so each such process compiles pyspark anew: 1.6 s of CPU to import what
takes 0.5 s from the venv's compiled site-packages (measured). In local mode,
where those processes run this venv's python, :func:`local_spark_home` gives
Spark a home without the zip (links to the real one's jars, scripts and config),
so they import the installed, compiled pyspark.
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


#: Spark's default checkpoint manager (FileContext) renames through Hadoop's
#: AbstractFileSystem, which on the local file system without Hadoop's native library
#: runs a ``readlink`` process per rename and a ``chmod`` per directory: about 17
#: processes forked from the driver's JVM per micro-batch (counted with JFR). The
#: FileSystem one renames with one rename(2), atomic on a local or POSIX file system
#: (set in local mode only).
_CHECKPOINT_FILES = ("org.apache.spark.sql.execution.streaming.checkpointing."
                     "FileSystemBasedCheckpointFileManager")


def local_spark_home() -> str | None:
    """A SPARK_HOME for local mode: the pip-installed one's entries, linked, except
    ``python/lib/pyspark.zip`` (see the module docstring). Made once per pyspark
    install under the temp directory; None when it cannot be made (Spark then uses
    its own home, only slower to start its Python processes)."""
    import hashlib
    import tempfile

    import pyspark
    from pyspark.find_spark_home import _find_spark_home

    real = os.path.realpath(_find_spark_home())
    if not os.path.isfile(os.path.join(real, "bin", "spark-submit")):
        return None
    tag = hashlib.sha1(f"{real} {pyspark.__version__}".encode()).hexdigest()[:12]
    home = os.path.join(tempfile.gettempdir(), f"panjoin-spark-home-{tag}")
    if os.path.isfile(os.path.join(home, "bin", "spark-submit")):
        return home
    try:
        work = tempfile.mkdtemp(prefix=f"{os.path.basename(home)}.", dir=os.path.dirname(home))
        for name in os.listdir(real):  # the scripts, jars and data; not pyspark's modules
            if name != "python" and not name.endswith((".py", ".pyi", ".typed", "__pycache__")):
                os.symlink(os.path.join(real, name), os.path.join(work, name))
        lib = os.path.join(real, "python", "lib")
        os.makedirs(os.path.join(work, "python", "lib"))
        for name in os.listdir(lib) if os.path.isdir(lib) else ():
            if name != "pyspark.zip":  # py4j's zip stays: the JVM names it on the path
                os.symlink(os.path.join(lib, name), os.path.join(work, "python", "lib", name))
        try:
            os.rename(work, home)  # atomic: another process may have made it meanwhile
        except OSError:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    except OSError:
        return None
    return home if os.path.isfile(os.path.join(home, "bin", "spark-submit")) else None


def spark_session(app: str = "panjoin", master: str = "local[2]", conf: dict | None = None,
                  planning_only: bool = False):
    """The (one per process) SparkSession, with the Kafka data source registered.

    ``planning_only``: the driver's JVM only plans micro-batches and keeps their
    offsets (the pipeline's default source, whose records never enter the JVM), so it
    JIT-compiles with C1 alone (``-XX:TieredStopAtLevel=1``): C2 spent 1.5-2.2 of the
    JVM's 2.6-3.5 CPU seconds over a 15-micro-batch run recompiling Spark's per-trigger
    code, for no gain in code this cold (measured; the JVM then used 0.9 s). Jobs that
    move rows through the JVM (Spark's own join, ``--source native``) keep C2."""
    _check_java()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    if master.startswith("local") and "SPARK_HOME" not in os.environ:
        home = local_spark_home()
        if home is not None:
            os.environ["SPARK_HOME"] = home
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
    if master.startswith("local"):  # checkpoints on this machine's file system
        b = b.config("spark.sql.streaming.checkpointFileManagerClass", _CHECKPOINT_FILES)
    conf = dict(conf or {})
    if planning_only:
        opts = conf.get("spark.driver.extraJavaOptions", "")
        conf["spark.driver.extraJavaOptions"] = f"{opts} -XX:TieredStopAtLevel=1".strip()
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from spark_conn.kafka_source import KafkaDataSource

    spark.dataSource.register(KafkaDataSource)
    return spark
