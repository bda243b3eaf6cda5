"""``panjoin bench index|system|peers|latency``: one point of an index microbenchmark, a
local cluster against the in-process engine, PanJoin against its peers, and pair
latency under an open-loop source (the sweeps and plots are in ``benchmarks/``).

    panjoin bench index --index bisort --op probe --nsub 8M --partitions 64K --batch 32K
    panjoin bench system --workers 2 --window 1M --measure 4M [--null-workers]
    panjoin bench peers --quick
    panjoin bench latency --rates 200K,500K,1M --max-latency 5
    panjoin bench latency --workers 2 --rates 100K,500K,1M --max-latency 10   # a cluster
    panjoin bench latency --topology handshake --workers 4 --window count:64K,64K \
        --predicate band:10 --rates 10K,20K --max-latency 10
    panjoin bench latency --pipeline --rates 20K,50K,100K --trigger '100 milliseconds'
"""

from __future__ import annotations

from panjoin.cli.options import INDEX_HELP, add_common, size
from panjoin.config import DEFAULT_INDEX, INDEX_CHOICES, INDEX_KINDS


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks (see benchmarks/)")
    bsub = p.add_subparsers(dest="bench", required=True, metavar="WHAT")
    b = bsub.add_parser("index", help="one point of an index microbenchmark",
                        description="Insert, probe or expire throughput of one subwindow index "
                                    "after a warm-up; prints 'tuples/s: X' last.")
    b.add_argument("--index", required=True, choices=INDEX_KINDS,
                   help=INDEX_HELP)
    b.add_argument("--op", required=True, choices=["insert", "probe", "expire"],
                   help="expire: drop a full subwindow and create its successor, as the "
                        "engine does (tuples expired per second)")
    b.add_argument("--nsub", type=size, default=1 << 20, help="subwindow size NSub")
    b.add_argument("--partitions", type=size, default=8192, help="partition count P")
    b.add_argument("--batch", type=size, default=32768, help="batch size NBat")
    b.add_argument("--selectivity", type=float, default=1.0, help="matches per probe tuple S")
    b.add_argument("--predicate", choices=["eq", "band"], default="band")
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--repeat", type=int, default=3, help="timed repetitions (median reported)")
    b.add_argument("--seed", type=int, default=0)
    add_common(b)
    b.set_defaults(run=run_index)

    b = bsub.add_parser("system", help="end-to-end rate of a local cluster vs in-process",
                        description="Fill count windows of W tuples per stream, then time the "
                                    "next tuples through a local cluster and through the "
                                    "in-process engine; prints 'tuples/s: X  "
                                    "overhead-vs-in-process: Y' last.")
    b.add_argument("--workers", type=int, default=2, help="worker processes")
    b.add_argument("--window", type=size, default=1 << 20, help="count window W per stream")
    b.add_argument("--batch", type=size, default=32768, help="batch size NBat")
    b.add_argument("--index", default="bisort", choices=INDEX_KINDS)
    b.add_argument("--selectivity", type=float, default=1.0, help="matches per tuple S")
    b.add_argument("--measure", type=size, default=1 << 21, help="timed tuples after the fill")
    b.add_argument("--threads", type=int, default=1, help="probe threads per worker")
    b.add_argument("--result-format", choices=["pairs", "ranges"], default="pairs",
                   help="BI-Sort: workers answer with (start, end) ranges that the manager "
                        "expands on its mirror of each main array (default: %(default)s)")
    b.add_argument("--replicas", type=int, choices=[1, 2], default=2,
                   help="copies of each subwindow on the cluster (default: %(default)s)")
    b.add_argument("--null-workers", action="store_true",
                   help="workers that hold nothing and answer every probe empty: the rate is "
                        "the manager's own ceiling, with its CPU-seconds per million tuples")
    add_common(b)
    b.set_defaults(run=run_system)

    b = bsub.add_parser("peers", help="PanJoin against its peers on the same data (issue 7)",
                        description="Nested loop, sorted list, symmetric hash join, DuckDB, "
                                    "Polars, DataFusion, Spark (when installed) and PanJoin "
                                    "(each index and the "
                                    "local cluster) on the same event files; prints a table, "
                                    "writes benchmarks/results/peers*.json and "
                                    "benchmarks/plots/peers_*.png.")
    b.add_argument("--quick", action="store_true", help="small windows (a few minutes)")
    b.add_argument("--windows", default=None,
                   help="comma-separated window sizes per stream, e.g. 64K,1M,8M")
    b.add_argument("--peers", default=None, help="comma-separated subset of the peers")
    b.add_argument("--workloads", default=None,
                   help="comma-separated subset of the workloads, e.g. 'band S=64 uniform,eq "
                        "uniform'")
    b.add_argument("--threads", type=int, default=None,
                   help="threads of every peer (PanJoin's Numba probes, DuckDB, Polars' pool "
                        "via POLARS_MAX_THREADS, DataFusion's partitions; default: 1)")
    b.add_argument("--same-process", action="store_true",
                   help="run DuckDB, Polars and DataFusion in this process too (by default "
                        "they run in a child process: DuckDB's malloc_trim hands the heap "
                        "back to the kernel, and PanJoin's next join faults it in again)")
    b.add_argument("--measure", type=size, default=None,
                   help="timed tuples after the fill (default: W)")
    b.add_argument("--bounded-probes", type=size, default=None,
                   help="probe tuples of a peer run bounded beyond its limit (default: 8K)")
    b.add_argument("--tag", default=None, help="suffix of the result and plot files")
    b.add_argument("--repeat", type=int, default=None,
                   help="interleaved rounds per workload, best kept (default: 2; quick: 1)")
    b.add_argument("--merge", nargs="+", metavar="JSON", default=None,
                   help="run nothing: print the table of these results files and plot them "
                        "together (with --tag)")
    b.add_argument("--out", default="benchmarks", help="folder for results/ and plots/")
    add_common(b)
    b.set_defaults(run=run_peers)

    b = bsub.add_parser(
        "latency", help="pair latency at given input rates (open-loop source)",
        description="Fill both windows, then replay a generated stream at each rate on a "
                    "fixed schedule (a stall counts against latency: no coordinated omission) "
                    "and measure each pair's latency: when it is handed out minus when the "
                    "later of its two tuples was due. Prints p50, p99, p99.9 and max per rate, "
                    "whether the source was kept up with, and the highest rate that kept up "
                    "with p99 within --p99-target.")
    b.add_argument("--window", default=None, metavar="SPEC",
                   help="count:WR,WS (default: count:1M,1M; --pipeline: time:TR,TS, default "
                        "time:5000,5000)")
    b.add_argument("--predicate", default="eq", metavar="SPEC", help="(default: %(default)s)")
    b.add_argument("--index", default=DEFAULT_INDEX, choices=INDEX_CHOICES, help=INDEX_HELP)
    b.add_argument("--dist", default="uniform", help="key distribution (default: %(default)s)")
    b.add_argument("--key-max", type=size, default=1_000_000,
                   help="keys uniform in [0, KEY_MAX] (default: %(default)s: about one "
                        "equi-join pair per tuple at a 1M window)")
    b.add_argument("--rates", default=None,
                   help="comma-separated input rates, tuples/s of both streams together "
                        "(default: 100K,200K,500K,1M; --pipeline: 20K,50K,100K,200K)")
    b.add_argument("--seconds", type=float, default=None,
                   help="measured seconds per rate (default: 3; --pipeline: 10)")
    b.add_argument("--max-latency", type=float, metavar="MS",
                   help="the engine sizes its batches to hold this bound (default: fixed "
                        "--batch-size and --collect-ms)")
    b.add_argument("--batch-size", type=size, metavar="NBAT",
                   help="batch size NBat (with --max-latency: the largest it may pick)")
    b.add_argument("--collect-ms", type=float, metavar="MS",
                   help="cut a batch whose oldest tuple waited MS (without --max-latency)")
    b.add_argument("--subwindow-size", type=size, metavar="NSUB")
    b.add_argument("--threads", type=int, metavar="T",
                   help="probe threads (default: the CPUs this process may use: its "
                        "affinity and cgroup CPU quota, rounded up)")
    b.add_argument("--workers", type=int, default=0, metavar="N",
                   help="on a local cluster of N worker processes and its manager endpoint "
                        "(its own process), each rate a streaming join pushed and polled "
                        "through the client (default: in-process)")
    b.add_argument("--topology", choices=["ring", "handshake"], default="ring",
                   help="with --workers: PanJoin subwindows over the workers (ring) or a "
                        "handshake chain of N nodes (default: %(default)s)")
    b.add_argument("--fast-forward", action="store_true",
                   help="handshake: the low-latency handshake join (every tuple travels the "
                        "chain at once)")
    b.add_argument("--segment", choices=["nested", "sorted"], default="nested",
                   help="handshake: how a node scans its segments (default: %(default)s)")
    b.add_argument("--replicas", type=int, choices=[1, 2], default=2,
                   help="ring cluster: copies of each subwindow (default: %(default)s)")
    b.add_argument("--p99-target", type=float, default=50.0, metavar="MS",
                   help="the highest rate that keeps up with p99 within MS is reported "
                        "(default: %(default)s)")
    b.add_argument("--json", metavar="PATH", help="write the results as JSON")
    b.add_argument("--plot", metavar="PNG", help="plot p50/p99 against the rate reached")
    b.add_argument("--label", help="the curve's name (default: the mode)")
    b.add_argument("--seed", type=int, default=1)
    g = b.add_argument_group(
        "pipeline mode", "Kafka to Kafka: a broker, a local cluster and the Spark job "
        "(panjoin pipeline) started and stopped here; an open-loop producer into R and S, a "
        "consumer of the joined topic (panjoin.bench.latency_pipeline)")
    g.add_argument("--pipeline", action="store_true",
                   help="measure the Kafka pipeline end to end instead of the in-process engine")
    g.add_argument("--trigger", default="100 milliseconds",
                   help="the job's processing-time trigger (default: %(default)s)")
    g.add_argument("--max-offsets-per-trigger", type=int, metavar="N",
                   help="most records per micro-batch (default: no limit)")
    g.add_argument("--broker", choices=["noida", "tansu"], default="noida",
                   help="the broker to start (default: %(default)s)")
    g.add_argument("--quick", action="store_true",
                   help="pipeline: 2K and 5K tuples/s, a 1 s window, 2 measured seconds")
    add_common(b)
    b.set_defaults(run=run_latency)


