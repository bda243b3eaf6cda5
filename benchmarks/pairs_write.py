"""Writing a pairs file: pyarrow's Parquet defaults against :func:`write_pairs`' options
(issue 31, item 4), alternated round by round on the same pairs, each write fsynced.

The pairs come from a pairs file (e.g. what ``panjoin replay`` wrote), so that their
order is the engine's. Example::

    python -m benchmarks.pairs_write pairs.parquet --rounds 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def main(argv=None) -> int:
    import pyarrow.parquet as pq

    from panjoin.events.results import _pairs_parquet

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pairs", help="a pairs file (columns r_id, s_id)")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    table = pq.ParquetFile(args.pairs).read(columns=["r_id", "s_id"]).combine_chunks()
    ways = {"pyarrow defaults": {}, "write_pairs": _pairs_parquet(table.column_names)}
    took = {k: [] for k in ways}
    size = {}
    with tempfile.TemporaryDirectory() as work:
        for _ in range(args.rounds):
            for name, opts in ways.items():
                path = os.path.join(work, "p.parquet")
                t0 = time.perf_counter()
                pq.write_table(table, path, **opts)
                fd = os.open(path, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
                took[name].append(time.perf_counter() - t0)
                size[name] = os.path.getsize(path)
    base = took["pyarrow defaults"]
    print(f"{table.num_rows:,} pairs, {args.rounds} rounds")
    print("| way | median s | min-max s | MiB | defaults / this (pairwise median) |")
    print("|---|---:|---:|---:|---:|")
    for name, t in took.items():
        ratio = statistics.median(b / x for b, x in zip(base, t, strict=True))
        print(f"| {name} | {statistics.median(t):.3f} | {min(t):.3f}-{max(t):.3f} | "
              f"{size[name] / 2**20:.1f} | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
