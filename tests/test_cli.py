"""The ``panjoin`` command as a user runs it: gen, replay, config files, bad input, bench."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from panjoin.cli.main import main
from panjoin.events import read_events, read_pairs
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window


@pytest.fixture(scope="module")
def events(gen_file):
    return gen_file("--n", "3000", "--key-max", "60", "--rate", "1000", "--disorder-ms", "40",
                    "--seed", "3")


@pytest.mark.parametrize("index", ["rap", "wib", "bisort", "nested"])
def test_replay_writes_the_reference_pairs(events, tmp_path, index, capsys):
    out = tmp_path / "pairs.parquet"
    assert main(["replay", str(events), "--window", "count:200,300", "--predicate", "band:1",
                 "--index", index, "--subwindow-size", "64", "--partitions", "8",
                 "--batch-size", "100", "--out", str(out), "--no-progress"]) == 0
    t = read_events(events)
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:200,300"),
                         parse_predicate("band:1"))
    assert np.array_equal(sort_pairs(read_pairs(out)), ref.pairs)
    text = capsys.readouterr().out
    assert f"results: {len(ref.pairs)} pairs" in text and "tuples/s" in text
    assert "bytes per stored tuple" in text


def test_replay_time_window_late_output(events, tmp_path):
    out, late = tmp_path / "p.parquet", tmp_path / "late.parquet"
    assert main(["replay", str(events), "--window", "time:50,80", "--predicate", "eq",
                 "--allowed-lateness", "10", "--index", "bisort", "--out", str(out),
                 "--late-out", str(late), "--no-progress"]) == 0
    t = read_events(events)
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("time:50,80", 10),
                         parse_predicate("eq"))
    assert np.array_equal(sort_pairs(read_pairs(out)), ref.pairs)
    lt = pq.read_table(late).to_pydict()
    n_late = sum(len(v) for v in ref.late_ids.values())
    assert n_late > 0 and len(lt["id"]) == n_late


def test_config_file_and_flags_override(events, tmp_path):
    conf = tmp_path / "join.toml"
    conf.write_text('window = "count:100,100"\npredicate = "band:5"\nindex = "rap"\n'
                    'batch-size = "64"\n')
    out = tmp_path / "p.parquet"
    assert main(["replay", str(events), "--config", str(conf), "--predicate", "eq",
                 "--out", str(out), "--no-progress"]) == 0
    t = read_events(events)
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:100,100"),
                         parse_predicate("eq"))
    assert np.array_equal(sort_pairs(read_pairs(out)), ref.pairs)


def test_unknown_config_key_is_an_error(events, tmp_path, capsys):
    conf = tmp_path / "bad.toml"
    conf.write_text('windw = "count:1,1"\n')
    with pytest.raises(SystemExit):
        main(["replay", str(events), "--config", str(conf), "--out", "x.parquet"])
    assert "windw" in capsys.readouterr().err


@pytest.mark.parametrize("spec,flag", [("count:0,5", "--window"), ("band:-1", "--predicate"),
                                       ("cnt:5", "--window")])
def test_bad_spec_message(events, tmp_path, spec, flag, capsys):
    args = {"--window": "count:5,5", "--predicate": "eq", flag: spec}
    out = tmp_path / "p.parquet"
    code = main(["replay", str(events), "--window", args["--window"], "--predicate",
                 args["--predicate"], "--out", str(out), "--no-progress"])
    assert code == 2
    assert spec.split(":")[0] in capsys.readouterr().err
    assert not out.exists()


def test_bad_input_names_the_row_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"stream": ["R", "S", "X"], "id": [1, 2, 3], "key": [1, 2, 3],
                             "ts": [0, 1, 2]}), bad)
    out = tmp_path / "p.parquet"
    assert main(["replay", str(bad), "--window", "count:5,5", "--predicate", "eq",
                 "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "row 3" in err and "X" in err
    assert not out.exists()


def test_help_and_bench_from_a_real_process():
    run = subprocess.run([sys.executable, "-m", "panjoin.cli", "replay", "--help"],
                         capture_output=True, text=True, check=True)
    assert "--subwindow-size" in run.stdout and "--partitions" in run.stdout
    run = subprocess.run([sys.executable, "-m", "panjoin.cli", "bench", "index", "--index",
                          "bisort", "--op", "probe", "--nsub", "16K", "--partitions", "128",
                          "--batch", "1K", "--repeat", "1", "--no-progress"],
                         capture_output=True, text=True, check=True)
    last = run.stdout.strip().splitlines()[-1]
    assert last.startswith("tuples/s: ") and float(last.split()[1]) > 0


@pytest.mark.parametrize("index", ["rap", "wib", "bisort"])
def test_bench_index_measures_expiry(index, capsys):
    assert main(["bench", "index", "--index", index, "--op", "expire", "--nsub", "16K",
                 "--partitions", "128", "--batch", "1K", "--repeat", "1",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "op: expire" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("tuples/s: ") and float(last.split()[1]) > 0


@pytest.mark.parametrize("where", [[], ["--workers", "2"]], ids=["in-process", "workers"])
def test_replay_of_a_one_batch_input_reports_its_memory_and_wall_split(events, tmp_path,
                                                                       where, capsys):
    # the whole file fits in one batch: it is joined only by the final flush
    out = tmp_path / "p.parquet"
    assert main(["replay", str(events), "--window", "count:100,100", "--predicate", "eq",
                 "--batch-size", "1M", "--out", str(out), "--no-progress", *where]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    mem = next(x for x in lines if x.startswith("memory: peak "))
    assert not mem.startswith("memory: peak 0 B"), mem
    # where the wall time went, after the lines the benchmarks parse
    assert any(x.startswith("time: ") for x in lines)
    assert lines[-1].startswith("wall ")
    body = lines[-1].split(" (", 1)[0]  # a cluster's line ends with a note
    phases = dict(p.rsplit(" ", 1) for p in body.split(": ", 1)[1].split(", "))
    assert {"read", "validate", "join", "write"} <= set(phases)
    assert ("start workers" in phases) == bool(where)
    assert float(lines[-1].split()[1]) >= sum(float(v) for v in phases.values()) - 0.02


def test_replay_writes_its_pairs_as_they_come(tmp_path, monkeypatch, capsys):
    """Replay hands each chunk's pairs to the file as row groups fill (a result-heavy
    join never holds all its pairs): many row groups, the reference pairs, payloads
    on every row; the file appears only when the join is done."""
    import panjoin.cli.replay as replay
    import panjoin.events.results as results

    monkeypatch.setattr(results, "PAIRS_ROW_GROUP", 1000)
    ev = tmp_path / "ev.parquet"
    assert main(["gen", str(ev), "--n", "3000", "--key-max", "30", "--payload",
                 "--no-progress"]) == 0
    out = tmp_path / "p.parquet"
    before_close = []
    real_close = results.PairsWriter.close

    def close(self):
        if self._file is not None:  # the first call: what the join left on disk
            with self._behind:  # the writer's thread may trail a fast join: let it catch up
                for _ in range(600):
                    if not self._pending:
                        break
                    self._behind.wait(0.1)
            before_close.append((out.exists(), self._waiting,
                                 sum(p.stat().st_size for p in tmp_path.glob(".p.parquet.*"))))
        real_close(self)

    monkeypatch.setattr(results.PairsWriter, "close", close)
    assert main(["replay", str(ev), "--window", "count:500,500", "--predicate", "band:2",
                 "--with-payload", "--batch-size", "128", "--chunk", "300", "--out", str(out),
                 "--no-progress"]) == 0
    t = read_events(ev)
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:500,500"),
                         parse_predicate("band:2"))
    assert len(ref.pairs) > 20_000
    ((existed, waiting, written),) = before_close
    assert not existed and waiting < 1000 and written > 100_000
    assert np.array_equal(sort_pairs(read_pairs(out)), ref.pairs)
    f = pq.ParquetFile(out)
    assert f.metadata.num_row_groups == -(-len(ref.pairs) // 1000)
    assert f.metadata.row_group(0).num_rows == 1000
    table = f.read()
    assert table.column("r_payload").to_pylist() == \
        [f"R{i}" for i in table.column("r_id").to_pylist()]
    assert f"results: {len(ref.pairs)} pairs" in capsys.readouterr().out
    # the warm-up join that loads the kernels keeps a wide band to about a pair a tuple
    wide = parse_predicate("band:33554432")
    assert replay._warm_key_max(wide) >= 8192 * 2 * 33554432
    assert replay._warm_key_max(parse_predicate("eq")) == 1 << 20
    assert replay._warm_key_max(parse_predicate("band:4611686018427387904")) == 1 << 61


def test_replay_with_payload_writes_both_sides_payloads(tmp_path, capsys):
    ev = tmp_path / "ev.parquet"
    assert main(["gen", str(ev), "--n", "3000", "--key-max", "300", "--payload",
                 "--no-progress"]) == 0
    out = tmp_path / "p.parquet"
    assert main(["replay", str(ev), "--window", "count:500,500", "--predicate", "band:1",
                 "--with-payload", "--batch-size", "128", "--out", str(out),
                 "--no-progress"]) == 0
    t = read_events(ev)
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:500,500"),
                         parse_predicate("band:1"))
    table = pq.read_table(out)
    assert np.array_equal(sort_pairs(read_pairs(out)), ref.pairs)
    assert table.column("r_payload").to_pylist() == \
        [f"R{i}" for i in table.column("r_id").to_pylist()]
    assert table.column("s_payload").to_pylist() == \
        [f"S{i}" for i in table.column("s_id").to_pylist()]
    bare = tmp_path / "bare.parquet"
    assert main(["gen", str(bare), "--n", "100", "--no-progress"]) == 0
    with pytest.raises(SystemExit, match="no payload column"):
        main(["replay", str(bare), "--window", "count:50,50", "--predicate", "eq",
              "--with-payload", "--out", str(tmp_path / "x.parquet"), "--no-progress"])


def test_gen_key2_and_replay_with_a_residual(tmp_path):
    ev = tmp_path / "ev.parquet"
    assert main(["gen", str(ev), "--n", "4000", "--key-max", "300", "--key2-max", "100",
                 "--seed", "3", "--no-progress"]) == 0
    t = read_events(ev)
    assert t.key2 is not None and t.key2.min() >= 0 and t.key2.max() < 100
    # key2 comes from its own random stream: the other columns are those without it
    bare = tmp_path / "bare.parquet"
    assert main(["gen", str(bare), "--n", "4000", "--key-max", "300", "--seed", "3",
                 "--no-progress"]) == 0
    b = read_events(bare)
    assert np.array_equal(b.key, t.key) and np.array_equal(b.ts, t.ts) and b.key2 is None
    out = tmp_path / "p.parquet"
    pred = "band:2&band2:10"
    assert main(["replay", str(ev), "--window", "count:500,500", "--predicate", pred,
                 "--batch-size", "128", "--out", str(out), "--no-progress"]) == 0
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:500,500"),
                         parse_predicate(pred), t.key2)
    unfiltered = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:500,500"),
                                parse_predicate("band:2"))
    assert 50 < len(ref.pairs) < len(unfiltered.pairs) // 2
    assert np.array_equal(sort_pairs(read_pairs(out)), ref.pairs)
    with pytest.raises(SystemExit):  # a residual on a file without key2: a clear error
        main(["replay", str(bare), "--window", "count:50,50", "--predicate", pred,
              "--out", str(tmp_path / "x.parquet"), "--no-progress"])


def test_every_command_has_a_runner():
    """Each (sub)command's parser, or one above it, names the function that runs it."""
    import argparse

    from panjoin.cli.main import build_parser

    def leaves(parser, path, run):
        run = parser.get_default("run") or run
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield path, run
            return
        for name, p in subs[0].choices.items():
            yield from leaves(p, [*path, name], run)

    runners = {" ".join(path): run for path, run in leaves(build_parser(), [], None)}
    assert len(runners) >= 13
    for path, run in runners.items():
        assert callable(run), path
    assert runners["bench peers"].__name__ == "run_peers"
    assert runners["bench system"].__name__ == "run_system"
    assert runners["pipeline"].__module__ == "spark_conn.cli"


