"""benchmarks/cli_vs_polars.py: replay, a Polars script and the engine alone give the same
pairs on one small file, and the table says how they compare."""

import pytest

from benchmarks import cli_vs_polars as bench


def test_a_small_sweep_compares_the_three_on_the_same_pairs(tmp_path):
    pytest.importorskip("polars")
    recs = bench.sweep([20_000], ["band1-count"], 1, str(tmp_path), echo=lambda *_: None)
    (rec,) = recs
    rp, po, en = (rec["runs"][k][0] for k in ("replay", "polars", "engine"))
    assert rp["pairs"] == po["pairs"] == en["pairs"] > 10_000
    assert rp["wall_s"] > rp["time_s"] >= rp["join_s"] > 0 and po["threads"] >= 1
    # Polars' wall leaves out the plan's imports (numpy, panjoin), which a user's
    # script does not make
    assert po["wall_with_plan_s"] - po["plan_import_s"] == pytest.approx(po["wall_s"])
    assert po["wall_s"] > po["join_s"] > 0 and po["plan_import_s"] > 0
    text = bench.table(recs)
    assert "| 20,000 | band1-count | " in text and text.count("\n") == 2


def test_pairs_that_differ_stop_the_sweep(tmp_path, monkeypatch):
    pytest.importorskip("polars")
    real = bench.run_polars

    def one_short(*a):
        out = real(*a)
        return {**out, "pairs": out["pairs"] - 1}

    monkeypatch.setattr(bench, "run_polars", one_short)
    with pytest.raises(AssertionError, match="pairs differ"):
        bench.sweep([20_000], ["eq-time"], 1, str(tmp_path), echo=lambda *_: None)


def test_the_processes_cache_bytecode_as_a_users_do(monkeypatch):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = bench._user_env()
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["PATH"] == bench.os.environ["PATH"]
