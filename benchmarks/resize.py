"""Issue 30, item 5: a resize under load. A streaming join runs open-loop at a fixed
rate on a cluster of 2 workers; at ``t_add`` a third worker is added, at ``t_remove``
the first is removed (``AddWorker`` / ``RemoveWorker``, what ``panjoin ctl`` calls),
and the run records, per bucket of 250 ms, the input rate, the pairs out per second
and the pairs' p50/p99 latency, plus the worker holding each new subwindow (the
manager's status page, ``/api/status``, polled every 0.5 s; it lists a ring's
newest 64 subwindows, so none is missed). At the end the pairs
are checked against an exact reference (:func:`equi_count_reference`).

What runs: 3 worker processes and ``panjoin manager`` over the first 2 (its own
process, ``--http-port``), as :mod:`panjoin.bench.latency`'s cluster target; the
source is this process, the join a live one (``Client.live``) opened with
``max_latency_ms``. The source is the latency benchmark's: tuple j of the measured
part is due at ``t0 + j / rate``, pushed when due, never early, and a pair's latency
is the time it was polled minus the due time of its later tuple (a stall counts).
The window is filled closed-loop first (untimed), so subwindows expire from the start.

    python -m benchmarks.resize --quick     # W 64K, 50K tuples/s, 16 s: about 40 s
    python -m benchmarks.resize --json benchmarks/results/resize.json
        # W 256K per stream, 100K tuples/s, 45 s, add at 15 s, remove at 30 s

Writes ``benchmarks/plots/resize[-quick].png`` (rates, latency, where each new
subwindow went, subwindows held per worker; vertical lines at the add and the remove).

A time bucket, worked: 250 ms holding 25,000 pushed tuples and 24,100 pairs polled,
whose latencies have median 31 ms -> ``{"t": 4.0, "in_per_s": 100000, "out_per_s":
96400, "p50_ms": 31.0, ...}``.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BUCKET_S = 0.25
#: the status page is polled this often for the rings (its own cache is 0.5 s)
POLL_PAGE_S = 0.5
#: the source's longest sleep between pushes (a tuple pushed up to this late waits on
#: the schedule: it counts against latency); coarse enough to leave the CPU to the cluster
SOURCE_STEP_S = 0.002


# ---------------------------------------------------------------------- the reference


def equi_count_reference(stream: np.ndarray, ids: np.ndarray, key: np.ndarray, wr: int,
                         ws: int, block: int = 1 << 18) -> np.ndarray:
    """Every (r_id, s_id) of an equi join on count windows ``count:wr,ws`` over tuples
    in arrival order (DESIGN section 2), sorted: an exact reference in numpy for
    inputs far beyond :func:`panjoin.reference.reference_join`'s quadratic reach.

    Each R tuple is matched with every S tuple of its key (S sorted by key), then the
    window decides: ``s`` came first and is among the last ``ws`` S tuples before
    ``r`` (its S index >= the S count before ``r`` minus ``ws``), or ``r`` came first
    and is among the last ``wr`` R tuples before ``s``. Example, ``count:1,1``, arrivals
    r1(5) s2(5) r3(5): r1-s2 (r1 is the last R before s2), r3-s2 (s2 the last S before
    r3) -> [[1, 2], [3, 2]]."""
    from panjoin.reference import sort_pairs

    is_r = stream == 0
    before_r = np.cumsum(is_r) - is_r  # R tuples before each position (an R's own index)
    before_s = np.cumsum(~is_r) - ~is_r
    rpos, spos = np.flatnonzero(is_r), np.flatnonzero(~is_r)
    spos = spos[np.argsort(key[spos], kind="stable")]
    skey = key[spos]
    out = []
    for a in range(0, len(rpos), block):
        rp = rpos[a:a + block]
        lo = np.searchsorted(skey, key[rp], "left")
        cnt = np.searchsorted(skey, key[rp], "right") - lo
        ri = np.repeat(rp, cnt)
        first = np.repeat(np.cumsum(cnt) - cnt, cnt)
        sj = spos[np.repeat(lo, cnt) + np.arange(len(ri)) - first]
        s_first = sj < ri
        ok = np.where(s_first, before_s[sj] >= before_s[ri] - ws,
                      before_r[ri] >= before_r[sj] - wr)
        out.append(np.stack([ids[ri[ok]], ids[sj[ok]]], axis=1))
    return sort_pairs(np.concatenate(out) if out else np.empty((0, 2), np.int64))


# ---------------------------------------------------------------------- per bucket


def buckets(pushes: np.ndarray, polls: np.ndarray, latency: np.ndarray, seconds: float,
            width: float = BUCKET_S) -> list[dict]:
    """Per ``width`` seconds from 0 to ``seconds``: tuples pushed per s (``pushes``:
    rows (time, tuples)), pairs polled per s (``polls``: each pair's poll time) and the
    p50/p99 latency (ms) of the pairs polled in the bucket (``latency``: each pair's, s;
    None in a bucket without pairs)."""
    n = int(np.ceil(seconds / width))
    edges = np.arange(n + 1) * width
    tin = np.histogram(pushes[:, 0], edges, weights=pushes[:, 1])[0] if len(pushes) else \
        np.zeros(n)
    at = np.clip(np.searchsorted(edges, polls, "right") - 1, 0, n - 1) if len(polls) else \
        np.empty(0, np.int64)
    inside = (polls >= 0) & (polls < edges[-1]) if len(polls) else np.empty(0, bool)
    rows = []
    for b in range(n):
        lat = latency[inside & (at == b)] * 1000.0
        q = np.quantile(lat, [0.5, 0.99]) if len(lat) else (None, None)
        rows.append({"t": float(edges[b]), "in_per_s": float(tin[b] / width),
                     "out_per_s": len(lat) / width,
                     "p50_ms": None if q[0] is None else float(q[0]),
                     "p99_ms": None if q[1] is None else float(q[1])})
    return rows


# ---------------------------------------------------------------------- the run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RingWatcher(threading.Thread):
    """Polls the manager's ``/api/status``: the first time each subwindow is seen (its
    stream and worker), and per poll the subwindows each worker holds for the join."""

    def __init__(self, url: str, t0: float):
        super().__init__(daemon=True, name="ring-watcher")
        self.url, self.t0 = url, t0
        # (stream, sub_id) -> {"t", "stream", "sub_id", "worker"}; those of the first
        # poll (the fill's) are not new: "t" None
        self.seen: dict = {}
        self.held: list = []  # (t, {worker: subwindows})
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=10) as r:
                    snap = json.loads(r.read())
            except OSError:
                snap = None
            t = time.perf_counter() - self.t0
            if snap is not None:
                count: dict = {}
                for j in snap["joins"]:
                    for s in ("R", "S"):  # beside them: "R_total", "S_total"
                        for x in j["rings"].get(s, ()):
                            self.seen.setdefault((s, x["sub_id"]), {
                                "t": t if self.held else None, "stream": s,
                                "sub_id": x["sub_id"], "worker": x["worker"]})
                            count[x["worker"]] = count.get(x["worker"], 0) + 1
                self.held.append((t, count))
            self.stop.wait(POLL_PAGE_S)


def run(window: int, rate: float, seconds: float, t_add: float, t_remove: float, *,
        nsub: int, max_latency_ms: float = 20.0, replicas: int = 1, seed: int = 1,
        echo=print) -> dict:
    """One run (see the module docstring); returns its settings, its buckets, the new
    subwindows, the subwindows held per poll, the resize calls' times and the check."""
    from panjoin.bench.latency import LiveTarget, _due_lookup
    from panjoin.client import Client
    from panjoin.generate import generate
    from panjoin.launch import start_manager, start_workers
    from panjoin.proto.panjoin.v1 import manager_pb2

    fill = 2 * window
    total = int(rate * seconds)
    ev = generate(fill + total, "uniform", key_max=window, seed=seed)
    port = _free_port()
    t_start = time.perf_counter()
    ws = start_workers(3)
    m = None
    try:
        m = start_manager([w.address for w in ws[:2]], args=[
            "--replicas", str(replicas), "--http-port", str(port)])
        addr = [w.address for w in ws]
        echo(f"workers {addr[0]}, {addr[1]} (+ {addr[2]} later), manager {m.address}, "
             f"started in {time.perf_counter() - t_start:.1f} s")
        with Client(m.address) as client:
            jid = client.open(f"count:{window},{window}", "eq", "bisort",
                              subwindow_size=nsub, max_latency_ms=max_latency_ms)
            target = LiveTarget(client, jid)
            got_r, got_s, lat, polled = [], [], [], []
            # the fill, closed-loop and untimed: the window is full when the clock starts
            for a in range(0, fill, 1 << 15):
                target.push(ev.slice(a, min(fill, a + (1 << 15))))
                r, s = target.poll()
                got_r.append(r)
                got_s.append(s)
            while target.pending():
                target.flush()
                r, s = target.poll()
                got_r.append(r)
                got_s.append(s)
                time.sleep(0.001)
            due_r, due_s = _due_lookup(ev, fill, rate)
            t0 = time.perf_counter() + 0.005
            watcher = RingWatcher(f"http://127.0.0.1:{port}/api/status", t0)
            watcher.start()
            calls: dict = {}

            def resize(rpc: str, address: str, at: float) -> None:
                time.sleep(max(0.0, t0 + at - time.perf_counter()))
                t1 = time.perf_counter()
                reply = getattr(client.stub, rpc)(manager_pb2.WorkerRef(address=address),
                                                  timeout=120)
                calls[rpc] = {"address": address, "asked": t1 - t0,
                              "done": time.perf_counter() - t0, "workers": list(reply.workers)}

            threads = [threading.Thread(target=resize, args=a, daemon=True) for a in (
                ("AddWorker", addr[2], t_add), ("RemoveWorker", addr[0], t_remove))]
            for th in threads:
                th.start()

            def take(r, s):
                if r.size:
                    now = time.perf_counter() - t0
                    got_r.append(r)
                    got_s.append(s)
                    d = np.maximum(due_r(r), due_s(s))
                    timed = np.isfinite(d)  # pairs of two fill tuples have no due time
                    lat.append(now - d[timed])
                    polled.append(np.full(int(timed.sum()), now))

            pushes = []
            pushed = 0
            while pushed < total:
                now = time.perf_counter()
                due_n = min(total, int((now - t0) * rate) + 1) if now >= t0 else 0
                if due_n > pushed:
                    target.push(ev.slice(fill + pushed, fill + due_n))
                    pushes.append((now - t0, due_n - pushed))
                    pushed = due_n
                take(*target.poll())
                wait = t0 + pushed / rate - time.perf_counter()
                if wait > 0:  # a coarser step than the latency benchmark's: less CPU
                    time.sleep(min(wait, SOURCE_STEP_S))
            target.flush()
            deadline = time.monotonic() + 120
            while target.pending() and time.monotonic() < deadline:
                take(*target.poll())
                time.sleep(0.0005)
            take(*target.poll())
            end = time.perf_counter() - t0
            for th in threads:
                th.join(timeout=120)
            time.sleep(2 * POLL_PAGE_S)  # the last subwindows seen
            watcher.stop.set()
            watcher.join(timeout=30)
            st = client.status(jid)
            target.close()
    finally:
        for p in [m, *ws]:
            if p is not None:
                p.stop()
    got = np.stack([np.concatenate(got_r), np.concatenate(got_s)], axis=1)
    t_ref = time.perf_counter()
    ref = equi_count_reference(ev.stream, ev.id, ev.key, window, window)
    from panjoin.reference import sort_pairs

    got = sort_pairs(got)
    exact = len(got) == len(ref) and bool(np.array_equal(got, ref))
    echo(f"pairs {len(got):,}, reference {len(ref):,}: "
         f"{'equal' if exact else 'DIFFERENT'} ({time.perf_counter() - t_ref:.1f} s to check)")
    lat_a = np.concatenate(lat) if lat else np.empty(0)
    # the buckets cover the source's run; pairs polled after it (the last batches,
    # flushed) are in the totals and the check, not in a bucket of their own
    rows = buckets(np.array(pushes, float).reshape(-1, 2),
                   np.concatenate(polled) if polled else np.empty(0), lat_a, seconds)
    subs = sorted((x for x in watcher.seen.values() if x["t"] is not None),
                  key=lambda x: (x["t"], x["sub_id"]))
    return {"settings": {"window": f"count:{window},{window}", "predicate": "eq",
                         "index": "bisort", "keys": f"uniform [0, {window}]", "rate": rate,
                         "seconds": seconds, "subwindow_size": nsub,
                         "max_latency_ms": max_latency_ms, "replicas": replicas,
                         "bucket_s": BUCKET_S, "fill": fill, "t_add": t_add,
                         "t_remove": t_remove},
            "workers": addr, "calls": calls, "buckets": rows, "new_subwindows": subs,
            "held": [{"t": t, "by_worker": c} for t, c in watcher.held],
            "pairs": int(len(got)), "reference_pairs": int(len(ref)), "exact": exact,
            "batches": int(st.batches), "end_s": end,
            "p50_ms": float(np.quantile(lat_a, 0.5) * 1000) if len(lat_a) else None,
            "p99_ms": float(np.quantile(lat_a, 0.99) * 1000) if len(lat_a) else None}


