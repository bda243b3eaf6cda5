"""The manager's live status page (``--http-port``, off by default; 0 picks a free port).

One HTML file (``static/status.html``, inline JS) and the charting library it draws
with (uPlot, MIT, vendored under ``static/`` with its license), served by the standard
library's :class:`~http.server.ThreadingHTTPServer` from a daemon thread on the
manager's host, stopped with its gRPC server. The page polls ``/api/status`` every
second; that JSON is read from what the manager already keeps, nothing is counted for
it: :meth:`ManagerServicer.cluster_status` (the ClusterStatus rpc: each join's
counters, each worker's own Status), :func:`panjoin.ops.metrics.manager_totals`
(totals over all joins, latency histograms) and the engines' rings (each subwindow's
worker, size, seq and ts range). Rates are the page's own: the difference of two
polls' totals over their time apart.

    GET /              the page
    GET /static/NAME   uPlot's script and style sheet
    GET /api/status    {"now": 1764177000.1, "topology": "ring",
                        "totals": {"tuples_in": {"R": 2000, "S": 2000}, "pairs": 5123, ...},
                        "latency": {"pair": {"p50": 0.004, "p90": ..., "p99": ..., "n": 812},
                                    "batch": {...}},
                        "workers": [{"address": "127.0.0.1:50051", "reachable": true,
                                     "nbytes": 626688, ...}],
                        "joins": [{"join_id": "3f2a9c1b0d4e", "window": "time:1000,1000",
                                   "rings": {"R": [{"sub_id": 0, "worker": "127.0.0.1:50051",
                                                    "count": 937, "ts_min": 0, ...}], ...}}]}

Percentiles are over the last :data:`RECENT_S` seconds (all time while the manager is
younger), from the histograms' difference (:meth:`Timings.since`).

Security follows the manager's (:mod:`panjoin.security`): with a token, ``/api/status``
wants it (``?token=`` or ``Authorization: Bearer``; the page passes on its own
``?token=``); with ``--tls-cert``, HTTPS with the same certificate; the host is the
gRPC server's (loopback by default, which the manager's own bind check guards).
"""

from __future__ import annotations

import hmac
import json
import logging
import ssl
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qs, urlsplit

from panjoin.ops.metrics import STREAMS, beside, manager_totals

log = logging.getLogger("panjoin.page")

#: percentiles cover this many seconds of the latest observations
RECENT_S = 10.0
#: at most this many subwindows of a ring are listed (the newest ones)
MAX_SUBWINDOWS = 64
#: a snapshot younger than this is served again (several tabs cost one snapshot)
CACHE_S = 0.5

STATIC = {"/": ("status.html", "text/html; charset=utf-8"),
          "/static/uPlot.iife.min.js": ("uPlot.iife.min.js", "text/javascript"),
          "/static/uPlot.min.css": ("uPlot.min.css", "text/css"),
          "/static/uPlot.LICENSE": ("uPlot.LICENSE", "text/plain; charset=utf-8")}


def _static(name: str) -> bytes:
    return resources.files("panjoin.ops").joinpath("static", name).read_bytes()


def _quantiles(t) -> dict:
    return {"p50": t.quantile(0.5), "p90": t.quantile(0.9), "p99": t.quantile(0.99),
            "n": t.count}


def _ring(engine, backend) -> dict:
    """Each stream's newest subwindows, oldest first: where their primary and backup
    are (worker addresses) and what they hold. The join's thread may change the ring
    meanwhile: a copy, retried if it changed under it."""
    rings = getattr(engine, "rings", None)
    if not rings:  # a handshake chain has none
        return {}
    sessions = getattr(backend, "sessions", None) or []
    names = [s.address for s in sessions]
    where = dict(getattr(backend, "where", {}))
    backup = dict(getattr(backend, "backup", {}))

    def name(i):
        return names[i] if i is not None and 0 <= i < len(names) else None

    out = {}
    for s in STREAMS:
        subs = []
        for _ in range(10):
            try:
                subs = list(rings[s])
                break
            except RuntimeError:  # changed while copied
                continue
        out[s] = [{"sub_id": x.sub_id, "worker": name(where.get(x.sub_id, x.worker)),
                   "backup": name(backup.get(x.sub_id)), "state": x.state.value,
                   "index": x.index,
                   "count": x.count, "capacity": x.capacity,
                   "seq_start": x.seq_start if x.count else None,
                   "seq_end": x.seq_end if x.count else None,
                   "ts_min": x.ts_min if x.count else None,
                   "ts_max": x.ts_max if x.count else None}
                  for x in subs[-MAX_SUBWINDOWS:]]
        out[s + "_total"] = len(subs)
    return out


