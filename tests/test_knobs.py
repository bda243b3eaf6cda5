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
    # their least; about 1 pair a tuple: the largest chunks
    assert "NSub 32768, NBat 32768, chunks of 1048576 rows (W 3000 tuples a stream" in caplog.text
    assert "pairs a probe tuple" in caplog.text
    t = read_events(ev)
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("count:3000,2000"),
                         parse_predicate("eq"))
    assert len(ref.pairs) > 1000
    assert np.array_equal(sort_pairs(read_pairs(out)), ref.pairs)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert main(["replay", str(ev), "--window", "count:3000,2000", "--predicate", "eq",
                     "--subwindow-size", "500", "--out", str(out), "--no-progress"]) == 0
    assert "NSub 500, NBat 32768, chunks of 1048576" in caplog.text
    assert np.array_equal(sort_pairs(read_pairs(out)), ref.pairs)


def _pairs_brute(key, stream, pred, w, probes=256) -> float:
    """Each of the last ``probes`` tuples per stream against its own window: the mean."""
    means = []
    for side in (0, 1):
        mine = np.flatnonzero(stream == side)[-probes:]
        counts = []
        for p in mine:
            win = key[np.flatnonzero(stream[:p] != side)[-w:]]
            d = (win - key[p]) if side == 0 else (key[p] - win)
            counts.append(sum(int(((d >= a) & (d <= b)).sum()) for a, b in pred.bands))
        if counts:
            means.append(np.mean(counts))
    return float(np.mean(means))


def test_pairs_a_probe_tuple_finds():
    """The estimate, with a sample as large as the window, is the exact mean over the
    last probes of each stream, each against its own window: uniform, zipf, increasing,
    all-equal, negative and float keys; equi, band and multi-band predicates."""
    rng = np.random.default_rng(3)
    n = 6000
    stream = (rng.random(n) < 0.4).astype(np.uint8)  # unbalanced: 40% S
    keys = {"uniform": rng.integers(-500, 500, n), "zipf": rng.zipf(1.5, n) % 200,
            "increasing": np.cumsum(rng.integers(0, 3, n)), "equal": np.full(n, -7),
            "float": rng.normal(0, 50, n)}
    for name, key in keys.items():
        for spec in ("eq", "band:5", "bands:-9,-4;2,30"):
            pred = parse_predicate(spec)
            for w in (100, 1500, 10_000):
                got = knobs_mod.pairs_per_tuple(key, stream, pred, w, sample=1 << 20)
                want = np.median([_pairs_brute(key[:e], stream[:e], pred, w)
                                for e in knobs_mod.sample_ends(n, w)])
                assert abs(got - want) < 1e-9 * max(1.0, want), (name, spec, w, got, want)
    # keys that change on the way: increasing ones that reach their cap and end all equal
    # (as the peers' increasing workload does) are judged over the file, not by its end
    w = 1000
    key = np.minimum(np.arange(40_000), 36_000)
    st = np.tile([0, 1], 20_000).astype(np.uint8)
    end = knobs_mod.pairs_per_tuple(key, st, parse_predicate("eq"), w, points=1)
    assert end > 0.9 * w  # the tail: every key equal
    assert knobs_mod.pairs_per_tuple(key, st, parse_predicate("eq"), w) < 0.01 * end
    # a sample of the window: close, not exact (uniform keys, 64 pairs a probe)
    key = rng.integers(0, 1 << 20, 400_000)
    st = (rng.random(key.size) < 0.5).astype(np.uint8)
    pred = parse_predicate("band:128")
    want = _pairs_brute(key, st, pred, 100_000, probes=64)
    got = knobs_mod.pairs_per_tuple(key, st, pred, 100_000, sample=4096, points=1)
    assert 0.8 * want < got < 1.25 * want
    # extreme int64 keys: an estimate, not an overflow
    ext = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max] * 500)
    assert knobs_mod.pairs_per_tuple(ext, np.tile([0, 1], 500).astype(np.uint8),
                                     parse_predicate("band:3"), 100) >= 0


