"""Kafka-to-Kafka throughput: the PanJoin pipeline vs Spark's own stream-stream join.

On the same topics and data (noida-db on loopback, R and S with 2 partitions
each, JSON records), both jobs read with the same source (``panjoin_kafka``), the
same micro-batch limit and the same "available now" end, and write joined
records to Kafka:

* ``panjoin``: :mod:`spark_conn.pipeline` through a local cluster (2 workers);
* ``spark``: what a Spark user would write: ``from_json``, ``withWatermark`` on
  event time, and an inner stream-stream join ``r.key = s.key AND
  s.ts > r.ts - TS AND s.ts < r.ts + TR``, written to Kafka with the sink.

Each job runs in a process and JVM of its own, after a warm-up of many small
micro-batches (Python workers, kernels, the JIT): the pipeline's JVM only plans
micro-batches (C1 JIT, :func:`spark_conn.session.spark_session`), Spark's join holds
its state in a JVM with Spark's defaults. Both result sets are read back from Kafka
and compared as (r_id, s_id) sets.
A band join (``|r.key - s.key| <= E``) has no equality key: Spark refuses the
query, and the script prints Spark's error.

    python -m benchmarks.pipeline --quick     # ~20K tuples, a few minutes on 2 cores
    python -m benchmarks.pipeline --n 3000000 --window-ms 2000000 --per-trigger 200000 \
        --nbat 131072 --broker tansu

It prints where the pipeline's time goes (its steps, Spark's trigger phases) and the
CPU each process spent (driver, Spark's JVM, broker, manager, workers). The manager
runs in its own process (``panjoin manager``); NSub defaults to half the window per
stream (``--nsub``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from panjoin.baselines.duckdb_join import duckdb_join
from panjoin.bench.proc import cpu_seconds
from panjoin.generate import generate
from panjoin.kafka import io
from panjoin.kafka.broker import start_broker
from panjoin.launch import start_cluster
from panjoin.semantics import Window, parse_predicate
from spark_conn.config import PipelineConfig
from spark_conn.peer import join_condition
from spark_conn.pipeline import run
from spark_conn.session import spark_session

JSON_SCHEMA = "id long, key long, ts long, payload string"


def spark_join(spark, bootstrap, r_topic, s_topic, out_topic, window_ms, per_trigger, ckpt,
               band: float | None = None):
    """Spark's stream-stream join, Kafka to Kafka; returns seconds."""
    from pyspark.sql import functions as F

    ending = {t: {str(p): v[1] for p, v in io.end_offsets(bootstrap, t).items()}
              for t in (r_topic, s_topic)}

    def side(t, name):
        df = (spark.readStream.format("panjoin_kafka")
              .option("kafka.bootstrap.servers", bootstrap).option("subscribe", t)
              .option("maxOffsetsPerTrigger", per_trigger // 2)
              .option("endingOffsets", json.dumps({t: ending[t]})).load())
        cols = F.from_json(F.col("value").cast("string"), JSON_SCHEMA)
        df = df.select(cols.alias("v")).select(
            F.col("v.id").alias(f"{name}_id"), F.col("v.key").alias(f"{name}_key"),
            F.col("v.payload").alias(f"{name}_payload"),
            F.timestamp_millis(F.col("v.ts")).alias(f"{name}_time"))
        return df.withWatermark(f"{name}_time", f"{window_ms} milliseconds")

    r, s = side(r_topic, "r"), side(s_topic, "s")
    # the condition of spark_conn.peer (the peer benchmark's Spark join); a band join
    # is built too, to show that Spark refuses it
    window = Window("time", window_ms, window_ms)
    pred = parse_predicate("eq" if band is None else f"band:{band:g}")
    joined = r.join(s, join_condition(window, pred, allow_band=True), "inner")
    out = joined.select(F.to_json(F.struct("r_id", "s_id", "r_key", "s_key", "r_payload",
                                           "s_payload")).alias("value"))
    t0 = time.perf_counter()
    q = (out.writeStream.format("panjoin_kafka").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", out_topic).option("checkpointLocation", ckpt)
         .trigger(processingTime="0 seconds").start())
    try:
        _await_end_multi(q, ending)
    finally:
        q.stop()
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    return time.perf_counter() - t0


def _await_end_multi(q, ending, poll=0.2):
    """Both sources (one per topic) reached their end and no trigger is running."""
    while q.isActive:
        prog = q.lastProgress
        if prog and len(prog.get("sources", [])) == 2:
            ends = {}
            for src in prog["sources"]:
                e = src.get("endOffset")
                ends.update(json.loads(e) if isinstance(e, str) else (e or {}))
            done = all(int(ends.get(t, {}).get(p, -1)) >= o
                       for t, ps in ending.items() for p, o in ps.items())
            if done and not q.status["isTriggerActive"]:
                return
        time.sleep(poll)


def _cpu_by_process() -> dict:
    """CPU seconds so far of every process, by role: the driver (this process),
    Spark's JVM and Python workers, the manager, the workers, the broker."""
    out: dict = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cpu = cpu_seconds(int(pid))
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        role = ("driver (job)" if int(pid) == os.getpid() else
                "Spark JVM" if "java" in cmd.split(" ")[0] else
                "manager" if "panjoin.cli manager" in cmd else
                "workers" if "panjoin.cli worker" in cmd else
                "broker" if ("noida" in cmd or "tansu" in cmd) else
                "Spark Python workers" if "pyspark" in cmd else None)
        if role:
            out[role] = out.get(role, 0.0) + cpu
    return out


def _cpu_busy() -> float:
    """Seconds the machine's cores were busy since boot (all processes; Linux)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def quiet(timeout: float = 120.0) -> float:
    """Wait until the machine is idle (under 10% of a core busy over half a second): a
    broker may still be persisting the topics just written (noida-db is, for tens of
    seconds after 3M records), and neither job should pay for that. Returns the wait."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        b0 = _cpu_busy()
        time.sleep(0.5)
        if _cpu_busy() - b0 < 0.05:
            break
    return time.perf_counter() - t0


def pairs_of(bootstrap, t) -> np.ndarray:
    recs = [json.loads(m.value()) for m in io.read_topic(bootstrap, t)]
    a = np.array([[x["r_id"], x["s_id"]] for x in recs], np.int64).reshape(-1, 2)
    return a[np.lexsort((a[:, 1], a[:, 0]))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (minutes on 2 cores)")
    ap.add_argument("--n", type=int, default=200_000, help="tuples in all (R + S)")
    ap.add_argument("--window-ms", type=int, default=20_000,
                    help="time window TR = TS in ms; tuples are 1 ms apart per stream pair")
    ap.add_argument("--per-trigger", type=int, default=50_000, help="records per micro-batch")
    ap.add_argument("--keys", type=int, default=0,
                    help="distinct keys (default: about one match per tuple in the window)")
    ap.add_argument("--source", choices=["python", "python-records"], default="python",
                    help="the pipeline's input path (spark_conn.pipeline --source)")
    ap.add_argument("--nbat", type=int, default=32768,
                    help="the manager's batch size NBat (panjoin pipeline --batch-size)")
    ap.add_argument("--nsub", type=int, default=0,
                    help="subwindow size NSub (default: half the window per stream, a power "
                         "of two: fewer, larger subwindows mean fewer probes per tuple)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes of the cluster")
    ap.add_argument("--broker", choices=["noida", "tansu"], default="noida",
                    help="the Kafka-protocol broker both jobs read from and write to")
    ap.add_argument("--driver-memory", default="6g", help="Spark's driver (JVM) memory")
    ap.add_argument("--repeat", type=int, default=1,
                    help="timed runs of the pipeline (the median is compared; the machines "
                         "are shared and noisy)")
    ap.add_argument("--skip-spark", action="store_true",
                    help="the pipeline alone (no Spark join, no comparison)")
    ap.add_argument("--as-spark-join", metavar="BOOTSTRAP", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.as_spark_join:
        return _as_spark_join(args)
    if args.quick:
        args.n, args.window_ms, args.per_trigger = 20_000, 2_000, 5_000
    keys = args.keys or max(1, args.window_ms)  # ~1 match per tuple
    # the window holds ~W/2 tuples per stream (below): subwindows of about half that
    nsub = args.nsub or 1 << max(10, (args.window_ms // 4 - 1).bit_length())
    ev = generate(args.n, "uniform", key_max=keys, seed=7, rate=1000, payload=True)
    window = args.window_ms
    # 1000 tuples per second of event time in all: a window of W ms holds ~W/2 per stream
    print(f"{args.n:,} tuples, time window {window} ms (~{window // 2:,} tuples per stream "
          f"in the window), {keys:,} keys, {args.per_trigger:,} records per micro-batch, "
          f"NBat {args.nbat:,}, NSub {nsub:,}, {args.workers} workers, broker {args.broker}")
    cluster = start_cluster(args.workers)  # workers and manager: one process each
    # each job has a JVM of its own: the pipeline's plans micro-batches only (C1 JIT, see
    # spark_conn.session); Spark's join keeps both windows as state in its driver's
    # JVM (local mode, Spark's default JIT), in a process of its own (_spark_join_process)
    spark = spark_session("panjoin-bench", planning_only=args.source == "python")
    tmp = tempfile.mkdtemp(prefix="panjoin-bench-")
    try:
        with start_broker(args.broker) as b:
            io.produce_events(b.bootstrap, ev, "R", "S", partitions=2)
            io.produce_events(b.bootstrap, _warm_events(), "wR", "wS", partitions=2)
            # a short window and small subwindows (but larger than BI-Sort's insertion
            # buffer, so that it merges into the main array), so that every kernel of
            # the timed run (insert, merge, probe, expire) is compiled here, not there
            run(PipelineConfig(b.bootstrap, cluster.address, os.path.join(tmp, "w"),
                               "time:2000,2000", "eq", r_topic="wR", s_topic="wS",
                               out_topic="wout", late_topic="wlate", dead_letter_topic="wdead",
                               max_offsets_per_trigger=400, batch_size=2048,
                               subwindow_size=4096), spark)

            times, outs = [], []
            for i in range(args.repeat):  # the same input, a fresh job and output topic
                cfg = PipelineConfig(b.bootstrap, cluster.address, os.path.join(tmp, f"p{i}"),
                                     f"time:{window},{window}", "eq",
                                     max_offsets_per_trigger=args.per_trigger,
                                     allowed_lateness=window, out_topic=f"pj-out{i}",
                                     late_topic=f"pj-late{i}", dead_letter_topic=f"pj-dead{i}",
                                     source=args.source, batch_size=args.nbat,
                                     subwindow_size=nsub)
                times.append(_pipeline_once(args, cfg, spark))
                outs.append(pairs_of(b.bootstrap, cfg.out_topic))
                print(f"panjoin pipeline : {args.n / times[-1]:12,.0f} tuples/s  "
                      f"({times[-1]:.1f} s, {len(outs[-1]):,} pairs)", flush=True)
            t_pj, p_pj = float(np.median(times)), outs[0]
            if args.repeat > 1:
                print(f"panjoin pipeline, median of {args.repeat}: {args.n / t_pj:,.0f} tuples/s "
                      f"({t_pj:.1f} s; runs {', '.join(f'{t:.1f}' for t in times)} s)",
                      flush=True)
            same_runs = all(np.array_equal(p_pj, o) for o in outs)
            if args.skip_spark:
                return 0
            spark.stop()  # the pipeline's JVM and cluster are done: nothing of them runs
            cluster.stop()
            t_sp = _spark_join_process(b.bootstrap, window, args.per_trigger,
                                       args.driver_memory, os.path.join(tmp, "s"))
            p_sp = pairs_of(b.bootstrap, "spark-out")
            # DESIGN section 2's pairs by the DuckDB peer (tested against the oracle)
            ref = duckdb_join(ev, f"time:{window},{window}", "eq", allowed_lateness=window,
                              pairs=True).pairs
            same = np.array_equal(p_pj, p_sp) and same_runs
            if not same:
                _differences(p_pj, p_sp, outs)
            print(f"reference (DESIGN section 2, {len(ref):,} pairs): panjoin "
                  f"{'equal' if all(np.array_equal(ref, o) for o in outs) else 'DIFFERENT'}, "
                  f"Spark {'equal' if np.array_equal(ref, p_sp) else 'DIFFERENT'}", flush=True)
            print(f"spark stream join: {args.n / t_sp:12,.0f} tuples/s  ({t_sp:.1f} s, "
                  f"{len(p_sp):,} pairs)")
            print(f"speedup: {t_sp / t_pj:.2f}x   identical results: {same}"
                  + (f" (pipeline: the median of {args.repeat} runs)" if args.repeat > 1 else ""),
                  flush=True)
    finally:
        cluster.stop()
    return 0


def _differences(p_pj: np.ndarray, p_sp: np.ndarray, outs: list) -> None:
    """What differs between the pipeline's pairs and Spark's (and between runs)."""
    a = {tuple(x) for x in p_pj.tolist()}
    b = {tuple(x) for x in p_sp.tolist()}
    print(f"  differences: {len(a - b):,} pairs only in panjoin's output (e.g. "
          f"{sorted(a - b)[:3]}), {len(b - a):,} only in Spark's (e.g. {sorted(b - a)[:3]}); "
          f"duplicates: panjoin {len(p_pj) - len(a):,}, Spark {len(p_sp) - len(b):,}; "
          f"runs of the pipeline that differ from the first: "
          f"{sum(not np.array_equal(outs[0], o) for o in outs)}", flush=True)


def _pipeline_once(args, cfg: PipelineConfig, spark) -> float:
    """One timed run of the pipeline, with where its time and CPU went; its seconds."""
    print(f"(waited {quiet():.1f} s for the machine to go idle)", flush=True)
    busy0, roles0 = _cpu_busy(), _cpu_by_process()
    st = run(cfg, spark)
    busy, roles = _cpu_busy() - busy0, _cpu_by_process()
    t = st["seconds"]
    print(f"  {st['batches']} micro-batches; time by step (s): " + ", ".join(
        f"{k[2:]} {v:.1f}" for k, v in st.items() if k.startswith("s_")), flush=True)
    print(f"  CPU: {busy:.1f} core-seconds busy in {t:.1f} s on {os.cpu_count()} "
          f"cores ({busy / t / os.cpu_count():.0%} of the machine)", flush=True)
    print("  CPU by process (s): " + ", ".join(
        f"{k} {v - roles0.get(k, 0.0):.1f}" for k, v in sorted(roles.items())), flush=True)
    print(f"  read ahead: {st['read_ahead_hits']} batches guessed right, "
          f"{st['read_ahead_misses']} wrong", flush=True)
    print("  Spark's trigger phases (s): " + ", ".join(
        f"{k} {v / 1000:.1f}" for k, v in st["spark_ms"].items()), flush=True)
    return t


def _warm_events():
    return generate(20_000, "uniform", key_max=2000, seed=1, rate=1000)


def _spark_join_process(bootstrap: str, window: int, per_trigger: int, memory: str,
                        tmp: str) -> float:
    """Spark's join on R, S -> topic spark-out in a process (and JVM) of its own, after a
    warm-up on wR, wS; returns its seconds. Also shows that Spark refuses a band join."""
    cmd = [sys.executable, "-m", "benchmarks.pipeline", "--as-spark-join", bootstrap,
           "--window-ms", str(window), "--per-trigger", str(per_trigger),
           "--driver-memory", memory]
    done = subprocess.run(cmd, capture_output=True, text=True,
                          env={**os.environ, "PANJOIN_TMP": tmp})
    out = done.stdout.splitlines()
    for line in out[:-1]:
        print(line, flush=True)
    if done.returncode != 0 or not out or not out[-1].startswith("{"):
        raise RuntimeError(f"Spark's join failed (exit {done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    return json.loads(out[-1])["seconds"]


def _as_spark_join(args) -> int:
    """The child of :func:`_spark_join_process`."""
    bootstrap, window, tmp = args.as_spark_join, args.window_ms, os.environ["PANJOIN_TMP"]
    spark = spark_session("panjoin-bench-spark", conf={"spark.driver.memory": args.driver_memory})
    # warm-up: Python workers and the JVM's JIT, many small micro-batches
    spark_join(spark, bootstrap, "wR", "wS", "wout2", window, 800, os.path.join(tmp, "w2"))
    io.create_topics(bootstrap, ["spark-out"])
    print(f"(waited {quiet():.1f} s for the machine to go idle)", flush=True)
    t = spark_join(spark, bootstrap, "R", "S", "spark-out", window, args.per_trigger,
                   os.path.join(tmp, "s"))
    try:
        spark_join(spark, bootstrap, "wR", "wS", "wout3", window, 1000,
                   os.path.join(tmp, "band"), band=3)
        print("band join in Spark: accepted (unexpected)")
    except Exception as e:  # AnalysisException
        msg = str(e).strip().splitlines()[0][:300]
        print(f"band join in Spark (|r.key - s.key| <= 3, same time range): refused: {msg}")
    spark.stop()
    print(json.dumps({"seconds": t}), flush=True)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
