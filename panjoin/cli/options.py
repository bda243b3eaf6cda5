"""Options shared by the ``panjoin`` commands, public so that the commands registered
from other packages (``panjoin kafka``: :mod:`panjoin.kafka.cli`; ``panjoin pipeline``:
:mod:`spark_conn.cli`) take them with the same names, help and defaults.

    >>> import argparse
    >>> p = argparse.ArgumentParser()
    >>> add_join_opts(p)
    >>> p.parse_args(["--window", "count:1K,1K", "--predicate", "eq", "--max-latency", "5"]
    ...              ).max_latency
    5.0
"""

from __future__ import annotations

import argparse
import sys

from panjoin.config import DEFAULT_INDEX, INDEX_CHOICES
from panjoin.semantics import SpecError, parse_size

INDEX_HELP = ("subwindow index: auto (per subwindow, from the batches and the predicate: "
              "hash for lookups at small batches, else BI-Sort; the log says which and "
              "why), rap (RaP-Table), wib (WiB+-Tree), bisort (BI-Sort), hash (a hash "
              "table: eq and narrow integer bands, fastest at small batches), nested "
              "(nested loop, the baseline), sortedlist (a sortedcontainers SortedList, a "
              "peer), bisort-opencl (BI-Sort on an OpenCL device: $PANJOIN_OPENCL_DEVICE, "
              "else the pocl CPU device)")


def size(text: str) -> int:
    """An argparse type: a count such as 8M or 64K (powers of two), or 1000."""
    try:
        return parse_size(text)
    except SpecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_common(p: argparse.ArgumentParser) -> None:
    """--config, --verbose, --no-progress: every command has them."""
    p.add_argument("--config", metavar="FILE", help="TOML file of option defaults")
    p.add_argument("-v", "--verbose", action="store_true", help="log every step")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_security(p: argparse.ArgumentParser, role: str) -> None:
    """TLS, the token and the message limit (:mod:`panjoin.security`). ``role``:
    "worker" (a worker or handshake node: its clients show certificates), "manager"
    (its clients send a token) or "client" (of a manager)."""
    g = p.add_argument_group("security (README: Security)")
    own = ("this server's certificate" if role != "client"
           else "this client's certificate, if the manager asks for one")
    g.add_argument("--tls-cert", metavar="PEM", help=f"TLS: {own} (PEM); with --tls-key")
    g.add_argument("--tls-key", metavar="PEM", help="TLS: the certificate's private key (PEM)")
    g.add_argument("--tls-ca", metavar="PEM", help={
        "worker": "mutual TLS: accept only clients (managers, neighbour nodes) whose "
                  "certificates this CA signed",
        "manager": "the CA that signed the workers' certificates (they check the manager's "
                   "by it too); without --auth-token-file, clients need one of its "
                   "certificates",
        "client": "the CA that signed the manager's certificate (TLS)"}[role])
    if role != "worker":
        g.add_argument("--auth-token-file", metavar="FILE", help=(
            "clients must send the token in FILE (authorization: Bearer TOKEN) on every "
            "call but health checks" if role == "manager" else
            "send the token in FILE to the manager (authorization: Bearer TOKEN)"))
    g.add_argument("--insecure", action="store_true",
                   help="allow plaintext and unauthenticated calls off loopback (a trusted "
                        "network only)")
    g.add_argument("--max-message-mb", type=int, default=64, metavar="MB",
                   help="the largest gRPC message sent or taken, in MiB (default: "
                        "%(default)s); raise it on the manager, the workers and the clients "
                        "together")


