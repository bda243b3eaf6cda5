"""The command a user runs, against Polars as a user runs it (issue 31, item 4).

Per event file and join, in one run, alternated round by round:

- ``panjoin replay FILE --window W --predicate P --out pairs.parquet``, with no tuning
  flag: the whole process's wall time (interpreter start, read, kernels, join, write),
  the join time it prints (``time:``, as the user waits for it) and its split's
  ``join`` (the same without loading the kernels from Numba's cache);
- Polars, as a script a user would write: a fresh process that reads the file, joins
  it with the same semantics (:func:`panjoin.baselines.polars_join.join_frame`, the
  plan ``panjoin bench peers`` checks against the reference) at Polars' default
  threads, and writes the pairs: its wall time less the import of the plan's modules
  (numpy, this project's semantics: a user's script imports Polars alone), and its
  join time (the join and the collect of its pairs; the read and the write around it
  are not in it);
- the engine alone, as ``bench peers`` measures it: warm, the configuration replay
  picks (:func:`panjoin.manager.knobs.offline_knobs`), pushed from arrays already in
  memory, in a process of its own; replay's rate (tuples / ``time:``) against the
  engine's is the share of the benchmark's speed a user gets.

Every process runs as on a user's machine, caching its modules' bytecode (without
the ``PYTHONDONTWRITEBYTECODE`` some sandboxes set), after one uncounted run of each.
Pairs are compared by count (replay's and Polars' files must hold the same number).
Files: uniform int keys, one tuple a millisecond (a time window of T ms holds about
T / 2 tuples a stream). Example::

    python -m benchmarks.cli_vs_polars --quick              # 2M tuples, eq and band:1, time
    python -m benchmarks.cli_vs_polars --sizes 2M,16M --rounds 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

JOINS = {  # name: (window, predicate)
    "eq-time": ("time:512000,512000", "eq"),
    "band1-time": ("time:512000,512000", "band:1"),
    "eq-count": ("count:256K,256K", "eq"),
    "band1-count": ("count:256K,256K", "band:1"),
}
QUICK_JOINS = ("eq-time", "band1-time")
TIME_RE = re.compile(r"time: ([0-9.]+) s  throughput: ([0-9,]+) tuples/s")
TUPLES_RE = re.compile(r"input tuples: ([0-9]+)")
SPLIT_RE = re.compile(r"(read|validate|load kernels|join|write|other) ([0-9.]+)")


def _size(text: str) -> int:
    from panjoin.semantics import parse_size

    return parse_size(text)


def make_file(n: int, work: str) -> str:
    """``n`` tuples, uniform keys in [0, n / 2], one a millisecond: about one partner a
    tuple in a 256K-tuple window of the other stream."""
    from panjoin.events import write_events
    from panjoin.generate import generate

    path = os.path.join(work, f"u{n}.parquet")
    if not os.path.exists(path):
        write_events(generate(n, "uniform", key_max=max(2, n // 8), rate=1000, seed=1), path)
    return path


def _user_env() -> dict:
    """The environment of a user's process: Python caches the bytecode of what it
    imports (``PYTHONDONTWRITEBYTECODE``, set by some sandboxes and CI images, would
    make every ``panjoin`` module compile from source each run: 0.1-0.2 s of a replay's
    start that no installed package pays)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=_user_env())
    wall = time.perf_counter() - t0
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return wall, p.stdout + p.stderr


