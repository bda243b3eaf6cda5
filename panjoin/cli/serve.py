"""``panjoin cluster|manager|worker|handshake-node``: the long-running processes. A
worker serves the subwindow commands, the manager the join endpoint over workers,
and ``cluster`` starts both on loopback; each runs until Ctrl-C or SIGTERM.

    panjoin cluster --workers 4 --port 50050
    panjoin worker --host 0.0.0.0 --port 50051 --tls-cert w.pem --tls-key w.key --tls-ca ca.pem
    panjoin manager --workers hostA:50051,hostB:50051 --port 50050 [--max-latency 10] \
        [--host 0.0.0.0 --tls-cert m.pem --tls-key m.key --tls-ca ca.pem --auth-token-file T]

Off loopback a server needs TLS and a way to authenticate its clients (README:
Security, :mod:`panjoin.security`).
"""

from __future__ import annotations

import logging
import sys

from panjoin.cli.options import add_common, add_security, add_topology, check_topology, size
from panjoin.security import current

log = logging.getLogger("panjoin")


def add_parser(sub) -> None:
    p = sub.add_parser("cluster", help="start workers and a manager endpoint on loopback",
                       description="Start N worker processes and the manager endpoint on "
                                   "127.0.0.1; Ctrl-C or SIGTERM stops everything.")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default: 2)")
    p.add_argument("--port", type=int, default=50050, help="manager port, 0 for any free one")
    p.add_argument("--threads", type=int, default=1, help="probe threads per worker")
    add_max_latency(p)
    add_idle_timeout(p)
    add_metrics_port(p)
    add_http_port(p)
    add_topology(p)
    add_security(p, "manager")
    add_common(p)
    p.set_defaults(run=run_cluster)

    p = sub.add_parser("manager", help="run the manager endpoint over existing workers",
                       description="Serve the panjoin.v1.Manager gRPC service over workers "
                                   "started with 'panjoin worker'.")
    p.add_argument("--workers", required=True, metavar="HOST:PORT,...",
                   help="comma-separated worker addresses")
    p.add_argument("--port", type=int, default=50050, help="port, 0 for any free one")
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    add_max_latency(p)
    add_idle_timeout(p)
    add_metrics_port(p)
    add_http_port(p)
    add_topology(p)
    add_security(p, "manager")
    add_common(p)
    p.set_defaults(run=run_manager)

    p = sub.add_parser("worker", help="run a worker process (gRPC server over the indexes)",
                       description="Serve the worker contract (create/insert/probe/expire "
                                   "subwindows) over gRPC, with health checking and "
                                   "reflection.")
    p.add_argument("--port", type=int, default=50051, help="port, 0 for any free one "
                                                           "(default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None,
                   help="probe threads of each join (default: the CPUs this process may use: "
                        "its affinity and cgroup CPU quota, rounded up)")
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
    p.add_argument("--max-sessions", type=int, default=64, metavar="N",
                   help="sessions (one per join and manager) held at once; one more is "
                        "refused with RESOURCE_EXHAUSTED (default: %(default)s)")
    p.add_argument("--idle-timeout", type=float, default=600.0, metavar="S",
                   help="end a session that sends nothing for S seconds, releasing what it "
                        "holds (a manager keeps its joins' sessions alive; default: "
                        "%(default)s)")
    p.add_argument("--memory-limit", type=size, metavar="BYTES",
                   help="memory budget for subwindows (K/M/G suffixes); a join or subwindow "
                        "beyond it is refused with RESOURCE_EXHAUSTED (default: 80%% of what "
                        "the worker may use once its kernels are loaded, less 192 MiB for "
                        "batches in flight: the host's MemAvailable, or its cgroup's "
                        "memory limit less its working set where that is less)")
    add_metrics_port(p)
    add_security(p, "worker")
    add_common(p)
    p.set_defaults(run=run_worker)

    p = sub.add_parser("handshake-node", help="run a handshake chain node (--topology handshake)",
                       description="Serve panjoin.v1.HandshakeNode: one node of a handshake "
                                   "join chain, talking to its neighbours over gRPC.")
    p.add_argument("--port", type=int, default=50061, help="port, 0 for any free one "
                                                           "(default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="scan threads (default: %(default)s)")
    p.add_argument("--max-chains", type=int, default=16, metavar="N",
                   help="chains (one per handshake join) held at once; one more is refused "
                        "with RESOURCE_EXHAUSTED (default: %(default)s)")
    p.add_argument("--idle-timeout", type=float, default=600.0, metavar="S",
                   help="release a chain that gets no message and no call for S seconds, "
                        "ending its streams (a driver, the manager or replay, keeps its "
                        "open chain alive; default: %(default)s)")
    add_security(p, "worker")
    add_common(p)
    p.set_defaults(run=run_handshake_node)


def add_metrics_port(p) -> None:
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics, on the gRPC "
                        "server's --host (HTTPS with its --tls-cert); 0: any free port, "
                        "printed at start (default: no metrics; README: Metrics)")


