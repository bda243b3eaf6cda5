"""``panjoin kafka broker|produce|consume`` and ``panjoin pipeline``: argument parsers
and runners, kept apart from :mod:`panjoin.cli` so that it only registers them.

    panjoin kafka broker --kind noida                    # prints the bootstrap address
    panjoin kafka produce events.parquet --bootstrap-servers 127.0.0.1:9092 \\
        --r-topic R --s-topic S
    panjoin kafka consume joined --bootstrap-servers 127.0.0.1:9092 --out joined.parquet
    panjoin pipeline --bootstrap-servers ... --manager 127.0.0.1:50050 \\
        --window time:1000,1000 --predicate band:10 --checkpoint ckpt/

``produce``, ``consume`` and ``pipeline`` take ``--kafka-option KEY=VALUE`` (librdkafka
properties for every client they open: TLS, SASL; see :mod:`panjoin.kafka.options`),
checked before anything connects or Spark starts.
"""

from __future__ import annotations

import argparse
import sys

from panjoin.kafka.options import add_option_arg, parse, validate


def add_parsers(sub, add_common, add_join_opts) -> None:
    p = sub.add_parser("kafka", help="Kafka: start a local broker, produce events, consume "
                                     "a topic")
    ksub = p.add_subparsers(dest="kafka_cmd", required=True, metavar="ACTION")

    b = ksub.add_parser("broker", help="run a Kafka-protocol broker on 127.0.0.1 until Ctrl-C",
                        description="Start noida-db (default) or Tansu on loopback and print "
                                    "'panjoin kafka broker: BOOTSTRAP'.")
    b.add_argument("--kind", choices=["noida", "tansu"], default="noida")
    b.add_argument("--port", type=int, default=0, help="port, 0 for any free one")
    b.add_argument("--data-dir", help="where noida-db keeps its data (default: a temp dir)")
    add_common(b)

    b = ksub.add_parser("produce", help="write an event file into an R topic and an S topic",
                        description="Each row becomes a JSON record {id, key, ts, payload} "
                                    "with Kafka timestamp ts, in arrival order per stream.")
    b.add_argument("events", help="event file (.parquet or .csv)")
    b.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT")
    b.add_argument("--r-topic", default="R")
    b.add_argument("--s-topic", default="S")
    b.add_argument("--partitions", type=int, default=1,
                   help="partitions of topics that do not exist yet (default: %(default)s)")
    add_option_arg(b)
    add_common(b)

    b = ksub.add_parser("consume", help="read a topic (e.g. the join output) into Parquet",
                        description="Columns kafka_partition, kafka_offset, kafka_timestamp, "
                                    "kafka_key, kafka_value, kafka_batch, kafka_seq, plus the "
                                    "fields of JSON-object values.")
    b.add_argument("topic")
    b.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT")
    b.add_argument("--out", required=True, help="output .parquet file")
    add_option_arg(b)
    add_common(b)

    p = sub.add_parser("pipeline", help="the Spark job: Kafka R,S -> manager -> Kafka output",
                       description="PySpark Structured Streaming: read the R and S topics, "
                                   "send each micro-batch to the manager in event-time order, "
                                   "write joined records to the output topic, late records to "
                                   "the late topic and malformed ones to the dead-letter "
                                   "topic; exactly once across restarts (--checkpoint).")
    add_pipeline_opts(p)
    add_join_opts(p)
    add_common(p)


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
                        "jar on the classpath)")
    g.add_argument("--idle-timeout", type=float, default=None, metavar="SECONDS",
                   help="time windows: a partition nothing was read from for this long stops "
                        "holding the watermark back (as Flink's withIdleness); the watermark "
                        "W is the least, over the input partitions, of the largest ts read "
                        "from each, and a tuple is late iff ts < W - allowed lateness "
                        "(default: never idle, so an empty partition holds W at -inf)")
    g.add_argument("--manager-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="how long to wait for a lost manager to come back before the batch "
                        "fails (the job then reconnects and rebuilds its window from the join "
                        "log; default: %(default)s)")


def kafka_options(args) -> dict[str, str]:
    """The ``--kafka-option`` values (and a config file's) of parsed ``args``, checked
    by librdkafka (:func:`panjoin.kafka.options.validate`): a ValueError names a bad one."""
    return validate(parse(getattr(args, "kafka_option", None)))


def run_kafka(args) -> int:
    from panjoin.kafka import io

    if args.kafka_cmd == "broker":
        from panjoin.cli import _serve_until_stopped
        from panjoin.kafka.broker import start_broker

        b = start_broker(args.kind, args.port, args.data_dir)
        print(f"panjoin kafka broker: {b.bootstrap} ({b.kind}, log {b.log_path})", flush=True)
        return _serve_until_stopped(b.stop)
    if args.kafka_cmd == "produce":
        from panjoin.events import read_events

        opts = kafka_options(args)
        events = read_events(args.events)
        counts = io.produce_events(args.bootstrap_servers, events, args.r_topic, args.s_topic,
                                   args.partitions, options=opts)
        print(", ".join(f"{n:,} records to {t}" for t, n in counts.items()))
        return 0
    n = io.consume_to_parquet(args.bootstrap_servers, args.topic, args.out,
                              options=kafka_options(args))
    print(f"{n:,} records of {args.topic} written to {args.out}")
    return 0


def run_pipeline(args) -> int:
    try:
        from spark_conn.pipeline import run_from_args
    except ModuleNotFoundError as e:
        print(f"panjoin pipeline: {e}; install the spark extra (make .venv/.installed)",
              file=sys.stderr)
        return 2
    return run_from_args(args)
