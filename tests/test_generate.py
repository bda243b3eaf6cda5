"""The stream generator: per-distribution properties, determinism, disorder, extremes."""

from __future__ import annotations

import doctest
import time
import warnings

import numpy as np
import pytest

from panjoin import generate as gen
from panjoin.events import read_events, write_events
from panjoin.generate import (
    DISTRIBUTIONS,
    EPOCH_MS,
    INCREASING_NOISE,
    band_for_selectivity,
    generate,
)

I64_MIN = np.iinfo(np.int64).min
I64_MAX = np.iinfo(np.int64).max


def ranks_within_stream(t) -> np.ndarray:
    """The id each tuple must have: its rank within its own stream, by arrival."""
    out = np.empty(len(t), np.int64)
    for code in (0, 1):
        rows = np.flatnonzero(t.stream == code)
        out[rows] = np.arange(rows.size)
    return out


@pytest.mark.parametrize("float_keys", [False, True])
@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_basic_shape(dist, float_keys):
    n = 20_000
    t = generate(n, dist, key_min=-500, key_max=1500, float_keys=float_keys, seed=3)
    assert len(t) == n
    assert t.stream.dtype == np.uint8 and set(np.unique(t.stream)) <= {0, 1}
    assert t.key.dtype == (np.float64 if float_keys else np.int64)
    assert t.id.dtype == np.int64 and t.ts.dtype == np.int64
    assert t.key.min() >= -500 and t.key.max() <= 1500
    assert np.array_equal(t.id, ranks_within_stream(t))  # unique per stream, 0.. by arrival
    r, s = t.counts()
    assert abs(r - n / 2) < 5 * np.sqrt(n)  # R with probability 1/2
    t.validate()
    assert t.payload is None
    if dist != "equal":
        assert np.unique(t.key).size > 1


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_deterministic_per_seed(dist):
    a = generate(5000, dist, seed=11, disorder_ms=7, payload=True)
    b = generate(5000, dist, seed=11, disorder_ms=7, payload=True)
    c = generate(5000, dist, seed=12, disorder_ms=7, payload=True)
    assert a.equals(b)
    assert not np.array_equal(a.stream, c.stream)
    # the key distribution draws from its own seed: tags and ts do not change with it
    u = generate(5000, "uniform", seed=11, disorder_ms=7)
    assert np.array_equal(a.stream, u.stream) and np.array_equal(a.ts, u.ts)


def test_r_fraction():
    assert generate(1000, r_fraction=1.0).counts() == (1000, 0)
    assert generate(1000, r_fraction=0.0).counts() == (0, 1000)
    r, s = generate(100_000, r_fraction=0.3).counts()
    assert abs(r / 100_000 - 0.3) < 0.01
    # the streams are interleaved, not one block after the other
    t = generate(1000, r_fraction=0.5)
    assert np.count_nonzero(np.diff(t.stream.astype(int))) > 300


