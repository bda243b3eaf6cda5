"""What a second busy core costs the engine: in-process alone, then beside a memory streamer.

The in-process engine (count window W per stream, band S = 1, BI-Sort, 4W tuples)
pinned to core 0, timed alone and then while another process on core 1 copies
a 64 MiB array over and over (memory traffic like a worker's, no shared data).
On a machine whose cores share the memory system the second run is slower;
that is the floor under any two-process split of the join on it (the scaling
benchmark's cluster). Prints the engine's time and its index time both ways.

    python -m benchmarks.contention --window 4M
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

STREAMER = """
import os, time, numpy as np
os.sched_setaffinity(0, {1})
a = np.ones(8 << 20); b = np.empty_like(a)
while True:
    np.copyto(b, a)
    b += 1
"""


def run(window: int) -> dict:
    from panjoin.generate import band_for_selectivity, generate
    from panjoin.manager.engine import JoinEngine

    key_max = 1 << 40
    n = 4 * window
    ev = generate(n, "uniform", key_min=0, key_max=key_max, seed=0)
    e = int(band_for_selectivity(1.0, window, 0, key_max))
    eng = JoinEngine(f"count:{window},{window}", f"band:{e}", index="bisort", threads=1)
    t0 = time.perf_counter()
    for a in range(0, n, 1 << 18):
        eng.push(ev.slice(a, min(n, a + (1 << 18))))
        eng.take_results()
    eng.flush()
    eng.take_results()
    st = eng.backend.stats
    return {"time_s": time.perf_counter() - t0, "insert_s": st.insert_s,
            "probe_s": st.probe_s, "manager_s": eng.stats.preprocess_s}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", default="4M", help="count window per stream")
    args = ap.parse_args(argv)
    from panjoin.cli.options import size as _size

    if len(os.sched_getaffinity(0)) < 2:
        print("contention: needs two cores", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, {0})
    w = _size(args.window)
    alone = run(w)
    streamer = subprocess.Popen([sys.executable, "-c", STREAMER])
    try:
        time.sleep(0.5)
        beside = run(w)
    finally:
        streamer.kill()
        streamer.wait()
    for k in alone:
        print(f"{k:10s} alone {alone[k]:7.2f} s  beside a streamer {beside[k]:7.2f} s  "
              f"{beside[k] / alone[k]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
