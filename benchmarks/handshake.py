"""Handshake join chain vs the PanJoin ring on the handshake join paper's section 5.2 workload.

R = (x int, y float, z char[20]), S = (a int, b float, c double, d bool), all
values uniform in 1..10000, symmetric rates (R and S alternate at random), and
the two-dimensional band join

    WHERE r.x BETWEEN s.a - 10 AND s.a + 10 AND r.y BETWEEN s.b - 10 AND s.b + 10

over count windows of W tuples per stream. Both topologies join on the x band
(the key) and apply the y condition as a residual filter to the result pairs.

- handshake: a chain of 1, 2 and 4 node processes (nested-loop segments, the
  paper's immediate scan), driven by the manager (:class:`HandshakeChain`);
- ring: :class:`JoinEngine` with BI-Sort subwindows on 2 worker processes
  (``GrpcBackend``), and in-process for reference at the small window.

Each run first fills both windows (2W tuples, untimed), then times the next
``measure`` tuples, ending with a flush (every pair found): sustained input
tuples/s with full windows. A nested-loop chain does W comparisons per input
tuple, so its rate at 1M-tuple windows follows from the rates measured at
smaller W (rate x W is its comparison rate; the table reports it), whereas the
BI-Sort ring is measured at W = 1M directly.

    python -m benchmarks.handshake --quick     # chain W 4K, 16K; ring W 16K, 1M (~15 min here)
    python -m benchmarks.handshake             # chain W 4K, 16K, 64K; ring W 16K, 1M, 2M
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from panjoin.events import EventTable
from panjoin.handshake.chain import HandshakeChain
from panjoin.launch import start_workers
from panjoin.manager.engine import JoinEngine

HERE = Path(__file__).parent
BAND = 10


class Workload:
    """The section 5.2 tuples; ``events`` carries (stream, id, key, ts) with key = x or a."""

    def __init__(self, n: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        stream = rng.integers(0, 2, n).astype(np.uint8)
        nr = int((stream == 0).sum())
        ns = n - nr
        ids = np.empty(n, np.int64)
        ids[stream == 0] = np.arange(nr)
        ids[stream == 1] = np.arange(ns)
        self.x = rng.integers(1, 10_001, nr).astype(np.int64)
        self.y = rng.uniform(1, 10_000, nr).astype(np.float32)  # float: 4 bytes
        self.z = rng.integers(97, 123, (nr, 20)).astype(np.uint8)  # char[20]
        self.a = rng.integers(1, 10_001, ns).astype(np.int64)
        self.b = rng.uniform(1, 10_000, ns).astype(np.float32)
        self.c = rng.uniform(1, 10_000, ns)  # double
        self.d = rng.integers(0, 2, ns).astype(bool)
        key = np.empty(n, np.int64)
        key[stream == 0] = self.x
        key[stream == 1] = self.a
        self.events = EventTable(stream=stream, id=ids, key=key, ts=np.arange(n, dtype=np.int64))

    def residual(self, r: np.ndarray, s: np.ndarray) -> int:
        """Pairs that also satisfy r.y BETWEEN s.b - 10 AND s.b + 10."""
        return int((np.abs(self.y[r].astype(np.float64) - self.b[s]) <= BAND).sum())


def _timed(eng, wl: Workload, window: int, measure: int, step: int,
           count_fill: bool = True) -> tuple[float, int]:
    ev = wl.events
    fill = 2 * window
    hits = 0  # result pairs passing the y condition, fill included (a cross-check)
    for a in range(0, fill, step):
        eng.push(ev.slice(a, min(fill, a + step)))
        pairs = eng.take_results()
        if count_fill:
            hits += wl.residual(*pairs)
    t0 = time.perf_counter()
    for a in range(fill, fill + measure, step):
        eng.push(ev.slice(a, min(fill + measure, a + step)))
        hits += wl.residual(*eng.take_results())
    eng.flush()
    hits += wl.residual(*eng.take_results())
    return measure / (time.perf_counter() - t0), hits


def run_chain(wl: Workload, nodes: list[str], window: int, measure: int) -> dict:
    with HandshakeChain(nodes, f"count:{window},{window}", f"band:{BAND}", key_dtype="int64",
                        batch_size=1024, max_batch=4096, max_in_flight=8192) as ch:
        rate, hits = _timed(ch, wl, window, measure, 8192)
        st = ch.status()
    return {"topology": "handshake", "nodes": len(nodes), "window": window, "measure": measure,
            "tuples_per_s": rate, "comparisons_per_s": rate * window, "results": hits,
            "pauses": st["pauses"], "segments_S": st["segments"]["S"]}


def run_ring(wl: Workload, workers: list[str] | None, window: int, measure: int) -> dict:
    from panjoin.manager.grpc_backend import GrpcBackend

    backend = GrpcBackend(workers) if workers else None
    try:
        # the x band alone matches about 21/10000 of the window (2,100 pairs per tuple at
        # W = 1M): batches of 8K keep each batch's pairs to a few hundred MB
        eng = JoinEngine(f"count:{window},{window}", f"band:{BAND}", index="bisort",
                         batch_size=8192, backend=backend, n_workers=len(workers or [1]),
                         threads=1)
        rate, hits = _timed(eng, wl, window, measure, 8192, count_fill=window <= 1 << 16)
    finally:
        if backend is not None:
            backend.close()
    return {"topology": "ring-bisort", "workers": len(workers) if workers else 0,
            "window": window, "measure": measure, "tuples_per_s": rate, "results": hits}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small windows, a few minutes")
    ap.add_argument("--out", default=None, help="JSON results (default: benchmarks/results/)")
    ap.add_argument("--ring-workers", action="store_true",
                    help="also run the ring on 2 worker processes at W >= 1M (slow: every "
                         "x-band pair crosses gRPC)")
    args = ap.parse_args(argv)
    K, M = 1 << 10, 1 << 20
    chain_windows = [4 * K, 16 * K] if args.quick else [4 * K, 16 * K, 64 * K]
    ring_windows = [16 * K, 1 * M] if args.quick else [16 * K, 1 * M, 2 * M]
    chain_nodes = [1, 2, 4]
    rows = []
    biggest = max(2 * w + w for w in ring_windows)
    wl = Workload(biggest)
    print(f"workload: {biggest:,} tuples generated", flush=True)
    procs = start_workers(max(chain_nodes), role="handshake-node")
    try:
        for w in chain_windows:
            measure = max(2048, min(32 * K, (1 << 28) // w))  # about 2^28 comparisons
            for n in chain_nodes:
                row = run_chain(wl, [p.address for p in procs[:n]], w, measure)
                rows.append(row)
                print(f"handshake  nodes {n}  W {w:>9,}  {row['tuples_per_s']:>12,.0f} tuples/s"
                      f"  ({row['comparisons_per_s']:.3g} comparisons/s, "
                      f"pauses {row['pauses']})", flush=True)
    finally:
        for p in procs:
            p.stop()
    workers = start_workers(2)
    try:
        for w in ring_windows:
            # at 1M+ the x band alone yields ~2,100 pairs per tuple; shipping them from the
            # workers takes longer than this machine allows, so there the ring runs in-process
            two = ([p.address for p in workers],) if (w <= 16 * K or args.ring_workers) else ()
            for ws in two + (None,):
                measure = w if w <= 16 * K else (64 * K if args.quick else 256 * K)
                row = run_ring(wl, ws, w, measure)
                rows.append(row)
                print(f"ring       {'2 workers ' if ws else 'in-process'}  W {w:>9,}  "
                      f"{row['tuples_per_s']:>12,.0f} tuples/s", flush=True)
    finally:
        for p in workers:
            p.stop()
    # the same input and window through both topologies gives the same pairs
    for r in rows:
        if r["topology"] == "handshake":
            twin = [q for q in rows if q["topology"] == "ring-bisort" and q["window"] == r["window"]
                    and q["measure"] == r["measure"]]
            for q in twin:
                assert q["results"] == r["results"], (r, q)
                r["checked_against_ring"] = True
    # the ratio at W = 1M: the ring measured, the chain from its comparison rate
    best = {}
    for r in rows:
        if r["topology"] == "handshake":
            best[r["nodes"]] = max(best.get(r["nodes"], 0), r["comparisons_per_s"])
    ring1m = max(r["tuples_per_s"] for r in rows
                 if r["topology"] == "ring-bisort" and r["window"] == 1 * M)
    print("\nat W = 1M per stream (ring measured; chain = its best comparisons/s / 1M):")
    summary = {}
    for n, cps in sorted(best.items()):
        chain1m = cps / (1 * M)
        summary[n] = {"chain_tuples_per_s_at_1M": chain1m, "ring_over_chain": ring1m / chain1m}
        print(f"  chain {n} node(s): {chain1m:,.1f} tuples/s   ring / chain = "
              f"{ring1m / chain1m:,.0f}x")
    out = Path(args.out) if args.out else HERE / "results" / (
        "handshake-quick.json" if args.quick else "handshake.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "python": sys.version.split()[0],
                               "rows": rows, "at_1M": summary}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
