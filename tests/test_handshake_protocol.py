"""Handshake join's chain protocol, simulated without processes, against the reference.

Grid: 1-4 nodes x {eq, band, bands, ne} x {count, time} x {fixed, random
interleaving}; plus float and extreme int64 keys, out-of-order input with late
tuples, skewed R/S rates, tiny result FIFOs (admission control), the balancing
invariant after every step, and a naive protocol without two-phase forwarding,
which must miss pairs (so these tests can fail).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from panjoin.generate import generate
from panjoin.handshake.merge import FIFO, MergingNetwork
from panjoin.handshake.simulate import Simulation
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import I64_MAX, I64_MIN, parse_predicate, parse_window

N = 500
EXTREMES = np.array([I64_MIN, I64_MIN + 1, -2, 0, 3, I64_MAX - 1, I64_MAX], dtype=np.int64)
WINDOWS = {"count": "count:60,35", "time": "time:70,45"}


@functools.cache
def stream(dist="uniform", n=N, disorder_ms=0, r_fraction=0.5, seed=11):
    if dist == "extreme":
        t = generate(n, "uniform", key_min=0, key_max=len(EXTREMES) - 1, seed=seed,
                     r_fraction=r_fraction, rate=1000.0)
        t.key = EXTREMES[t.key]
        return t
    if dist == "float":
        t = generate(n, "uniform", key_min=0, key_max=30, float_keys=True, seed=seed,
                     rate=1000.0)
        t.key = np.round(t.key * 4) / 4 + 0.1
        return t
    return generate(n, dist, key_min=-20, key_max=40, seed=seed, disorder_ms=disorder_ms,
                    r_fraction=r_fraction, rate=1000.0)


def check(t, window, pred, n_nodes, lateness=0, **kw):
    w, p = parse_window(window, lateness), parse_predicate(pred)
    ref = reference_join(t.stream, t.id, t.key, t.ts, w, p)
    sim = Simulation(n_nodes, w, p, key_dtype=t.key.dtype, **kw)
    got = sim.run(t.stream, t.id, t.key, t.ts)
    assert len(np.unique(got, axis=0)) == len(got), "a pair was produced twice"
    got = sort_pairs(got)
    assert got.shape == ref.pairs.shape, f"{len(got)} pairs, reference has {len(ref.pairs)}"
    assert np.array_equal(got, ref.pairs)
    late = sim.driver.take_late()
    for x in ("R", "S"):
        assert np.array_equal(np.sort(late[x]), np.sort(ref.late_ids[x]))
    return sim


@pytest.mark.parametrize("n_nodes", [1, 2, 3, 4])
@pytest.mark.parametrize("wkind", ["count", "time"])
@pytest.mark.parametrize("pred", ["eq", "band:3", "bands:-9,-6;2,4", "ne"])
@pytest.mark.parametrize("order", ["fifo", "random"])
def test_chain_equals_reference(n_nodes, wkind, pred, order):
    n = 150 if pred == "ne" else 300  # ne's result is quadratic
    check(stream(n=n), WINDOWS[wkind], pred, n_nodes, order=order, seed=n_nodes,
          feed_chunk=5, max_batch=7, check=order == "random")


@pytest.mark.parametrize("n_nodes", [1, 3])
@pytest.mark.parametrize("wkind", ["count", "time"])
@pytest.mark.parametrize("pred", ["eq", "bands:-9,-6;2,4", "ne"])
def test_sorted_segment_index_equals_reference(n_nodes, wkind, pred):
    check(stream(n=150 if pred == "ne" else 300), WINDOWS[wkind], pred, n_nodes,
          order="random", seed=3, feed_chunk=6, max_batch=5, check=True, index="sorted")


@pytest.mark.parametrize("index", ["nested", "sorted"])
def test_float_keys_with_either_segment_kind(index):
    check(stream("float", n=300), WINDOWS["time"], "band:0.5", 2, order="random", seed=1,
          check=True, index=index)


@pytest.mark.parametrize("dist", ["float", "extreme", "zipf", "equal"])
@pytest.mark.parametrize("wkind", ["count", "time"])
def test_key_distributions(dist, wkind):
    check(stream(dist, n=300), WINDOWS[wkind], "band:1" if dist != "extreme" else "band:3",
          3, order="random", seed=4, feed_chunk=9, check=True)


@pytest.mark.parametrize("n_nodes", [1, 3])
@pytest.mark.parametrize("lateness", [0, 25])
def test_time_window_out_of_order_with_late_tuples(n_nodes, lateness):
    t = stream(n=N, disorder_ms=40)
    sim = check(t, "time:50,30", "band:4", n_nodes, lateness=lateness, order="random",
                seed=9, feed_chunk=6)
    assert sim.driver.n_late > 0  # the case is exercised


@pytest.mark.parametrize("r_fraction", [0.85, 0.15])
@pytest.mark.parametrize("wkind", ["count", "time"])
def test_skewed_rates(r_fraction, wkind):
    check(stream(n=N, r_fraction=r_fraction), WINDOWS[wkind], "band:2", 4, order="random",
          seed=2, feed_chunk=4, check=True)


@pytest.mark.parametrize("fifo", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("n_nodes", [1, 2, 4])
def test_tiny_fifos_pause_input_and_lose_nothing(fifo, n_nodes):
    sim = check(stream(n=300), "count:40,40", "band:4", n_nodes, node_fifo=fifo,
                merger_fifo=max(1, fifo // 2), sink_rate=1, order="random", seed=fifo,
                feed_chunk=8, check=True)
    assert sim.admission.pauses > 0, "the FIFOs never filled: admission control untested"
    assert max(sim.status()["fifo_high_water"]) <= fifo


def test_balancing_invariant_and_convergence():
    # a long count-window stream, no drain: at rest every segment holds its share
    t = generate(3000, "uniform", key_min=0, key_max=10_000, seed=5, rate=1000.0)
    w, p = parse_window("count:400,240"), parse_predicate("band:1")
    for n_nodes in (2, 3, 4):
        sim = Simulation(n_nodes, w, p, order="random", seed=n_nodes, feed_chunk=16)
        sim.feed_all(t.stream, t.id, t.key, t.ts)
        assert sim.quiet()
        for x, flow in (("S", -1), ("R", 1)):
            sizes = sim.sizes(x)
            assert sum(sizes) == w.size(x), sizes  # exactly the window, expired lazily
            if flow == 1:
                sizes = sizes[::-1]  # now the stream flows toward index 0
            # at rest: non-increasing against the flow, neighbours within one tuple
            for k in range(1, n_nodes):
                assert 0 <= sizes[k - 1] - sizes[k] <= 1, (x, sim.sizes(x))
            assert max(sizes) - min(sizes) <= n_nodes - 1
        # while running, never more than one tuple against the flow (checked every step)
        assert sim.max_imbalance["S"] <= 1 and sim.max_imbalance["R"] <= 1


@pytest.mark.parametrize("fast_forward", [False, True])
@pytest.mark.parametrize("wkind", ["count", "time"])
def test_drain_then_more_input(wkind, fast_forward):
    # a flush in the middle of the stream (the manager's flush=True), then more input
    t = stream(n=N)
    w, p = parse_window(WINDOWS[wkind]), parse_predicate("band:3")
    sim = Simulation(3, w, p, order="random", seed=7, feed_chunk=5, check=True,
                     fast_forward=fast_forward)
    parts = []
    for a, b in ((0, 170), (170, 171), (171, N)):
        sim.feed_all(t.stream[a:b], t.id[a:b], t.key[a:b], t.ts[a:b])
        sim.drain()
        parts.append(sim.take_pairs())
    ref = reference_join(t.stream, t.id, t.key, t.ts, w, p).pairs
    assert np.array_equal(sort_pairs(np.concatenate(parts)), ref)


@pytest.mark.parametrize("fast_forward", [False, True])
def test_without_two_phase_forwarding_pairs_go_wrong(fast_forward):
    # the naive protocol misses pairs (Figure 7); express runs need both streams
    # two-phase, or crossings miss or double them
    t = stream(n=N)
    w, p = parse_window("count:60,60"), parse_predicate("band:5")
    ref = {tuple(x) for x in reference_join(t.stream, t.id, t.key, t.ts, w, p).pairs}
    wrong = 0
    for seed in range(6):
        sim = Simulation(3, w, p, order="random", seed=seed, feed_chunk=5, max_batch=3,
                         two_phase=False, fast_forward=fast_forward)
        got = [tuple(x) for x in sim.run(t.stream, t.id, t.key, t.ts)]
        wrong += len(ref - set(got)) + len(got) - len(set(got) & ref)
    assert wrong > 0


# ------------------------------------------------------------------ fast forwarding


@pytest.mark.parametrize("n_nodes", [1, 2, 3, 5])
@pytest.mark.parametrize("wkind", ["count", "time"])
@pytest.mark.parametrize("pred", ["eq", "band:3", "bands:-9,-6;2,4", "ne"])
@pytest.mark.parametrize("order", ["fifo", "random"])
def test_fast_forwarding_equals_reference(n_nodes, wkind, pred, order):
    n = 150 if pred == "ne" else 300
    check(stream(n=n), WINDOWS[wkind], pred, n_nodes, order=order, seed=n_nodes,
          feed_chunk=5, max_batch=7, check=order == "random", fast_forward=True)


@pytest.mark.parametrize("seed", range(12))
def test_fast_forwarding_under_many_interleavings(seed):
    # express runs cross stored tuples on every link in every order the seeds pick;
    # tiny runs and batches make crossings (and held express runs at the ends) common
    wkind = ("count", "time")[seed % 2]
    check(stream(n=N, seed=seed), WINDOWS[wkind], "band:2", 2 + seed % 4, order="random",
          seed=seed, feed_chunk=1 + seed % 4, max_batch=1 + seed % 3, check=True,
          fast_forward=True)


@pytest.mark.parametrize("case", ["sorted", "float", "extreme", "zipf", "late", "skewed",
                                  "tiny-fifo"])
def test_fast_forwarding_cases(case):
    kw = dict(order="random", seed=5, feed_chunk=6, check=True, fast_forward=True)
    if case == "sorted":
        check(stream(n=300), WINDOWS["count"], "bands:-9,-6;2,4", 3, index="sorted", **kw)
    elif case in ("float", "extreme", "zipf"):
        check(stream(case, n=300), WINDOWS["time"], "band:3" if case == "extreme" else "band:1",
              3, **kw)
    elif case == "late":
        sim = check(stream(n=N, disorder_ms=40), "time:50,30", "band:4", 3, lateness=25, **kw)
        assert sim.driver.n_late > 0
    elif case == "skewed":
        check(stream(n=N, r_fraction=0.85), WINDOWS["count"], "band:2", 4, **kw)
    else:
        sim = check(stream(n=300), "count:40,40", "band:4", 3, node_fifo=2, merger_fifo=1,
                    sink_rate=1, **kw)
        assert sim.admission.pauses > 0


def test_fast_forwarding_finds_pairs_as_tuples_enter():
    # the latency it is for: after each input chunk, with the chain left to settle,
    # every pair of the tuples fed so far is out, without a drain
    t = stream(n=300)
    w, p = parse_window("count:200,200"), parse_predicate("band:2")
    for ff in (True, False):
        sim = Simulation(4, w, p, order="fifo", feed_chunk=10, fast_forward=ff)
        got = []
        early = 0
        for a in range(0, 300, 30):
            sim.feed_all(t.stream[a:a + 30], t.id[a:a + 30], t.key[a:a + 30], t.ts[a:a + 30])
            got.append(sim.take_pairs())
            sofar = reference_join(t.stream[:a + 30], t.id[:a + 30], t.key[:a + 30],
                                   t.ts[:a + 30], w, p).pairs
            early += len(np.concatenate(got)) == len(sofar)
        if ff:
            assert early == 10  # every chunk's pairs out before the next chunk
        else:
            assert early < 10  # the plain chain finds old pairs only when tuples cross


def test_merging_network_shape_and_no_loss():
    net = MergingNetwork(5, node_fifo=3, merger_fifo=2)
    assert len(net.mergers) == 7  # 8 leaves -> 4 + 2 + 1 mergers
    rng = np.random.default_rng(0)
    sent, got = [], []
    pending = [np.arange(i * 100, i * 100 + int(rng.integers(5, 30))) for i in range(5)]
    while any(p.size for p in pending) or net.pairs_inside():
        for i, p in enumerate(pending):
            k = net.leaves[i].offer(p, -p)
            sent.append(p[:k])
            pending[i] = p[k:]
        net.step()
        r, s = net.root.take(1)
        assert np.array_equal(r, -s)
        got.append(r)
        assert all(len(f) <= f.capacity for f in net.fifos())
    assert np.array_equal(np.sort(np.concatenate(got)), np.sort(np.concatenate(sent)))


def test_fifo_rejects_zero_capacity():
    with pytest.raises(ValueError, match="capacity"):
        FIFO(0)
