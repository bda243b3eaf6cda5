"""The latency benchmark: how soon a pair comes out, at a given input rate (issue 27).

An **open-loop** source replays an arrival-ordered stream at a fixed rate: tuple i of
the measured part is *due* at ``t0 + i / rate``, and the driver hands the target every
tuple that is due, never early. Whatever the target does (a long batch, a compile, a
slow answer) the schedule does not wait for it: the tuples that fell due meanwhile
are pushed late, and their lateness counts against latency (no coordinated
omission). A pair's latency is the time the driver receives it minus the due time of
the later of its two tuples::

    due:   r7 at 10.000 ms   s3 at 10.004 ms
    out:   (r7, s3) returned by poll() at 12.250 ms  ->  latency 2.246 ms

Each run first fills both windows closed-loop (untimed; pairs discarded), so what is
measured is the steady state with full windows, subwindows expiring as they would
in production. The source then runs ``HEAD_S`` before the measured tuples and
``TAIL_S`` past them, whose pairs alone are counted: neither the change from the
closed-loop fill to the open-loop stream (the engine's first measurements of its
batches are the fill's) nor the end of the input (a last partial batch, a flush) is
part of a stream's steady state. The target *kept up* when the source's backlog behind its
schedule grew by less than ``KEPT_UP_MS`` over the run, and so did the pairs' median
latency from the first quarter of the run to the last (a target that takes its input
without waiting, as a remote join does, queues it inside instead of holding the
source back; either way a target that cannot keep up falls behind more and more, by
hundreds of ms over a run of a few seconds).

A target is anything with ``push(chunk)`` (an :class:`~panjoin.events.EventTable`
slice), ``poll() -> (r_id, s_id)`` (the pairs it hands out now, never blocking),
``pending() -> bool`` (tuples still buffered or pairs still being computed),
``flush()`` (end of input: process everything) and ``close()``, and may say
``step_s``: the source then pushes at most once a step (at most that much later than
a tuple's due time, which counts against its latency), and ``wait(timeout)``: block
until pairs arrive (a remote target's pairs are then taken the moment they come, as a
consumer blocked on its result stream takes them, not at the source's next step):
:class:`EngineTarget` is the in-process engine, driven with ``tick()`` and
``take_results(wait=False)`` as a caller that must not block would drive it;
:class:`LiveTarget` is a streaming join on a manager endpoint (``--workers N``: a
local cluster of worker processes and ``panjoin manager`` in its own process, or
``--topology handshake``: the manager over a handshake chain), pushed and polled
through :class:`panjoin.client.LiveJoin`, so a pair's latency there includes the
client's gRPC stream both ways.

    >>> from panjoin.generate import generate
    >>> ev = generate(30_000, seed=1)
    >>> t = EngineTarget(JoinEngine("count:4K,4K", "eq", index="nested",
    ...                             max_latency_ms=20))
    >>> r = run_open_loop(ev, fill=8192, rate=50_000, target=t)
    >>> r.pairs > 0 and r.kept_up
    True
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from panjoin.manager.engine import JoinEngine

#: a run kept up when its source's backlog, and its pairs' median latency, grew by at
#: most this much over the run
KEPT_UP_MS = 50.0
#: at most this long between two polls while nothing is due (a busy target is polled
#: as soon as it returns)
POLL_S = 0.0002
#: the source goes on this long past the measured tuples (at the same rate), so that
#: the measured ones are never held back by the end of the input
TAIL_S = 0.25
#: and starts this long before them (a warm-up, as the pipeline's benchmark has): the
#: change from the closed-loop fill to the open-loop stream is not a stream's steady
#: state either (the first rounds' measured times are the fill's)
HEAD_S = 0.25
#: the longest client linger the source uses under a bound (ms), see :func:`linger_ms`
LINGER_MAX_MS = 5.0


@dataclass
class LatencyResult:
    """One run: the rate asked for and reached, the pair latencies' quantiles (ms)."""

    mode: str
    rate: float  # tuples/s the source was asked for
    achieved: float  # tuples/s it reached (measured tuples / time of the last push)
    tuples: int
    pairs: int
    p50_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    behind_ms: float  # the source's largest backlog behind schedule
    end_behind_ms: float  # its backlog at the last push
    kept_up: bool
    growth_ms: float = 0.0  # median latency, last quarter of the run minus first
    batches: int = 0  # batches the target cut during the measured part (if it says)
    mean_batch: float = 0.0  # tuples per batch
    settings: dict = field(default_factory=dict)

    def line(self) -> str:
        return (f"{self.mode:>10}  rate {self.rate / 1e6:6.3f}M"
                f"  reached {self.achieved / 1e6:6.3f}M"
                f"  p50 {self.p50_ms:8.2f}  p99 {self.p99_ms:8.2f}  p99.9 {self.p999_ms:8.2f}"
                f"  max {self.max_ms:8.2f} ms  behind {self.behind_ms:7.1f} ms  "
                f"{'kept up' if self.kept_up else 'FELL BEHIND'}  batch {self.mean_batch:,.0f}"
                f"  pairs {self.pairs:,}")


