"""``--index auto`` against every fixed index, cell by cell (issue 31, item 1).

A grid of the peer benchmark's workloads (:mod:`panjoin.bench.peers.workloads`: key
distribution x predicate x count window W), each joined in this process by the engine
with one thread, at a small batch (1K, a latency-bound stream) and the default one (32K),
once per index: ``auto`` and the fixed ones that apply (``hash`` only where it answers
by lookups). Each run fills both windows twice (4W tuples, untimed), then times the next M
tuples pushed in chunks of the batch size; the CPU seconds of that part are the figure
(the machine is shared). Rounds interleave the indexes; the best of the rounds is kept.
Every run of a cell must give the same number of pairs. Prints per cell the best fixed
index, auto's choice and auto's time over the best (target: <= 1.15).

    python -m benchmarks.index_auto --quick        # W 16K, M 64K: a minute or two
    python -m benchmarks.index_auto --rounds 3 --json benchmarks/results/index_auto.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from panjoin.bench.peers.workloads import (
    Workload,
    add_grid_args,
    calibrate,
    engine_input,
    events_for,
    grid_cells,
)
from panjoin.manager.engine import JoinEngine, warm_up
from panjoin.semantics import parse_predicate, parse_size
from panjoin.subwindow.hash_table import predicate_fits

FIXED = ("bisort", "hash", "rap", "wib")
#: an all-equal cell's measured part makes at most this many pairs (M is this over W)
EQUAL_PAIRS = 1 << 26


def run(data, wl: Workload, index: str, nbat: int, measure: int) -> tuple[float, int, dict]:
    """CPU seconds of the measured part, pairs found in it, the subwindows alive at its end
    per index kind."""
    ev, pred = engine_input(wl, data)
    fill = len(ev) - measure  # two windows a stream: the measured ones built with what
    # auto saw of the stream (its first subwindows know nothing yet)
    eng = JoinEngine(wl.window_spec(), pred, index=index, batch_size=nbat, threads=1)
    for a in range(0, fill, 1 << 16):
        eng.push(ev.slice(a, min(fill, a + (1 << 16))))
        eng.take_results()
    eng.flush()
    eng.take_results()
    t0 = time.process_time()
    pairs = 0
    for a in range(fill, len(ev), nbat):
        eng.push(ev.slice(a, a + nbat))
        r, _ = eng.take_results()
        pairs += r.shape[0]
    eng.flush()
    r, _ = eng.take_results()
    pairs += r.shape[0]
    live = Counter(x.index for ring in eng.rings.values() for x in ring)  # the measured part's
    return time.process_time() - t0, pairs, dict(live)


def grid(windows, dists, preds, batches, measure: int, rounds: int, seed: int = 1,
         fixed=FIXED):
    cells = []
    for wl, m in grid_cells(windows, dists, preds, measure, EQUAL_PAIRS):
        w = wl.window
        data = events_for(wl, 2 * w + m, seed)  # fill: 4W, 2W a stream
        wl = calibrate(wl, data)
        indexes = ["auto"] + [i for i in fixed if i != "hash" or predicate_fits(
            parse_predicate(engine_input(wl, data)[1]), "int64")]
        for nbat in batches:
            best: dict[str, float] = {}
            pairs: dict[str, int] = {}
            kinds: dict = {}
            for _ in range(rounds):
                for index in indexes:
                    cpu, n, by = run(data, wl, index, nbat, m)
                    best[index] = min(best.get(index, float("inf")), cpu)
                    pairs[index] = n
                    if index == "auto":
                        kinds = by
            if len(set(pairs.values())) != 1:
                raise AssertionError(f"{wl.name} W {w} NBat {nbat}: pairs differ {pairs}")
            times = {i: t for i, t in best.items() if i != "auto"}
            top = min(times, key=times.get)
            # auto's choice is deterministic: its kind's own fixed run is a
            # second, less noisy figure of what auto costs
            chose = (times[next(iter(kinds))] / times[top] if len(kinds) == 1
                     else None)
            cell = {"window": w, "workload": wl.name, "predicate": wl.predicate(),
                    "nbat": nbat, "pairs": pairs["auto"], "cpu_s": best,
                    "best_fixed": top, "auto_kinds": kinds,
                    "auto_over_best": best["auto"] / times[top],
                    "choice_over_best": chose}
            cells.append(cell)
            ch = f"{chose:.2f}x" if chose is not None else "mixed"
            print(f"W {w:>8,} {wl.name:<22} NBat {nbat:>6,}: best {top:<6} "
                  f"{times[top]:6.3f} s, auto {best['auto']:6.3f} s "
                  f"({'+'.join(sorted(kinds))}) = {cell['auto_over_best']:.2f}x, "
                  f"its choice {ch}  "
                  + "  ".join(f"{i} {t:.3f}" for i, t in sorted(times.items())),
                  flush=True)
    return cells


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="W 16K, M 64K, one round")
    ap.add_argument("--windows", default="64K,256K")
    ap.add_argument("--measure", type=parse_size, default=256 * 1024)
    ap.add_argument("--rounds", type=int, default=2)
    add_grid_args(ap, "64M")
    ap.add_argument("--large", default="1M,4M", help="also eq at NBat 1K over these windows, "
                    "against BI-Sort and hash only (default: %(default)s; '' for none)")
    ap.add_argument("--json", help="write the cells here")
    a = ap.parse_args(argv)
    windows = [16 * 1024] if a.quick else [parse_size(x) for x in a.windows.split(",")]
    if a.quick:
        a.large = ""
    measure = 64 * 1024 if a.quick else a.measure
    rounds = 1 if a.quick else a.rounds
    for index in ("auto", *FIXED):
        warm_up(index)
    cells = grid(windows, a.dists.split(","), a.preds.split(","), [1024, 32 * 1024], measure,
                 rounds)
    if a.large:  # where hash can win: eq, small batches, subwindows beyond the caches
        cells += grid([parse_size(x) for x in a.large.split(",")],
                      ["uniform", "zipf", "increasing"], ["eq"], [1024], measure, rounds,
                      fixed=("bisort", "hash"))
    for key in ("auto_over_best", "choice_over_best"):
        worst = max(cells, key=lambda c: c[key] or 0)
        print(f"worst cell by {key}: {worst['workload']} W {worst['window']:,} NBat "
              f"{worst['nbat']:,}: {worst[key]:.2f}x the best fixed index "
              f"({worst['best_fixed']})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(cells, f, indent=1)


if __name__ == "__main__":
    main()