def add_http_port(p) -> None:
    p.add_argument("--http-port", type=int, metavar="PORT",
                   help="serve the live status page at http://HOST:PORT/ (its data at "
                        "/api/status), on the gRPC server's --host (HTTPS with its "
                        "--tls-cert; with --auth-token-file open it as /?token=TOKEN); 0: "
                        "any free port, printed at start (default: no page; README: Status "
                        "page)")


def page_note(server, host: str) -> str:
    """``, status page on http://HOST:PORT/`` for the ready line, or ''."""
    port = getattr(server, "http_port", None)
    if port is None:
        return ""
    return f", status page on http{'s' if current().cert else ''}://{host}:{port}/"


def metrics_note(server, host: str) -> str:
    """``, metrics on HOST:PORT`` for the ready line (panjoin.launch reads it), or ''."""
    from panjoin.launch import METRICS

    port = getattr(server, "metrics_port", None)
    return f"{METRICS}{host}:{port}" if port is not None else ""


def add_idle_timeout(p) -> None:
    p.add_argument("--idle-timeout", type=float, default=300.0, metavar="S",
                   help="close a join that has had no Join stream and no call for S seconds "
                        "(a client that opened it and vanished; default: %(default)s)")


def add_max_latency(p) -> None:
    p.add_argument("--max-latency", type=float, metavar="MS",
                   help="the latency bound of joins opened without one (OpenRequest."
                        "max_latency_ms): the manager sizes their batches to hold it and "
                        "pushes their pairs as they complete, between the answers to the "
                        "inputs (default: none; such joins answer each input once)")


def run_cluster(args) -> int:
    from panjoin.launch import die_with_parent, start_cluster
    from panjoin.manager.engine import warm_up_manager
    from panjoin.manager.service import serve_manager
    from panjoin.serving import serve_until_stopped

    die_with_parent()  # its workers die with it in turn
    check_topology(args, "panjoin cluster")
    role = "handshake-node" if args.topology == "handshake" else "worker"
    # with metrics, each worker serves its own on a free port too (printed below)
    wargs = ([["--metrics-port", "0"]] * args.workers
             if args.metrics_port is not None and role == "worker" else None)
    cluster = start_cluster(args.workers, args.threads, manager=False, role=role,
                            worker_args=wargs)
    try:
        warm_up_manager()
        server, port = serve_manager(cluster.addresses, args.port, topology=args.topology,
                                     fifo=args.fifo, segment=args.segment,
                                     replicas=args.replicas, max_latency_ms=args.max_latency,
                                     fast_forward=args.fast_forward,
                                     worker_timeout=args.worker_timeout,
                                     idle_timeout=args.idle_timeout,
                                     metrics_port=args.metrics_port,
                                     http_port=args.http_port, placement=args.placement)
    except BaseException:
        cluster.stop()
        raise
    print(f"panjoin cluster: manager on 127.0.0.1:{port}, workers "
          f"{', '.join(cluster.addresses)}"
          + (" (handshake chain)" if args.topology == "handshake" else "")
          + page_note(server, "127.0.0.1"), flush=True)
    if server.metrics_port is not None:
        print(f"panjoin cluster: metrics of the manager on 127.0.0.1:{server.metrics_port}"
              + "".join(f", of {w.address} on {w.metrics}" for w in cluster.workers
                        if w.metrics), flush=True)

    def stop():
        server.stop(grace=2).wait()
        cluster.stop()
        print("panjoin cluster: stopped", flush=True)

    return serve_until_stopped(stop)