def test_timestamps_follow_the_rate():
    t = generate(10_000, rate=1000.0)  # one tuple per ms
    assert t.ts.tolist() == list(range(EPOCH_MS, EPOCH_MS + 10_000))
    t = generate(10_000, rate=1_000_000.0)  # 1000 tuples per ms
    assert t.ts[0] == EPOCH_MS and t.ts[-1] == EPOCH_MS + 9
    assert np.all(np.diff(t.ts) >= 0)
    assert np.bincount(t.ts - EPOCH_MS).tolist() == [1000] * 10
    t = generate(1000, rate=3.0)  # a non-integral period: i * 1000 / 3, rounded down
    assert t.ts.tolist() == [EPOCH_MS + i * 1000 // 3 for i in range(1000)]
    t = generate(1000, rate=7.5)
    assert t.ts.tolist() == [EPOCH_MS + (i * 2000) // 15 for i in range(1000)]


@pytest.mark.parametrize("disorder", [1, 5, 250])
def test_disorder(disorder):
    n = 50_000
    t = generate(n, rate=100_000.0, disorder_ms=disorder, seed=4)
    arrival = EPOCH_MS + np.arange(n) * 1000 // 100_000
    delay = arrival - t.ts
    assert delay.min() >= 0 and delay.max() <= disorder
    assert np.any(np.diff(t.ts) < 0)  # really out of order
    # never more than disorder_ms behind the largest ts seen so far: with an
    # allowed lateness of disorder_ms no tuple is late
    running = np.maximum.accumulate(t.ts)
    assert np.all(t.ts >= np.concatenate(([t.ts[0]], running[:-1])) - disorder)
    delayed = np.count_nonzero(delay) / n
    assert 0.5 * gen.DISORDER_FRACTION < delayed <= gen.DISORDER_FRACTION + 0.01
    u = generate(n, rate=100_000.0, disorder_ms=disorder, disorder_fraction=1.0, seed=4)
    assert np.count_nonzero(arrival - u.ts) > 0.4 * n
    assert np.array_equal(generate(n, rate=100_000.0, seed=4).ts, arrival)  # none by default


@pytest.mark.parametrize("float_keys", [False, True])
def test_increasing_rises_with_arrival(float_keys):
    n = 100_000
    lo, hi = -1_000_000, 3_000_000
    t = generate(n, "increasing", key_min=lo, key_max=hi, float_keys=float_keys)
    slack = 2 * INCREASING_NOISE * (hi - lo) + 1
    # never further below the largest key so far than the noise allows
    assert np.all(np.maximum.accumulate(t.key) - t.key <= slack)
    assert t.key[: n // 10].max() < t.key[-n // 10 :].min()
    assert t.key[0] - lo <= slack and hi - t.key[-1] <= slack  # spans the whole range
    assert np.corrcoef(np.arange(n), t.key)[0, 1] > 0.999


@pytest.mark.parametrize("float_keys", [False, True])
def test_zipf_is_rank_size(float_keys):
    n = 100_000
    t = generate(n, "zipf", key_min=0, key_max=2**31 - 1, float_keys=float_keys)
    k = t.key
    assert np.unique(k).size < 0.7 * n  # heavy duplicates
    # like the YouTube view counts: 99% of the values in 1% of the range, at the low end
    assert np.mean(k <= 0.01 * (2**31 - 1)) >= 0.99
    assert np.median(k) < 1e-3 * (2**31 - 1)
    if not float_keys:
        values, counts = np.unique(k, return_counts=True)
        assert counts.max() > 50  # the tail collapses onto a few small keys
    # a steeper exponent piles up more
    steep = generate(n, "zipf", key_min=0, key_max=2**31 - 1, zipf_a=2.0)
    assert np.unique(steep.key).size < np.unique(generate(n, "zipf", key_max=2**31 - 1).key).size


def test_zipf_small_range_all_ranks():
    t = generate(12, "zipf", key_max=99, rate=4000)
    assert set(t.key.tolist()) <= {99 // k**1.2 for k in range(1, 13)} | {
        int(99 / k**1.2) for k in range(1, 13)
    }


@pytest.mark.parametrize("modes", [1, 3, 4])
def test_normal_has_modes_peaks(modes):
    n = 120_000
    lo, hi = 0, 1_000_000
    t = generate(n, "normal", key_min=lo, key_max=hi, modes=modes, seed=5)
    centers = lo + (np.arange(modes) + 0.5) / modes * (hi - lo)
    sigma = gen.NORMAL_SIGMA * (hi - lo) / modes
    nearest = np.argmin(np.abs(t.key[:, None] - centers[None, :]), axis=1)
    dist = np.abs(t.key - centers[nearest])
    assert np.mean(dist <= 3 * sigma) > 0.99
    assert abs(np.mean(dist <= sigma) - 0.6827) < 0.01  # normal around each centre
    shares = np.bincount(nearest, minlength=modes) / n
    assert np.all(np.abs(shares - 1 / modes) < 0.01)


def test_equal_keys():
    assert np.all(generate(1000, "equal", key_min=42, key_max=99).key == 42)
    f = generate(1000, "equal", key_min=-2.5, key_max=3, float_keys=True)
    assert f.key.dtype == np.float64 and np.all(f.key == -2.5)
    assert np.all(generate(10, "equal", key_min=I64_MIN, key_max=I64_MAX).key == I64_MIN)


@pytest.mark.parametrize("dist", ["uniform", "zipf", "increasing", "normal"])
def test_float_keys_are_not_integral(dist):
    k = generate(10_000, dist, float_keys=True).key
    assert np.mean(k != np.floor(k)) > 0.99


def test_uniform_is_uniform():
    k = generate(200_000, key_min=0, key_max=9).key
    counts = np.bincount(k)
    assert counts.size == 10 and np.all(np.abs(counts / 200_000 - 0.1) < 0.005)
    f = generate(200_000, float_keys=True, key_min=0, key_max=1).key
    assert np.all(np.abs(np.histogram(f, bins=10, range=(0, 1))[0] / 200_000 - 0.1) < 0.005)


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_int64_extremes_do_not_overflow(dist):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow warning fails the test
        t = generate(50_000, dist, key_min=I64_MIN, key_max=I64_MAX, seed=6)
    k = t.key
    assert k.dtype == np.int64
    # no wrap-around: the keys keep the distribution's shape over the full range
    if dist == "uniform":
        assert np.mean(k < 0) == pytest.approx(0.5, abs=0.02)
        assert k.min() < I64_MIN // 2 and k.max() > I64_MAX // 2
    elif dist == "increasing":
        assert k[0] < I64_MIN // 2 < I64_MAX // 2 < k[-1]
        assert k[:5000].max() < k[-5000:].min()
        assert k[-1] == I64_MAX or np.max(k) > I64_MAX - 2 * INCREASING_NOISE * 2.0**64
    elif dist == "zipf":
        assert np.mean(k < I64_MIN // 2) > 0.99 and k.max() <= I64_MAX
    elif dist == "normal":
        centres = (np.arange(4) + 0.5) / 4 * 2.0**64 + I64_MIN
        off = np.abs(k[:, None] - centres).min(axis=1) / (gen.NORMAL_SIGMA * 2.0**64 / 4)
        assert np.mean(off < 3) > 0.99 and np.mean(off < 1) == pytest.approx(0.683, abs=0.01)
    else:
        assert np.all(k == I64_MIN)
    # the top of the range is reachable exactly, and narrow ranges at the edges work
    assert generate(2000, "increasing", key_min=I64_MIN, key_max=I64_MAX).key[-1] == I64_MAX
    for d_lo, d_hi in ((I64_MAX - 1, I64_MAX), (I64_MIN, I64_MIN + 1), (I64_MAX, I64_MAX)):
        kk = generate(2000, dist, key_min=d_lo, key_max=d_hi).key
        assert kk.min() >= d_lo and kk.max() <= d_hi


def test_float_extremes():
    for lo, hi in ((-1e308, 1e308), (float(I64_MIN), float(I64_MAX))):
        for dist in DISTRIBUTIONS:
            k = generate(5000, dist, key_min=lo, key_max=hi, float_keys=True).key
            assert np.all(np.isfinite(k)) and k.min() >= lo and k.max() <= hi


def test_payload():
    t = generate(1000, payload=True)
    tags = np.where(t.stream == 0, "R", "S")
    assert t.payload.to_pylist() == [f"{a}{b}" for a, b in zip(tags, t.id, strict=True)]


def test_small_n_and_bad_arguments():
    assert len(generate(0)) == 0 and generate(0, "zipf").key.dtype == np.int64
    assert len(generate(1, "increasing")) == 1
    bad = [
        dict(n=-1),
        dict(dist="pareto"),
        dict(key_min=5, key_max=4),
        dict(key_min=0.5),
        dict(key_max=2**63),
        dict(float_keys=True, key_max=float("inf")),
        dict(rate=0),
        dict(disorder_ms=-1),
        dict(r_fraction=1.5),
        dict(modes=0),
        dict(zipf_a=0),
        dict(disorder_fraction=2),
    ]
    for kw in bad:
        args = {"n": 10, **kw}
        with pytest.raises(ValueError):
            generate(args.pop("n"), **args)
    with pytest.raises(ValueError, match="uniform, zipf, increasing, normal, equal"):
        generate(10, "pareto")


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_generated_tables_round_trip(tmp_path, suffix):
    t = generate(20_000, "normal", float_keys=True, disorder_ms=3, payload=True)
    write_events(t, tmp_path / f"g{suffix}")
    assert read_events(tmp_path / f"g{suffix}").equals(t)


def test_fast():
    t0 = time.perf_counter()
    generate(2_000_000, "zipf", disorder_ms=5)
    # about 0.3 s here (10M in ~1.5 s); generous for a shared machine
    assert time.perf_counter() - t0 < 10


# --------------------------------------------------------------------------- selectivity


def test_band_for_selectivity_formula():
    assert band_for_selectivity(4, 1000, 0, 1_000_000) == 2000.0
    assert band_for_selectivity(1, 2, -10, 10) == 5.0
    assert band_for_selectivity(0, 100, 0, 10) == 0.0
    assert band_for_selectivity(-3, 100, 0, 10) == 0.0
    full = band_for_selectivity(1, 1, I64_MIN, I64_MAX)
    assert full == pytest.approx(2.0**63)
    assert band_for_selectivity(2, 10, 0.0, 1.5) == pytest.approx(0.15)
    with pytest.raises(ValueError):
        band_for_selectivity(1, 0, 0, 10)
    with pytest.raises(ValueError):
        band_for_selectivity(float("nan"), 10, 0, 10)


@pytest.mark.parametrize("selectivity", [1, 16, 300])
def test_band_gives_the_selectivity(selectivity):
    window = 20_000
    lo, hi = 0, 10_000_000
    e = band_for_selectivity(selectivity, window, lo, hi)
    stored = np.sort(generate(window, key_min=lo, key_max=hi, seed=1).key)
    probe = generate(4000, key_min=lo + int(e), key_max=hi - int(e), seed=2).key
    matches = np.searchsorted(stored, probe + e, "right") - np.searchsorted(stored, probe - e)
    assert matches.mean() == pytest.approx(selectivity, rel=0.1)


def test_doctests():
    assert doctest.testmod(gen).failed == 0
