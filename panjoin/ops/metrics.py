"""Prometheus metrics of the manager, the workers and the pipeline, in the text format at
``/metrics`` on ``--metrics-port`` (off by default; 0 picks a free port).

Nothing counts in the hot path for them: each process registers one custom collector
in its own :class:`~prometheus_client.CollectorRegistry` (not the library's global one,
so that tests running several servers in one process don't clash), and the collector
reads the numbers the engine, the worker or the pipeline already keeps when Prometheus
scrapes (:class:`~panjoin.manager.engine.EngineStats`, the worker sessions' backends,
the pipeline's ``stats``). Durations are :class:`~panjoin.ops.timings.Timings`
histograms. A join closed on the manager still counts in the manager-wide totals
(:class:`Retired`), so they never go down.

Example: a manager on ``--metrics-port 9100`` after one join of 4 tuples with 4 pairs::

    $ curl -s 127.0.0.1:9100/metrics | grep -v '^#' | grep -E 'tuples_in|pairs_out'
    panjoin_tuples_in_total{stream="R"} 2.0
    panjoin_tuples_in_total{stream="S"} 2.0
    panjoin_pairs_out_total 4.0

The manager's metrics (README: Metrics lists them all): tuples in, late tuples, pairs
out, batches, batch time and pair latency histograms, failovers, promoted backups,
admission pauses, over all joins; per open join (label ``join_id``) the same counters
plus subwindows and tuples held per worker and stream, and bytes held. A worker's: its
sessions, commands, subwindows and tuples per stream, bytes held and reserved, and the
seconds spent inserting and probing. The pipeline's: records read per stream, records
written per kind (joined, late, dead-letter), batches, the batch time and the pairs'
event-to-result latency (written minus the event time of the later tuple, as Kafka
Streams' ``record-e2e-latency``) as histograms, the watermark and the lag behind it,
and the Kafka offsets read and committed per partition.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from panjoin.ops.timings import Timings

log = logging.getLogger("panjoin.metrics")

STREAMS = ("R", "S")


def serve_metrics(collector, port: int, host: str = "127.0.0.1") -> tuple[object, int]:
    """Serve ``collector`` (anything with ``collect()``) at ``http://host:port/metrics``
    from a daemon thread, in a registry of its own; TLS with the process's certificate
    when it has one (:mod:`panjoin.security`). Returns the HTTP server (``shutdown()``
    stops it) and the bound port (``port=0`` picks a free one)."""
    from panjoin.security import current

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    sec = current()
    try:
        httpd, _ = start_http_server(port, host, registry=registry, certfile=sec.cert,
                                     keyfile=sec.key)
    except OSError as e:
        raise ValueError(f"cannot serve metrics on {host}:{port}: {e}; pick another "
                         "--metrics-port (0: any free one)") from None
    bound = httpd.server_port
    log.info("metrics on http%s://%s:%d/metrics", "s" if sec.cert else "", host, bound)
    return httpd, bound


def with_metrics(server, collector, port: int | None, host: str) -> None:
    """Serve ``collector`` next to gRPC ``server`` (:func:`serve_metrics`), unless
    ``port`` is None; ``server.metrics_port`` is the bound port (None: no metrics), and
    ``server.stop`` stops the metrics too."""
    beside(server, "metrics_port", port, lambda p: serve_metrics(collector, p, host))


def beside(server, attr: str, port: int | None, serve) -> None:
    """Start an HTTP server next to gRPC ``server`` with ``serve(port) -> (httpd, bound
    port)``, unless ``port`` is None; ``server.<attr>`` is the bound port (None: not
    started), and ``server.stop`` stops it too."""
    setattr(server, attr, None)
    if port is None:
        return
    httpd, bound = serve(port)
    setattr(server, attr, bound)
    stop_with(server, httpd)


def stop_with(server, httpd) -> None:
    """Make gRPC ``server``'s ``stop`` shut HTTP server ``httpd`` down first."""
    stop = server.stop

    def stop_both(grace):
        httpd.shutdown()
        httpd.server_close()
        return stop(grace)

    server.stop = stop_both


def _counter(name, doc, labels=()):
    return CounterMetricFamily(name, doc, labels=list(labels))


def _gauge(name, doc, labels=()):
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _histogram(name: str, doc: str, t: Timings) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, buckets=t.cumulative(), sum_value=t.sum)


# ---------------------------------------------------------------------- manager