class Snapshots:
    """``/api/status`` of a manager servicer, kept for :data:`CACHE_S`, with the
    latency histograms of the last :data:`RECENT_S` seconds for the percentiles."""

    def __init__(self, servicer):
        self.servicer = servicer
        self.lock = threading.Lock()
        self.last: tuple[float, bytes] | None = None
        self.history: deque = deque()  # (monotonic time, pair latency, batch time)

    def json(self) -> bytes:
        with self.lock:
            now = time.monotonic()
            if self.last is None or now - self.last[0] > CACHE_S:
                self.last = (now, json.dumps(self.snapshot(now)).encode())
            return self.last[1]

    def snapshot(self, now: float) -> dict:
        sv = self.servicer
        reply = sv.cluster_status()
        per, tot = manager_totals(sv)
        self.history.append((now, tot["latency_s"].copy(), tot["batch_s"].copy()))
        while len(self.history) > 1 and now - self.history[1][0] >= RECENT_S:
            self.history.popleft()
        _, pair0, batch0 = self.history[0]
        recent = (tot["latency_s"].since(pair0), tot["batch_s"].since(batch0))
        if recent[0].count == 0 and recent[1].count == 0:  # nothing lately: all time
            recent = (tot["latency_s"], tot["batch_s"])
        totals = {k: v for k, v in tot.items() if k not in ("batch_s", "latency_s")}
        totals["tuples_in"] = totals.pop("tuples_by")
        totals["late"] = totals.pop("late_by")
        workers = []
        for w in reply.workers:
            st = w.status
            workers.append({"address": w.address, "reachable": w.reachable, "error": w.error,
                            "subwindows": st.subwindows, "tuples": st.tuples,
                            "nbytes": st.nbytes, "reserved": st.memory_reserved,
                            "memory_limit": st.memory_limit, "sessions": st.sessions})
        objs = {jid: j for jid, j, _ in per}
        joins = []
        for js in reply.joins:
            st, cfg = js.status, js.settings
            j = objs.get(st.join_id)
            sessions = (getattr(j.backend, "sessions", None) or []) if j is not None else []
            joins.append({
                "join_id": st.join_id, "window": cfg.window, "predicate": cfg.predicate,
                "index": cfg.index, "tuples_in": st.tuples_in, "pairs": st.results,
                "late": st.late, "batches": st.batches, "window_r": st.window_r,
                "window_s": st.window_s, "memory_bytes": st.memory_bytes,
                "workers_alive": st.workers_alive, "failovers": st.failovers,
                "probes_in_flight": st.probes_in_flight,
                "loads": [{"address": s.address, "alive": s.alive, "retiring": s.retiring,
                           "subwindows": s.load.subwindows, "tuples": s.load.tuples,
                           "nbytes": s.load.nbytes} for s in sessions],
                "rings": _ring(j.engine, j.backend) if j is not None else {}})
        return {"now": time.time(), "topology": reply.topology, "workers": workers,
                "totals": totals, "joins": joins,
                "latency": {"pair": _quantiles(recent[0]), "batch": _quantiles(recent[1]),
                            "window_s": RECENT_S}}


def _handler(snapshots: Snapshots, token: str | None):
    want = f"Bearer {token}".encode() if token else None

    class Handler(BaseHTTPRequestHandler):
        server_version = "panjoin"

        def do_GET(self):  # noqa: N802 (http.server's name)
            url = urlsplit(self.path)
            if url.path in STATIC:
                name, ctype = STATIC[url.path]
                return self._send(200, ctype, _static(name))
            if url.path == "/favicon.ico":
                return self._send(204, "image/x-icon", b"")
            if url.path != "/api/status":
                return self._send(404, "text/plain", b"not found: the page is at /, its "
                                  b"data at /api/status\n")
            if want is not None and not self._authorized(url):
                return self._send(401, "application/json", json.dumps(
                    {"error": "this manager has a token: open the page as /?token=TOKEN "
                              "(or send 'Authorization: Bearer TOKEN')"}).encode())
            try:
                body = snapshots.json()
            except Exception as e:  # the page shows it and polls on
                log.exception("status page snapshot failed")
                return self._send(500, "application/json",
                                  json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
            self._send(200, "application/json", body)

        def _authorized(self, url) -> bool:
            got = self.headers.get("Authorization", "")
            q = parse_qs(url.query).get("token")
            if q:
                got = f"Bearer {q[0]}"
            return hmac.compare_digest(got.encode(), want)

        def _send(self, code: int, ctype: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args):  # not one stderr line a poll
            log.debug("%s " + fmt, self.address_string(), *args)

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # e.g. plaintext sent to HTTPS
        log.debug("status page: a request from %s failed", client_address, exc_info=True)


def serve_page(servicer, port: int, host: str = "127.0.0.1") -> tuple[ThreadingHTTPServer, int]:
    """Serve the status page of manager ``servicer`` at ``http(s)://host:port/`` from a
    daemon thread. Returns the server (``shutdown()`` stops it) and the bound port."""
    from panjoin.security import current

    sec = current()
    try:
        httpd = _Server((host, port), _handler(Snapshots(servicer), sec.token()))
    except OSError as e:
        raise ValueError(f"cannot serve the status page on {host}:{port}: {e}; pick another "
                         "--http-port (0: any free one)") from None
    if sec.cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(sec.cert, sec.key)
        # the handshake on the first read, in the request's thread: a slow client
        # does not hold up the accepting one
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True,
                                       do_handshake_on_connect=False)
    threading.Thread(target=httpd.serve_forever, daemon=True, name="status-page").start()
    bound = httpd.server_port
    log.info("status page on http%s://%s:%d/", "s" if sec.cert else "", host, bound)
    return httpd, bound


def with_page(server, servicer, port: int | None, host: str) -> None:
    """Serve ``servicer``'s page next to gRPC ``server`` (:func:`serve_page`), unless
    ``port`` is None; ``server.http_port`` is the bound port (None: no page), and
    ``server.stop`` stops the page too."""
    beside(server, "http_port", port, lambda p: serve_page(servicer, p, host))