def run_index(args) -> int:
    from panjoin.bench.index import IndexPoint, run_point

    point = IndexPoint(index=args.index, op=args.op, nsub=args.nsub, partitions=args.partitions,
                       batch=args.batch, selectivity=args.selectivity, predicate=args.predicate,
                       threads=args.threads, repeat=args.repeat, seed=args.seed)
    res = run_point(point, progress=not args.no_progress)
    print(f"index: {point.index}  op: {point.op}  nsub: {point.nsub}  partitions: "
          f"{point.partitions}  batch: {point.batch}  threads: {point.threads}")
    print(f"results per probe tuple: {res.results_per_tuple:.2f}  "
          f"bytes per stored tuple: {res.bytes_per_tuple:.1f}")
    print(f"tuples/s: {res.tuples_per_s:.6g}")
    return 0


def run_system(args) -> int:
    from panjoin.bench.system import SystemPoint, run_system

    pt = SystemPoint(workers=args.workers, window=args.window, batch=args.batch,
                     index=args.index, selectivity=args.selectivity, measure=args.measure,
                     threads=args.threads, result_format=args.result_format,
                     replicas=args.replicas, null_workers=args.null_workers)
    costs: dict = {}
    cluster, local = run_system(pt, progress=not args.no_progress, costs=costs)
    lc, cc = costs["local"], costs["cluster"]
    print(f"workers: {pt.workers}{' (null)' if pt.null_workers else ''}  window: {pt.window}  "
          f"batch: {pt.batch}  index: {pt.index}  selectivity: {pt.selectivity:g}  "
          f"replicas: {pt.replicas}  results as: {pt.result_format}  "
          f"in-process: {local:,.0f} tuples/s")
    per_m = 1e6 / pt.measure
    print(f"CPU-s per M tuples: in-process {lc['process_cpu_s'] * per_m:.3f} (index "
          f"{lc['index_s'] * per_m:.3f}); manager {cc['process_cpu_s'] * per_m:.3f}, workers' "
          f"commands {cc['index_s'] * per_m:.3f}"
          + ("" if pt.null_workers else
             f" = {cc['index_s'] / max(lc['index_s'], 1e-9):.2f}x the in-process index"))
    if pt.null_workers:
        print(f"manager ceiling: {cluster:,.0f} tuples/s on its own")
    print(f"tuples/s: {cluster:.6g}  overhead-vs-in-process: {local / cluster:.3f}")
    return 0