@dataclass
class Retired:
    """The counters of the joins a manager has closed, so that its totals never go down."""

    joins: int = 0
    tuples_by: dict = field(default_factory=lambda: dict.fromkeys(STREAMS, 0))
    late_by: dict = field(default_factory=lambda: dict.fromkeys(STREAMS, 0))
    pairs: int = 0
    batches: int = 0
    failovers: int = 0
    promoted: int = 0
    pauses: int = 0
    batch_s: Timings = field(default_factory=Timings)
    latency_s: Timings = field(default_factory=Timings)

    def add(self, engine, backend) -> None:
        """Fold a closing join's counters in."""
        n = join_numbers(engine, backend)
        self.joins += 1
        for s in STREAMS:
            self.tuples_by[s] += n["tuples_by"][s]
            self.late_by[s] += n["late_by"][s]
        for k in ("pairs", "batches", "failovers", "promoted", "pauses"):
            setattr(self, k, getattr(self, k) + n[k])
        for k in ("batch_s", "latency_s"):
            if n[k] is not None:
                getattr(self, k).add(n[k])


def join_numbers(engine, backend) -> dict:
    """A join's counters, whether its engine is a ring's (JoinEngine) or a handshake
    chain's (which counts fewer things: no per-stream split, no histograms)."""
    st = engine.stats
    tuples_by = getattr(st, "tuples_by", None) or {"R": st.tuples_in, "S": 0}
    late_by = getattr(st, "late_by", None) or {"R": st.late, "S": 0}
    adm = getattr(engine, "admission", None)
    return {"tuples_by": dict(tuples_by), "late_by": dict(late_by), "pairs": st.results,
            "batches": st.batches, "failovers": getattr(backend, "failovers", 0),
            "promoted": getattr(backend, "promoted", 0),
            "pauses": adm.pauses if adm is not None else 0,
            "batch_s": getattr(st, "batch_s", None), "latency_s": getattr(st, "latency_s", None)}


def _placement(engine, backend, workers: list[str]) -> dict[tuple[str, str], list[int]]:
    """``{(worker address, stream): [subwindows, tuples]}`` of a ring join, read from the
    engine's rings (the join's thread may change them meanwhile: a copy, and none
    this time if it changed under the copy)."""
    sessions = getattr(backend, "sessions", None)
    names = [s.address for s in sessions] if sessions else list(workers)
    out: dict[tuple[str, str], list[int]] = {}
    for s in STREAMS:
        for w in names:
            out[(w, s)] = [0, 0]
    rings = getattr(engine, "rings", None)
    if not rings:
        return out
    for s in STREAMS:
        try:
            subs = list(rings[s])
        except RuntimeError:  # changed while copied: the next scrape has it
            continue
        for sub in subs:
            w = names[sub.worker] if 0 <= sub.worker < len(names) else str(sub.worker)
            cell = out.setdefault((w, s), [0, 0])
            cell[0] += 1
            cell[1] += sub.count
    return out


def manager_totals(sv) -> tuple[list, dict]:
    """The open joins ``[(join_id, join, join_numbers)]`` of manager servicer ``sv``, and
    its totals over all joins, the closed ones (:class:`Retired`) included: the keys of
    :func:`join_numbers` (``batch_s`` and ``latency_s`` merged :class:`Timings`) plus
    ``joins_open`` and ``joins_opened``. The metrics and the status page
    (:mod:`panjoin.ops.page`) both read these."""
    with sv.lock:
        joins = list(sv.joins.items())
    old: Retired = sv.retired
    per = [(jid, j, join_numbers(j.engine, j.backend)) for jid, j in joins]
    tot = {"tuples_by": {s: old.tuples_by[s] + sum(n["tuples_by"][s] for *_, n in per)
                         for s in STREAMS},
           "late_by": {s: old.late_by[s] + sum(n["late_by"][s] for *_, n in per)
                       for s in STREAMS},
           "joins_open": len(joins), "joins_opened": old.joins + len(joins)}
    for key in ("pairs", "batches", "failovers", "promoted", "pauses"):
        tot[key] = getattr(old, key) + sum(n[key] for *_, n in per)
    for key in ("batch_s", "latency_s"):
        t = Timings()
        t.add(getattr(old, key))
        for *_, n in per:
            if n[key] is not None:
                t.add(n[key])
        tot[key] = t
    return per, tot


