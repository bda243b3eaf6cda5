"""``--index auto``: which index each new subwindow gets and why, that the choice follows
the stream (batch sizes under a latency bound), that mixed rings stay exact against the
reference (in-process and on real workers), and that the default is auto."""

import logging

import numpy as np
import pytest

from panjoin.generate import generate
from panjoin.manager.engine import JoinEngine
from panjoin.manager.index_choice import HASH_MAX_BATCH, HASH_MIN_NSUB, IndexChooser
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window


def _ref(ev, window, pred, lateness=0):
    return reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window(window, lateness),
                          parse_predicate(pred)).pairs


def _pairs(eng):
    r, s = eng.take_results()
    return sort_pairs(np.stack([r, s], axis=1))


@pytest.mark.parametrize("pred,nbat,kind", [
    ("eq", 1024, "hash"),
    ("eq", HASH_MAX_BATCH, "hash"),
    ("eq", HASH_MAX_BATCH + 1, "bisort"),
    ("band:3", 1024, "bisort"),       # a few lookups a tuple cost more than one range
    ("band:64", 1024, "bisort"),
    ("ne", 1024, "bisort"),
    ("eq&band2:1", 1024, "hash"),     # the residual is checked after the lookup
])
def test_the_rule(pred, nbat, kind):
    c = IndexChooser(parse_predicate(pred), nsub=1 << 20)
    assert c.choose(nbat).kind == "bisort"  # nothing seen yet
    for _ in range(8):
        c.observe_batch(nbat)
    choice = c.choose(1 << 20)  # observed batches outweigh the cap
    assert choice.kind == kind and str(parse_predicate(pred)) in choice.why


def test_small_subwindows_stay_bisort():
    c = IndexChooser(parse_predicate("eq"), nsub=HASH_MIN_NSUB - 1)
    for _ in range(8):
        c.observe_batch(64)
    assert c.choose().kind == "bisort" and "in cache" in c.choose().why
    c = IndexChooser(parse_predicate("eq"), nsub=HASH_MIN_NSUB)
    for _ in range(8):
        c.observe_batch(64)
    assert c.choose().kind == "hash"


def test_the_choice_follows_the_batches():
    c = IndexChooser(parse_predicate("eq"), nsub=1 << 20)
    for _ in range(8):
        c.observe_batch(512)
    assert c.choose().kind == "hash"
    for _ in range(30):
        c.observe_batch(2 * HASH_MAX_BATCH)
    assert c.choose().kind == "bisort"
    for _ in range(30):
        c.observe_batch(256)
    assert c.choose().kind == "hash"


def test_many_pairs_or_increasing_keys_stay_bisort():
    rng = np.random.default_rng(1)
    c = IndexChooser(parse_predicate("eq"), nsub=1 << 20)
    for _ in range(10):
        c.observe_batch(1000, pairs=11_000, keys=rng.integers(0, 100, 1000))
    assert c.choose().kind == "bisort" and "pairs a tuple" in c.choose().why
    c2 = IndexChooser(parse_predicate("eq"), nsub=1 << 20)
    for _ in range(10):  # a tenth of a window: 0.3 pairs a tuple will be 3
        c2.observe_batch(1000, pairs=300, keys=rng.integers(0, 100, 1000), fill=0.1)
    assert c2.choose().kind == "bisort" and "~3.0 pairs" in c2.choose().why
    for _ in range(30):
        c.observe_batch(1000, pairs=900, keys=rng.integers(0, 100, 1000))
    assert c.choose().kind == "hash"
    for i in range(30):  # a key range that drifts up, in random order within a batch
        c.observe_batch(1000, pairs=900, keys=rng.integers(0, 10_000, 1000) + 2000 * i)
    assert c.choose().kind == "bisort" and "increasing" in c.choose().why


def test_a_ring_of_both_kinds_is_exact_and_logged(caplog, monkeypatch):
    """Small batches, then large ones, then small: subwindows of both kinds live in the
    window at once, and every pair is found once (the threshold scaled down with the
    data, so that the reference stays quick)."""
    monkeypatch.setattr("panjoin.manager.index_choice.HASH_MAX_BATCH", 256)
    monkeypatch.setattr("panjoin.manager.index_choice.HASH_MIN_NSUB", 1)
    ev = generate(15_000, "uniform", key_max=3_000, seed=3)
    window, pred = "count:1500,1200", "eq"
    eng = JoinEngine(window, pred, index="auto", subwindow_size=250, batch_size=16,
                     threads=1)
    with caplog.at_level(logging.INFO, logger="panjoin.manager"):
        for a, b, nbat in ((0, 3000, 16), (3000, 12_000, 1000), (12_000, 15_000, 16)):
            eng.batch_size = eng.max_lag = nbat
            for c in range(a, b, 250):
                eng.push(ev.slice(c, c + 250))
        eng.flush()
    got = _pairs(eng)
    assert eng.stats.index_by["hash"] > 3 and eng.stats.index_by["bisort"] > 3
    kinds = [x.index for ring in eng.rings.values() for x in ring]
    assert set(kinds) <= {"hash", "bisort"}
    said = [r.getMessage() for r in caplog.records if "index auto" in r.getMessage()]
    assert any(": hash, as eq, batches of" in m for m in said)
    assert any(": bisort, as eq, batches of" in m for m in said)
    np.testing.assert_array_equal(got, _ref(ev, window, pred))