def test_a_command_line_builds_its_commands_parser_only():
    """``COMMANDS`` lists every command the modules register, in their order; a command
    line that names one builds that module's parsers only (the others stay unimported
    in a replay, tests/test_replay_startup.py), and the same options parse."""
    import argparse

    from panjoin.cli.main import COMMANDS, build_parser

    def commands(ap):
        return list([a for a in ap._actions
                     if isinstance(a, argparse._SubParsersAction)][0].choices)

    assert commands(build_parser()) == list(COMMANDS)
    for cmd, module in COMMANDS.items():
        assert commands(build_parser(["-v", cmd, "replay"])) == \
            [c for c, m in COMMANDS.items() if m == module]
    argv = ["replay", "x.parquet", "--window", "count:4,4", "--predicate", "eq", "--out", "o"]
    assert vars(build_parser(argv).parse_args(argv)) == vars(build_parser().parse_args(argv))


def test_the_installed_panjoin_command_runs():
    """The console script that pyproject's [project.scripts] installs (what the README
    tells users to type), not ``python -m``: its entry point must name a callable."""
    import importlib.metadata

    (ep,) = [e for e in importlib.metadata.entry_points(group="console_scripts")
             if e.name == "panjoin"]
    assert callable(ep.load()), f"{ep.value} is not a function"
    script = Path(sys.executable).parent / "panjoin"
    run = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "usage: panjoin" in run.stdout