def _pairs(path: str) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def run_replay(events: str, window: str, pred: str, out: str) -> dict:
    wall, text = _timed([sys.executable, "-m", "panjoin.cli", "replay", events, "--window",
                         window, "--predicate", pred, "--out", out, "--no-progress"])
    m = TIME_RE.search(text)
    split = [line for line in text.splitlines() if line.startswith("wall ")][-1]
    phases = {k: float(v) for k, v in SPLIT_RE.findall(split)}
    # "time:" is the join as the user waits for it, kernel loading included (to the
    # microsecond from the tuples and the throughput: it prints 10 ms steps); the split's
    # "join" leaves the loading out
    tuples = int(TUPLES_RE.search(text).group(1))
    rate = int(m.group(2).replace(",", ""))
    took = tuples / rate if rate else float(m.group(1))
    kernels = phases.get("load kernels", 0.0)
    return {"wall_s": wall, "time_s": took, "join_s": max(0.0, took - kernels) if kernels
            else took,
            "kernels_s": kernels, "split": split,
            "pairs": _pairs(out)}


def run_polars(events: str, window: str, pred: str, out: str) -> dict:
    wall, text = _timed([sys.executable, "-m", "benchmarks.cli_vs_polars", "--polars-child",
                         events, window, pred, out])
    rec = json.loads(text.strip().splitlines()[-1])
    # a user's script imports Polars alone: the plan's modules (numpy, this project's
    # semantics) are this benchmark's, so their import is not Polars' time
    return {"wall_s": wall - rec["plan_import_s"], "wall_with_plan_s": wall, **rec,
            "pairs": _pairs(out)}


def run_engine(events: str, window: str, pred: str) -> dict:
    wall, text = _timed([sys.executable, "-m", "benchmarks.cli_vs_polars", "--engine-child",
                         events, window, pred])
    return {"wall_s": wall, **json.loads(text.strip().splitlines()[-1])}


def polars_child(events: str, window: str, pred: str, out: str) -> None:
    """A user's Polars script: read, join at the default threads, write. The plan's
    modules are imported first and timed (``plan_import_s``): a user's script would
    hold the plan's expressions itself and import only Polars."""
    t0 = time.perf_counter()
    from panjoin.baselines.polars_join import join_frame
    from panjoin.semantics import parse_predicate, parse_window

    plan_import_s = time.perf_counter() - t0
    import polars as pl

    # the file says R / S, the plan numbers the streams 0 / 1 (as replay's read does)
    df = pl.read_parquet(events, columns=["stream", "id", "key", "ts"]).with_columns(
        stream=(pl.col("stream") == "S").cast(pl.Int8))
    t0 = time.perf_counter()
    pairs = join_frame(df, parse_window(window), parse_predicate(pred))
    join_s = time.perf_counter() - t0
    pairs.write_parquet(out)
    print(json.dumps({"join_s": join_s, "threads": pl.thread_pool_size(),
                      "plan_import_s": plan_import_s}))


def engine_child(events: str, window: str, pred: str) -> None:
    """The engine on arrays in memory, warm, with replay's configuration (its whole-file
    knobs), pushed in replay's chunks: what ``bench peers`` measures."""
    from panjoin.events import read_events
    from panjoin.manager.engine import JoinEngine, warm_up
    from panjoin.manager.knobs import offline_knobs
    from panjoin.semantics import parse_window

    ev = read_events(events)
    warm_up()
    nsub, nbat = offline_knobs(parse_window(window), ev.ts, ev.stream)
    eng = JoinEngine(window, pred, subwindow_size=nsub, batch_size=nbat)
    n = 0
    t0 = time.perf_counter()
    for a in range(0, len(ev), 1 << 20):
        eng.push(ev.slice(a, min(len(ev), a + (1 << 20))))
        n += sum(int(p[0].size) for p in eng.take_result_pieces(wait=False))
    eng.flush()
    n += sum(int(p[0].size) for p in eng.take_result_pieces())
    join_s = time.perf_counter() - t0
    print(json.dumps({"join_s": join_s, "pairs": n}))


