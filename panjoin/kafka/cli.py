"""``panjoin kafka broker|produce|consume``: the parser and the runner, registered by
:mod:`panjoin.cli.main` (``panjoin pipeline`` is :mod:`spark_conn.cli`).

    panjoin kafka broker --kind noida                    # prints the bootstrap address
    panjoin kafka produce events.parquet --bootstrap-servers 127.0.0.1:9092 \\
        --r-topic R --s-topic S
    panjoin kafka consume joined --bootstrap-servers 127.0.0.1:9092 --out joined.parquet

``produce`` and ``consume`` take ``--kafka-option KEY=VALUE`` (librdkafka
properties for every client they open: TLS, SASL; see :mod:`panjoin.kafka.options`),
checked before anything connects or Spark starts.
"""

from __future__ import annotations

from panjoin.cli.options import add_common
from panjoin.kafka.options import add_option_arg, from_args


def add_parser(sub) -> None:
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
    p.set_defaults(run=run)


def run(args) -> int:
    from panjoin.kafka import io

    if args.kafka_cmd == "broker":
        from panjoin.kafka.broker import start_broker
        from panjoin.serving import serve_until_stopped

        b = start_broker(args.kind, args.port, args.data_dir)
        print(f"panjoin kafka broker: {b.bootstrap} ({b.kind}, log {b.log_path})", flush=True)
        return serve_until_stopped(b.stop)
    if args.kafka_cmd == "produce":
        from panjoin.events import read_events

        opts = from_args(args)
        events = read_events(args.events)
        counts = io.produce_events(args.bootstrap_servers, events, args.r_topic, args.s_topic,
                                   args.partitions, options=opts)
        print(", ".join(f"{n:,} records to {t}" for t, n in counts.items()))
        return 0
    n = io.consume_to_parquet(args.bootstrap_servers, args.topic, args.out,
                              options=from_args(args))
    print(f"{n:,} records of {args.topic} written to {args.out}")
    return 0