# ---------------------------------------------------------------------- report


def summary(res: dict) -> list[str]:
    """Mean rates and latency before the add, between add and remove, after the
    remove (the first second after each change apart), and where new subwindows went."""
    s = res["settings"]
    cuts = [(0.0, s["t_add"]), (s["t_add"] + 1, s["t_remove"]),
            (s["t_remove"] + 1, s["seconds"])]
    names = ["2 workers", "3 workers", "2 workers (first removed)"]
    out = []
    for name, (a, b) in zip(names, cuts, strict=True):
        rows = [r for r in res["buckets"] if a <= r["t"] < b]
        p99 = [r["p99_ms"] for r in rows if r["p99_ms"] is not None]
        p50 = [r["p50_ms"] for r in rows if r["p50_ms"] is not None]
        subs = [x for x in res["new_subwindows"] if a <= x["t"] < b]
        where = {}
        for x in subs:
            where[x["worker"]] = where.get(x["worker"], 0) + 1
        out.append(f"| {name} | {a:.0f}-{b:.0f} s | "
                   f"{np.mean([r['in_per_s'] for r in rows]):,.0f} | "
                   f"{np.mean([r['out_per_s'] for r in rows]):,.0f} | "
                   f"{np.median(p50) if p50 else float('nan'):.1f} | "
                   f"{np.median(p99) if p99 else float('nan'):.1f} | "
                   f"{max(p99) if p99 else float('nan'):.1f} | "
                   + ", ".join(sorted(f"{_short(w, res)}: {n}" for w, n in where.items()))
                   + " |")
    return ["| phase | time | in tuples/s | pairs/s | median p50 ms | median p99 ms | "
            "worst p99 ms | new subwindows by worker |", "|---|---|---:|---:|---:|---:|---:|---|",
            *out]


