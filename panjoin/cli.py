"""The ``panjoin`` command: replay a recorded stream, generate one, benchmark, demo.

Every subcommand takes ``--config FILE`` (TOML; keys are the long option names,
e.g. ``window = "count:1M,1M"`` or ``batch-size = 32768``); flags given on the
command line win over the file. Sizes accept K/M/G suffixes (powers of two).

    panjoin gen events.parquet --n 2M --dist zipf
    panjoin replay events.parquet --window count:1M,1M --predicate band:10 \\
        --index bisort --out pairs.parquet
    panjoin bench index --index bisort --op probe --nsub 8M --partitions 64K --batch 32K
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import tomllib
from pathlib import Path

import numpy as np

from panjoin import __version__
from panjoin.semantics import SpecError, parse_size

log = logging.getLogger("panjoin")

INDEX_HELP = ("subwindow index: rap (RaP-Table), wib (WiB+-Tree), bisort (BI-Sort), "
              "nested (nested loop, the baseline), bisort-opencl (BI-Sort on an OpenCL "
              "device: $PANJOIN_OPENCL_DEVICE, else the pocl CPU device)")


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except SpecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML file of option defaults")
    p.add_argument("-v", "--verbose", action="store_true", help="log every step")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _add_join_opts(p: argparse.ArgumentParser, required: bool = True) -> None:
    g = p.add_argument_group("join (the paper's knobs)")
    g.add_argument("--window", required=required, metavar="SPEC",
                   help="count:WR,WS (tuples) or time:TR,TS (ms of event time)")
    g.add_argument("--predicate", required=required, metavar="SPEC",
                   help="eq | ne | band:E (|r.key-s.key|<=E) | bands:A,B;C,D (s.key-r.key in ...);"
                        " append &band2:E, &bands2:A,B or &eq2 for a residual on the events'"
                        " key2 column, e.g. band:10&band2:10")
    g.add_argument("--index", default="bisort",
                   choices=["rap", "wib", "bisort", "nested", "bisort-opencl"],
                   help=INDEX_HELP + " (default: %(default)s)")
    g.add_argument("--allowed-lateness", type=int, default=0, metavar="MS",
                   help="time windows: a tuple more than MS behind the largest ts so far is "
                        "late (default: %(default)s)")
    g.add_argument("--subwindow-size", type=_size, metavar="NSUB",
                   help="tuples per subwindow (default: a quarter of a count window, else "
                        "64K). For a large time window give about half the tuples it holds "
                        "per stream: each batch probes fewer subwindows (1.75x faster at 1M "
                        "tuples per stream with 512K, benchmarks/RESULTS.md)")
    g.add_argument("--partitions", type=_size, metavar="P",
                   help="partitions per subwindow (default: NSub/128, at most 64K)")
    g.add_argument("--batch-size", type=_size, default=32768, metavar="NBAT",
                   help="max tuples per batch (default: %(default)s)")
    g.add_argument("--max-lag", type=_size, metavar="N",
                   help="cut a stream's batch once the other stream has received N tuples since "
                        "its oldest tuple (default: the batch size)")
    g.add_argument("--threads", type=int, metavar="T", help="probe threads (default: all cores)")


def _add_topology(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", choices=["ring", "handshake"], default="ring",
                   help="ring: PanJoin subwindows over workers (default); handshake: a chain of "
                        "handshake join nodes (nested-loop segments, two-phase forwarding)")
    p.add_argument("--fifo", type=_size, default=1 << 16, metavar="PAIRS",
                   help="handshake: capacity of every result FIFO in pairs; admission control "
                        "pauses the input while one is full (default: %(default)s)")
    p.add_argument("--segment", choices=["nested", "sorted"], default="nested",
                   help="handshake: how a node scans its segments: the paper's nested loop "
                        "(default) or a sorted key index")
    p.add_argument("--replicas", type=int, choices=[1, 2], default=2,
                   help="ring: copies of each subwindow. 2: a backup on the next worker logs "
                        "the same inserts and takes over when its worker dies (no loss; "
                        "default); 1: none, so a lost worker ends the join")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="panjoin",
        description="PanJoin: a sliding-window stream join with RaP-Table, WiB+-Tree and "
                    "BI-Sort subwindows.",
    )
    ap.add_argument("--version", action="version", version=f"panjoin {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    p = sub.add_parser("replay", help="join a recorded event file and write the result pairs",
                       description="Join an event file (Parquet or CSV with columns stream, id, "
                                   "key, ts[, payload], rows in arrival order) and write the "
                                   "exact result as Parquet columns r_id, s_id.")
    p.add_argument("events", help="event file (.parquet or .csv)")
    _add_join_opts(p)
    p.add_argument("--out", required=True, metavar="PAIRS.parquet", help="result pairs")
    p.add_argument("--late-out", metavar="LATE.parquet",
                   help="late tuples (time windows): columns stream, id")
    p.add_argument("--chunk", type=_size, default=1 << 20, help="rows pushed at a time")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, metavar="N",
                       help="run on a local cluster of N worker processes (default: in-process)")
    where.add_argument("--cluster", metavar="HOST:PORT",
                       help="run on an existing manager endpoint (panjoin cluster / manager)")
    p.add_argument("--result-format", choices=["pairs", "ranges"], default="pairs",
                   help="on a cluster with BI-Sort: workers answer with (start, end) ranges "
                        "expanded on the manager's mirror, a copy of each BI-Sort subwindow "
                        "(O(window) memory on the manager; default: %(default)s)")
    p.add_argument("--with-payload", action="store_true",
                   help="join the events' payloads back onto the pairs: columns r_payload, "
                        "s_payload (kept by the client or in-process engine; workers never "
                        "see them)")
    _add_topology(p)
    _add_common(p)

    p = sub.add_parser("gen", help="generate an event file",
                       description="Write a generated stream pair as an event file.")
    p.add_argument("out", help="output file (.parquet or .csv)")
    p.add_argument("--n", type=_size, default=1 << 20, help="tuples in all (default: 1M)")
    p.add_argument("--dist", default="uniform",
                   choices=["uniform", "zipf", "increasing", "normal", "equal"],
                   help="key distribution (default: %(default)s)")
    p.add_argument("--key-min", type=int, default=0)
    p.add_argument("--key-max", type=int, default=1_000_000)
    p.add_argument("--float-keys", action="store_true", help="float64 keys")
    p.add_argument("--rate", type=float, default=1e6, help="tuples per second (sets ts)")
    p.add_argument("--disorder-ms", type=int, default=0, help="max ts delay of late-ish tuples")
    p.add_argument("--r-fraction", type=float, default=0.5, help="share of R tuples")
    p.add_argument("--zipf-a", type=float, default=1.2)
    p.add_argument("--modes", type=int, default=4, help="peaks of the 'normal' distribution")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--payload", action="store_true", help="add a string payload column")
    p.add_argument("--key2-max", type=float, default=None, metavar="M",
                   help="add a second attribute key2, uniform in [0, M), for residual "
                        "predicates such as band:10&band2:10")
    _add_common(p)

    p = sub.add_parser("bench", help="benchmarks (see benchmarks/)")
    bsub = p.add_subparsers(dest="bench", required=True, metavar="WHAT")
    b = bsub.add_parser("index", help="one point of an index microbenchmark",
                        description="Insert or probe throughput of one subwindow index after a "
                                    "warm-up; prints 'tuples/s: X' last.")
    b.add_argument("--index", required=True, choices=["rap", "wib", "bisort", "nested"],
                   help=INDEX_HELP)
    b.add_argument("--op", required=True, choices=["insert", "probe"])
    b.add_argument("--nsub", type=_size, default=1 << 20, help="subwindow size NSub")
    b.add_argument("--partitions", type=_size, default=8192, help="partition count P")
    b.add_argument("--batch", type=_size, default=32768, help="batch size NBat")
    b.add_argument("--selectivity", type=float, default=1.0, help="matches per probe tuple S")
    b.add_argument("--predicate", choices=["eq", "band"], default="band")
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--repeat", type=int, default=3, help="timed repetitions (median reported)")
    b.add_argument("--seed", type=int, default=0)
    _add_common(b)

    p = sub.add_parser("cluster", help="start workers and a manager endpoint on loopback",
                       description="Start N worker processes and the manager endpoint on "
                                   "127.0.0.1; Ctrl-C or SIGTERM stops everything.")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default: 2)")
    p.add_argument("--port", type=int, default=50050, help="manager port, 0 for any free one")
    p.add_argument("--threads", type=int, default=1, help="probe threads per worker")
    _add_topology(p)
    _add_common(p)

    p = sub.add_parser("manager", help="run the manager endpoint over existing workers",
                       description="Serve the panjoin.v1.Manager gRPC service over workers "
                                   "started with 'panjoin worker'.")
    p.add_argument("--workers", required=True, metavar="HOST:PORT,...",
                   help="comma-separated worker addresses")
    p.add_argument("--port", type=int, default=50050, help="port, 0 for any free one")
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    _add_topology(p)
    _add_common(p)

    p = sub.add_parser("worker", help="run a worker process (gRPC server over the indexes)",
                       description="Serve the worker contract (create/insert/probe/expire "
                                   "subwindows) over gRPC, with health checking and "
                                   "reflection.")
    p.add_argument("--port", type=int, default=50051, help="port, 0 for any free one "
                                                           "(default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="probe threads (default: %(default)s)")
    p.add_argument("--index-backend", choices=["numba", "opencl"], default="numba",
                   help="opencl: BI-Sort subwindows ('bisort') run on an OpenCL device "
                        "(default: %(default)s)")
    p.add_argument("--device", metavar="SPEC",
                   help="OpenCL device: 'P:D', cpu, gpu, accelerator or part of its name "
                        "(default: $PANJOIN_OPENCL_DEVICE, else the pocl CPU device; "
                        "'python -m opencl' lists them)")
    p.add_argument("--null", action="store_true",
                   help="hold nothing and answer every probe empty: a cluster of null workers "
                        "measures the manager's own ceiling")
    _add_common(p)

    p = sub.add_parser("handshake-node", help="run a handshake chain node (--topology handshake)",
                       description="Serve panjoin.v1.HandshakeNode: one node of a handshake "
                                   "join chain, talking to its neighbours over gRPC.")
    p.add_argument("--port", type=int, default=50061, help="port, 0 for any free one "
                                                           "(default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="scan threads (default: %(default)s)")
    _add_common(p)

    b = bsub.add_parser("system", help="end-to-end rate of a local cluster vs in-process",
                        description="Fill count windows of W tuples per stream, then time the "
                                    "next tuples through a local cluster and through the "
                                    "in-process engine; prints 'tuples/s: X  "
                                    "overhead-vs-in-process: Y' last.")
    b.add_argument("--workers", type=int, default=2, help="worker processes")
    b.add_argument("--window", type=_size, default=1 << 20, help="count window W per stream")
    b.add_argument("--batch", type=_size, default=32768, help="batch size NBat")
    b.add_argument("--index", default="bisort", choices=["rap", "wib", "bisort", "nested"])
    b.add_argument("--selectivity", type=float, default=1.0, help="matches per tuple S")
    b.add_argument("--measure", type=_size, default=1 << 21, help="timed tuples after the fill")
    b.add_argument("--threads", type=int, default=1, help="probe threads per worker")
    b.add_argument("--result-format", choices=["pairs", "ranges"], default="pairs",
                   help="BI-Sort: workers answer with (start, end) ranges that the manager "
                        "expands on its mirror of each main array (default: %(default)s)")
    b.add_argument("--replicas", type=int, choices=[1, 2], default=2,
                   help="copies of each subwindow on the cluster (default: %(default)s)")
    b.add_argument("--null-workers", action="store_true",
                   help="workers that hold nothing and answer every probe empty: the rate is "
                        "the manager's own ceiling, with its CPU-seconds per million tuples")
    _add_common(b)

    b = bsub.add_parser("peers", help="PanJoin against its peers on the same data (issue 7)",
                        description="Nested loop, sorted list, symmetric hash join, DuckDB, "
                                    "Spark (when installed) and PanJoin (each index and the "
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
                   help="threads of every peer (PanJoin's Numba probes, DuckDB; default: 1)")
    b.add_argument("--measure", type=_size, default=None,
                   help="timed tuples after the fill (default: W)")
    b.add_argument("--bounded-probes", type=_size, default=None,
                   help="probe tuples of a peer run bounded beyond its limit (default: 8K)")
    b.add_argument("--tag", default=None, help="suffix of the result and plot files")
    b.add_argument("--repeat", type=int, default=None,
                   help="interleaved rounds per workload, best kept (default: 2; quick: 1)")
    b.add_argument("--merge", nargs="+", metavar="JSON", default=None,
                   help="run nothing: print the table of these results files and plot them "
                        "together (with --tag)")
    b.add_argument("--out", default="benchmarks", help="folder for results/ and plots/")
    _add_common(b)

    p = sub.add_parser("demo", help="the join alone through a local cluster, no Kafka or "
                                    "Spark (`make demo` runs the Kafka path)")
    p.add_argument("--n", type=_size, default=3 << 20, help="tuples in all (default: 3M)")
    p.add_argument("--index", default="bisort", choices=["rap", "wib", "bisort", "nested"])
    p.add_argument("--window", type=_size, default=1 << 20, help="count window per stream")
    p.add_argument("--workers", type=int, default=2,
                   help="worker processes of the local cluster; 0 runs in-process (default: 2)")
    _add_common(p)

    from panjoin.kafka.cli import add_parsers as add_kafka_parsers

    add_kafka_parsers(sub, _add_common, _add_join_opts)
    return ap


def _chosen_parser(ap: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The (sub)parser of the command named in argv (``bench index`` included)."""
    parser = ap
    for tok in argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            break
        if tok in subs[0].choices:
            parser = subs[0].choices[tok]
    return parser


