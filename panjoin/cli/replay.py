"""``panjoin replay``: join a recorded event file, in-process, on a local cluster of
worker processes, on a running manager endpoint or on a handshake chain, and write
the exact result pairs (and late tuples).

    panjoin replay events.parquet --window count:1M,1M --predicate band:10 \\
        --index bisort --out pairs.parquet [--workers 2 | --cluster HOST:PORT]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import threading
import time

from panjoin.cli.options import (
    add_common,
    add_join_opts,
    add_security,
    add_topology,
    check_topology,
    progress,
    size,
)
from panjoin.memory import fmt_bytes

log = logging.getLogger("panjoin")


def add_parser(sub) -> None:
    p = sub.add_parser("replay", help="join a recorded event file and write the result pairs",
                       description="Join an event file (Parquet or CSV with columns stream, id, "
                                   "key, ts[, payload], rows in arrival order) and write the "
                                   "exact result as Parquet columns r_id, s_id.")
    p.add_argument("events", help="event file (.parquet or .csv)")
    add_join_opts(p)
    p.add_argument("--out", required=True, metavar="PAIRS.parquet", help="result pairs")
    p.add_argument("--late-out", metavar="LATE.parquet",
                   help="late tuples (time windows): columns stream, id")
    p.add_argument("--chunk", type=size,
                   help="rows pushed at a time (default: about 8M pairs' worth, from a "
                        "batch to 1M rows; 1M on a --cluster)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, metavar="N",
                       help="run on a local cluster of N worker processes (default: in-process)")
    where.add_argument("--cluster", metavar="HOST:PORT[,HOST:PORT...]",
                       help="run on an existing manager endpoint (panjoin cluster / manager); "
                            "several, comma-separated: a join sharded by key over them, one "
                            "key range each (time windows only; the managers may share "
                            "their workers)")
    p.add_argument("--result-format", choices=["pairs", "ranges"],
                   help="on a cluster with BI-Sort: workers answer with (start, end) ranges "
                        "expanded on the manager's mirror, a copy of each BI-Sort subwindow "
                        "(O(window) memory on the manager; default: pairs)")
    p.add_argument("--results-via", choices=["workers", "manager"], default="workers",
                   help="on one --cluster manager: the pairs come straight from the workers "
                        "(results past the manager, where it grants them: a manager with "
                        "--replicas 1, the ring topology), else through the manager "
                        "(default: workers)")
    p.add_argument("--seq-ids", action="store_true",
                   help="on one --cluster manager, a count window: the tuples' ids stay "
                        "here and the join names each tuple by its arrival number in its "
                        "stream (the manager then carries 4 bytes a tuple less, and no id "
                        "column through its passes); each pair is mapped back here, two "
                        "gathers a pair. For a client with CPU to spare beside a busy "
                        "manager (default: the ids go with the tuples)")
    p.add_argument("--with-payload", action="store_true",
                   help="join the events' payloads back onto the pairs: columns r_payload, "
                        "s_payload (kept by the client or in-process engine; workers never "
                        "see them)")
    p.add_argument("--warm-up", action="store_true",
                   help="before the timed join, join the file's first 20K tuples in a "
                        "throwaway join (count:4K,4K, same predicate and index), so that "
                        "the kernels are loaded, as in a service that is already running "
                        "(default: the timed join loads them)")
    p.add_argument("--memory-limit", type=size, metavar="BYTES",
                   help="in-process: the memory the window's subwindows may hold (K/M/G "
                        "suffixes); a window beyond it is refused before the join starts "
                        "(default: 80%% of what this process may use: the host's "
                        "MemAvailable, or its cgroup's memory limit less its usage where "
                        "that is less)")
    p.add_argument("--shards", type=_shards, default="auto", metavar="K|auto",
                   help="in-process, time windows: split the join by key over K engines on "
                        "K threads (an R tuple joins in the shard that owns its key, an S "
                        "tuple in every shard it can pair in; the pairs are the same). "
                        "auto: one shard a CPU this process may use, when the file's keys "
                        "spread over them (not for count windows, increasing or few keys, "
                        "a band wider than a shard, or --max-latency) (default: auto)")
    add_topology(p)
    add_security(p, "client")
    add_common(p)
    p.set_defaults(run=run)


#: tuples of the file that --warm-up joins first
WARM_UP_TUPLES = 20_000
#: printed once the warm-up is done, right before the timed join
WARMED = "warm-up: done, the timed join starts"


def _shards(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        k = int(text)
    except ValueError:
        k = 0
    if not 1 <= k <= 64:
        raise argparse.ArgumentTypeError(f"{text!r}: give 'auto' or a number of shards, 1..64")
    return k


def _warm_events(events):
    return events.slice(0, min(len(events), WARM_UP_TUPLES))


def _warm_join(events, pred, index, threads, kind: str = "count") -> None:
    """The throwaway join that loads the kernels (``--warm-up``, and
    :func:`_load_kernels_behind`): 4K tuples a stream, or 4 s, as the join's window
    ``kind`` is; the join's predicate, index and threads."""
    from panjoin.manager.engine import JoinEngine

    warm = JoinEngine("count:4096,4096" if kind == "count" else "time:4000,4000", pred,
                      index=index, threads=threads, key_dtype=str(events.key.dtype))
    warm.push(events)
    warm.flush()
    warm.take_results()


