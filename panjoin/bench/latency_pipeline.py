"""Pair latency of the Kafka pipeline, end to end (issue 27): Kafka R, S -> the Spark
job -> the manager -> Kafka ``joined``, measured the way :mod:`panjoin.bench.latency`
measures the in-process engine (open-loop source, latency against due times), and
reported with its :class:`~panjoin.bench.latency.LatencyResult`.

What runs: a broker (:func:`panjoin.kafka.broker.start_broker`), a local cluster
(:func:`panjoin.launch.start_cluster`) and the job as a process of its own
(``panjoin pipeline`` with a processing-time trigger, :func:`spark_conn.cli.job_argv`),
as ``make demo`` starts them; this process is the producer and the consumer. At
the end the job gets SIGINT (it stops its query and writes its counters), then the
cluster and the broker stop: nothing is left running.

**Producer, open loop.** Each rate is a *phase*: tuple j of the phase is due at
``t_k + j / rate`` (``t_k``: the phase's start on this machine's clock), and a
thread writes every tuple that is due, never early, to topic R or S (whole record
batches, :class:`~panjoin.kafka.writer.BatchWriter`); a stall of the broker or the
writer delays the writes, and the delay counts against latency. A record is::

    {"id": 812, "key": 40321, "ts": 1764200000123, "due_us": 1764200000123456}

``due_us`` is its due time (µs since the epoch) and ``ts``, the event time the join
uses, is the due time in ms, so a time window ``time:T,T`` holds about ``rate * T``
tuples, half per stream. Keys are uniform, drawn so that a tuple has about one
partner (``key_max = rate * T / 2`` for ``eq``, times ``2E + 1`` for ``band:E``).

**Consumer.** A thread tails topic ``joined`` (:class:`~panjoin.kafka.fetcher.Fetcher`)
and notes when it read each record. A joined record holds both input records
(:mod:`spark_conn.joined`); its latency is the time it was read minus the later of
its two due times (looked up by id: the producer keeps every tuple's due time, the
same number as the records' ``due_us``)::

    r 812 due 10.000 s, s 97 due 10.004 s, "joined" record read at 10.310 s -> 306 ms

**Phases.** Before the first phase the job is started and two *ping* tuples (an R
and an S of a key nothing else has) are produced; the run begins once their pair
comes out (Spark's start, the first micro-batch and its compilations are not
measured). Each phase runs ``warm`` seconds (the window fills at the new rate),
``seconds`` measured, and a tail; only pairs whose later tuple falls in the measured
part count. Between phases the producer waits until the consumer has seen the
phase's last pairs (the job caught up); a phase after which it did not within
``CATCH_UP_S`` ends the sweep (higher rates would start on a backlog).

**Kept up.** The producer kept its schedule (at most ``KEPT_UP_MS`` behind at the
end of the measured part) and the pipeline kept up with it: the pairs' latency did
not grow over the measured part by more than ``MAX_TREND`` seconds per second (a
pipeline that processes a fraction ``f < 1`` of the input rate lags more by
``1/f - 1`` s every second; a steady one only repeats its trigger's sawtooth).

    >>> rs = pipeline_latency([20_000, 50_000], seconds=5.0)         # doctest: +SKIP
    >>> [(r.rate, round(r.p99_ms), r.kept_up) for r in rs]           # doctest: +SKIP
    [(20000, 420, True), (50000, 480, True)]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from panjoin.bench.latency import KEPT_UP_MS, TAIL_S, LatencyResult
from panjoin.semantics import parse_predicate, parse_window

#: a phase's pipeline kept up when its pairs' latency grew by at most this many
#: seconds per second of the measured part (the slope of a least-squares line)
MAX_TREND = 0.05
#: how long to wait after a phase for the job to catch up before the next one
CATCH_UP_S = 30.0
#: how long the job may take to start and answer the first marker
START_S = 300.0
#: the consumer polls the output topic this often when nothing came
POLL_S = 0.002
#: the markers' keys are multiples of this: far from every generated key, their bands
#: and each other
PING_KEY = -(1 << 40)


@dataclass
class PipelineLatencyConfig:
    """One sweep: the job's settings and the rates it is fed at."""

    rates: list
    window: str = "time:5000,5000"
    predicate: str = "eq"
    seconds: float = 10.0  # measured seconds per rate
    warm: float | None = None  # unmeasured seconds before each (default: the window's T)
    trigger: str = "100 milliseconds"
    max_offsets_per_trigger: int | None = None
    broker: str = "noida"
    workers: int = 2
    partitions: int = 2  # of each input topic
    index: str = "bisort"
    batch_size: int = 32768
    subwindow_size: int | None = None  # default: half of what the window holds at the top rate
    max_latency_ms: float | None = None  # the job's --max-latency (the manager's engine)
    seed: int = 1
    label: str | None = None  # the results' mode (default: "pipeline <trigger>")


