"""The whole Kafka path on one machine (``make demo``): an embedded broker, a
local cluster, a generated stream produced into topics R and S, the Spark job, and
the counts, throughput and where the output is.

    python -m spark_conn.demo --n 200K --window-ms 2000 --predicate band:2
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from panjoin.generate import generate
from panjoin.kafka import io
from panjoin.kafka.broker import start_broker
from panjoin.launch import start_cluster
from panjoin.semantics import parse_size
from spark_conn.config import PipelineConfig
from spark_conn.pipeline import run
from spark_conn.session import spark_session


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spark_conn.demo", description=__doc__)
    ap.add_argument("--n", default="200K", help="tuples in all (default: %(default)s)")
    ap.add_argument("--window-ms", type=int, default=2000, help="time window TR = TS")
    ap.add_argument("--predicate", default="band:2")
    ap.add_argument("--broker", choices=["noida", "tansu"], default="noida")
    ap.add_argument("--per-trigger", default="100K", help="records per micro-batch")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    n, per = parse_size(args.n), parse_size(args.per_trigger)
    work = tempfile.mkdtemp(prefix="panjoin-demo-")
    ev = generate(n, "uniform", key_max=max(10, args.window_ms * 2), seed=0, rate=1000,
                  disorder_ms=50, payload=True)
    cluster = start_cluster(args.workers)  # workers and manager: one process each
    try:
        with start_broker(args.broker, data_dir=os.path.join(work, "broker")) as b:
            print(f"broker {b.kind} on {b.bootstrap}; manager on {cluster.address} with "
                  f"{args.workers} workers", flush=True)
            t0 = time.perf_counter()
            io.produce_events(b.bootstrap, ev, "R", "S", partitions=2)
            print(f"produced {n:,} tuples into R and S in {time.perf_counter() - t0:.1f} s",
                  flush=True)
            cfg = PipelineConfig(b.bootstrap, cluster.address, os.path.join(work, "ckpt"),
                                 f"time:{args.window_ms},{args.window_ms}", args.predicate,
                                 allowed_lateness=100, max_offsets_per_trigger=per)
            t0 = time.perf_counter()
            spark = spark_session("panjoin-demo", planning_only=True)
            print(f"Spark session started in {time.perf_counter() - t0:.1f} s", flush=True)
            st = run(cfg, spark)
            print(f"pipeline: {st['batches']} micro-batches, {st['tuples']:,} records in "
                  f"{st['seconds']:.1f} s = {st['tuples'] / st['seconds']:,.0f} records/s "
                  f"Kafka to Kafka (the query's start, its first batch's Python workers "
                  f"and kernel compilation included)")
            print(f"  {st['joined']:,} joined records -> topic {cfg.out_topic}")
            print(f"  {st['late']:,} late tuples -> topic {cfg.late_topic}")
            print(f"  {st['dead']:,} malformed records -> topic {cfg.dead_letter_topic}")
            out = os.path.join(work, "joined.parquet")
            io.consume_to_parquet(b.bootstrap, cfg.out_topic, out)
            print(f"output topic copied to {out}; checkpoint in {cfg.checkpoint}")
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