def add_join_opts(p: argparse.ArgumentParser, required: bool = True) -> None:
    """The join's knobs, named as in the paper: window, predicate, index, NSub, P, NBat."""
    g = p.add_argument_group("join (the paper's knobs)")
    g.add_argument("--window", required=required, metavar="SPEC",
                   help="count:WR,WS (tuples) or time:TR,TS (ms of event time)")
    g.add_argument("--predicate", required=required, metavar="SPEC",
                   help="eq | ne | band:E (|r.key-s.key|<=E) | bands:A,B;C,D (s.key-r.key in ...);"
                        " append &band2:E, &bands2:A,B or &eq2 for a residual on the events'"
                        " key2 column, e.g. band:10&band2:10")
    g.add_argument("--index", choices=INDEX_CHOICES,  # None: check_topology tells it was left out
                   help=INDEX_HELP + f" (default: {DEFAULT_INDEX})")
    g.add_argument("--allowed-lateness", type=int, default=0, metavar="MS",
                   help="time windows: a tuple more than MS behind the largest ts so far is "
                        "late (default: %(default)s)")
    g.add_argument("--subwindow-size", type=size, metavar="NSUB",
                   help="tuples per subwindow (default: replay of a file: the window's "
                        "tuples per stream W up to 512K, W/2 beyond; a stream: a quarter "
                        "of a count window (a half under --max-latency), else 64K; README: "
                        "the knobs)")
    g.add_argument("--partitions", type=size, metavar="P",
                   help="partitions per subwindow (default: NSub/128, at most 64K)")
    g.add_argument("--batch-size", type=size, metavar="NBAT",
                   help="max tuples per batch (default: replay of a file: W/2 clamped to "
                        "32K..256K; a stream: 32768; with --max-latency the engine picks it, "
                        "at most NBAT)")
    g.add_argument("--max-latency", type=float, metavar="MS",
                   help="hold pair latency within MS: the engine sizes its batches and collect "
                        "deadline itself from the measured batch costs and input rate (small "
                        "when the input is slow, larger under load, never past the bound), "
                        "as Flink's buffer timeout does by hand")
    g.add_argument("--max-lag", type=size, metavar="N",
                   help="cut a stream's batch once the other stream has received N tuples since "
                        "its oldest tuple (default: the batch size)")
    g.add_argument("--threads", type=int, metavar="T",
                   help="probe threads (default: the CPUs this process may use: its "
                        "affinity and cgroup CPU quota, rounded up)")


#: the defaults of :func:`add_topology`'s flags (and of ``--index``, ``--result-format``).
#: argparse's are None, so that :func:`check_topology` tells a flag the user gave from
#: one left out; it fills these in after its checks.
DEFAULTS = {"topology": "ring", "fifo": 1 << 16, "segment": "nested", "worker_timeout": 60.0,
            "replicas": 2, "index": DEFAULT_INDEX, "result_format": "pairs",
            "placement": "time"}


def add_topology(p: argparse.ArgumentParser) -> None:
    """Where the subwindows live: the ring (replicas) or a handshake chain (FIFOs).
    Call :func:`check_topology` on the parsed args before using them."""
    p.add_argument("--topology", choices=["ring", "handshake"],
                   help="ring: PanJoin subwindows over workers (default); handshake: a chain of "
                        "handshake join nodes (nested-loop segments, two-phase forwarding)")
    p.add_argument("--fifo", type=size, metavar="PAIRS",
                   help="handshake: capacity of every result FIFO in pairs; admission control "
                        f"pauses the input while one is full (default: {DEFAULTS['fifo']})")
    p.add_argument("--segment", choices=["nested", "sorted"],
                   help="handshake: how a node scans its segments: the paper's nested loop "
                        "(default) or a sorted key index")
    p.add_argument("--fast-forward", action="store_true",
                   help="handshake: the low-latency handshake join (Roy et al., VLDB 2014): "
                        "every arriving tuple is sent along the whole chain at once and "
                        "joined on the way, so its pairs come out within a few hops, not "
                        "when it crosses the old tuples")
    p.add_argument("--worker-timeout", type=float, metavar="S",
                   help="ring: a worker that leaves a command unanswered S seconds gets a "
                        "heartbeat; one that answers neither is declared dead and its "
                        f"backups take over (default: {DEFAULTS['worker_timeout']:g})")
    p.add_argument("--replicas", type=int, choices=[1, 2],
                   help="ring: copies of each subwindow. 2: a backup on the next worker logs "
                        "the same inserts and takes over when its worker dies (no loss; "
                        "default); 1: none, so a lost worker ends the join")
    p.add_argument("--placement", choices=["time", "key"],
                   help="ring: where the subwindows go. time: each whole subwindow on one "
                        "worker, round-robin (the paper's; default); key: every subwindow "
                        "cut by key over all the workers, so a tuple goes to about one "
                        "worker, not to every worker holding a subwindow (one copy: implies "
                        "--replicas 1; a fixed worker set)")