def run_peers(args) -> int:
    from pathlib import Path

    from panjoin.bench.peers import PeerConfig, check_results, run_peers, table

    cfg = PeerConfig.quick() if args.quick else PeerConfig()
    if args.windows:
        cfg.windows = [size(w) for w in args.windows.split(",")]
    if args.peers:
        cfg.peers = tuple(p.strip() for p in args.peers.split(","))
    if args.workloads:
        cfg.only = tuple(w.strip() for w in args.workloads.split(","))
    if args.merge:
        from panjoin.bench.peers import load_records, plot

        recs = load_records(args.merge)
        plot(recs, Path(args.out) / "plots", f"-{args.tag}" if args.tag else "")
        print(table(recs))
        problems = check_results(recs)
        print("result pairs: " + ("MISMATCH: " + "; ".join(problems) if problems else
                                  "all peers that ran agree"))
        return 1 if problems else 0
    if args.repeat:
        cfg.repeat = args.repeat
    if args.threads:
        cfg.threads = args.threads
    cfg.isolate = not args.same_process
    if args.measure:
        cfg.measure = args.measure
    if args.bounded_probes is not None:
        cfg.bounded_probes = args.bounded_probes
    tag = "-quick" if args.quick else ""
    tag = tag if args.tag is None else f"-{args.tag}"
    out = Path(args.out)
    recs = run_peers(cfg, progress=not args.no_progress,
                     out_json=out / "results" / f"peers{tag}.json", plot_dir=out / "plots",
                     tag=tag)
    print(table(recs))
    problems = check_results(recs)
    for p in problems:
        print(f"RESULT MISMATCH: {p}")
    print("result pairs: " + ("MISMATCH" if problems else "all peers that ran agree"))
    return 1 if problems else 0


