"""``panjoin pipeline`` (also ``python -m spark_conn.cli``): the Spark job's command
line, registered by :mod:`panjoin.cli.main` with the join options every command
shares (:mod:`panjoin.cli.options`).

    panjoin pipeline --bootstrap-servers 127.0.0.1:9092 --manager 127.0.0.1:50050 \\
        --window time:1000,1000 --predicate band:10 --checkpoint ckpt/

The Kafka options (``--kafka-option KEY=VALUE``: librdkafka properties for every
client the job opens, e.g. TLS or SASL; see :mod:`panjoin.kafka.options`) are checked
before anything connects or Spark starts, and so is ``--max-latency`` (see
:mod:`spark_conn.config`).

:func:`job_argv` is the inverse of :func:`config_from_args`: a config as this
command's flags, so that a driver (``panjoin bench latency --pipeline``) runs the job
as a process of its own, the way a user does; with a processing-time trigger the job
runs until SIGINT, then stops its query and writes its counters (``--stats-json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from panjoin.cli.options import DEFAULTS, add_common, add_join_opts, add_security, rpc_error
from panjoin.kafka.options import add_option_arg, from_args
from panjoin.security import Security
from spark_conn.config import PipelineConfig
from spark_conn.native import parse_jars


def add_parser(sub) -> None:
    p = sub.add_parser("pipeline", help="the Spark job: Kafka R,S -> manager -> Kafka output",
                       description="PySpark Structured Streaming: read the R and S topics, "
                                   "send each micro-batch to the manager in event-time order, "
                                   "write joined records to the output topic, late records to "
                                   "the late topic and malformed ones to the dead-letter "
                                   "topic; exactly once across restarts (--checkpoint).")
    add_pipeline_opts(p)
    add_join_opts(p)
    add_common(p)
    p.set_defaults(run=run)


def add_pipeline_opts(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("pipeline")
    g.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT")
    add_option_arg(g)
    g.add_argument("--manager", required=True, metavar="HOST:PORT",
                   help="the manager endpoint (panjoin cluster prints it)")
    g.add_argument("--r-topic", default="R")
    g.add_argument("--s-topic", default="S")
    g.add_argument("--out-topic", default="joined")
    g.add_argument("--late-topic", default="late")
    g.add_argument("--dead-letter-topic", default="dead-letter")
    g.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="Spark checkpoint + the pipeline's join log (restart from here)")
    g.add_argument("--key-field", default="key")
    g.add_argument("--ts-field", default="ts")
    g.add_argument("--id-field", default="id")
    g.add_argument("--key-type", choices=["int64", "float64"], default="int64")
    g.add_argument("--max-offsets-per-trigger", type=int, default=None, metavar="N",
                   help="most records per micro-batch, over both topics (default: no limit)")
    g.add_argument("--starting-offsets", default="earliest",
                   help="earliest | latest | JSON {\"topic\": {\"partition\": offset}}")
    g.add_argument("--trigger", default="available-now",
                   help="available-now (process what is there, then stop) or a processing "
                        "interval like '2 seconds'")
    g.add_argument("--source", choices=["python", "python-records", "native"],
                   default="python",
                   help="python: Spark plans each micro-batch's offsets with the Python Data "
                        "Source and the job reads the records with confluent-kafka; "
                        "python-records: the records travel through Spark's Python Data "
                        "Source; native: Spark's format('kafka') (needs the JVM connector "
                        "jars: --spark-jars)")
    g.add_argument("--spark-jars", metavar="JAR,...",
                   help="comma-separated jar paths for spark.jars: with --source native, "
                        "Spark's Kafka connector (spark-sql-kafka-0-10, "
                        "spark-token-provider-kafka-0-10, kafka-clients, commons-pool2); "
                        "checked before any topic is created")
    g.add_argument("--idle-timeout", type=float, default=None, metavar="SECONDS",
                   help="time windows: a partition nothing was read from for this long stops "
                        "holding the watermark back (as Flink's withIdleness); the watermark "
                        "W is the least, over the input partitions, of the largest ts read "
                        "from each, and a tuple is late iff ts < W - allowed lateness "
                        "(default: never idle, so an empty partition holds W at -inf)")
    g.add_argument("--stats-json", metavar="PATH",
                   help="at the end, write the job's counters and its time per step (and "
                        "Spark's per trigger phase) as JSON")
    g.add_argument("--manager-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="how long to wait for a lost manager to come back before the batch "
                        "fails (the job then reconnects and rebuilds its window from the join "
                        "log; default: %(default)s)")
    g.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve the job's Prometheus metrics at http://127.0.0.1:PORT/metrics "
                        "(0: any free port, logged; default: none; README: Metrics)")
    add_security(p, "client")  # how the job reaches the manager


def config_from_args(args) -> PipelineConfig:
    """The job's config; the Kafka options are checked here, before Spark starts."""
    if args.threads is not None:  # the join runs on the manager's workers, not here
        raise ValueError("--threads is the workers' setting: give it to 'panjoin cluster' "
                         "or 'panjoin worker'; the pipeline's join runs on the manager")
    return PipelineConfig(
        bootstrap=args.bootstrap_servers, manager=args.manager, checkpoint=args.checkpoint,
        window=args.window, predicate=args.predicate, r_topic=args.r_topic,
        s_topic=args.s_topic, out_topic=args.out_topic, late_topic=args.late_topic,
        dead_letter_topic=args.dead_letter_topic, key_field=args.key_field,
        ts_field=args.ts_field, id_field=args.id_field, key_type=args.key_type,
        index=args.index or DEFAULTS["index"], allowed_lateness=args.allowed_lateness,
        subwindow_size=args.subwindow_size, partitions=args.partitions,
        batch_size=args.batch_size or 32768, max_offsets_per_trigger=args.max_offsets_per_trigger,
        starting_offsets=args.starting_offsets, trigger=args.trigger, source=args.source,
        spark_jars=parse_jars(args.spark_jars),
        idle_timeout=args.idle_timeout, manager_timeout=args.manager_timeout,
        kafka_options=from_args(args), max_latency_ms=args.max_latency, max_lag=args.max_lag,
        security=Security.from_args(args), metrics_port=args.metrics_port)


