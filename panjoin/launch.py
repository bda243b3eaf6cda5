"""The one way PanJoin starts a process: workers and a manager on loopback, for clusters and tests.

Each worker is ``python -m panjoin.cli worker --port 0``: the OS picks a free
port, the worker prints ``panjoin worker listening on HOST:PORT`` and the
launcher reads it (no race on "free" ports), then waits until the worker's gRPC
health service answers SERVING, which a worker does once it has compiled its kernels
(:mod:`workers.warm_up`; up to :data:`WARM_UP_TIMEOUT` on a cold cache). The
manager (``panjoin manager --workers ...``) starts the same way and prints
``panjoin manager listening on HOST:PORT``. Every
process gets this process's security flags (:mod:`panjoin.security`: TLS, the
message limit; the manager also the token file), or those of ``security``.

A started process dies with its starter, even one killed with -9 (a test run that
is killed leaves no worker behind): the launcher passes its pid in
``PANJOIN_PARENT_PID`` and the process calls :func:`die_with_parent`, a thread that
waits on a pidfd of that pid and exits the process when it becomes readable. (Not
``prctl(PR_SET_PDEATHSIG)`` in a ``preexec_fn``: that signal follows the *thread*
that forked, so a worker started from a pool thread would die with the thread, and
a ``preexec_fn`` runs Python in a fork of a process full of gRPC threads.)

    >>> procs = start_workers(2)          # doctest: +SKIP
    >>> [p.address for p in procs]        # doctest: +SKIP
    ['127.0.0.1:40123', '127.0.0.1:40125']
    >>> start_manager([p.address for p in procs]).address   # doctest: +SKIP
    '127.0.0.1:40131'
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from panjoin.config import DEFAULT_INDEX
from panjoin.security import Security, channel, current

READY = "panjoin worker listening on "
MANAGER_READY = "panjoin manager listening on "
#: what follows the address on a ready line when the process serves metrics
METRICS = ", metrics on "


@dataclass
class WorkerProcess:
    proc: subprocess.Popen
    address: str
    #: HOST:PORT of its Prometheus metrics (``--metrics-port``), None without
    metrics: str | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kill -9, as a crash would (for fault tests)."""
        if self.alive():
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()


#: how long a started process may take to report SERVING: a worker compiles its
#: kernels first (workers.warm_up), seconds on a warm Numba cache but minutes on a
#: cold one under load (measured: 11 min with the load average at 9 on 2 cores)
WARM_UP_TIMEOUT = 1200.0
#: how often a wait for SERVING says on stderr that it still waits (s)
PROGRESS_S = 15.0


def wait_healthy(address: str, timeout: float = WARM_UP_TIMEOUT,
                 security: Security | None = None) -> None:
    """Block until the gRPC health service at ``address`` answers SERVING (a worker does
    once its kernels are compiled), over a channel under ``security`` (None: the
    process's); says every PROGRESS_S seconds that it still waits."""
    t0 = time.monotonic()
    deadline, said = t0 + timeout, t0
    status = "no answer"
    with channel(address, security) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while True:
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
            except grpc.RpcError:
                pass
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"worker at {address} did not become healthy in "
                                   f"{timeout:.0f}s (last: {status})")
            if now - said >= PROGRESS_S:
                said = now
                print(f"waiting for {address} to serve ({status}: compiling its kernels?) "
                      f"for {now - t0:.0f} s", file=sys.stderr, flush=True)
            time.sleep(0.1)


#: what a process can be: ``panjoin worker`` (ring topology) or ``panjoin handshake-node``
ROLES = ("worker", "handshake-node")