def sweep(sizes: list[int], joins: list[str], rounds: int, work: str, echo=print) -> list[dict]:
    recs = []
    for n in sizes:
        events = make_file(n, work)
        if not recs:  # uncounted: the first run of each caches its modules' bytecode
            window, pred = JOINS[joins[0]]
            run_replay(events, window, pred, os.path.join(work, "r.parquet"))
            run_polars(events, window, pred, os.path.join(work, "p.parquet"))
        for name in joins:
            window, pred = JOINS[name]
            runs = {"replay": [], "polars": [], "engine": []}
            for rnd in range(rounds):
                out_r, out_p = os.path.join(work, "r.parquet"), os.path.join(work, "p.parquet")
                rep = run_replay(events, window, pred, out_r)
                pol = run_polars(events, window, pred, out_p)
                eng = run_engine(events, window, pred)
                if not rep["pairs"] == pol["pairs"] == eng["pairs"]:
                    raise AssertionError(f"{name} at {n}: pairs differ: replay {rep['pairs']}, "
                                         f"polars {pol['pairs']}, engine {eng['pairs']}")
                for k, v in (("replay", rep), ("polars", pol), ("engine", eng)):
                    runs[k].append(v)
                echo(f"{n} {name} round {rnd + 1}: replay wall {rep['wall_s']:.2f} s time "
                     f"{rep['time_s']:.2f} s (join {rep['join_s']:.2f}) | polars wall "
                     f"{pol['wall_s']:.2f} s join {pol['join_s']:.2f} s | engine join "
                     f"{eng['join_s']:.2f} s | pairs {rep['pairs']:,}")
            recs.append({"tuples": n, "join": name, "window": window, "predicate": pred,
                         "runs": runs})
    return recs


def table(recs: list[dict]) -> str:
    med = statistics.median
    lines = ["| tuples | join | pairs | replay wall / time / join s | Polars wall / join s "
             "(threads) | Polars / replay: wall | time | join | replay's join rate / the "
             "engine's |", "|" + "---|" * 9]
    for r in recs:
        rp, po, en = r["runs"]["replay"], r["runs"]["polars"], r["runs"]["engine"]
        wall = med(p["wall_s"] / q["wall_s"] for p, q in zip(po, rp, strict=True))
        join = med(p["join_s"] / q["join_s"] for p, q in zip(po, rp, strict=True))
        tm = med(p["join_s"] / q["time_s"] for p, q in zip(po, rp, strict=True))
        share = med(e["join_s"] / q["time_s"] for e, q in zip(en, rp, strict=True))
        lines.append(
            f"| {r['tuples']:,} | {r['join']} | {rp[0]['pairs']:,} | "
            f"{med(x['wall_s'] for x in rp):.2f} / {med(x['time_s'] for x in rp):.3f} / "
            f"{med(x['join_s'] for x in rp):.3f} | "
            f"{med(x['wall_s'] for x in po):.2f} / {med(x['join_s'] for x in po):.3f} "
            f"({po[0]['threads']}) | {wall:.2f}x | {tm:.2f}x | {join:.2f}x | {share:.0%} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--polars-child"]:
        polars_child(*argv[1:5])
        return 0
    if argv[:1] == ["--engine-child"]:
        engine_child(*argv[1:4])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="2M,16M", help="tuples per file (default: 2M,16M)")
    ap.add_argument("--joins", default=",".join(JOINS), help=f"of {', '.join(JOINS)}")
    ap.add_argument("--rounds", type=int, default=2, help="alternated rounds (default: 2)")
    ap.add_argument("--quick", action="store_true", help="2M tuples, eq and band:1 time, 1 round")
    ap.add_argument("--work", help="folder for the files (default: a temporary one)")
    ap.add_argument("--json", help="write every run here")
    args = ap.parse_args(argv)
    try:
        import polars  # noqa: F401
    except ImportError:
        print("cli_vs_polars: Polars is not installed: pip install -e '.[peers]'",
              file=sys.stderr)
        return 1
    sizes = [2 << 20] if args.quick else [_size(s) for s in args.sizes.split(",")]
    joins = list(QUICK_JOINS) if args.quick else args.joins.split(",")
    rounds = 1 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        recs = sweep(sizes, joins, rounds, work)
    print(table(recs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(recs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