@pytest.mark.parametrize("window,pred", [("time:300,200", "eq"), ("count:900,700", "band:40"),
                                         ("count:900,700", "eq")])
def test_auto_under_a_latency_bound_is_exact(window, pred, monkeypatch):
    monkeypatch.setattr("panjoin.manager.index_choice.HASH_MIN_NSUB", 1)
    lateness = 20 if window.startswith("time") else 0
    ev = generate(8000, "uniform", key_max=2_000, rate=20_000,
                  disorder_ms=10 if lateness else 0, seed=5)
    # batch_size: the largest the bound may pick; a slow machine makes it pick large
    # ones, and auto decides only after 8 batches (fewer than 8 of 8000 tuples: no hash)
    eng = JoinEngine(parse_window(window, lateness), pred, index="auto", subwindow_size=256,
                     max_latency_ms=5, batch_size=256, threads=1)
    for a in range(0, len(ev), 97):
        eng.push(ev.slice(a, a + 97))
        eng.tick()
    eng.flush()
    np.testing.assert_array_equal(_pairs(eng), _ref(ev, window, pred, lateness))
    assert sum(eng.stats.index_by.values()) > 2
    if pred != "band:40":
        assert eng.stats.index_by["hash"] > 0


def test_the_default_is_auto():
    from panjoin.cli.main import build_parser
    from panjoin.cli.options import check_topology  # fills in the ring's defaults

    args = build_parser().parse_args(["replay", "x.parquet", "--window", "count:4,4",
                                      "--predicate", "eq", "--out", "o.parquet"])
    check_topology(args, "panjoin replay")
    assert args.index == "auto"
    assert JoinEngine("count:4,4", "eq").index == "auto"


def test_auto_on_workers_is_exact(monkeypatch):
    """Real workers build the subwindows auto picks (hash, then BI-Sort once the batches
    grow), and the pairs are exact."""
    from panjoin.launch import start_cluster
    from panjoin.manager.grpc_backend import GrpcBackend

    monkeypatch.setattr("panjoin.manager.index_choice.HASH_MIN_NSUB", 1)
    monkeypatch.setattr("panjoin.manager.index_choice.HASH_MAX_BATCH", 256)
    ev = generate(9000, "uniform", key_max=1_500, seed=9)
    window = "count:1500,1500"
    with start_cluster(2, manager=False) as cluster, GrpcBackend(cluster.addresses) as be:
        eng = JoinEngine(window, "eq", index="auto", subwindow_size=300, batch_size=64,
                         backend=be, n_workers=2)
        for a, b, nbat in ((0, 3000, 64), (3000, 9000, 2000)):
            eng.batch_size = eng.max_lag = nbat
            for c in range(a, b, 500):
                eng.push(ev.slice(c, c + 500))
        eng.flush()
        got = _pairs(eng)
    assert eng.stats.index_by["hash"] > 0 and eng.stats.index_by["bisort"] > 0
    np.testing.assert_array_equal(got, _ref(ev, window, "eq"))


def test_under_a_latency_bound_the_batch_size_does_not_count():
    """A backlog's large batches under a bound: hash all the same (a BI-Sort
    subwindow's fixed cost would keep the batches large for its whole life)."""
    free = IndexChooser(parse_predicate("eq"), nsub=1 << 20)
    bound = IndexChooser(parse_predicate("eq"), nsub=1 << 20, bounded=True)
    for c in (free, bound):
        for _ in range(10):
            c.observe_batch(256 << 10, pairs=250_000)
    assert free.choose().kind == "bisort"
    assert bound.choose().kind == "hash" and "latency bound" in bound.choose().why
    # the other reasons still hold under a bound
    band = IndexChooser(parse_predicate("band:2"), nsub=1 << 20, bounded=True)
    assert band.choose().kind == "bisort"
    for _ in range(30):
        bound.observe_batch(1000, pairs=20_000)
    assert bound.choose().kind == "bisort" and "pairs a tuple" in bound.choose().why


def test_uniform_keys_never_read_as_increasing():
    """Rising medians are a coin flip a batch for stationary keys: over thousands of
    batches of any size the chooser must not take them for increasing keys (with a
    weight of 0.2 it did every few hundred batches)."""
    rng = np.random.default_rng(7)
    c = IndexChooser(parse_predicate("eq"), nsub=1 << 20, bounded=True)
    worst = 0.0
    for i in range(5000):
        n = int(rng.integers(500, 20_000))
        c.observe_batch(n, pairs=n, keys=rng.integers(0, 1_000_000, n), stream="RS"[i % 2])
        if i >= 8:
            worst = max(worst, c.order)
            assert c.choose().kind == "hash", (i, c.choose().why)
    assert worst > 0.6  # it does wander: the test can tell a heavier weight


def test_pairs_a_tuple_are_not_fooled_by_a_small_batch_after_a_large_one():
    """The pairs found since the last batch belong to the batch before, which may be
    20x larger: a small batch after a large one is not 20 pairs a tuple."""
    c = IndexChooser(parse_predicate("eq"), nsub=1 << 20, bounded=True)
    for _ in range(40):
        c.observe_batch(20_000, pairs=1_000)  # the pairs of the small batch before
        c.observe_batch(1_000, pairs=20_000)  # the pairs of the large batch before
    assert 0.8 < c.pairs < 1.5  # (averages of ratios: 9-11)
    assert c.choose().kind == "hash"
