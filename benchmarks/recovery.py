"""Bounded recovery: restart time of a killed pipeline job against the job's age.

The job (``python -m spark_conn.pipeline``, real Spark, Tansu on loopback, a local
cluster of 2 workers) runs over a stream cut into ``--batches`` micro-batches; it is
killed (SIGKILL to its process group: the driver and Spark's JVM) once its join log
holds batch K, for each K of ``--kill-at``, and started again on the same
checkpoint. For each K it reports the batches the restart replayed into the new join,
the seconds that rebuild took (the job's own log line) and the seconds from the
restart to its first new micro-batch (Spark's start included), and checks that the
output topic equals the uninterrupted reference (exactly once). A restart that
replays only the window costs the same at batch 190 as at batch 50.

    python -m benchmarks.recovery --quick          # 60 batches, kills at 20 and 55
    python -m benchmarks.recovery                  # 200 batches, kills at 50 and 190
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from panjoin.baselines.duckdb_join import duckdb_join
from panjoin.generate import generate
from panjoin.kafka import io
from panjoin.kafka.broker import start_broker
from panjoin.launch import start_cluster
from panjoin.reference import sort_pairs


def _cmd(bootstrap, manager, ckpt, topics, args) -> list[str]:
    r, s, out, late, dead = topics
    return [sys.executable, "-m", "spark_conn.pipeline", "--bootstrap-servers", bootstrap,
            "--manager", manager, "--checkpoint", ckpt, "--window",
            f"time:{args.window_ms},{args.window_ms}", "--predicate", "eq",
            "--allowed-lateness", "0", "--r-topic", r, "--s-topic", s, "--out-topic", out,
            "--late-topic", late, "--dead-letter-topic", dead,
            "--max-offsets-per-trigger", str(args.per_trigger), "-v"]


def _last_logged(path: str) -> int:
    try:
        with open(path) as f:
            lines = [x for x in f.read().splitlines() if x.strip()]
        return json.loads(lines[-1])["batch"] if lines else -1
    except (OSError, ValueError, KeyError):
        return -1


def one_kill(bootstrap, manager, ev, kill_at: int, args, work: str) -> dict:
    tag = f"{kill_at}-{os.getpid()}-{time.monotonic_ns() % 100000}"
    topics = [f"{x}-{tag}" for x in ("R", "S", "joined", "late", "dead")]
    io.produce_events(bootstrap, ev, topics[0], topics[1], partitions=2)
    ckpt = os.path.join(work, f"ckpt-{tag}")
    log_path = os.path.join(ckpt, "panjoin", "join.log")
    cmd = _cmd(bootstrap, manager, ckpt, topics, args)
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    t0 = time.perf_counter()
    while p.poll() is None and _last_logged(log_path) < kill_at:
        time.sleep(0.02)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    ran = time.perf_counter() - t0
    logged = _last_logged(log_path)
    with open(log_path) as f:
        log_lines = sum(1 for x in f if x.strip())
    t1 = time.perf_counter()
    q = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first_new = rebuild_s = replayed = None
    tail = []
    for line in q.stdout:
        tail = (tail + [line])[-40:]
        m = re.search(r"rebuilt the join from (\d+) logged batches .* in ([\d.]+) s", line)
        if m and replayed is None:
            replayed, rebuild_s = int(m.group(1)), float(m.group(2))
        m = re.search(r" batch (\d+): \d+ records", line)
        if m and first_new is None and int(m.group(1)) > logged:
            first_new = time.perf_counter() - t1
    if q.wait() != 0:
        raise SystemExit("the restarted job failed:\n" + "".join(tail))
    got = [json.loads(m.value()) for m in io.read_topic(bootstrap, topics[2])]
    pairs = sort_pairs(np.array([[x["r_id"], x["s_id"]] for x in got], np.int64).reshape(-1, 2))
    return {"kill_at": kill_at, "logged_when_killed": logged, "log_lines": log_lines,
            "ran_s": round(ran, 2), "replayed_batches": replayed, "rebuild_s": rebuild_s,
            "to_first_new_batch_s": round(first_new, 2) if first_new else None,
            "pairs": len(pairs), "duplicates": len(pairs) - len(np.unique(pairs, axis=0)),
            "_pairs": pairs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="60 batches, kills at 20 and 55")
    ap.add_argument("--batches", type=int, default=200, help="micro-batches in the stream")
    ap.add_argument("--per-trigger", type=int, default=1000, help="records per micro-batch")
    ap.add_argument("--kill-at", default="50,190", help="batches to kill the job at")
    ap.add_argument("--window-ms", type=int, default=4000,
                    help="time window per stream (ms; tuples are ~1 ms apart)")
    ap.add_argument("--out", default="benchmarks/results/recovery.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.batches, args.kill_at = 60, "20,55"
        args.out = args.out.replace(".json", "-quick.json")
    kills = [int(x) for x in args.kill_at.split(",")]
    n = args.batches * args.per_trigger
    ev = generate(n, "uniform", key_max=n // 4, seed=3, rate=1000)
    broker = start_broker("tansu")
    cluster = start_cluster(2)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as work:
            for k in kills:
                rows.append(one_kill(broker.bootstrap, cluster.address, ev, k, args, work))
                r = rows[-1]
                print(f"killed at batch {r['logged_when_killed']} (log of {r['log_lines']} "
                      f"lines after {r['ran_s']} s): restart replayed {r['replayed_batches']} "
                      f"batches in {r['rebuild_s']} s, first new batch after "
                      f"{r['to_first_new_batch_s']} s; {r['pairs']:,} pairs, "
                      f"{r['duplicates']} duplicates", flush=True)
    finally:
        cluster.stop()
        broker.stop()
    same = all(np.array_equal(rows[0]["_pairs"], r["_pairs"]) for r in rows)
    # DESIGN section 2's pairs by the DuckDB peer (tested against the brute-force
    # oracle); the stream is in order, so nothing is late
    ref = duckdb_join(ev, f"time:{args.window_ms},{args.window_ms}", "eq", pairs=True)
    want = sort_pairs(ref.pairs)
    exact = all(np.array_equal(r["_pairs"], want) for r in rows)
    print(f"outputs equal to each other: {same}; equal to the reference "
          f"({len(want):,} pairs): {exact}")
    for r in rows:
        r.pop("_pairs")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "runs": rows, "reference_pairs": len(want),
                   "equal_to_reference": exact}, f, indent=1)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