def job_argv(cfg: PipelineConfig) -> list[str]:
    """``panjoin pipeline``'s flags for ``cfg`` (the Kafka options included), so that
    ``config_from_args(parse(job_argv(cfg)))`` equals ``cfg``."""
    c = cfg
    a = ["--bootstrap-servers", c.bootstrap, "--manager", c.manager, "--checkpoint",
         c.checkpoint, "--window", c.window, "--predicate", c.predicate, "--r-topic", c.r_topic,
         "--s-topic", c.s_topic, "--out-topic", c.out_topic, "--late-topic", c.late_topic,
         "--dead-letter-topic", c.dead_letter_topic, "--key-field", c.key_field, "--ts-field",
         c.ts_field, "--id-field", c.id_field, "--key-type", c.key_type, "--index", c.index,
         "--allowed-lateness", str(c.allowed_lateness), "--batch-size", str(c.batch_size),
         "--starting-offsets", c.starting_offsets, "--trigger", c.trigger, "--source", c.source,
         "--manager-timeout", str(c.manager_timeout)]
    for flag, v in (("--subwindow-size", c.subwindow_size), ("--partitions", c.partitions),
                    ("--max-offsets-per-trigger", c.max_offsets_per_trigger),
                    ("--idle-timeout", c.idle_timeout), ("--max-latency", c.max_latency_ms),
                    ("--max-lag", c.max_lag), ("--metrics-port", c.metrics_port)):
        if v is not None:
            a += [flag, str(v)]
    if c.spark_jars:
        a += ["--spark-jars", ",".join(c.spark_jars)]
    for k, v in c.kafka_options.items():
        a += ["--kafka-option", f"{k}={v}"]
    a += c.security.argv()
    if c.extra_open:
        raise ValueError(f"extra_open {c.extra_open} has no flag of panjoin pipeline")
    return a


def run(args) -> int:
    """Run the job of parsed ``args`` (``panjoin pipeline``); needs the spark extra."""
    cfg = config_from_args(args)  # a bad setting: ValueError, which main reports
    try:
        from spark_conn.pipeline import run as run_job
    except ModuleNotFoundError as e:
        print(f"panjoin pipeline: {e}; install the spark extra (make .venv/.installed)",
              file=sys.stderr)
        return 2
    from spark_conn.native import NativeSourceError

    try:
        st = run_job(cfg)
    except NativeSourceError as e:  # how to fix it, in one line, as for a bad flag
        print(f"panjoin pipeline: {e}", file=sys.stderr)
        return 1
    print(f"pipeline: {st['batches']} micro-batches, {st['tuples']:,} records in "
          f"{st['seconds']:.1f} s ({st['tuples'] / max(st['seconds'], 1e-9):,.0f} records/s); "
          f"{st['joined']:,} joined -> {cfg.out_topic}, {st['late']:,} late -> "
          f"{cfg.late_topic}, {st['dead']:,} malformed -> {cfg.dead_letter_topic}"
          + (f"; {st['replayed_batches']} batches replayed into the join, "
             f"{st['skipped_records']} records already written" if st["replayed_batches"]
             else ""), flush=True)
    if args.stats_json:
        with open(args.stats_json, "w") as f:
            json.dump(st, f, indent=1)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spark_conn.cli",
                                 description="Kafka R,S -> PanJoin manager -> Kafka output")
    add_pipeline_opts(ap)
    add_join_opts(ap)
    add_common(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except Exception as e:
        line = rpc_error(e)  # the manager's answer, one line (as panjoin's main)
        if line is None:
            raise
        print(f"{ap.prog}: {line}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