def start_workers(n: int, threads: int = 1, timeout: float = WARM_UP_TIMEOUT,
                  role: str = "worker",
                  worker_args: list[list[str]] | None = None,
                  cpus: set[int] | None = None, hosts: list | None = None,
                  security: Security | None = None) -> list[WorkerProcess]:
    """Start ``n`` worker processes on 127.0.0.1; stops the started ones if one fails.

    ``role="handshake-node"`` starts handshake chain nodes instead of ring workers.
    ``worker_args``: extra arguments, one list per process (e.g.
    ``[[], ["--index-backend", "opencl"]]``). ``cpus``: pin them to these cores
    (as ``taskset`` would: every thread they start inherits it). ``hosts``: one
    emulated host per process (:class:`panjoin.bench.hosts.Host`, cgroups).
    ``security``: their TLS flags (None: this process's).
    """
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; choose one of {', '.join(ROLES)}")
    extra = worker_args or [[] for _ in range(n)]
    if len(extra) != n:
        raise ValueError(f"worker_args has {len(extra)} lists for {n} workers")
    if hosts is not None and len(hosts) != n:
        raise ValueError(f"{len(hosts)} hosts for {n} workers")
    sec = security or current()
    started: list[WorkerProcess] = []
    try:
        procs = [_spawn([role, "--port", "0", "--threads", str(threads),
                         *sec.argv(token=False), *extra[w]], cpus,
                        hosts[w] if hosts is not None else None)
                 for w in range(n)]
        for p in procs:
            started.append(WorkerProcess(p, *_ready(p, READY, role)))
        for w in started:
            wait_healthy(w.address, timeout, sec)
        return started
    except BaseException:
        for w in started:
            w.stop()
        raise


def start_manager(workers: list[str], timeout: float = WARM_UP_TIMEOUT,
                  args: list[str] | None = None, cpus: set[int] | None = None,
                  host=None, security: Security | None = None) -> WorkerProcess:
    """Start ``panjoin manager`` over running workers in its own process (its own
    interpreter: the join's bookkeeping shares no GIL with the caller); returns when
    its gRPC endpoint is healthy. ``args``: extra flags, e.g. ``["--topology",
    "handshake"]``; ``cpus``: pin it to these cores; ``host``: its emulated host;
    ``security``: its TLS flags and token file (None: this process's)."""
    sec = security or current()
    p = _spawn(["manager", "--port", "0", "--workers", ",".join(workers), *sec.argv(),
                *(args or [])], cpus, host)
    m = WorkerProcess(p, "")
    try:
        m.address, m.metrics = _ready(p, MANAGER_READY, "manager")
        wait_healthy(m.address, timeout, sec)
        return m
    except BaseException:
        m.stop()
        raise


@dataclass
class LocalCluster:
    """Worker processes and, if started, a manager over them; a context manager that
    stops them all (the one lifecycle of the CLI, the benchmarks and the tests)::

        with start_cluster(2, manager=False) as c:     # doctest: +SKIP
            backend = GrpcBackend(c.addresses)
    """

    workers: list[WorkerProcess]
    manager: WorkerProcess | None = None

    @property
    def addresses(self) -> list[str]:
        """The workers' addresses: what :class:`GrpcBackend` and ``--workers`` take."""
        return [w.address for w in self.workers]

    @property
    def address(self) -> str:
        """The manager's address: what ``--manager`` and :class:`panjoin.client.Client` take."""
        if self.manager is None:
            raise ValueError("this cluster has no manager: start it with manager=True")
        return self.manager.address

    def warm_up(self, index: str = DEFAULT_INDEX) -> None:
        """Run a small join through the workers (:func:`panjoin.manager.engine.warm_up`)."""
        from panjoin.manager.engine import warm_up
        from panjoin.manager.grpc_backend import GrpcBackend

        with GrpcBackend(self.addresses) as backend:
            warm_up(index, backend, len(self.workers))

    def stop(self) -> None:
        if self.manager is not None:
            self.manager.stop()
        for w in self.workers:
            w.stop()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_cluster(n: int, threads: int = 1, *, manager: bool = True, role: str = "worker",
                  worker_args: list[list[str]] | None = None, manager_args: list[str] | None = None,
                  cpus: set[int] | None = None, manager_cpus: set[int] | None = None,
                  hosts: list | None = None, manager_host=None,
                  security: Security | None = None) -> LocalCluster:
    """``n`` workers (:func:`start_workers`, with ``role``, ``worker_args``, ``cpus``,
    ``hosts``) and, with ``manager``, ``panjoin manager`` over them
    (:func:`start_manager`, with ``manager_args`` on ``manager_cpus`` or in
    ``manager_host``), all under ``security`` (None: this process's); a failed start
    stops what did start."""
    ws = start_workers(n, threads, role=role, worker_args=worker_args, cpus=cpus, hosts=hosts,
                       security=security)
    try:
        m = (start_manager([w.address for w in ws], args=manager_args, cpus=manager_cpus,
                           host=manager_host, security=security) if manager else None)
    except BaseException:
        for w in ws:
            w.stop()
        raise
    return LocalCluster(ws, m)