class EngineTarget:
    """The in-process engine as a latency target."""

    mode = "in-process"

    def __init__(self, engine: JoinEngine):
        self.engine = engine

    def push(self, chunk) -> None:
        self.engine.push(chunk)

    def poll(self):
        self.engine.tick()
        return self.engine.take_results(wait=False)

    def pending(self) -> bool:
        st = self.engine.status()
        return bool(st["buffered"]["R"] or st["buffered"]["S"] or st["probes_in_flight"])

    def flush(self) -> None:
        self.engine.flush()

    def batches(self) -> int:
        return self.engine.stats.batches

    def close(self) -> None:
        self.engine.backend.close()


class LiveTarget:
    """A streaming join (opened with ``max_latency_ms``) on a manager endpoint: chunks
    go out without waiting, pairs are polled as the manager pushes them. The source
    wakes once a ``step_s`` (the client's linger): what falls due meanwhile waits in the
    source instead of in the client's linger buffer, and the driver does not spin on the
    cores that the manager and the workers need (pushing every few tuples, its process
    used more CPU than the manager or a worker: 2.0-2.6 s in 3.5 s at 500K tuples/s)."""

    def __init__(self, client, join_id: str, mode: str = "cluster",
                 linger_ms: float | None = None):
        from panjoin.client import LINGER_MS

        self.client = client
        self.join_id = join_id
        self.mode = mode
        linger_ms = LINGER_MS if linger_ms is None else linger_ms
        self.live = client.live(join_id, linger_ms=linger_ms)
        self.step_s = linger_ms / 1000.0

    def push(self, chunk) -> None:
        self.live.push(chunk)

    def poll(self):
        out = self.live.poll()
        return out.r_id, out.s_id

    def wait(self, timeout: float) -> bool:
        return self.live.wait(timeout)

    def pending(self) -> bool:
        return self.live.pending()

    def flush(self) -> None:
        self.live.flush()

    def batches(self) -> int:
        return int(self.client.status(self.join_id).batches)

    def close(self) -> None:
        self.live.close()


def _due_lookup(events, fill: int, rate: float):
    """Per stream, a function ids -> due time in s after the start of the replay;
    tuples of the fill are due at -inf. Built before the clock starts: over millions of
    tuples it takes tens of ms, which would otherwise open every run with a backlog."""
    n = len(events)
    due = np.full(n, -np.inf)
    due[fill:] = np.arange(n - fill) / rate
    out = []
    for x in (0, 1):
        rows = np.flatnonzero(events.stream == x)
        ids = events.id[rows]
        if ids.size == 0 or (ids[0] == 0 and np.array_equal(ids, np.arange(ids.size))):
            d = due[rows]
            out.append(lambda q, d=d: d[q])
        else:
            order = np.argsort(ids, kind="stable")
            sid, d = ids[order], due[rows[order]]
            out.append(lambda q, sid=sid, d=d: d[np.searchsorted(sid, q)])
    return out