def _short(worker: str, res: dict) -> str:
    return f"w{res['workers'].index(worker) + 1}" if worker in res["workers"] else worker


def plot(res: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, rows = res["settings"], res["buckets"]
    t = [r["t"] + BUCKET_S / 2 for r in rows]
    fig, ax = plt.subplots(4, 1, figsize=(8, 9), sharex=True,
                           gridspec_kw={"height_ratios": [3, 3, 1.6, 2]})
    ax[0].plot(t, [r["in_per_s"] / 1e3 for r in rows], label="input")
    ax[0].plot(t, [r["out_per_s"] / 1e3 for r in rows], label="pairs out")
    ax[0].set_ylabel("K per s")
    ax[0].legend(fontsize=8, loc="lower right")
    for q, style in (("p50_ms", "--"), ("p99_ms", "-")):
        ax[1].plot(t, [r[q] if r[q] is not None else np.nan for r in rows], style,
                   marker=".", markersize=3, label=q.split("_")[0])
    ax[1].set_yscale("log")
    ax[1].set_ylabel("pair latency (ms)\n(gap: no pair out)")
    ax[1].legend(fontsize=8, loc="upper right")
    workers = res["workers"]
    for x in res["new_subwindows"]:
        y = workers.index(x["worker"]) + 1 if x["worker"] in workers else 0
        ax[2].plot(x["t"], y, "o" if x["stream"] == "R" else "x", color=f"C{y - 1}",
                   markersize=4)
    ax[2].set_yticks(range(1, len(workers) + 1), [f"w{i + 1}" for i in range(len(workers))])
    ax[2].set_ylim(0.5, len(workers) + 0.5)
    ax[2].set_ylabel("new subwindow\n(o R, x S)")
    for i, w in enumerate(workers):
        ax[3].step([h["t"] for h in res["held"]], [h["by_worker"].get(w, 0) for h in res["held"]],
                   where="post", color=f"C{i}", label=f"w{i + 1}")
    ax[3].set_ylabel("subwindows held")
    ax[3].set_xlabel("time (s)")
    ax[3].legend(fontsize=8, loc="upper left", ncol=3)
    for a in ax:
        a.axvline(s["t_add"], color="g", lw=1, ls=":")
        a.axvline(s["t_remove"], color="r", lw=1, ls=":")
        a.grid(True, alpha=0.3)
    ax[0].set_title(f"resize under load: {s['window']} eq, {s['rate'] / 1e3:,.0f}K tuples/s, "
                    f"NSub {s['subwindow_size']:,}\nw3 added at {s['t_add']:.1f} s (green), "
                    f"w1 removed at {s['t_remove']:.1f} s (red)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="W 64K, 50K tuples/s, 16 s (add at 5 s, remove at 10 s)")
    ap.add_argument("--rate", type=float, help="tuples/s (default 100K; quick 50K)")
    ap.add_argument("--seconds", type=float, help="measured seconds (default 45; quick 16)")
    ap.add_argument("--max-latency", type=float, default=20.0, metavar="MS")
    ap.add_argument("--replicas", type=int, default=1, choices=[1, 2])
    ap.add_argument("--json", metavar="PATH", help="write the whole result here")
    ap.add_argument("--plot", metavar="PATH", help="the figure (default "
                    "benchmarks/plots/resize[-quick].png)")
    a = ap.parse_args(argv)
    w = 1 << 16 if a.quick else 1 << 18
    rate = a.rate or (50_000 if a.quick else 100_000)
    secs = a.seconds or (16.0 if a.quick else 45.0)
    res = run(w, rate, secs, secs / 3, 2 * secs / 3, nsub=w // 8,
              max_latency_ms=a.max_latency, replicas=a.replicas)
    for k in ("AddWorker", "RemoveWorker"):
        c = res["calls"].get(k)
        if c:
            print(f"{k} {c['address']}: asked at {c['asked']:.2f} s, in effect at "
                  f"{c['done']:.2f} s")
    print("\n".join(summary(res)))
    print(f"whole run: p50 {res['p50_ms']:.1f} ms, p99 {res['p99_ms']:.1f} ms, "
          f"{res['batches']:,} batches")
    out = Path(a.plot) if a.plot else HERE / "plots" / f"resize{'-quick' if a.quick else ''}.png"
    plot(res, out)
    print(f"plot: {out}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0 if res["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