def _load_kernels_behind(args, window, pred) -> threading.Thread | None:
    """An in-process replay's kernels, loaded on a thread while this one reads and
    checks the file (``pyarrow`` and numpy let go of the GIL; so does Numba's cache
    loading, in LLVM): the ``--warm-up`` join on generated tuples of the file's key
    type (a Parquet schema says it; otherwise int64). A wrong guess only costs the
    join loading its kernels itself. The join waits for the thread first, so no two
    joins run kernels at once; an input error leaves without waiting for it. A join
    sharded over several managers loads its router's kernels so instead."""
    sharded = bool(args.cluster) and len(managers(args.cluster)) > 1
    if args.warm_up or not (_in_process(args) or sharded):
        return None
    float_keys = False
    with contextlib.suppress(Exception):  # unreadable: read_events says why, in order
        import pyarrow as pa
        import pyarrow.parquet as pq

        float_keys = pa.types.is_floating(pq.read_schema(args.events).field("key").type)

    # imported before the thread starts, not by both threads at once: two threads
    # importing the same packages together can meet in a circular import
    import panjoin.events  # noqa: F401 (the main thread's read)
    import panjoin.manager.engine  # noqa: F401 (the loader's join)
    from panjoin.generate import warm_up_events
    from panjoin.sharding import warm_up_router

    def load():
        try:
            if sharded:
                warm_up_router("float64" if float_keys else "int64", pred)
                return
            if _may_shard(args, window):
                warm_up_router("float64" if float_keys else "int64", pred)
            # key2 in [0, 1): a residual's second band passes every candidate
            _warm_join(warm_up_events(WARM_UP_TUPLES, _warm_key_max(pred), float_keys=float_keys,
                                      key2_max=None if pred.residual is None else 1.0),
                       pred, args.index, args.threads, window.kind)
        except Exception:  # the join itself will meet (and report) whatever this did
            log.debug("loading the kernels ahead failed", exc_info=True)

    t = threading.Thread(target=load, name="panjoin-load-kernels", daemon=True)
    t.start()
    return t


def _warm_key_max(pred) -> int:
    """Keys of the generated warm-up tuples in [0, K]: wide enough that a band finds
    about one partner a tuple in the warm-up's 4K window (K = 8192 x the widest band),
    so a wide band does not turn a kernel load into a result-heavy join (band:2^25 over
    keys in [0, 2^20] made 80M pairs: seconds)."""
    width = 0 if pred.negated else pred.max_width()
    return int(min(max(1 << 20, 8192 * width), 1 << 61))


def run(args) -> int:
    from panjoin.cli.phases import Phases

    with Phases() as ph:
        return _run(args, ph)