def run_open_loop(events, fill: int, rate: float, target, *, tail_s: float = TAIL_S,
                  head_s: float = HEAD_S, progress=None) -> LatencyResult:
    """Fill with ``events[:fill]`` closed-loop, then replay ``events[fill:]`` at ``rate``
    tuples/s into ``target``; returns the pair latencies of the replayed part but its
    first ``head_s`` and last ``tail_s`` seconds (see the module docstring)."""
    step = 1 << 16
    for a in range(0, fill, step):
        target.push(events.slice(a, min(fill, a + step)))
        target.poll()
    while target.pending():  # the fill's rounds answered before the clock starts
        target.flush()
        target.poll()
    total = len(events) - fill
    head = min(int(head_s * rate), max(0, total - 1))  # the warm-up's tuples
    n = max(1, total - head - int(tail_s * rate))  # the measured tuples
    end = head + n  # the tuples from here on are the tail's
    b0 = target.batches() if hasattr(target, "batches") else 0
    lat: list[np.ndarray] = []
    dues: list[np.ndarray] = []  # the due time of each pair's later tuple
    pairs = 0
    due_r, due_s = _due_lookup(events, fill, rate)
    start = (head - 0.5) / rate if head else -1.0  # pairs due before it: the warm-up's
    horizon = (end - 0.5) / rate  # pairs whose later tuple is due after it: the tail's
    t0 = time.perf_counter() + 0.005

    def take(now_pairs, now):
        nonlocal pairs
        r, s = now_pairs
        if r.size:
            d = np.maximum(due_r(r), due_s(s))
            # a pair of two fill tuples has no due time
            ok = np.isfinite(d) & (d < horizon) & (d >= start)
            lat.append(now - t0 - d[ok])
            dues.append(d[ok])
            pairs += int(ok.sum())

    step = getattr(target, "step_s", 0.0)  # the source pushes at most once a step
    wait_for_pairs = getattr(target, "wait", None)
    pushed = 0
    behind = 0.0
    end_behind = 0.0
    last_push = t0 + head / rate
    next_step = t0  # the source's next push, at the earliest
    backlog: list[tuple[int, float]] = []  # (tuples pushed before, backlog in s)
    while pushed < total:
        now = time.perf_counter()
        due_n = min(total, int((now - t0) * rate) + 1) if now >= t0 else 0
        if due_n > pushed and now >= next_step:
            next_step = now + step
            back = now - (t0 + pushed / rate)  # how long the oldest of these waited
            if pushed < end and due_n > head:  # a push of measured tuples
                behind = max(behind, back)
                end_behind = back
                last_push = now
                backlog.append((pushed, back))
            target.push(events.slice(fill + pushed, fill + due_n))
            if progress is not None:
                progress.update(due_n - pushed)
            pushed = due_n
        out = target.poll()
        take(out, time.perf_counter())
        if pushed < total:
            after = time.perf_counter()
            # the next tuple's due time, or the target's next step (the tuples due
            # meanwhile are pushed late, and that counts against their latency)
            wait = max(t0 + pushed / rate, next_step) - after
            if wait > 0:
                wait = min(wait, max(POLL_S, step))
                if wait_for_pairs is not None:  # pairs are taken the moment they arrive
                    wait_for_pairs(wait)
                else:
                    time.sleep(wait)
    target.flush()
    take(target.poll(), time.perf_counter())
    while target.pending():
        take(target.poll(), time.perf_counter())
        time.sleep(POLL_S)
    ms = np.concatenate(lat) * 1000.0 if lat else np.zeros(1)
    q = np.quantile(ms, [0.5, 0.99, 0.999]) if ms.size else np.zeros(3)
    batches = (target.batches() - b0) if hasattr(target, "batches") else 0
    first = max((b for p, b in backlog if p < head + n // 4), default=0.0)
    # the last push counts too: a target far behind pushes the whole last quarter at once
    last = max([b for p, b in backlog if p >= end - n // 4] + [end_behind])
    # a target that takes its input without waiting (a remote join) queues it inside
    # instead: then the pairs' latency grows over the run
    growth = 0.0
    if lat:
        lt, du = np.concatenate(lat), np.concatenate(dues)
        quarter = (horizon - max(start, 0.0)) / 4
        early, late = lt[du < max(start, 0.0) + quarter], lt[du >= horizon - quarter]
        if early.size and late.size:
            growth = float(np.median(late) - np.median(early))
    return LatencyResult(
        mode=getattr(target, "mode", type(target).__name__), rate=rate,
        achieved=min(rate, n / max(last_push - (t0 + head / rate), 1e-9)),
        tuples=n, pairs=pairs,
        p50_ms=float(q[0]), p99_ms=float(q[1]), p999_ms=float(q[2]), max_ms=float(ms.max()),
        behind_ms=behind * 1000.0, end_behind_ms=end_behind * 1000.0,
        kept_up=max(last - first, growth) * 1000.0 <= KEPT_UP_MS,
        growth_ms=growth * 1000.0, batches=batches,
        mean_batch=n / batches if batches else 0.0)


def max_sustainable(results: list[LatencyResult], p99_ms: float) -> float:
    """The highest rate that kept up with p99 at or under ``p99_ms`` (0 if none)."""
    ok = [r.rate for r in results if r.kept_up and r.p99_ms <= p99_ms]
    return max(ok, default=0.0)


def write_json(results: list[LatencyResult], path) -> None:
    with open(path, "w") as f:
        json.dump([asdict(r) for r in results], f, indent=1)


def plot(results: list[LatencyResult], path, title: str = "") -> None:
    """Throughput against latency: p50 and p99 over the reached rate, one curve per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    modes = sorted({r.mode for r in results})
    for i, m in enumerate(modes):
        rs = sorted((r for r in results if r.mode == m), key=lambda r: r.rate)
        x = [r.achieved / 1e6 for r in rs]
        c = f"C{i}"
        ax.plot(x, [r.p99_ms for r in rs], "-o", color=c, label=f"{m} p99")
        ax.plot(x, [r.p50_ms for r in rs], "--", color=c, alpha=0.7, label=f"{m} p50")
        for r, xi in zip(rs, x, strict=True):
            if not r.kept_up:
                ax.plot(xi, r.p99_ms, "x", color="k", markersize=9)
    ax.set_yscale("log")
    ax.set_xlabel("input rate reached (M tuples/s)")
    ax.set_ylabel("pair latency (ms)")
    ax.set_title(title or "PanJoin: throughput and pair latency (x: fell behind)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency_sweep(rates, *, window: str = "count:1M,1M", predicate: str = "eq",
                  index: str = "bisort", dist: str = "uniform", key_max: int = 1_000_000,
                  seconds: float = 3.0, max_latency_ms: float | None = None,
                  batch_size: int | None = None, collect_ms: float | None = None,
                  subwindow_size: int | None = None, threads: int | None = None,
                  workers: int = 0, topology: str = "ring", replicas: int = 2,
                  fast_forward: bool = False, segment: str = "nested",
                  seed: int = 1, label: str | None = None, progress: bool = False,
                  echo=None) -> list[LatencyResult]:
    """One open-loop run per rate, each on a fresh join over the same data (a count
    window's fill, then ``seconds`` at the highest rate plus the tail): in-process by
    default; with ``workers`` on a local cluster started once for the sweep (``topology``
    ring: that many workers with ``replicas``, or a handshake chain of that many
    nodes, with ``fast_forward`` the low-latency one, ``segment`` its nodes' scan), its
    manager in its own process,
    each rate a streaming join on it."""
    from panjoin.cli.options import progress as bar
    from panjoin.generate import generate
    from panjoin.manager.engine import warm_up
    from panjoin.semantics import parse_window

    w = parse_window(window)
    if w.kind != "count":
        raise ValueError("the latency benchmark replays count windows (its source sets the "
                         "arrival times, not event time)")
    if topology not in ("ring", "handshake"):
        raise ValueError(f"unknown topology {topology!r}; choose 'ring' or 'handshake'")
    if topology == "handshake" and not workers:
        raise ValueError("the handshake topology runs on node processes: give workers")
    fill = int(w.r + w.s)
    top = max(rates)
    events = generate(fill + int(top * (HEAD_S + seconds + TAIL_S)), dist, key_max=key_max,
                      seed=seed)
    settings = dict(window=window, predicate=predicate, index=index, dist=dist,
                    max_latency_ms=max_latency_ms, batch_size=batch_size,
                    collect_ms=collect_ms, subwindow_size=subwindow_size, threads=threads)
    if workers:
        settings.update(workers=workers, topology=topology,
                        replicas=replicas if topology == "ring" else None,
                        fast_forward=fast_forward if topology == "handshake" else None,
                        segment=segment if topology == "handshake" else None)
        cluster = _start_cluster(workers, topology, replicas, index, predicate, threads,
                                 fast_forward, segment)
    else:
        cluster = None
        warm_up(index)
    out = []
    try:
        for rate in rates:
            ev = events.slice(0, fill + int(rate * (HEAD_S + seconds + TAIL_S)))
            if cluster is None:
                eng = JoinEngine(window, predicate, index=index, batch_size=batch_size,
                                 max_collect_ms=collect_ms, max_latency_ms=max_latency_ms,
                                 subwindow_size=subwindow_size, threads=threads)
                target = EngineTarget(eng)
                extra = dict(nsub=eng.nsub, partitions=eng.partitions, threads=eng.threads)
            else:
                target, extra = _live_target(cluster, topology, window, predicate, index,
                                             max_latency_ms, batch_size, collect_ms,
                                             subwindow_size)
            try:
                with bar(len(ev) - fill, f"{rate:,.0f} tuples/s", not progress) as pb:
                    res = run_open_loop(ev, fill, rate, target, progress=pb)
            finally:
                target.close()
            res.settings = dict(settings, **extra)
            if label:
                res.mode = label
            if echo is not None:
                echo(res.line())
            out.append(res)
    finally:
        if cluster is not None:
            cluster[0].close()
            cluster[1].stop()
    return out


def _start_cluster(workers: int, topology: str, replicas: int, index: str, predicate: str,
                   threads: int | None, fast_forward: bool = False, segment: str = "nested"):
    """(client, LocalCluster): worker processes (or handshake nodes) and ``panjoin
    manager`` over them, warmed up: the workers' index kernels, then a small streaming
    join through the manager (its own kernels, and the whole path)."""
    from panjoin.client import Client
    from panjoin.generate import generate
    from panjoin.launch import start_cluster

    if topology == "handshake":
        cluster = start_cluster(workers, threads or 1, role="handshake-node",
                                manager_args=["--topology", "handshake", "--segment", segment]
                                + (["--fast-forward"] if fast_forward else []))
    else:
        cluster = start_cluster(workers, threads or 1,
                                manager_args=["--replicas", str(replicas)])
    try:
        if topology == "ring":
            cluster.warm_up(index)
        client = Client(cluster.address)
        ev = generate(20_000, "uniform", key_max=1 << 20, seed=1)
        client.join(ev, "count:4K,4K", predicate, index, chunk=1024, max_latency_ms=5)
        return client, cluster
    except BaseException:
        cluster.stop()
        raise


def linger_ms(max_latency_ms: float | None) -> float:
    """The source's client linger (and step) under a bound: a quarter of it, at most
    LINGER_MAX_MS (Kafka's default linger.ms): each message costs the manager an apply
    and an answer, so a 1 ms linger at 500K tuples/s made 1,000 messages a second and
    a manager that fell seconds behind on them."""
    from panjoin.client import LINGER_MS

    if not max_latency_ms:
        return LINGER_MS
    return max(LINGER_MS, min(LINGER_MAX_MS, max_latency_ms / 4))


def _live_target(cluster, topology, window, predicate, index, max_latency_ms, batch_size,
                 collect_ms, subwindow_size):
    """A fresh streaming join on the sweep's cluster; (target, its settings)."""
    from panjoin.proto.panjoin.v1 import manager_pb2

    client = cluster[0]
    opts = {k: v for k, v in dict(batch_size=batch_size, max_collect_ms=collect_ms,
                                  subwindow_size=subwindow_size).items() if v}
    # without a bound the join does not stream: pairs come with the answers to inputs
    reply = client.stub.Open(manager_pb2.OpenRequest(
        window=window, predicate=predicate, index=index,
        max_latency_ms=max_latency_ms or 0.0, **opts))
    st = reply.settings
    target = LiveTarget(client, client.adopt(reply),
                        "handshake" if topology == "handshake" else "cluster",
                        linger_ms(max_latency_ms))
    return target, dict(nsub=st.subwindow_size, partitions=st.partitions,
                        nbat=st.batch_size)