def rate(text: str) -> float:
    """A rate in tuples/s: 200K = 200,000 (decimal, unlike window sizes), 1.5M, 50000."""
    t = text.strip().upper()
    mult = {"K": 1e3, "M": 1e6, "G": 1e9}.get(t[-1:], 1.0)
    try:
        return float(t[:-1] if mult != 1.0 else t) * mult
    except ValueError:
        raise SystemExit(f"bad rate {text!r}: tuples per second, e.g. 200K or 1.5M") from None


def run_latency(args) -> int:
    from panjoin.bench.latency import latency_sweep, max_sustainable, plot, write_json

    if (args.fast_forward or args.segment != "nested") and (
            args.topology != "handshake" or not args.workers):
        raise SystemExit("panjoin bench latency: error: --fast-forward and --segment are a "
                         "handshake chain's; add --topology handshake --workers N")
    if args.pipeline:
        results = _pipeline_latency(args)
    else:
        rates = [rate(r) for r in (args.rates or "100K,200K,500K,1M").split(",")]
        results = latency_sweep(
            rates, window=args.window or "count:1M,1M", predicate=args.predicate,
            index=args.index, dist=args.dist, key_max=args.key_max,
            seconds=args.seconds or 3.0,
            max_latency_ms=args.max_latency, batch_size=args.batch_size,
            collect_ms=args.collect_ms, subwindow_size=args.subwindow_size,
            threads=args.threads, workers=args.workers, topology=args.topology,
            replicas=args.replicas, fast_forward=args.fast_forward, segment=args.segment,
            seed=args.seed,
            label=args.label,
            progress=not args.no_progress, echo=print)
    best = max_sustainable(results, args.p99_target)
    print(f"max sustainable rate with p99 <= {args.p99_target:g} ms: {best:,.0f} tuples/s")
    if args.json:
        write_json(results, args.json)
    if args.plot:
        plot(results, args.plot)
    return 0


def _pipeline_latency(args):
    """``--pipeline``: the Kafka pipeline end to end (panjoin.bench.latency_pipeline)."""
    from panjoin.bench.latency_pipeline import (
        PipelineLatencyConfig,
        pipeline_latency,
        time_per_step,
    )

    quick = args.quick
    cfg = PipelineLatencyConfig(
        rates=[rate(r) for r in (args.rates or ("2K,5K" if quick else "20K,50K,100K,200K")
                                 ).split(",")],
        window=args.window or ("time:1000,1000" if quick else "time:5000,5000"),
        predicate=args.predicate, seconds=args.seconds or (2.0 if quick else 10.0),
        trigger=args.trigger, max_offsets_per_trigger=args.max_offsets_per_trigger,
        broker=args.broker, index=args.index, batch_size=args.batch_size or 32768,
        subwindow_size=args.subwindow_size, max_latency_ms=args.max_latency, seed=args.seed,
        label=args.label, workers=args.workers or 2)
    run = pipeline_latency(cfg, echo=print)
    print("the job: " + time_per_step(run.stats))
    return run.results