@dataclass
class Phase:
    rate: float
    stream: np.ndarray  # uint8 per tuple, arrival order
    id: np.ndarray  # int64, per stream
    key: np.ndarray
    n_warm: int  # the first n_warm tuples are not measured
    n_measured: int  # then these are; the rest is the tail
    t0: float = 0.0  # perf_counter when tuple 0 is due
    due_us: np.ndarray | None = None  # the records' due_us (µs since the epoch), once produced
    # the producer's record of how it kept the schedule
    behind_s: float = 0.0  # largest delay of a write behind its oldest record's due time
    end_behind_s: float = 0.0  # that delay at the last write of a measured tuple
    last_measured_push: float = 0.0

    @property
    def n(self) -> int:
        return len(self.stream)

    def due(self) -> np.ndarray:
        return self.t0 + np.arange(self.n) / self.rate


def key_range(rate: float, window_ms: float, predicate: str) -> int:
    """Distinct keys for about one partner per tuple at ``rate`` (see the module doc)."""
    pred = parse_predicate(predicate)
    # keys within reach of one key: the bands' widths (eq: the key itself)
    width = 1 if pred.kind == "ne" else sum(int(b - a) + 1 for a, b in pred.bands)
    return max(1, int(rate * window_ms / 1000.0 * width / 2))


def make_phases(cfg: PipelineLatencyConfig) -> list[Phase]:
    """Every phase's tuples: streams and keys drawn per phase, ids running on per stream."""
    w = parse_window(cfg.window)
    if w.kind != "time":
        raise ValueError("the pipeline's latency benchmark needs a time window (time:TR,TS): "
                         "its records' event time is their due time")
    t_ms = (w.r + w.s) / 2
    warm = cfg.warm if cfg.warm is not None else t_ms / 1000.0
    rng = np.random.default_rng(cfg.seed)
    next_id = [1, 1]  # markers have ids below 0; id 0 is unused
    out = []
    for rate in cfg.rates:
        n_warm, n_meas = int(warm * rate), max(1, int(cfg.seconds * rate))
        n = n_warm + n_meas + int(TAIL_S * rate)
        stream = (rng.random(n) >= 0.5).astype(np.uint8)
        ids = np.empty(n, np.int64)
        for x in (0, 1):
            m = stream == x
            ids[m] = next_id[x] + np.arange(int(m.sum()))
            next_id[x] += int(m.sum())
        keys = rng.integers(0, key_range(rate, t_ms, cfg.predicate), n, dtype=np.int64)
        out.append(Phase(float(rate), stream, ids, keys, n_warm, n_meas))
    return out