def _run(args, ph) -> int:
    from panjoin.semantics import parse_predicate, parse_window

    check_topology(args, "panjoin replay", on_manager=bool(args.cluster))
    if args.max_latency is None:  # a file's join: no latency to hold (before any kernel)
        from panjoin.config import wait_passively

        wait_passively()
    window = parse_window(args.window, args.allowed_lateness)
    pred = parse_predicate(args.predicate)
    if args.seq_ids and not (args.cluster and len(managers(args.cluster)) == 1
                             and window.kind == "count"):
        raise SystemExit("panjoin replay: error: --seq-ids is for a count window on one "
                         "--cluster manager (a time window's late tuples get no seq; "
                         "in-process and local joins carry no ids over a wire): drop it")
    if args.cluster and len(managers(args.cluster)) > 1 and window.kind != "time":
        from panjoin.sharding import COUNT_REFUSED

        raise SystemExit(f"panjoin replay: error: --cluster {args.cluster}: {COUNT_REFUSED}")
    _check_shards(args, window)
    _fill_threads(args, pred, window)
    args.prefault = _prefault_behind(args)
    loader = _load_kernels_behind(args, window, pred)
    rc = _read_and_join(args, window, pred, ph, loader)
    if loader is not None:  # an error leaves without it: bad input is told at once, not
        loader.join()  # after a cold compile (the thread is a daemon; Numba's lock keeps
    return rc  # a later join in this process safe beside it)