def _given(args, dest: str) -> bool:
    return getattr(args, dest, None) not in (None, False)


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_topology(args, prog: str, on_manager: bool = False) -> None:
    """A flag that the chosen mode would ignore is an error that says why (exit 1),
    never ignored; then the defaults (:data:`DEFAULTS`) of the flags left out. With
    ``on_manager`` (``replay --cluster``) the topology flags are the running manager's,
    fixed when it started, and ``--threads`` its workers'."""
    def fail(why: str):
        raise SystemExit(f"{prog}: error: {why}")

    if on_manager:
        for dest in ("topology", "fifo", "segment", "fast_forward", "worker_timeout",
                     "replicas", "placement"):
            if _given(args, dest):
                fail(f"{_flag(dest)} is the manager's setting, fixed when it started: give "
                     f"it to 'panjoin cluster' or 'panjoin manager', not to a join on "
                     f"--cluster")
        if _given(args, "threads"):
            fail("--threads is the workers' setting: give it to 'panjoin cluster' or "
                 "'panjoin worker', not to a join on --cluster")
    handshake = getattr(args, "topology", None) == "handshake"
    if not handshake:
        for dest in ("fast_forward", "fifo", "segment"):
            if _given(args, dest):
                fail(f"{_flag(dest)} is a handshake chain's; add --topology handshake")
    else:
        for dest in ("replicas", "worker_timeout", "placement"):
            if _given(args, dest):
                fail(f"{_flag(dest)} is the ring's (subwindows on workers); a handshake "
                     "chain keeps one copy of each tuple and has no failover: drop it or "
                     "use --topology ring")
        if _given(args, "index"):
            fail("--index picks the ring's subwindow index; handshake nodes scan their "
                 "segments as --segment says (nested or sorted)")
        if _given(args, "result_format"):
            fail("--result-format is the ring's (BI-Sort ranges through the manager's "
                 "mirror); a handshake chain answers with pairs: drop it")
    if getattr(args, "placement", None) == "key":
        if getattr(args, "replicas", None) not in (None, 1):
            fail("--placement key keeps one copy of every piece: drop --replicas or give "
                 "--replicas 1 (--placement time --replicas 2 survives a worker's loss)")
        if getattr(args, "result_format", None) == "ranges":
            fail("--result-format ranges needs whole BI-Sort subwindows on one worker: "
                 "drop it, or use --placement time")
        args.replicas = 1
    for dest, v in DEFAULTS.items():
        if dest in vars(args) and getattr(args, dest) is None:
            setattr(args, dest, v)


def rpc_error(e: BaseException) -> str | None:
    """``"CODE: detail"`` if ``e`` is a gRPC error (a failed call to a manager or a
    worker), else None: the one line a command prints for it, instead of a traceback.

    >>> rpc_error(ValueError("x")) is None
    True
    """
    grpc = sys.modules.get("grpc")  # not imported: nothing could have raised one
    if grpc is None or not isinstance(e, grpc.RpcError):
        return None
    code = e.code() if callable(getattr(e, "code", None)) else None
    detail = e.details() if callable(getattr(e, "details", None)) else str(e)
    return f"{code.name if code is not None else 'gRPC error'}: {detail}"


def progress(total, desc, disable, unit="tuples"):
    """A progress bar on stderr (tqdm), off with ``--no-progress`` (then tqdm is not
    imported: 25 ms of a replay's start)."""
    if disable:
        return _NoProgress()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=sys.stderr,
                dynamic_ncols=True)


class _NoProgress:
    """The bar of ``--no-progress``: counts, shows nothing."""

    n = 0

    def update(self, n=1) -> None:
        self.n += n

    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc) -> None:
        pass


