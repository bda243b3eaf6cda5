"""The whole-file knobs of ``panjoin replay`` (panjoin/manager/knobs.py): the formula, the
time-window estimate from the file, the log line, flags overriding, and the default
replay staying exact."""

import doctest
import logging

import numpy as np

import panjoin.manager.knobs as knobs_mod
from panjoin.cli.main import main
from panjoin.events import read_events, read_pairs
from panjoin.manager.knobs import offline_knobs, window_tuples
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window


def test_doctests():
    assert doctest.testmod(knobs_mod).failed == 0


def test_the_formula():
    K = 1024
    for w, nsub, nbat in [(1, 32 * K, 32 * K), (64 * K, 64 * K, 32 * K),
                          (256 * K, 256 * K, 128 * K), (768 * K, 512 * K, 256 * K),
                          (4096 * K, 2048 * K, 256 * K)]:
        assert offline_knobs(parse_window(f"count:{w},{w // 2 or 1}")) == (nsub, nbat)
    # a time window: tuples per ms of the busier stream in the file x the span
    ts = np.arange(0, 100_000, dtype=np.int64)  # 1 tuple per ms, 3/4 of them R
    stream = (np.arange(ts.shape[0]) % 4 == 0).astype(np.uint8)
    assert window_tuples(parse_window("time:2000,1000"), ts, stream) == 1500
    nsub, nbat = offline_knobs(parse_window("time:400000,1000"), ts, stream)
    assert 299_000 < nsub < 301_000 and 149_000 < nbat < 151_000  # W = 300K tuples
    assert offline_knobs(parse_window("time:20,20"), ts, stream) == (32 * K, 32 * K)


def test_replay_says_its_knobs_and_stays_exact(tmp_path, caplog):
    ev, out = tmp_path / "e.parquet", tmp_path / "p.parquet"
    assert main(["gen", str(ev), "--n", "20000", "--key-max", "3000", "--seed", "4",
                 "--no-progress"]) == 0
    with caplog.at_level(logging.INFO):
        assert main(["replay", str(ev), "--window", "count:3000,2000", "--predicate", "eq",
                     "--out", str(out), "--no-progress"]) == 0
    assert "NSub 32768, NBat 32768" in caplog.text  # W 3000: both at their least
    t = read_events(ev)
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:3000,2000"),
                         parse_predicate("eq"))
    assert len(ref.pairs) > 1000
    assert np.array_equal(sort_pairs(read_pairs(out)), ref.pairs)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert main(["replay", str(ev), "--window", "count:3000,2000", "--predicate", "eq",
                     "--subwindow-size", "500", "--out", str(out), "--no-progress"]) == 0
    assert "NSub 500, NBat 32768" in caplog.text
    assert np.array_equal(sort_pairs(read_pairs(out)), ref.pairs)
