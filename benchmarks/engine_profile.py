"""Where the in-process engine's time goes, step by step (issue 20).

One workload of the peer benchmark (``panjoin bench peers``: uniform keys, count
window W per stream, about one match per probe tuple), joined by the in-process
engine with one thread and the peer benchmark's configuration for it
(:func:`panjoin.bench.peers.adapters.engine_config`), after a warm-up and one
untimed pass; then one pass under cProfile, whose self times are summed into the
steps of the PanJoin manager:

- ``sort``: step 2, the batch's argsort and its columns gathered into key order;
- ``probe``: steps 3-4, the index kernels that find the pairs;
- ``insert``: the index's insert (BI-Sort's merge into its main array);
- ``ids``: step 5, stored seqs mapped to ids;
- ``other``: everything else (collecting, cutting batches, Python).

    python -m benchmarks.engine_profile                       # eq, W = 1M
    python -m benchmarks.engine_profile --pred band --window 256K
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from panjoin.bench.peers.adapters import engine_config, engine_op
from panjoin.bench.peers.runner import _stream
from panjoin.bench.peers.workloads import Workload, events_for
from panjoin.manager.engine import warm_up
from panjoin.semantics import parse_size

#: function names (as cProfile reports them) per step; the rest is "other"
STEPS = {
    "sort": ("argsort", "'sort'", "key_order", "pack_rows", "unpack_rows", "_process"),
    "probe": ("probe_pairs", "probe_kernel", "bisort_probe_residual", "rap_probe"),
    "insert": ("merge_back", "build_index", "rap_insert", "insert", "buffer_insert"),
    "ids": ("ids_of",),
}


def profile(pred: str, window: int, index: str = "bisort") -> tuple[dict, float, int]:
    """``({step: seconds}, whole seconds, tuples)`` of one profiled pass."""
    wl = Workload(pred, 1, "uniform", window)
    data = events_for(wl, window, 0)
    warm_up(index)
    chunk = min(1 << 16, max(1, window // 4))
    _stream(engine_op(wl, data, index, 1), data, 2 * window, chunk)  # heap and caches warm
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    _stream(engine_op(wl, data, index, 1), data, 2 * window, chunk)
    prof.disable()
    whole = time.perf_counter() - t0
    steps = dict.fromkeys(STEPS, 0.0)
    steps["other"] = 0.0
    for (_, _, name), (_, _, tottime, _, _) in pstats.Stats(prof).stats.items():
        step = next((s for s, names in STEPS.items() if any(n in name for n in names)),
                    "other")
        steps[step] += tottime
    return steps, whole, len(data)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pred", default="eq", choices=["eq", "band"])
    ap.add_argument("--window", default="1M", help="tuples per stream (default 1M)")
    ap.add_argument("--index", default="bisort")
    args = ap.parse_args(argv)
    w = parse_size(args.window)
    steps, whole, n = profile(args.pred, w, args.index)
    nsub, nbat = engine_config(Workload(args.pred, 1, "uniform", w), args.index)
    total = sum(steps.values())
    print(f"{args.pred} uniform, W = {w}, {args.index}, NSub {nsub or 'default'}, NBat {nbat}: "
          f"{n} tuples, {n / whole / 1e6:.2f}M tuples/s under cProfile")
    print("| step | seconds | ns per input tuple | share |")
    print("|---|---:|---:|---:|")
    for step, s in steps.items():
        print(f"| {step} | {s:.3f} | {s / n * 1e9:.0f} | {s / total:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