class ManagerCollector:
    """The manager's metrics, read from its open joins and :class:`Retired` at scrape
    time. ``servicer``: a :class:`panjoin.manager.service.ManagerServicer`."""

    def __init__(self, servicer):
        self.servicer = servicer

    def collect(self):
        sv = self.servicer
        per, tot = manager_totals(sv)
        tin = _counter("panjoin_tuples_in", "Tuples pushed, all joins", ["stream"])
        late = _counter("panjoin_late", "Late tuples (neither joined nor stored), all joins",
                        ["stream"])
        for s in STREAMS:
            tin.add_metric([s], tot["tuples_by"][s])
            late.add_metric([s], tot["late_by"][s])
        yield tin
        yield late
        for key, name, doc in (
                ("pairs", "panjoin_pairs_out", "Result pairs produced, all joins"),
                ("batches", "panjoin_batches", "Batches processed, all joins"),
                ("failovers", "panjoin_failovers", "Worker failures recovered from"),
                ("promoted", "panjoin_promoted_backups",
                 "Backup subwindows promoted to primaries after a worker failure"),
                ("pauses", "panjoin_admission_pauses",
                 "Times a handshake chain held its input back (a result FIFO was full)")):
            c = _counter(name, doc)
            c.add_metric([], tot[key])
            yield c
        for key, name, doc in (
                ("batch_s", "panjoin_batch_seconds", "Wall time to process one batch"),
                ("latency_s", "panjoin_pair_latency_seconds",
                 "Event-to-result latency of each pair: its probe round collected minus "
                 "the arrival of the oldest tuple of the probing batch")):
            yield _histogram(name, doc, tot[key])
        g = _gauge("panjoin_joins_open", "Joins open now")
        g.add_metric([], tot["joins_open"])
        yield g
        c = _counter("panjoin_joins_opened", "Joins opened since the manager started")
        c.add_metric([], tot["joins_opened"])
        yield c
        yield from self._per_join(per, sv.workers)

    @staticmethod
    def _per_join(per, workers):
        fam = {
            "tin": _counter("panjoin_join_tuples_in", "Tuples pushed to the join",
                            ["join_id", "stream"]),
            "late": _counter("panjoin_join_late", "Late tuples of the join",
                             ["join_id", "stream"]),
            "pairs": _counter("panjoin_join_pairs_out", "Pairs the join produced", ["join_id"]),
            "batches": _counter("panjoin_join_batches", "Batches the join processed",
                                ["join_id"]),
            "subs": _gauge("panjoin_join_subwindows", "Subwindows held, per worker and stream",
                           ["join_id", "worker", "stream"]),
            "tuples": _gauge("panjoin_join_window_tuples",
                             "Tuples held in the window, per worker and stream",
                             ["join_id", "worker", "stream"]),
            "bytes": _gauge("panjoin_join_held_bytes",
                            "Bytes the workers hold for the join (backups included), as of "
                            "their last feedback", ["join_id"]),
            "alive": _gauge("panjoin_join_workers_alive", "Workers the join still uses",
                            ["join_id"]),
        }
        for jid, j, n in per:
            for s in STREAMS:
                fam["tin"].add_metric([jid, s], n["tuples_by"][s])
                fam["late"].add_metric([jid, s], n["late_by"][s])
            fam["pairs"].add_metric([jid], n["pairs"])
            fam["batches"].add_metric([jid], n["batches"])
            for (w, s), (subs, tuples) in _placement(j.engine, j.backend, workers).items():
                fam["subs"].add_metric([jid, w, s], subs)
                fam["tuples"].add_metric([jid, w, s], tuples)
            sessions = getattr(j.backend, "sessions", None) or []
            fam["bytes"].add_metric([jid], sum(s.load.nbytes for s in sessions if s.alive))
            fam["alive"].add_metric([jid], sum(1 for s in sessions if s.alive)
                                    if sessions else len(workers))
        yield from fam.values()


# ---------------------------------------------------------------------- worker