def encode(ids: np.ndarray, keys: np.ndarray, due_us: np.ndarray) -> pa.Array:
    """The JSON records ``{"id", "key", "ts", "due_us"}`` (ts = due in ms), built by
    Arrow's string kernels: no Python object per record."""
    s = [pa.array(x).cast(pa.string()) for x in (ids, keys, due_us // 1000, due_us)]
    rec = pc.binary_join_element_wise('{"id":', s[0], ',"key":', s[1], ',"ts":', s[2],
                                      ',"due_us":', s[3], "}", "")
    return rec.cast(pa.large_binary())


class Clock:
    """perf_counter (the schedule's clock) to µs since the epoch (the records' clock)."""

    def __init__(self):
        self.wall, self.perf = time.time(), time.perf_counter()

    def epoch_us(self, t) -> np.ndarray:
        return np.round((np.asarray(t, np.float64) - self.perf + self.wall) * 1e6).astype(
            np.int64)


class Producer:
    """Writes a phase's tuples to R and S as they fall due (see the module doc)."""

    def __init__(self, bootstrap: str, r_topic: str, s_topic: str, clock: Clock):
        from panjoin.kafka.writer import BatchWriter

        self.writer = BatchWriter(bootstrap)
        self.topics, self.clock = (r_topic, s_topic), clock
        self.writes = 0

    def marker(self, m: int) -> int:
        """Marker ``m``: an R and an S tuple of id ``-1 - m`` and a key of their own (no
        other tuple is within a band of it), due now. Their pair comes out once the job
        has processed everything produced before them; returns their due_us."""
        due = self.clock.epoch_us([time.perf_counter()])
        v = encode(np.full(1, -1 - m, np.int64), np.full(1, PING_KEY * (m + 1)), due)
        for t in self.topics:
            self.writer.write(t, v, self.writes)
        self.writes += 1
        return int(due[0])

    def run(self, ph: Phase) -> None:
        """Produce ``ph`` on its schedule from ``ph.t0`` (set here, just ahead)."""
        ph.t0 = time.perf_counter() + 0.05
        due = ph.due()
        ph.due_us = self.clock.epoch_us(due)
        vals, dues = [], []
        for x in (0, 1):  # per stream, in arrival order
            rows = np.flatnonzero(ph.stream == x)
            vals.append(encode(ph.id[rows], ph.key[rows], ph.due_us[rows]))
            dues.append(due[rows])
        sent = [0, 0]
        n_meas = ph.n_warm + ph.n_measured
        end_meas = [int(np.searchsorted(np.flatnonzero(ph.stream == x), n_meas)) for x in (0, 1)]
        while sent[0] < len(dues[0]) or sent[1] < len(dues[1]):
            now = time.perf_counter()
            wrote = False
            for x in (0, 1):
                k = int(np.searchsorted(dues[x], now, side="right"))
                if k > sent[x]:
                    back = now - dues[x][sent[x]]
                    ph.behind_s = max(ph.behind_s, back)
                    if sent[x] < end_meas[x]:
                        ph.end_behind_s, ph.last_measured_push = back, now
                    self.writer.write(self.topics[x], vals[x].slice(sent[x], k - sent[x]),
                                      self.writes)
                    self.writes += 1
                    sent[x], wrote = k, True
            if not wrote:
                nxt = min(d[s] for d, s in zip(dues, sent, strict=True) if s < len(d))
                time.sleep(max(0.0, min(nxt - time.perf_counter(), 0.001)))

    def close(self) -> None:
        self.writer.close()


class Consumer:
    """Tails the output topic in a thread: per read, the time and the pairs' ids."""

    def __init__(self, bootstrap: str, topic: str):
        from panjoin.kafka.fetcher import Fetcher

        self.fetcher, self.topic = Fetcher(bootstrap), topic
        self.pos: dict = {}
        self.reads: list = []  # (perf_counter, r_ids, s_ids)
        self.seen = 0
        self.markers: set = set()  # the markers' ids whose pair was read
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._new = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="latency-consumer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        from panjoin.kafka.fetcher import value_buffers
        from panjoin.kafka.json_fields import INT, read_fields

        try:
            while not self._stop.is_set():
                ends = self.fetcher.end_offsets(self.topic)
                want = [(self.topic, p, self.pos.get(p, 0), e) for p, (_, e) in ends.items()
                        if e > self.pos.get(p, 0)]
                if not want:
                    time.sleep(POLL_S)
                    continue
                got = self.fetcher.read(want)
                now = time.perf_counter()
                for (_, p, _, e) in want:
                    self.pos[p] = e
                vals = pa.chunked_array([t.column("value") for t in got.values()
                                         if t.num_rows], pa.large_binary()).combine_chunks()
                data, offs = value_buffers(vals)
                ints, _, ok = read_fields(data, offs, [b"r_id", b"s_id"], [INT, INT])
                if not ok.all():
                    raise ValueError(f"{int((~ok).sum())} records of {self.topic} without "
                                     "integer r_id and s_id")
                with self._new:
                    self.reads.append((now, ints[:, 0].copy(), ints[:, 1].copy()))
                    self.markers.update(ints[ints[:, 0] < 0, 0].tolist())
                    self.seen += len(ok)
                    self._new.notify_all()
        except BaseException as e:  # reported by pairs() and wait()
            self.error = e
            with self._new:
                self._new.notify_all()

    def wait_for(self, marker: int, timeout: float, alive=lambda: True) -> bool:
        """Until marker ``marker``'s pair was read (:meth:`Producer.marker`), at most
        ``timeout`` s and while ``alive()``."""
        deadline = time.monotonic() + timeout
        with self._new:
            while -1 - marker not in self.markers:
                if self.error is not None:
                    raise RuntimeError(f"reading {self.topic} failed: {self.error}")
                left = deadline - time.monotonic()
                if left <= 0 or not alive():
                    return False
                self._new.wait(min(left, 0.5))
        return True

    def pairs(self):
        """``(read time, r_id, s_id)`` of every record read so far, in reading order."""
        if self.error is not None:
            raise RuntimeError(f"reading {self.topic} failed: {self.error}")
        with self._new:
            reads = list(self.reads)
        if not reads:
            return np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64)
        t = np.concatenate([np.full(len(r), w) for w, r, _ in reads])
        return (t, np.concatenate([r for _, r, _ in reads]),
                np.concatenate([s for _, _, s in reads]))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.fetcher.close()


def due_by_id(phases: list[Phase]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per stream, indexed by id: the due time and the phase it belongs to (-1: id 0,
    which is no tuple's; -2 - k: phase k's warm-up or tail, not measured). Markers (ids
    below 0) are no phase's: the caller leaves their pairs out."""
    n = [1 + sum(int((ph.stream == x).sum()) for ph in phases) for x in (0, 1)]
    due = [np.full(k, np.nan) for k in n]
    tag = [np.full(k, -1, np.int64) for k in n]
    for k, ph in enumerate(phases):
        d = ph.due()
        meas = np.zeros(ph.n, bool)
        meas[ph.n_warm:ph.n_warm + ph.n_measured] = True
        for x in (0, 1):
            m = ph.stream == x
            due[x][ph.id[m]] = d[m]
            tag[x][ph.id[m]] = np.where(meas[m], k, -2 - k)
    return due[0], due[1], tag[0], tag[1]


def phase_results(phases: list[Phase], consumer: Consumer, settings: dict,
                  mode: str) -> list[LatencyResult]:
    """Each phase's pair latencies (see the module doc) as a LatencyResult."""
    t, r, s = consumer.pairs()
    keep = (r > 0) & (s > 0)  # a marker pairs with its own other half only
    t, r, s = t[keep], r[keep], s[keep]
    due_r, due_s, tag_r, tag_s = due_by_id(phases)
    later = np.fmax(due_r[r], due_s[s])
    # the phase of a pair is its later tuple's
    tag = np.where(due_r[r] >= due_s[s], tag_r[r], tag_s[s])
    out = []
    for k, ph in enumerate(phases):
        m = tag == k
        lat = (t[m] - later[m]) * 1000.0
        q = np.quantile(lat, [0.5, 0.99, 0.999]) if lat.size else np.full(3, np.nan)
        trend = float(np.polyfit(later[m] - ph.t0, lat / 1000.0, 1)[0]) if lat.size > 2 else 0.0
        span = ph.last_measured_push - (ph.t0 + ph.n_warm / ph.rate)
        kept = ph.end_behind_s * 1000.0 <= KEPT_UP_MS and trend <= MAX_TREND
        out.append(LatencyResult(
            mode=mode, rate=ph.rate,
            achieved=min(ph.rate, ph.n_measured / max(span, 1e-9)), tuples=ph.n_measured,
            pairs=int(m.sum()), p50_ms=float(q[0]), p99_ms=float(q[1]), p999_ms=float(q[2]),
            max_ms=float(lat.max()) if lat.size else float("nan"),
            behind_ms=ph.behind_s * 1000.0, end_behind_ms=ph.end_behind_s * 1000.0,
            kept_up=bool(kept and lat.size),
            settings=dict(settings, trend_s_per_s=round(trend, 4),
                          min_ms=float(lat.min()) if lat.size else float("nan"))))
    return out


def kept_up(res: LatencyResult, caught: bool, before: bool) -> bool:
    """Whether the phase of ``res`` kept up: by its own measure (producer on schedule,
    latency not growing), the job caught up after it (``caught``: its marker came out in
    time), and the phase before it kept up (``before``).

    A phase after one that fell behind starts with that backlog: its pairs come out in a
    burst as the job drains it (a latency trend near -1 s/s, as if shrinking), which is
    not keeping up with its rate.

        >>> r = LatencyResult("pipeline", 1e5, 1e5, 10, 10, 1, 2, 3, 4, 0, 0, True)
        >>> kept_up(r, True, True), kept_up(r, False, True), kept_up(r, True, False)
        (True, False, False)
    """
    return bool(res.kept_up and caught and before)


def _stop_job(job: subprocess.Popen, timeout: float = 60.0) -> None:
    """SIGINT (the job stops its query and writes its counters), then SIGKILL to its
    process group (Spark's JVM and Python workers) if it does not end."""
    if job.poll() is None:
        job.send_signal(signal.SIGINT)
        try:
            job.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    try:  # whatever of its group is left (the JVM normally ends with its driver)
        os.killpg(job.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    job.wait()


@dataclass
class Sweep:
    """What :func:`pipeline_latency` ran: per phase its result, the tuples produced, and
    every pair read (the time, both ids; markers' pairs included)."""

    results: list  # LatencyResult per phase that ran
    phases: list  # Phase per phase that ran, due_us filled in
    markers: list  # due_us of marker m (ids -1 - m of both streams, key PING_KEY * (m + 1))
    reads: tuple  # (read time, r_id, s_id), from Consumer.pairs()
    stats: dict  # the job's counters (panjoin pipeline --stats-json)
    out_topic: str = ""  # the topic the pairs were read from

    def events(self):
        """Every tuple produced as an EventTable in arrival order (markers included)."""
        from panjoin.events import EventTable

        cols = []
        for m, due in enumerate(self.markers):
            cols.append((np.array([0, 1], np.uint8), np.full(2, -1 - m), np.full(
                2, PING_KEY * (m + 1)), np.full(2, due // 1000)))
            if m < len(self.phases):
                ph = self.phases[m]
                cols.append((ph.stream, ph.id, ph.key, ph.due_us // 1000))
        return EventTable(*(np.concatenate([c[i] for c in cols]) for i in range(4)))


def pipeline_latency(cfg: PipelineLatencyConfig, echo=print, work: str | None = None,
                     bootstrap: str | None = None) -> Sweep:
    """Start a broker (unless ``bootstrap`` names one), a cluster and the job (their
    files in a new folder under ``work``); run every rate of ``cfg`` as a phase, each
    followed by a marker; stop what was started. The results are those of
    :attr:`Sweep.results`, the job's time per step in :attr:`Sweep.stats`
    (:func:`time_per_step`)."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from panjoin.kafka import io
    from panjoin.kafka.broker import start_broker
    from panjoin.launch import start_cluster
    from spark_conn.cli import job_argv
    from spark_conn.config import PipelineConfig

    phases = make_phases(cfg)
    w = parse_window(cfg.window)
    nsub = cfg.subwindow_size or 1 << max(10, int(max(cfg.rates) * w.r / 4000).bit_length())
    work = tempfile.mkdtemp(prefix="panjoin-latency-", dir=work)  # a fresh job (and broker)
    mode = cfg.label or f"pipeline {cfg.trigger}"
    settings = dict(window=cfg.window, predicate=cfg.predicate, index=cfg.index,
                    trigger=cfg.trigger, max_offsets_per_trigger=cfg.max_offsets_per_trigger,
                    broker=cfg.broker, workers=cfg.workers, partitions=cfg.partitions,
                    batch_size=cfg.batch_size, nsub=nsub, seconds=cfg.seconds,
                    max_latency_ms=cfg.max_latency_ms)
    run = Sweep([], [], [], (), {})
    uid = os.path.basename(work)  # topics of their own on a shared broker
    broker_cm = (nullcontext(SimpleNamespace(bootstrap=bootstrap)) if bootstrap else
                 start_broker(cfg.broker, data_dir=os.path.join(work, "broker")))
    with start_cluster(cfg.workers) as cluster, broker_cm as broker:
        cluster.warm_up(cfg.index)
        job_cfg = PipelineConfig(
            broker.bootstrap, cluster.address, os.path.join(work, "ckpt"), cfg.window,
            cfg.predicate, r_topic=f"R-{uid}", s_topic=f"S-{uid}", out_topic=f"joined-{uid}",
            late_topic=f"late-{uid}", dead_letter_topic=f"dead-letter-{uid}", index=cfg.index,
            batch_size=cfg.batch_size, subwindow_size=nsub,
            max_offsets_per_trigger=cfg.max_offsets_per_trigger, trigger=cfg.trigger,
            max_latency_ms=cfg.max_latency_ms)
        run.out_topic = job_cfg.out_topic
        io.create_topics(broker.bootstrap, [job_cfg.r_topic, job_cfg.s_topic], cfg.partitions)
        io.create_topics(broker.bootstrap, [job_cfg.out_topic, job_cfg.late_topic,
                                            job_cfg.dead_letter_topic])
        producer = Producer(broker.bootstrap, job_cfg.r_topic, job_cfg.s_topic, Clock())
        consumer = Consumer(broker.bootstrap, job_cfg.out_topic)
        stats_path = os.path.join(work, "job-stats.json")
        job_log = open(os.path.join(work, "job.log"), "w")
        job = subprocess.Popen(
            [sys.executable, "-m", "panjoin.cli", "pipeline", *job_argv(job_cfg),
             "--stats-json", stats_path], stdout=job_log, stderr=subprocess.STDOUT,
            start_new_session=True)
        alive = lambda: job.poll() is None  # noqa: E731
        caught_up: list[bool] = []  # per phase: its marker came out in time
        kept: list[bool] = []  # per phase: it kept up (see kept_up)
        try:
            t_start = time.perf_counter()
            run.markers.append(producer.marker(0))
            if not consumer.wait_for(0, START_S, alive):
                raise RuntimeError(f"the job did not answer in {START_S:.0f} s (exit "
                                   f"{job.poll()}); see {job_log.name}")
            echo(f"job started and answered in {time.perf_counter() - t_start:.1f} s "
                 f"(broker {cfg.broker}, {cfg.workers} workers, trigger {cfg.trigger!r}, "
                 f"NSub {nsub:,})")
            for k, ph in enumerate(phases):
                producer.run(ph)
                run.phases.append(ph)
                run.markers.append(producer.marker(k + 1))
                caught = consumer.wait_for(k + 1, CATCH_UP_S, alive)
                caught_up.append(caught)
                res = phase_results(run.phases, consumer, settings, mode)[k]
                res.kept_up = kept_up(res, caught, k == 0 or kept[-1])
                kept.append(res.kept_up)
                echo(res.line() + f"  trend {res.settings['trend_s_per_s']:+.3f} s/s")
                if not caught:
                    echo(f"the job did not catch up within {CATCH_UP_S:.0f} s after "
                         f"{ph.rate:,.0f} tuples/s: higher rates not run")
                    break
            run.results = phase_results(run.phases, consumer, settings, mode)
            for k, r in enumerate(run.results):
                # not caught up: its latest pairs were never read, the quantiles are lower
                # bounds
                r.settings["caught_up"] = caught_up[k]
                r.kept_up = kept[k]
            run.reads = consumer.pairs()
        finally:
            _stop_job(job)
            job_log.close()
            consumer.close()
            producer.close()
        if os.path.exists(stats_path):
            with open(stats_path) as f:
                run.stats = json.load(f)
    return run


def time_per_step(stats: dict) -> str:
    """The job's time per micro-batch, by step, and Spark's per trigger, by phase."""
    b = max(1, stats.get("batches", 0))
    steps = ", ".join(f"{k[2:]} {v / b * 1000:.1f}" for k, v in stats.items()
                      if k.startswith("s_") and k not in ("s_start", "s_stop"))
    n = max(1, stats.get("spark_triggers", 0))
    spark = ", ".join(f"{k} {v / n:.1f}" for k, v in stats.get("spark_ms", {}).items())
    return (f"{stats.get('batches', 0)} micro-batches, {stats.get('tuples', 0):,} records; "
            f"ms per micro-batch: {steps}; Spark's ms per trigger (last {n}): {spark}")



def plot_files(paths, png: str) -> list[LatencyResult]:
    """The results of several ``--json`` files in one plot, a curve per broker and trigger
    (:func:`panjoin.bench.latency.plot`); returns them."""
    from panjoin.bench.latency import plot

    out = []
    for p in paths:
        with open(p) as f:
            for d in json.load(f):
                r = LatencyResult(**d)
                r.mode = f"{r.settings.get('broker', '')} {r.settings.get('trigger', r.mode)}"
                out.append(r)
    plot(out, png, "Kafka pipeline end to end: pair latency (x: fell behind)")
    return out