def _parse(argv) -> argparse.Namespace:
    """Parse flags; a ``--config`` TOML file supplies defaults that flags override."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    ap = build_parser()
    if known.config:
        path = Path(known.config)
        try:
            conf = tomllib.loads(path.read_text())
        except FileNotFoundError:
            ap.error(f"config file {path} not found")
        except tomllib.TOMLDecodeError as e:
            ap.error(f"config file {path} is not valid TOML: {e}")
        argv = sys.argv[1:] if argv is None else list(argv)
        sub = _chosen_parser(ap, argv)
        actions = {a.dest: a for a in sub._actions}
        defaults = {}
        for k, v in conf.items():
            action = actions.get(k.replace("-", "_"))
            if action is None or action.dest in ("help", "config"):
                continue
            if action.type is not None and isinstance(v, str):
                v = action.type(v)
            defaults[action.dest] = v
            action.required = False
        sub.set_defaults(**defaults)
        unknown = sorted(k for k in conf if k.replace("-", "_") not in defaults)
        if unknown:
            ap.error(f"config file {path}: unknown option(s) {', '.join(unknown)}")
    return ap.parse_args(argv)


def _progress(total, desc, disable, unit="tuples"):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, disable=disable,
                file=sys.stderr, dynamic_ncols=True)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def run_replay(args) -> int:
    from panjoin.events import read_events
    from panjoin.semantics import parse_predicate, parse_window

    window = parse_window(args.window, args.allowed_lateness)
    pred = parse_predicate(args.predicate)
    t0 = time.perf_counter()
    events = read_events(args.events)
    log.info("read %d events (%d R, %d S) from %s in %.2fs", len(events), *events.counts(),
             args.events, time.perf_counter() - t0)
    if args.with_payload and events.payload is None:
        raise SystemExit(f"panjoin replay: error: {args.events} has no payload column; "
                         "drop --with-payload, or add one (panjoin gen --payload)")
    if args.with_payload and args.topology == "handshake":
        raise SystemExit("panjoin replay: error: the handshake topology carries no payloads; "
                         "drop --with-payload or use --topology ring")
    if pred.residual is not None and events.key2 is None:
        raise SystemExit(f"panjoin replay: error: predicate {pred} has a residual on key2, "
                         f"but {args.events} has no key2 column; add one or drop the '&...2' "
                         "part of --predicate")
    if not args.with_payload:
        events.payload = None  # not asked for: the manager need not keep them
    if args.cluster:
        return _replay_on_manager(args, events, window, pred)
    if args.topology == "handshake":
        return _replay_handshake(args, events, window, pred)
    backend, workers = None, []
    if args.workers:
        from panjoin.launch import start_workers
        from panjoin.manager.grpc_backend import GrpcBackend

        workers = start_workers(args.workers, args.threads or 1)
        backend = GrpcBackend([w.address for w in workers], result_format=args.result_format,
                              replicas=args.replicas)
        log.info("local cluster: %s", ", ".join(w.address for w in workers))
    try:
        return _replay_engine(args, events, window, pred, backend, max(1, len(workers)))
    finally:
        if backend is not None:
            backend.close()
        for w in workers:
            w.stop()


def _replay_on_manager(args, events, window, pred) -> int:
    from panjoin.client import Client
    from panjoin.events import write_ids, write_pairs

    t1 = time.perf_counter()
    opts = {k: v for k, v in dict(subwindow_size=args.subwindow_size,
                                   partitions=args.partitions, batch_size=args.batch_size,
                                   max_lag=args.max_lag,
                                   allowed_lateness=window.lateness,
                                   result_format=int(args.result_format == "ranges")).items()
            if v}
    with Client(args.cluster) as c:
        res = c.join(events, str(window), str(pred), args.index, chunk=args.chunk, **opts)
    r, s, late = res
    elapsed = time.perf_counter() - t1
    write_pairs(args.out, r, s, res.r_payload, res.s_payload)
    if args.late_out:
        write_ids(args.late_out, late)
    print(f"input tuples: {len(events)}  late: {sum(len(v) for v in late.values())}")
    print(f"results: {len(r)} pairs -> {args.out}")
    print(f"time: {elapsed:.2f} s  throughput: {len(events) / max(elapsed, 1e-9):,.0f} tuples/s"
          f"  (manager {args.cluster})")
    return 0


def _replay_handshake(args, events, window, pred) -> int:
    from panjoin.handshake.chain import HandshakeChain
    from panjoin.launch import start_workers

    nodes = start_workers(args.workers or 1, args.threads or 1, role="handshake-node")
    log.info("handshake chain: %s", " - ".join(w.address for w in nodes))
    try:
        chain = HandshakeChain([w.address for w in nodes], window, pred,
                               key_dtype=str(events.key.dtype),
                               batch_size=min(args.batch_size, 4096), node_fifo=args.fifo,
                               merger_fifo=args.fifo, index=args.segment)
        try:
            rc = _replay_engine(args, events, window, pred, None, len(nodes), engine=chain)
            st = chain.status()
            print(f"handshake: {len(nodes)} nodes  admission pauses: {st['pauses']}  "
                  f"segments R {st['segments']['R']} S {st['segments']['S']}")
            return rc
        finally:
            chain.close()
    finally:
        for w in nodes:
            w.stop()


def _replay_engine(args, events, window, pred, backend, n_workers, engine=None) -> int:
    from panjoin.events import write_ids, write_pairs
    from panjoin.manager.engine import JoinEngine

    if engine is None:
        engine = JoinEngine(window, pred, index=args.index, subwindow_size=args.subwindow_size,
                            partitions=args.partitions, batch_size=args.batch_size,
                            max_lag=args.max_lag, threads=args.threads,
                            key_dtype=str(events.key.dtype), backend=backend,
                            n_workers=n_workers)
        log.info("join %s on %s, index %s, NSub %d, P %d, NBat %d", window, pred, args.index,
                 engine.nsub, engine.partitions, engine.batch_size)
    parts = []
    peak = 0
    t1 = time.perf_counter()
    with _progress(len(events), "replay", args.no_progress) as bar:
        for start in range(0, len(events), args.chunk):
            chunk = events.slice(start, min(len(events), start + args.chunk))
            engine.push(chunk)
            parts.append(engine.take_results(payloads=True))
            peak = max(peak, engine.memory_bytes())
            bar.update(len(chunk))
        engine.flush()
        parts.append(engine.take_results(payloads=True))
    elapsed = time.perf_counter() - t1
    r_all = np.concatenate([p[0] for p in parts])
    s_all = np.concatenate([p[1] for p in parts])
    pays = [None, None]
    if getattr(engine, "with_payload", False):
        import pyarrow as pa

        pays = [pa.concat_arrays([p[k] for p in parts]) for k in (2, 3)]
    write_pairs(args.out, r_all, s_all, *pays)
    late = engine.take_late()
    if args.late_out:
        write_ids(args.late_out, late)
    n_late = sum(len(v) for v in late.values())
    rate = len(events) / elapsed if elapsed > 0 else float("inf")
    stored = max(1, max(engine.window_tuples().values()) * 2)
    print(f"input tuples: {len(events)}  late: {n_late}"
          + ("" if args.late_out or not n_late else " (not written: give --late-out)"))
    print(f"results: {len(r_all)} pairs -> {args.out}")
    print(f"time: {elapsed:.2f} s  throughput: {rate:,.0f} tuples/s")
    print(f"memory: peak {_fmt_bytes(peak)} in the window "
          f"({peak / stored:.1f} bytes per stored tuple)")
    return 0


def run_gen(args) -> int:
    from panjoin.events import write_events
    from panjoin.generate import generate

    t0 = time.perf_counter()
    table = generate(args.n, args.dist, key_min=args.key_min, key_max=args.key_max,
                     float_keys=args.float_keys, rate=args.rate, disorder_ms=args.disorder_ms,
                     r_fraction=args.r_fraction, zipf_a=args.zipf_a, modes=args.modes,
                     seed=args.seed, payload=args.payload, key2_max=args.key2_max)
    write_events(table, args.out)
    nr, ns = table.counts()
    print(f"wrote {len(table)} events ({nr} R, {ns} S, {args.dist} keys) to {args.out} "
          f"in {time.perf_counter() - t0:.2f} s")
    return 0


def run_bench(args) -> int:
    if args.bench == "system":
        return run_bench_system(args)
    if args.bench == "peers":
        return run_bench_peers(args)
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


def _serve_until_stopped(stop_fn) -> int:
    import signal
    import threading

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    stop_fn()
    return 0


def run_cluster(args) -> int:
    from panjoin.launch import start_workers
    from panjoin.manager.service import serve_manager

    role = "handshake-node" if args.topology == "handshake" else "worker"
    workers = start_workers(args.workers, args.threads, role=role)
    addrs = [w.address for w in workers]
    try:
        server, port = serve_manager(addrs, args.port, topology=args.topology, fifo=args.fifo,
                                     segment=args.segment, replicas=args.replicas)
    except BaseException:
        for w in workers:
            w.stop()
        raise
    print(f"panjoin cluster: manager on 127.0.0.1:{port}, workers {', '.join(addrs)}"
          + (" (handshake chain)" if args.topology == "handshake" else ""), flush=True)

    def stop():
        server.stop(grace=2).wait()
        for w in workers:
            w.stop()
        print("panjoin cluster: stopped", flush=True)

    return _serve_until_stopped(stop)


def run_manager(args) -> int:
    from panjoin.launch import MANAGER_READY, wait_healthy
    from panjoin.manager.service import serve_manager

    addrs = [a.strip() for a in args.workers.split(",") if a.strip()]
    for a in addrs:
        wait_healthy(a, timeout=30)
    server, port = serve_manager(addrs, args.port, args.host, topology=args.topology,
                                 fifo=args.fifo, segment=args.segment, replicas=args.replicas)
    print(f"{MANAGER_READY}{args.host}:{port}, workers {', '.join(addrs)}", flush=True)
    return _serve_until_stopped(lambda: server.stop(grace=2).wait())


def run_worker(args) -> int:
    from panjoin.launch import READY
    from workers.server import serve

    if args.index_backend == "opencl":
        from opencl.device import OpenCLError, runtime

        try:  # fail now, not at the first subwindow: no platform, no device, no build
            rt = runtime(args.device)
            rt.program("int64")
        except OpenCLError as e:
            print(f"panjoin worker: {e}", file=sys.stderr)
            return 2
        log.info("BI-Sort subwindows on OpenCL device %s", rt.name)
    server, port = serve(args.port, args.threads, args.host, index_backend=args.index_backend,
                         device=args.device, null=args.null)
    print(f"{READY}{args.host}:{port}", flush=True)
    log.info("worker serving on %s:%d with %d threads", args.host, port, args.threads)
    return _serve_until_stopped(lambda: server.stop(grace=2).wait())


def run_handshake_node(args) -> int:
    from panjoin.launch import READY
    from workers.handshake_node import serve

    server, port = serve(args.port, args.threads, args.host)
    print(f"{READY}{args.host}:{port}", flush=True)
    log.info("handshake node serving on %s:%d", args.host, port)
    return _serve_until_stopped(lambda: server.stop(grace=2).wait())


def run_bench_system(args) -> int:
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


def run_bench_peers(args) -> int:
    from pathlib import Path

    from panjoin.bench.peers import PeerConfig, check_counts, run_peers, table

    cfg = PeerConfig.quick() if args.quick else PeerConfig()
    if args.windows:
        cfg.windows = [_size(w) for w in args.windows.split(",")]
    if args.peers:
        cfg.peers = tuple(p.strip() for p in args.peers.split(","))
    if args.workloads:
        cfg.only = tuple(w.strip() for w in args.workloads.split(","))
    if args.merge:
        from panjoin.bench.peers import load_records, plot

        recs = load_records(args.merge)
        plot(recs, Path(args.out) / "plots", f"-{args.tag}" if args.tag else "")
        print(table(recs))
        problems = check_counts(recs)
        print("result counts: " + ("MISMATCH: " + "; ".join(problems) if problems else
                                   "all peers that ran agree"))
        return 1 if problems else 0
    if args.repeat:
        cfg.repeat = args.repeat
    if args.threads:
        cfg.threads = args.threads
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
    problems = check_counts(recs)
    for p in problems:
        print(f"COUNT MISMATCH: {p}")
    print("result counts: " + ("MISMATCH" if problems else "all peers that ran agree"))
    return 1 if problems else 0


def run_demo(args) -> int:
    """Generate a stream, band-join it with selectivity about 1, print throughput."""
    from panjoin.generate import band_for_selectivity, generate
    from panjoin.manager.engine import JoinEngine
    from panjoin.manager.grpc_backend import GrpcBackend

    key_max = 1 << 40
    print(f"PanJoin demo: {args.n:,} tuples (uniform keys, half R, half S), "
          f"count window {args.window:,} per stream, index {args.index}")
    events = generate(args.n, "uniform", key_min=0, key_max=key_max, seed=42)
    e = band_for_selectivity(1.0, args.window, 0, key_max)
    pred = f"band:{int(e)}"
    workers, backend = [], None
    if args.workers > 0:
        from panjoin.launch import start_workers

        workers = start_workers(args.workers)
        backend = GrpcBackend([w.address for w in workers])
        print(f"local cluster: {len(workers)} worker processes at "
              f"{', '.join(w.address for w in workers)}")
    try:
        print("warming up: compiling the kernels once (cached on disk for later runs)")
        warm = GrpcBackend([w.address for w in workers]) if workers else None
        try:
            eng = JoinEngine("count:4096,4096", pred, index=args.index, batch_size=1024,
                             subwindow_size=2048, backend=warm, n_workers=max(1, len(workers)))
            eng.push(events.slice(0, min(len(events), 20000)))
            eng.flush()
        finally:
            if warm is not None:
                warm.close()
        return _demo_run(args, events, pred, backend, max(1, len(workers)))
    finally:
        if backend is not None:
            backend.close()
        for w in workers:
            w.stop()


def _demo_run(args, events, pred, backend, n_workers) -> int:
    from panjoin.manager.engine import JoinEngine

    engine = JoinEngine(f"count:{args.window},{args.window}", pred, index=args.index,
                        batch_size=32768, backend=backend, n_workers=n_workers)
    print(f"predicate {pred} (about 1 match per tuple), NSub {engine.nsub:,}, "
          f"P {engine.partitions:,}, NBat {engine.batch_size:,}")
    n_results = 0
    step = 1 << 18
    t0 = time.perf_counter()
    with _progress(len(events), "join", args.no_progress) as bar:
        for start in range(0, len(events), step):
            chunk = events.slice(start, min(len(events), start + step))
            engine.push(chunk)
            n_results += len(engine.take_results()[0])
            bar.update(len(chunk))
        engine.flush()
        n_results += len(engine.take_results()[0])
    elapsed = time.perf_counter() - t0
    print(f"results: {n_results:,} pairs ({n_results / len(events):.2f} per input tuple)")
    print(f"throughput: {len(events) / elapsed:,.0f} input tuples/s ({elapsed:.2f} s)")
    print(f"window memory: {_fmt_bytes(engine.memory_bytes())}")
    return 0


def _run_kafka(args) -> int:
    from panjoin.kafka.cli import run_kafka

    return run_kafka(args)


def _run_pipeline(args) -> int:
    from panjoin.kafka.cli import run_pipeline

    return run_pipeline(args)


def main(argv=None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers = {"replay": run_replay, "gen": run_gen, "bench": run_bench, "demo": run_demo,
                "worker": run_worker, "cluster": run_cluster, "manager": run_manager,
                "handshake-node": run_handshake_node, "kafka": _run_kafka,
                "pipeline": _run_pipeline}
    try:
        return handlers[args.cmd](args)
    except (SpecError, ValueError, TypeError, FileNotFoundError) as e:
        from panjoin.events import EventError

        kind = "bad input" if isinstance(e, EventError) else "error"
        print(f"panjoin {args.cmd}: {kind}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