class WorkerCollector:
    """A worker's metrics, read from its sessions at scrape time. ``servicer``: a
    :class:`workers.server.WorkerServicer` (its ``retired_s`` keeps the insert and probe
    seconds of the sessions that ended)."""

    def __init__(self, servicer):
        self.servicer = servicer

    def collect(self):
        sv = self.servicer
        with sv.lock:
            backends = [s.backend for s in sv.sessions.values() if s.backend is not None]
            n_sessions, reserved = len(sv.sessions), sv.reserved
            insert_s, probe_s = sv.retired_s
        subs = dict.fromkeys(STREAMS, 0)
        tuples = dict.fromkeys(STREAMS, 0)
        held = 0
        for b in backends:
            insert_s += b.stats.insert_s
            probe_s += b.stats.probe_s
            for sub_id, st in list(getattr(b, "subs", {}).items()):
                s = b.streams.get(sub_id, "R")
                subs[s] += 1
                tuples[s] += len(st)
                held += st.nbytes
        g = _gauge("panjoin_worker_sessions", "Sessions open (one per join and manager)")
        g.add_metric([], n_sessions)
        yield g
        c = _counter("panjoin_worker_commands", "Commands carried out")
        c.add_metric([], sv.commands)
        yield c
        gs = _gauge("panjoin_worker_subwindows", "Subwindows held (backups included)",
                    ["stream"])
        gt = _gauge("panjoin_worker_tuples", "Tuples held (backups included)", ["stream"])
        for s in STREAMS:
            gs.add_metric([s], subs[s])
            gt.add_metric([s], tuples[s])
        yield gs
        yield gt
        for name, doc, v in (
                ("panjoin_worker_held_bytes", "Bytes held by the subwindows' indexes", held),
                ("panjoin_worker_reserved_bytes",
                 "Bytes the subwindows reserve against the memory budget", reserved),
                ("panjoin_worker_memory_limit_bytes", "The memory budget (--memory-limit)",
                 sv.memory_limit)):
            g = _gauge(name, doc)
            g.add_metric([], v)
            yield g
        for name, doc, v in (
                ("panjoin_worker_insert_seconds", "Seconds spent inserting", insert_s),
                ("panjoin_worker_probe_seconds", "Seconds spent probing", probe_s)):
            c = _counter(name, doc)
            c.add_metric([], v)
            yield c


# ---------------------------------------------------------------------- pipeline


class PipelineCollector:
    """The Kafka pipeline's metrics (:class:`spark_conn.pipeline.Pipeline`): its
    ``stats``, its watermark and the offsets read and committed per partition."""

    def __init__(self, pipeline):
        self.pipeline = pipeline

    def collect(self):
        p = self.pipeline
        st = dict(p.stats)
        c = _counter("panjoin_pipeline_records_in",
                     "Records read from the input topics (malformed ones included)",
                     ["stream"])
        for s in STREAMS:
            c.add_metric([s], st.get(f"tuples_{s.lower()}", 0))
        yield c
        for key, name, doc in (
                ("joined", "panjoin_pipeline_pairs_out", "Joined records written"),
                ("late", "panjoin_pipeline_late", "Late records written to the late topic"),
                ("dead", "panjoin_pipeline_dead_letters",
                 "Malformed records written to the dead-letter topic"),
                ("batches", "panjoin_pipeline_batches", "Micro-batches joined")):
            c = _counter(name, doc)
            c.add_metric([], st.get(key, 0))
            yield c
        for t, name, doc in (
                (p.batch_s, "panjoin_pipeline_batch_seconds",
                 "Wall time of one micro-batch in foreachBatch: read, join, log and write"),
                (p.latency_s, "panjoin_pipeline_pair_latency_seconds",
                 "Event-to-result latency of each joined record: the time it was written "
                 "minus the event time (ts) of the later of its two tuples")):
            yield _histogram(name, doc, t.copy())
        wm = p.metrics_watermark()
        g = _gauge("panjoin_pipeline_watermark_seconds",
                   "The job's event-time watermark W (min over partitions of the largest ts)")
        lag = _gauge("panjoin_pipeline_watermark_lag_seconds",
                     "Wall clock minus the watermark: how far event time trails now")
        if wm is not None:
            g.add_metric([], wm / 1000.0)
            lag.add_metric([], time.time() - wm / 1000.0)
        yield g
        yield lag
        read = _gauge("panjoin_pipeline_offset_read",
                      "Next offset to read per input partition", ["topic", "partition"])
        done = _gauge("panjoin_pipeline_offset_committed",
                      "Next offset whose batch is joined and written, per input partition",
                      ["topic", "partition"])
        for fam, offs in ((read, p.offsets_read), (done, p.offsets_committed)):
            for (topic, part), off in sorted(dict(offs).items()):
                fam.add_metric([topic, str(part)], off)
        yield read
        yield done