def test_a_result_heavy_join_gets_smaller_batches():
    K = 1024
    one_m = parse_window("count:1M,1M")
    assert offline_knobs(one_m, pairs=1.0) == (512 * K, 256 * K)
    assert offline_knobs(one_m, pairs=8.0) == (512 * K, 256 * K)  # 2M pairs a batch
    assert offline_knobs(one_m, pairs=16.0) == (512 * K, 128 * K)
    assert offline_knobs(one_m, pairs=32.0) == (512 * K, 64 * K)  # and NSub W/2
    assert offline_knobs(one_m, pairs=64.0) == (256 * K, 32 * K)
    assert offline_knobs(one_m, pairs=66.0) == (256 * K, 32 * K)  # an estimate of 64
    assert offline_knobs(one_m, pairs=1e6) == (256 * K, 32 * K)  # never below the least
    # NBat is 32K already; the subwindows still shrink (the expired tail a probe meets)
    w64 = parse_window("count:64K,64K")
    assert offline_knobs(w64, pairs=8.0) == (64 * K, 32 * K)
    assert offline_knobs(w64, pairs=32.0) == (32 * K, 32 * K)
    assert offline_knobs(w64, pairs=64.0) == (16 * K, 32 * K)
    assert offline_knobs(parse_window("count:16K,16K"), pairs=1e3) == (4 * K, 32 * K)
    assert offline_knobs(parse_window("count:2K,2K"), pairs=2e3) == (1 * K, 32 * K)
    # a chunk makes about 8M pairs: the writer trails the join by that much at the end
    assert knobs_mod.chunk_rows(1.0, 256 * K) == 1024 * K
    assert knobs_mod.chunk_rows(64.0, 128 * K) == 128 * K
    assert knobs_mod.chunk_rows(64.0, 32 * K) == 128 * K
    assert knobs_mod.chunk_rows(1e6, 32 * K) == 32 * K  # never below a batch
    # increasing keys beyond 512K: a band's probes meet the newest keys, W/2 at least
    assert offline_knobs(one_m, pairs=64.0, increasing=True) == (512 * K, 32 * K)
    assert offline_knobs(w64, pairs=64.0, increasing=True) == (16 * K, 32 * K)  # W/4 best
    assert offline_knobs(w64, pairs=8.0, increasing=True) == (64 * K, 32 * K)
    four_m = parse_window("count:4M,4M")
    assert offline_knobs(four_m, pairs=64.0, increasing=True) == (2048 * K, 32 * K)
    assert offline_knobs(four_m, pairs=40.0) == (2048 * K, 64 * K)  # 40 rounds to 32: W/2
    assert offline_knobs(four_m, pairs=4.0) == (2048 * K, 256 * K)
    # no window to speak of, one stream only, an empty file: no estimate, no error
    one = np.zeros(50, np.uint8)
    assert knobs_mod.pairs_per_tuple(np.arange(50), one, parse_predicate("eq"), 10) == 0.0
    assert knobs_mod.pairs_per_tuple(np.arange(0), one[:0], parse_predicate("eq"), 10) == 0.0
    got = knobs_mod.pairs_per_tuple(np.zeros(50), np.tile([0, 1], 25).astype(np.uint8),
                                    parse_predicate("eq"), 0)  # the first R finds none
    assert got == (24 / 25 + 1) / 2


def test_the_chunk_follows_the_pairs_in_process_and_is_256k_on_a_manager(caplog):
    """Replay's chunk: about 8M pairs' worth in-process; a manager's Join stream takes
    256K-row chunks (JoinInputs below glibc's mmap threshold: 1M rows, 25 MB, were faulted
    in afresh each); a chunk given is kept (and the log line names it in every case)."""
    import argparse

    from panjoin.cli.replay import _fill_knobs, _wire_or_max_chunk
    from panjoin.generate import generate

    ev = generate(40_000, "uniform", key_max=100, seed=2)  # about 100 pairs a tuple
    window, pred = parse_window("count:10000,10000"), parse_predicate("eq")

    def chunk(cluster, given=None):
        a = argparse.Namespace(cluster=cluster, chunk=given, subwindow_size=None,
                               batch_size=None, workers=None, placement="time")
        with caplog.at_level(logging.INFO):
            _fill_knobs(a, window, ev, pred)
        assert f"chunks of {a.chunk} rows" in caplog.text
        return a.chunk

    assert chunk(None) == 64 * 1024  # 8M / 100 pairs, to a power of two
    assert chunk("localhost:1") == knobs_mod.CHUNK_WIRE == 1 << 18
    assert chunk(None, given=5000) == 5000
    # without the whole-file rule (a latency bound, the handshake chain)
    assert _wire_or_max_chunk(argparse.Namespace(cluster="localhost:1")) == 1 << 18
    assert _wire_or_max_chunk(argparse.Namespace(cluster=None)) == knobs_mod.CHUNK_MAX


def test_keys_that_increase_are_told_from_the_rest():
    """The peers' increasing keys (capped: they end all equal) increase; uniform, zipf,
    all-equal and decreasing keys do not."""
    from panjoin.generate import generate

    assert knobs_mod.keys_increase(generate(200_000, "increasing", seed=1).key)
    for dist in ("uniform", "zipf", "equal"):
        assert not knobs_mod.keys_increase(generate(200_000, dist, seed=1).key), dist
    capped = np.minimum(np.arange(100_000), 60_000)  # the last 40% all equal
    assert knobs_mod.keys_increase(capped)
    assert not knobs_mod.keys_increase(np.arange(100_000)[::-1].copy())