def _prefault_behind(args):
    """An in-process file join's heap, faulted in on a thread while this one reads the
    file (:func:`panjoin.config.prefault_heap`): a chunk's rows (the file's, from its
    Parquet footer, at most a chunk) at ``PREFAULT_BYTES_PER_ROW``, at most an eighth of
    what the process may use. The prefault (``release()`` it before the join), or None
    (a cluster, a latency bound, ``PANJOIN_TUNE_MALLOC=0``, not glibc)."""
    if not _in_process(args) or args.max_latency is not None:
        return None
    import os

    from panjoin.config import PREFAULT_BYTES_PER_ROW, prefault_heap
    from panjoin.manager.knobs import CHUNK_MAX
    from panjoin.memory import memory_budget

    try:
        import pyarrow.parquet as pq

        rows = pq.ParquetFile(args.events).metadata.num_rows
    except Exception:  # not Parquet (CSV), or unreadable (the read says why)
        rows = os.path.getsize(args.events) // 16 if os.path.isfile(args.events) else 0
    rows = min(rows, args.chunk or CHUNK_MAX)
    return prefault_heap(min(rows * PREFAULT_BYTES_PER_ROW, memory_budget().left // 8))


def _in_process(args) -> bool:
    """The join runs in this process: no manager, no local cluster, no handshake nodes."""
    return not (args.cluster or args.workers or args.topology == "handshake")


def _check_shards(args, window) -> None:
    """``--shards K`` (K > 1) where the join cannot shard is an error that says why."""
    if args.shards in ("auto", 1):
        return
    why = None
    if not _in_process(args):
        why = ("shards an in-process join; on managers give several --cluster addresses "
               "(one key range each)")
    elif window.kind != "time":
        from panjoin.sharding import COUNT_REFUSED

        why = COUNT_REFUSED.replace("several managers", "several shards")
    elif args.max_latency is not None:
        why = "is for a file's join at full speed: drop it or --max-latency"
    if why:
        raise SystemExit(f"panjoin replay: error: --shards {args.shards} {why}")


def _may_shard(args, window) -> bool:
    """The in-process join may run in shards (:mod:`panjoin.manager.sharded_engine`)."""
    return (args.shards != 1 and _in_process(args) and window.kind == "time"
            and args.max_latency is None)


def _fill_threads(args, pred, window) -> None:
    """--threads left out of an in-process replay: every CPU the process may use but the
    pairs writer's (:func:`panjoin.manager.knobs.offline_threads`), before the kernels
    load (one thread and two use different ones); a join that may shard, one a shard
    (its shards are then one a CPU, :func:`_plan_shards`). ``PANJOIN_THREADS`` still
    decides."""
    import os

    if args.threads is not None or os.environ.get("PANJOIN_THREADS") or not _in_process(args):
        return
    from panjoin.config import thread_budget
    from panjoin.manager.knobs import offline_threads

    cpus, why = thread_budget()
    if _may_shard(args, window) and cpus > 1:
        args.threads, args.threads_filled = 1, offline_threads(pred, cpus)
        return
    args.threads = offline_threads(pred, cpus)
    log.info("%d kernel thread%s for the file's join: of %s, %s", args.threads,
             "" if args.threads == 1 else "s", why,
             "all (a residual's probes filter many candidates a pair)"
             if pred.residual is not None else "all but the pairs writer's (at least one)")


def _read_and_join(args, window, pred, ph, loader) -> int:
    from panjoin.events import read_events

    t0 = time.perf_counter()
    took = {}
    with ph.phase("read"):
        events = read_events(args.events, took)
    ph.move("read", "validate", took.get("validate", 0.0))  # read_events' own split
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
    if args.warm_up and args.topology == "handshake":
        raise SystemExit("panjoin replay: error: --warm-up is for the ring topology (the "
                         "handshake nodes' scan loads in the first messages)")
    if args.topology != "handshake" and args.max_latency is None:
        _fill_knobs(args, window, events, pred)
    if args.chunk is None:
        args.chunk = _wire_or_max_chunk(args)
    if args.cluster:
        return _replay_on_manager(args, events, window, pred, ph)
    if args.topology == "handshake":
        return _replay_handshake(args, events, window, pred, ph)
    if args.prefault is not None:
        with ph.phase("prefault"):  # the heap the read did not hide
            args.prefault.release()
    waited = 0.0
    if loader is not None:
        with ph.phase("load kernels"):  # what the read did not hide
            waited = time.perf_counter()
            loader.join()
            waited = time.perf_counter() - waited
    if not args.workers:
        return _replay_engine(args, events, window, pred, None, 1, ph, waited=waited,
                              bounds=_plan_shards(args, events, window, pred))
    from panjoin.launch import start_cluster
    from panjoin.manager.grpc_backend import GrpcBackend
    from panjoin.manager.key_placement import KeyPlacedBackend

    with contextlib.ExitStack() as stack:
        with ph.phase("start workers"):
            cluster = stack.enter_context(start_cluster(args.workers, args.threads or 1,
                                                        manager=False))
        log.info("local cluster: %s", ", ".join(cluster.addresses))
        if args.warm_up:
            with ph.phase("load kernels"):
                cluster.warm_up(args.index)
        placed = KeyPlacedBackend if args.placement == "key" else GrpcBackend
        with placed(cluster.addresses, deadline=args.worker_timeout,
                    result_format=args.result_format, replicas=args.replicas) as backend:
            return _replay_engine(args, events, window, pred, backend, args.workers, ph)


def _plan_shards(args, events, window, pred):
    """The shard boundaries of an in-process join (None: one engine), as ``--shards``
    says: auto, one shard a CPU where the keys spread
    (:func:`panjoin.manager.sharded_engine.plan_shards`); K, K shards."""
    if not _may_shard(args, window):
        return None
    from panjoin.config import thread_budget
    from panjoin.manager.sharded_engine import plan_shards
    from panjoin.sharding import boundaries

    if args.shards != "auto":
        bounds = boundaries(events.key, args.shards)
        log.info("%d shards by key (boundaries %s), --shards %d", args.shards,
                 bounds.tolist(), args.shards)
        return bounds
    cpus, _ = thread_budget()
    bounds, why = plan_shards(events.key, events.stream, window, pred, cpus, args.threads or 1)
    log.info("%s%s", "" if bounds is not None else "one engine: ", why)
    filled = getattr(args, "threads_filled", None)
    if bounds is None and filled is not None:  # --threads as one engine would have it
        args.threads = filled
    return bounds


def managers(cluster: str) -> list[str]:
    """The manager addresses of ``--cluster A[,B...]``: more than one shards the join."""
    return [a.strip() for a in cluster.split(",") if a.strip()]


def _fill_knobs(args, window, events, pred) -> None:
    """NSub, NBat and the chunk left out: the whole-file rule (:mod:`panjoin.manager.knobs`)."""
    from panjoin.manager.knobs import (
        CHUNK_WIRE,
        chunk_rows,
        keys_increase,
        offline_knobs,
        pairs_per_tuple,
        window_tuples,
    )

    if None not in (args.subwindow_size, args.batch_size, args.chunk):
        return
    w = window_tuples(window, events.ts, events.stream)
    pairs = pairs_per_tuple(events.key, events.stream, pred, w)
    increasing = keys_increase(events.key)
    sharers = _batch_sharers(args) if args.batch_size is None else 1
    nsub, nbat = offline_knobs(window, events.ts, events.stream, pairs, increasing, sharers)
    if args.subwindow_size is None:
        args.subwindow_size = nsub
    if args.batch_size is None:
        args.batch_size = nbat
    if args.chunk is None:
        args.chunk = CHUNK_WIRE if args.cluster else chunk_rows(pairs, args.batch_size)
    log.info("knobs for the whole file (panjoin/manager/knobs.py; --subwindow-size, "
             "--batch-size and --chunk override): NSub %d, NBat %d, chunks of %d rows (W %d "
             "tuples a stream, about %.3g pairs a probe tuple%s%s)", args.subwindow_size,
             args.batch_size, args.chunk, w, pairs, ", keys increasing" if increasing else "",
             f", each batch cut by key over {sharers} workers" if sharers > 1 else "")


def _batch_sharers(args) -> int:
    """The workers every batch is cut over, by key: ``--workers N --placement key``'s N,
    or on ``--cluster``'s one manager, its workers if it places by key (``panjoin manager
    --placement key``: its ClusterStatus); else 1 (in-process, time placement, a join
    sharded over managers, a manager that does not answer: the join will say why)."""
    if args.workers and not args.cluster:
        return args.workers if args.placement == "key" else 1
    addresses = managers(args.cluster) if args.cluster else []
    if len(addresses) != 1:
        return 1
    import grpc

    from panjoin.client import Client
    from panjoin.proto.panjoin.v1 import manager_pb2

    try:
        with Client(addresses[0]) as c:
            st = c.stub.ClusterStatus(manager_pb2.ClusterStatusRequest(), timeout=30)
    except grpc.RpcError as e:
        log.debug("no cluster status from %s (%s): NBat as in-process", addresses[0], e)
        return 1
    return max(1, len(st.workers)) if st.topology == "ring" and st.placement == "key" else 1


def _wire_or_max_chunk(args) -> int:
    """The chunk without the whole-file rule: on a manager, JoinInputs of ``CHUNK_WIRE``
    rows, else ``CHUNK_MAX`` (:mod:`panjoin.manager.knobs`)."""
    from panjoin.manager.knobs import CHUNK_MAX, CHUNK_WIRE

    return CHUNK_WIRE if args.cluster else CHUNK_MAX


def _replay_on_manager(args, events, window, pred, ph) -> int:
    from panjoin.client import Client
    from panjoin.events import PairsWriter, write_ids
    from panjoin.sharded import sharded_join

    t1 = time.perf_counter()
    opts = {k: v for k, v in dict(subwindow_size=args.subwindow_size,
                                   partitions=args.partitions, batch_size=args.batch_size,
                                   max_lag=args.max_lag, max_latency_ms=args.max_latency,
                                   allowed_lateness=window.lateness,
                                   result_format=int(args.result_format == "ranges")).items()
            if v}
    addresses = managers(args.cluster)
    if args.warm_up:  # a join of its own on each manager, closed before the timed one
        with ph.phase("load kernels"):
            if len(addresses) > 1:  # and this process's router
                from panjoin.sharding import warm_up_router

                warm_up_router(events.key.dtype, pred)
            for a in addresses:
                with Client(a) as c:
                    c.join(_warm_events(events), "count:4096,4096", str(pred), args.index,
                           chunk=args.chunk)
        print(WARMED, flush=True)
        t1 = time.perf_counter()
    c1 = time.process_time()
    with PairsWriter(args.out, background=True) as out:  # an error removes the partial file
        spent = _Writing(ph, out)
        with ph.phase("join"):
            if len(addresses) > 1:  # one key range each; late tuples decided here
                res = sharded_join(addresses, events, str(window), str(pred), args.index,
                                   chunk=args.chunk, out=spent, **opts)
            else:  # the pairs go to the file as the managers answer
                with Client(addresses[0]) as c:
                    res = c.join(events, str(window), str(pred), args.index,
                                 chunk=args.chunk, out=spent,
                                 direct_results=args.results_via == "workers",
                                 seq_ids=args.seq_ids, **opts)
                    if args.seq_ids:
                        log.info("tuple ids stayed here: the join named tuples by seq")
                    why = c.why_not_direct or "--results-via manager"
                    via = ("the workers" if args.results_via == "workers" and not
                           c.why_not_direct else f"the manager ({why})")
                    log.info("pairs came from %s", via)
            elapsed = time.perf_counter() - t1 - spent.wall
            cpu = time.process_time() - c1 - spent.cpu()
        with ph.phase("write"):
            out.close()
            late = res.late
            if args.late_out:
                write_ids(args.late_out, late)
    print(f"input tuples: {len(events)}  late: {sum(len(v) for v in late.values())}")
    print(f"results: {out.rows} pairs -> {args.out}")
    where = (f"manager {args.cluster}, pairs from {via}" if len(addresses) == 1 else
             f"sharded over {len(addresses)} managers {args.cluster}")
    print(f"time: {elapsed:.2f} s  throughput: {len(events) / max(elapsed, 1e-9):,.0f} tuples/s"
          f"  ({where})")
    print(f"cpu: {cpu:.2f} s in the join (this process)")
    print(wall_line(args, ph, remote=True))
    return 0


def _replay_handshake(args, events, window, pred, ph) -> int:
    from panjoin.handshake.chain import HandshakeChain
    from panjoin.launch import start_cluster

    with contextlib.ExitStack() as stack:
        with ph.phase("start workers"):
            nodes = stack.enter_context(start_cluster(args.workers or 1, args.threads or 1,
                                                      manager=False, role="handshake-node"))
        log.info("handshake chain: %s", " - ".join(nodes.addresses))
        chain = HandshakeChain(nodes.addresses, window, pred, key_dtype=str(events.key.dtype),
                               batch_size=min(args.batch_size or 4096, 4096), node_fifo=args.fifo,
                               merger_fifo=args.fifo, index=args.segment,
                               fast_forward=args.fast_forward)
        try:
            rc = _replay_engine(args, events, window, pred, None, len(nodes.workers), ph,
                                engine=chain)
            st = chain.status()
            print(f"handshake: {len(nodes.workers)} nodes  admission pauses: {st['pauses']}  "
                  f"FIFO high water {max(st['fifo_high_water'])} of {args.fifo}  "
                  f"segments R {st['segments']['R']} S {st['segments']['S']}")
            print(wall_line(args, ph, remote=True))
            return rc
        finally:
            chain.close()


def _held(window, events) -> int:
    """Tuples the window will hold per stream at most, for the engine's memory check: its
    size (a count window) or span times the file's rate, and never more than the file
    has of its busier stream (a count window of 1G over a 2M-tuple file holds 1M)."""
    from panjoin.manager.knobs import window_tuples

    n_s = int(events.stream.sum())
    return min(window_tuples(window, events.ts, events.stream), max(n_s, len(events) - n_s))


def _replay_engine(args, events, window, pred, backend, n_workers, ph, engine=None,
                   waited: float = 0.0, bounds=None) -> int:
    """The join on ``engine`` (default: a :class:`JoinEngine` in-process or over
    ``backend``, or in shards by key with ``bounds``); ``waited``: seconds spent waiting
    for :func:`_load_kernels_behind`, counted in the join's ``time:`` as kernel loading
    the join would otherwise pay."""
    with contextlib.ExitStack() as stack:
        return _join_file(args, events, window, pred, backend, n_workers, ph, engine, waited,
                          bounds, stack)


def _join_file(args, events, window, pred, backend, n_workers, ph, engine, waited, bounds,
               stack) -> int:
    from panjoin.events import PairsWriter, write_ids
    from panjoin.manager.engine import JoinEngine

    engine_given = engine is not None  # a handshake chain: its nodes load their kernels
    if engine is None:
        settings = dict(index=args.index, subwindow_size=args.subwindow_size,
                        partitions=args.partitions, batch_size=args.batch_size,
                        max_lag=args.max_lag, threads=args.threads,
                        max_latency_ms=args.max_latency, key_dtype=str(events.key.dtype),
                        memory_limit=args.memory_limit, window_tuples=_held(window, events))
        if bounds is not None:
            from panjoin.manager.sharded_engine import ShardedEngine

            engine = stack.enter_context(ShardedEngine(window, pred, bounds, **settings))
        else:
            engine = JoinEngine(window, pred, backend=backend, n_workers=n_workers, **settings)
        log.info("join %s on %s, index %s, NSub %d, P %d, NBat %d%s", window, pred, args.index,
                 engine.nsub, engine.partitions, engine.batch_size,
                 "" if bounds is None else
                 f", {len(bounds) + 1} shards by key of NSub {engine.shard_nsub}")
        if args.warm_up and backend is None:
            with ph.phase("load kernels"):
                _warm_join(_warm_events(events), pred, args.index, args.threads, window.kind)
                if bounds is not None:
                    from panjoin.sharding import warm_up_router

                    warm_up_router(events.key.dtype, pred)
            print(WARMED, flush=True)
    peak = 0
    t1 = time.perf_counter()
    c1 = time.process_time()
    with PairsWriter(args.out, background=True) as out:  # an error removes the partial file
        spent = _Writing(ph, out)
        with ph.phase("join"), progress(len(events), "replay", args.no_progress) as bar:
            for start in range(0, len(events), args.chunk):
                chunk = events.slice(start, min(len(events), start + args.chunk))
                engine.push(chunk)
                spent.write_all(engine.take_result_pieces(payloads=True))
                peak = max(peak, engine.memory_bytes())
                bar.update(len(chunk))
            engine.flush()
            # an input smaller than a batch is only joined here: sample the window after
            # the flush too, or a one-batch input reports a peak of 0 bytes; workers
            # report what they hold with their answers, so wait for the last ones first
            if backend is not None:
                backend.sync()
            peak = max(peak, engine.memory_bytes())
            spent.write_all(engine.take_result_pieces(payloads=True))
            elapsed = time.perf_counter() - t1 + waited - spent.wall
            cpu = time.process_time() - c1 - spent.cpu()
        with ph.phase("write"):
            out.close()  # the last row group, then the file moves into place
            late = engine.take_late()
            if args.late_out:
                write_ids(args.late_out, late)
    n_late = sum(len(v) for v in late.values())
    rate = len(events) / elapsed if elapsed > 0 else float("inf")
    stored = max(1, max(engine.window_tuples().values()) * 2)
    print(f"input tuples: {len(events)}  late: {n_late}"
          + ("" if args.late_out or not n_late else " (not written: give --late-out)"))
    print(f"results: {out.rows} pairs -> {args.out}")
    print(f"time: {elapsed:.2f} s  throughput: {rate:,.0f} tuples/s")
    print(f"cpu: {cpu:.2f} s in the join (this process)")
    if engine_given:  # a handshake chain: its segments live in the node processes
        print("memory: held by the handshake nodes, not measured here")
    else:
        print(f"memory: peak {fmt_bytes(peak)} in the window "
              f"({peak / stored:.1f} bytes per stored tuple)")
    if not engine_given:  # a handshake chain's caller prints its own line first
        print(wall_line(args, ph, remote=backend is not None))
    return 0


class _Writing:
    """Pairs written to ``out`` while the join runs (a :class:`PairsWriter` row group at
    a time on a thread of its own, so a result-heavy join never holds all its pairs and
    its encoding overlaps the join): the seconds this thread spends handing them over,
    and the writing thread's CPU, are the write phase's, not the join's. Its
    :meth:`write` is a PairsWriter's, so a :class:`~panjoin.client.Client` join can
    take it as its ``out``."""

    def __init__(self, ph, out):
        self.ph, self.out, self.wall, self._cpu = ph, out, 0.0, 0.0

    def write(self, r_id, s_id, r_payload=None, s_payload=None) -> None:
        self.write_all([(r_id, s_id, r_payload, s_payload)])

    def write_all(self, pieces) -> None:
        t, c = time.perf_counter(), time.thread_time()
        for piece in pieces:
            self.out.write(*piece)
        dt = time.perf_counter() - t
        self.wall += dt
        self._cpu += time.thread_time() - c
        self.ph.move("join", "write", dt)

    def cpu(self) -> float:
        return self._cpu + self.out.thread_cpu


def wall_line(args, ph, remote: bool) -> str:
    """Where the wall time went; on workers, said where their kernels loaded."""
    return ph.line("" if args.warm_up or not remote else
                   "join includes the workers' kernel loading; --warm-up measures it apart")