def run_manager(args) -> int:
    from panjoin.config import freeze_heap
    from panjoin.launch import MANAGER_READY, WARM_UP_TIMEOUT, die_with_parent, wait_healthy
    from panjoin.manager.engine import warm_up_manager
    from panjoin.manager.service import serve_manager
    from panjoin.serving import serve_until_stopped

    die_with_parent()
    check_topology(args, "panjoin manager")
    current().check_bind(args.host, "the manager server")  # before waiting on the workers
    addrs = [a.strip() for a in args.workers.split(",") if a.strip()]
    warm_up_manager()  # its kernels, meanwhile the workers warm up theirs
    for a in addrs:  # a worker on a cold Numba cache compiles for minutes first
        wait_healthy(a, timeout=WARM_UP_TIMEOUT)
    server, port = serve_manager(addrs, args.port, args.host, topology=args.topology,
                                 fifo=args.fifo, segment=args.segment, replicas=args.replicas,
                                 max_latency_ms=args.max_latency, fast_forward=args.fast_forward,
                                 worker_timeout=args.worker_timeout,
                                 idle_timeout=args.idle_timeout,
                                 metrics_port=args.metrics_port, http_port=args.http_port,
                                 placement=args.placement)
    freeze_heap()  # startup's objects out of the full collections, as in a worker
    print(f"{MANAGER_READY}{args.host}:{port}{metrics_note(server, args.host)}"
          f"{page_note(server, args.host)}, workers {', '.join(addrs)}", flush=True)
    return serve_until_stopped(lambda: server.stop(grace=2).wait())


def run_worker(args) -> int:
    from panjoin.config import freeze_heap
    from panjoin.launch import READY, die_with_parent
    from panjoin.memory import fmt_bytes
    from panjoin.serving import serve_until_stopped, set_serving
    from workers.server import serve
    from workers.warm_up import warm_up

    die_with_parent()
    if args.index_backend == "opencl":
        from opencl.device import OpenCLError, runtime

        try:  # fail now, not at the first subwindow: no platform, no device, no build
            rt = runtime(args.device)
            rt.program("int64")
        except OpenCLError as e:
            print(f"panjoin worker: {e}", file=sys.stderr)
            return 2
        log.info("BI-Sort subwindows on OpenCL device %s", rt.name)
    if args.threads is None:
        from panjoin.config import thread_budget

        args.threads, why = thread_budget()
        log.info("%s (--threads overrides)", why)
    try:
        server, port = serve(args.port, args.threads, args.host,
                             index_backend=args.index_backend, device=args.device,
                             null=args.null, max_sessions=args.max_sessions, serving=False,
                             idle_timeout=args.idle_timeout, memory_limit=args.memory_limit,
                             metrics_port=args.metrics_port)
    except ValueError as e:
        print(f"panjoin worker: {e}", file=sys.stderr)
        return 2
    print(f"{READY}{args.host}:{port}{metrics_note(server, args.host)}", flush=True)
    if not args.null:  # NOT_SERVING until its kernels are compiled (workers.warm_up)
        n, s = warm_up(args.threads)
        log.info("warm-up: %d joins in %.1f s", n, s)
        server.servicer.settle_memory_limit()
    log.info("memory budget for subwindows: %s (--memory-limit overrides)",
             fmt_bytes(server.servicer.memory_limit))
    freeze_heap()  # startup's objects out of the full collections (latency)
    set_serving(server)
    log.info("worker serving on %s:%d with %d threads", args.host, port, args.threads)
    return serve_until_stopped(lambda: server.stop(grace=2).wait())


def run_handshake_node(args) -> int:
    from panjoin.config import freeze_heap
    from panjoin.launch import READY, die_with_parent
    from panjoin.serving import serve_until_stopped, set_serving
    from workers.handshake_node import serve
    from workers.warm_up import warm_up_handshake

    die_with_parent()
    try:
        server, port = serve(args.port, args.threads, args.host, serving=False,
                             max_chains=args.max_chains, idle_timeout=args.idle_timeout)
    except ValueError as e:
        print(f"panjoin handshake-node: {e}", file=sys.stderr)
        return 2
    print(f"{READY}{args.host}:{port}", flush=True)
    n, s = warm_up_handshake()  # NOT_SERVING until its scans are compiled
    log.info("warm-up: %d chains in %.1f s", n, s)
    freeze_heap()
    set_serving(server)
    log.info("handshake node serving on %s:%d", args.host, port)
    return serve_until_stopped(lambda: server.stop(grace=2).wait())