def pinned(cmd: list[str], cpus: set[int] | None) -> list[str]:
    """``cmd`` run on the cores ``cpus`` only, through util-linux's ``taskset`` (a
    preexec affinity call would fork a process that holds gRPC threads)."""
    if not cpus:
        return cmd
    if shutil.which("taskset") is None:
        raise RuntimeError("pinning processes to cores needs 'taskset' (apt install util-linux)")
    return ["taskset", "-c", ",".join(str(c) for c in sorted(cpus)), *cmd]


def command(args: list[str], cpus: set[int] | None = None, host=None) -> list[str]:
    """``python -m panjoin.cli ARGS`` as the launcher runs it: pinned to ``cpus``,
    inside the emulated ``host`` (anything with ``wrap(cmd)``)."""
    cmd = pinned([sys.executable, "-m", "panjoin.cli", *args], cpus)
    return host.wrap(cmd) if host is not None else cmd


#: the environment variable that names the starter a process dies with
PARENT_ENV = "PANJOIN_PARENT_PID"


def _spawn(args: list[str], cpus: set[int] | None = None, host=None) -> subprocess.Popen:
    return subprocess.Popen(command(args, cpus, host), stdout=subprocess.PIPE, text=True,
                            env={**os.environ, PARENT_ENV: str(os.getpid())})


def die_with_parent() -> None:
    """In a process the launcher started: exit (status 1) as soon as the launcher's
    process is gone, however it died. Does nothing in a process started otherwise (a
    user's ``panjoin worker``, which outlives its shell by design)."""
    pid = os.environ.pop(PARENT_ENV, None)  # not inherited by what this one starts
    if not pid:
        return
    try:
        fd = os.pidfd_open(int(pid))  # this very process, whatever reuses its pid later
    except ProcessLookupError:
        os._exit(1)  # gone already
    except OSError:  # no pidfd (Linux < 5.3): watch for being re-parented instead
        fd = None
    first = os.getppid()

    def watch() -> None:
        if fd is not None:
            poll = select.poll()
            poll.register(fd, select.POLLIN)  # readable once the process has exited
            while not poll.poll(None):
                pass
        else:
            while os.getppid() == first:
                time.sleep(0.5)
        os._exit(1)  # no clean stop: the one who would read its output is gone

    threading.Thread(target=watch, daemon=True, name="die-with-parent").start()


def _address(p: subprocess.Popen, ready: str, role: str) -> str:
    """The address in the process's first line of output, which must start with ``ready``."""
    line = p.stdout.readline()
    if not line.startswith(ready):
        p.kill()
        raise RuntimeError(f"{role} did not start (said {line!r}); run "
                           f"'panjoin {role} --port 0' to see why")
    return line[len(ready):].strip()


def _ready(p: subprocess.Popen, ready: str, role: str) -> tuple[str, str | None]:
    """(address, metrics HOST:PORT or None) from the process's ready line:
    ``READY HOST:PORT[, metrics on HOST:PORT][, workers ...]``."""
    rest = _address(p, ready, role)
    metrics = None
    if METRICS in rest:
        metrics = rest.split(METRICS, 1)[1].split(",")[0].strip()
    return rest.split(",")[0].strip(), metrics
