"""Handshake join chain vs the PanJoin ring on the handshake join paper's section 5.2 workload.

R = (x int, y float, z char[20]), S = (a int, b float, c double, d bool), all
values uniform in 1..10000, symmetric rates (R and S alternate at random), and
the two-dimensional band join

    WHERE r.x BETWEEN s.a - 10 AND s.a + 10 AND r.y BETWEEN s.b - 10 AND s.b + 10

over count windows of W tuples per stream, as the predicate ``band:10&band2:10``:
key = x (a), key2 = y (b). Both topologies evaluate the y condition where the pairs
are produced (the residual): the chain's nested loop checks both conditions per
pair, the ring's BI-Sort probe finds the x-band candidates and checks y on each
inside its kernel, so only the ~1 in 250,000 qualifying pairs are ever written.

- handshake: a chain of 1, 2 and 4 node processes (nested-loop segments, the
  paper's immediate scan), driven by the manager (:class:`HandshakeChain`). The
  windows are filled by :meth:`HandshakeChain.bulk_fill` (the tuples go straight
  into the balanced segments: a nested-loop fill would cost about W^2 = 10^12
  comparisons at W = 1M), then ``measure`` tuples are fed and the clock stops when
  the chain is quiet again (every node idle: the work those tuples caused, their
  forwarding included, is done). No drain: draining moves whole windows across
  each other, which is not steady-state work;
- ring: :class:`JoinEngine` with BI-Sort subwindows on 2 worker processes
  (``GrpcBackend``) and in-process (one thread). Windows filled by pushing 2W
  tuples (untimed), then ``measure`` tuples timed, ending with a flush.

Cross-check: the 1-node chain produces every pair of a tuple when it enters, so its
pairs involving a measured tuple equal the ring's; the script asserts it, and that
every pair of every run satisfies the y condition.

    python -m benchmarks.handshake --quick     # W 16K and 1M (about 10 min here)
    python -m benchmarks.handshake             # W 16K, 1M and 2M (ring), longer segments
    python -m benchmarks.handshake --ring-only 2M   # the ring alone at W = 2M
    python -m benchmarks.handshake --layouts   # BI-Sort key2 permuted vs gathered
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
from panjoin.launch import start_cluster
from panjoin.manager.engine import JoinEngine
from panjoin.semantics import parse_size

HERE = Path(__file__).parent
BAND = 10


PREDICATE = f"band:{BAND}&band2:{BAND}"


class Workload:
    """The section 5.2 tuples; ``events`` carries key = x (R) or a (S) and key2 = y or b."""

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
        key2 = np.empty(n, np.float64)  # float32 values, exact in float64
        key2[stream == 0] = self.y
        key2[stream == 1] = self.b
        self.events = EventTable(stream=stream, id=ids, key=key, ts=np.arange(n, dtype=np.int64),
                                 key2=key2)
        # arrival position of each id, per stream
        self.pos = (np.flatnonzero(stream == 0), np.flatnonzero(stream == 1))

    def check(self, r: np.ndarray, s: np.ndarray) -> None:
        """Every pair satisfies both conditions (the residual was applied, not skipped)."""
        assert np.all(np.abs(self.x[r] - self.a[s]) <= BAND), "a pair fails the x band"
        assert np.all(np.abs(self.y[r].astype(np.float64) - self.b[s]) <= BAND), \
            "a pair fails the y condition"

    def measured(self, r: np.ndarray, s: np.ndarray, start: int, stop: int) -> int:
        """Pairs whose later tuple arrived at a position in [start, stop)."""
        later = np.maximum(self.pos[0][r], self.pos[1][s])
        return int(((later >= start) & (later < stop)).sum())


def _quiet(ch, poll: float = 0.02) -> float:
    """Wait until no node of the chain has processed a message for two polls; returns
    the time of the last change seen."""
    last, seen = None, time.perf_counter()
    while True:
        st = ch.node_status()
        cur = tuple((n.messages, n.tuples_in, n.forwarded) for n in st)
        now = time.perf_counter()
        if cur == last:
            if now - seen >= 2 * poll:
                return seen
        else:
            last, seen = cur, now
        time.sleep(poll)


def run_chain(wl: Workload, nodes: list[str], window: int, measure: int) -> dict:
    ev = wl.events
    fill = 2 * window
    with HandshakeChain(nodes, f"count:{window},{window}", PREDICATE, key_dtype="int64",
                        batch_size=1024, max_batch=4096, max_in_flight=8192) as ch:
        t0 = time.perf_counter()
        ch.bulk_fill(ev.slice(0, fill))
        _quiet(ch)
        fill_s = time.perf_counter() - t0
        r0 = sum(n.results for n in ch.node_status())
        ch.take_results()
        hits, pairs = 0, 0
        t0 = time.perf_counter()
        for a in range(fill, fill + measure, 8192):
            ch.push(ev.slice(a, min(fill + measure, a + 8192)))
        t1 = _quiet(ch)
        produced = sum(n.results for n in ch.node_status()) - r0
        while ch.collected_total - r0 < produced:  # the pairs' way to the manager
            time.sleep(0.01)
        r, s = ch.take_results()
        wl.check(r, s)
        hits, pairs = wl.measured(r, s, fill, fill + measure), int(r.size)
        st = ch.status()
        scanned = sum(n.scanned_pairs for n in ch.node_status())
    rate = measure / (t1 - t0)
    return {"topology": "handshake", "nodes": len(nodes), "window": window, "measure": measure,
            "tuples_per_s": rate, "comparisons_per_s": scanned / (t1 - t0),
            "comparisons_per_tuple": scanned / measure, "results": hits, "pairs": pairs,
            "fill_s": fill_s, "pauses": st["pauses"], "segments_S": st["segments"]["S"]}


def run_ring(wl: Workload, workers: list[str] | None, window: int, measure: int,
             threads: int = 1, check_at: tuple[int, ...] = ()) -> dict:
    from panjoin.manager.grpc_backend import GrpcBackend

    ev = wl.events
    fill = 2 * window
    backend = GrpcBackend(workers) if workers else None
    try:
        eng = JoinEngine(f"count:{window},{window}", PREDICATE, index="bisort",
                         batch_size=8192, backend=backend, n_workers=len(workers or [1]),
                         threads=threads)
        t0 = time.perf_counter()
        for a in range(0, fill, 8192):
            eng.push(ev.slice(a, min(fill, a + 8192)))
            eng.take_results()
        fill_s = time.perf_counter() - t0
        parts = []
        t0 = time.perf_counter()
        for a in range(fill, fill + measure, 8192):
            eng.push(ev.slice(a, min(fill + measure, a + 8192)))
            parts.append(eng.take_results())
        eng.flush()
        parts.append(eng.take_results())
        dt = time.perf_counter() - t0
        r = np.concatenate([p[0] for p in parts])
        s = np.concatenate([p[1] for p in parts])
        wl.check(r, s)
    finally:
        if backend is not None:
            backend.close()
    return {"topology": "ring-bisort", "workers": len(workers) if workers else 0,
            "threads": threads, "window": window, "measure": measure,
            "tuples_per_s": measure / dt,
            "results_by_segment": {m: wl.measured(r, s, fill, fill + m) for m in check_at},
            "pairs": int(r.size), "fill_s": fill_s}


def layouts(n: int = 1 << 18, m: int = 8192, repeat: int = 7) -> dict:
    """BI-Sort's residual probe with key2 permuted with the main array vs gathered by
    arrival position, and the x band alone (every candidate written): one subwindow of
    ``n`` section-5.2 tuples, a sorted batch of ``m`` probes, best of ``repeat``."""
    from panjoin.semantics import parse_predicate, probe_bounds, residual_bounds
    from panjoin.subwindow import Residual, make_index

    wl = Workload(n + m, seed=1)
    ev = wl.events
    keys, k2 = ev.key[:n], ev.key2[:n]
    o = np.argsort(keys, kind="stable")
    pk, pk2 = ev.key[n:], ev.key2[n:]
    po = np.argsort(pk, kind="stable")
    pred = parse_predicate(PREDICATE)
    lo, hi = probe_bounds(pred, "R", pk[po])
    res = Residual(*residual_bounds(pred, "R", pk2[po]))
    out = {}
    for name, layout, r in (("permuted", "permuted", res), ("gather", "gather", res),
                            ("x band only", "permuted", None)):
        ix = make_index("bisort", n, partitions=n // 128, residual_layout=layout)
        ix.insert(keys[o], np.zeros(n, np.int64), np.arange(n, dtype=np.int64)[o], k2[o])
        got = ix.probe(lo, hi, None, r)  # compiles
        best = min(_probe_time(ix, lo, hi, r) for _ in range(repeat))
        out[name] = {"ms": best * 1e3, "pairs": int(got[0].size)}
        print(f"layout {name:>12}: {best * 1e3:8.1f} ms for {m:,} probes into {n:,} tuples "
              f"({got[0].size:,} pairs)", flush=True)
    return out


def _probe_time(ix, lo, hi, res) -> float:
    t0 = time.perf_counter()
    ix.probe(lo, hi, None, res)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="W 16K and 1M, short segments")
    ap.add_argument("--out", default=None, help="JSON results (default: benchmarks/results/)")
    ap.add_argument("--ring-only", action="append", default=[], metavar="W",
                    help="only the ring, at window W (e.g. 2M; repeatable), 64K measured")
    ap.add_argument("--layouts", action="store_true",
                    help="only BI-Sort's key2 layouts (permuted vs gather), one subwindow")
    args = ap.parse_args(argv)
    if args.layouts:
        layouts()
        return 0
    K, M = 1 << 10, 1 << 20
    chain_windows = [16 * K, 1 * M]
    ring_windows = [16 * K, 1 * M] if args.quick else [16 * K, 1 * M, 2 * M]
    if args.ring_only:
        chain_windows, ring_windows = [], [parse_size(w) for w in args.ring_only]
        args.quick = True
    chain_nodes = [1, 2, 4]

    def chain_measure(w):  # about 2^32 comparisons (2^33 without --quick)
        return max(2048, min(32 * K, (1 << (32 if args.quick else 33)) // w))

    def ring_measure(w):
        return max(chain_measure(w), min(w, 64 * K if args.quick else 256 * K))

    rows = []
    biggest = max([2 * w + chain_measure(w) for w in chain_windows]
                  + [2 * w + ring_measure(w) for w in ring_windows])
    wl = Workload(biggest)
    print(f"workload: {biggest:,} tuples generated; predicate {PREDICATE}", flush=True)
    if chain_windows:
        with start_cluster(max(chain_nodes), manager=False, role="handshake-node") as procs:
            for w in chain_windows:
                for n in chain_nodes:
                    row = run_chain(wl, procs.addresses[:n], w, chain_measure(w))
                    rows.append(row)
                    print(f"handshake  nodes {n}  W {w:>9,}  {row['tuples_per_s']:>12,.1f} "
                          f"tuples/s  ({row['comparisons_per_s']:.3g} comparisons/s, "
                          f"{row['comparisons_per_tuple']:.3g} per tuple; {row['measure']:,} "
                          f"measured, fill {row['fill_s']:.1f} s)", flush=True)
    with start_cluster(2, manager=False) as workers:
        for w in ring_windows:
            for ws in (workers.addresses, None):
                row = run_ring(wl, ws, w, ring_measure(w), check_at=(chain_measure(w),))
                rows.append(row)
                print(f"ring       {'2 workers ' if ws else 'in-process'}  W {w:>9,}  "
                      f"{row['tuples_per_s']:>12,.0f} tuples/s  ({row['measure']:,} measured, "
                      f"fill {row['fill_s']:.1f} s)", flush=True)
    # the 1-node chain and the rings give the same pairs for the measured tuples
    for r in rows:
        if r["topology"] == "handshake" and r["nodes"] == 1:
            for q in rows:
                if q["topology"] == "ring-bisort" and q["window"] == r["window"]:
                    assert q["results_by_segment"][r["measure"]] == r["results"], (r, q)
                    r["checked_against_ring"] = q["checked_against_chain"] = True
    summary = {}
    print("\nratios, ring / chain, tuples/s measured at the same W:")
    for w in chain_windows:
        for q in (q for q in rows if q["topology"] == "ring-bisort" and q["window"] == w):
            for r in (r for r in rows if r["topology"] == "handshake" and r["window"] == w):
                ratio = q["tuples_per_s"] / r["tuples_per_s"]
                key = f"W={w} ring-{q['workers'] or 'in-process'} / chain-{r['nodes']}"
                summary[key] = ratio
                print(f"  W {w:>9,}  ring {'2 workers' if q['workers'] else 'in-process'}"
                      f" / chain {r['nodes']} node(s): {ratio:,.0f}x")
    out = Path(args.out) if args.out else HERE / "results" / (
        "handshake-ring-only.json" if args.ring_only else
        "handshake-quick.json" if args.quick else "handshake.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "python": sys.version.split()[0],
                               "predicate": PREDICATE, "rows": rows, "ratios": summary},
                              indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
