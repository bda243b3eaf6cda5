"""PANJOIN_PROFILE: a panjoin process writes a cProfile of its threads at exit, only for
the commands named (a real subprocess, as a benchmark's manager or worker is)."""

from __future__ import annotations

import os
import pstats
import subprocess
import sys


def _gen(tmp_path, **env):
    out = tmp_path / "ev.parquet"
    r = subprocess.run([sys.executable, "-m", "panjoin.cli", "gen", str(out), "--n", "2000"],
                       env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def test_a_profiled_command_dumps_its_threads_at_exit(tmp_path):
    prof = tmp_path / "prof"
    r = _gen(tmp_path, PANJOIN_PROFILE=str(prof))
    files = list(prof.glob("gen-*.pstats"))
    assert len(files) == 1 and str(files[0]) in r.stderr
    funcs = {f"{os.path.basename(f)}:{name}" for f, _, name in pstats.Stats(str(files[0])).stats}
    assert "generate.py:generate" in funcs  # the command's own work is in it


def test_only_the_commands_named_are_profiled(tmp_path):
    prof = tmp_path / "prof"
    _gen(tmp_path, PANJOIN_PROFILE=str(prof), PANJOIN_PROFILE_COMMANDS="manager,worker")
    assert not prof.exists() or not list(prof.iterdir())
