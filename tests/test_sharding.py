"""The router of a sharded join (panjoin/sharding.py): every qualifying pair lands in
exactly one shard, checked pair by pair against a brute-force predicate on small random
data; the router's kernel passes against that rule written out in numpy; lateness decided
by the reference's rule; count windows refused."""

import os
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from panjoin.semantics import I64_MAX, I64_MIN, SpecError, late_mask, parse_predicate, parse_window
from panjoin.sharding import Router, boundaries, s_targets, shard_of

PREDICATES = ["eq", "band:3", "band:0", "bands:-5,-2;4,9", "ne", "bands:-1.5,0.5;7,7",
              "band:2&band2:1"]


def qualifies(pred, r_key, s_key) -> bool:
    """The key condition alone, exactly (Python integers, Fractions for floats)."""
    d = Fraction(s_key) - Fraction(r_key) if isinstance(s_key, float) else int(s_key) - int(r_key)
    inside = any(Fraction(a) <= d <= Fraction(b) for a, b in pred.bands)
    return not inside if pred.negated else inside


def check_every_pair_once(keys_r, keys_s, bounds, pred):
    """Each qualifying (r, s) is found in exactly one shard: the one r is stored in
    (R goes to one shard only) must also hold s."""
    owner = shard_of(bounds, keys_r)
    assert owner.min() >= 0 and owner.max() <= bounds.size
    to = s_targets(bounds, pred, keys_s)
    assert to.shape == (bounds.size + 1, keys_s.size)
    found = 0
    for i, rk in enumerate(keys_r.tolist()):
        for j, sk in enumerate(keys_s.tolist()):
            if qualifies(pred, rk, sk):
                assert to[owner[i], j], (pred, rk, sk, bounds.tolist())
                found += 1
    return found


@pytest.mark.parametrize("spec", PREDICATES)
@pytest.mark.parametrize("seed", range(4))
def test_every_qualifying_pair_lands_in_one_shard_small_ints(spec, seed):
    rng = np.random.default_rng(seed)
    pred = parse_predicate(spec)
    keys = rng.integers(-20, 20, size=120)
    k = int(rng.integers(2, 5))
    # boundaries on keys that occur (straddled by bands), repeated ones too (an empty shard)
    bounds = np.sort(rng.choice(keys, size=k - 1))
    if seed == 3:
        bounds = np.array([0, 0, 5])
    found = check_every_pair_once(keys[:60], keys[60:], bounds, pred)
    assert found > 0


@pytest.mark.parametrize("spec", ["band:5", "bands:-7,-3;2,9", "ne", "eq", "bands:-1e30,1e30"])
def test_extreme_int64_keys(spec):
    pred = parse_predicate(spec)
    rng = np.random.default_rng(1)
    low = np.int64(I64_MIN) + rng.integers(0, 20, size=40)
    high = np.int64(I64_MAX) - rng.integers(0, 20, size=40)
    keys = np.concatenate([low, high, rng.integers(-10, 10, size=20)])
    rng.shuffle(keys)
    for bounds in ([I64_MIN + 10], [I64_MAX - 8], [I64_MIN + 3, 0, I64_MAX - 3]):
        check_every_pair_once(keys[:50], keys[50:], np.array(bounds, dtype=np.int64), pred)


@pytest.mark.parametrize("spec", ["eq", "band:0.25", "bands:-1.5,-0.5;0.5,2", "ne"])
def test_float_keys(spec):
    pred = parse_predicate(spec)
    rng = np.random.default_rng(2)
    keys = np.round(rng.uniform(-3, 3, size=100) * 4) / 4  # on a grid: edges hit exactly
    keys[:5] = [0.1, 0.1 + 1e-16, 1e300, -1e300, 0.35]
    bounds = np.array([-0.5, 0.1, 0.35])
    assert check_every_pair_once(keys[:50], keys[50:], bounds, pred) > 0


def test_eq_sends_every_tuple_to_one_shard_and_a_band_only_near_a_boundary():
    keys = np.arange(-50, 50)
    bounds = np.array([-10, 20])
    assert (s_targets(bounds, parse_predicate("eq"), keys).sum(axis=0) == 1).all()
    two = s_targets(bounds, parse_predicate("band:3"), keys).sum(axis=0) == 2
    # s.key within 3 of a boundary: r.key in [s-3, s+3] meets both sides
    assert set(keys[two].tolist()) == set(range(-13, -7)) | set(range(17, 23))


def test_boundaries_are_exact_quantiles_of_the_keys_dtype():
    keys = np.array([I64_MAX - 1, I64_MAX, I64_MIN, I64_MIN + 1], dtype=np.int64)
    assert boundaries(keys, 2).tolist() == [I64_MAX - 1]
    assert boundaries(np.arange(100, dtype=np.float64), 4).dtype == np.float64
    assert boundaries(np.zeros(0, np.int64), 3).tolist() == [0, 0]


def reference_late(ts, lateness):
    """DESIGN section 2, one tuple at a time: late iff ts < (largest earlier ts) - L."""
    out, top = [], None
    for t in ts.tolist():
        out.append(top is not None and t < top - lateness)
        top = t if top is None else max(top, t)
    return out


@pytest.mark.parametrize("lateness", [0, 3, 10])
def test_late_mask_follows_the_reference_rule_across_chunks(lateness):
    rng = np.random.default_rng(lateness)
    ts = np.cumsum(rng.integers(0, 3, size=500)) - rng.integers(0, 20, size=500)
    ts[:3] = [I64_MIN, I64_MIN + 1, 5]  # no wrap near the end of int64
    got, top = [], None
    for a in range(0, ts.size, 37):  # chunk boundaries must not matter
        late, top = late_mask(ts[a:a + 37], top, lateness)
        got.extend(late.tolist())
    assert got == reference_late(ts, lateness)
    assert any(got)


def test_router_watermark_and_rows():
    r = Router(np.array([10]), parse_window("time:5,5", lateness=2), "band:2")
    a = r.route([0, 1, 1], np.array([9, 11, 5]), np.array([100, 101, 102]))
    assert a.watermark == I64_MIN  # nothing arrived before the first chunk
    assert [x.tolist() for x in a.rows] == [[0, 1, 2], [1]]
    b = r.route([0, 0, 1], np.array([12, 3, 10]), np.array([90, 103, 101]))
    assert b.watermark == 102  # the largest ts before this chunk
    assert b.late["R"].tolist() == [0] and b.late["S"].tolist() == []
    assert [x.tolist() for x in b.rows] == [[1, 2], [2]]
    # what a shard keeps under W: no kept tuple is below W - L
    assert all(t >= b.watermark - 2 for t in [103, 101])


def test_count_windows_are_refused_with_the_reason():
    with pytest.raises(SpecError, match="count windows do not shard.*global arrival"):
        Router(np.array([0]), "count:10,10", "eq")


def test_keys_of_another_dtype_are_refused():
    r = Router(np.array([0]), "time:5,5", "eq")
    with pytest.raises(TypeError, match="sample the boundaries"):
        r.route([0], np.array([0.5]), np.array([1]))


_EDGE_KEYS = [I64_MIN, I64_MIN + 1, -1, 0, 1, I64_MAX - 1, I64_MAX]


@settings(max_examples=150, deadline=None)
@given(spec=st.sampled_from([*PREDICATES, "bands:0.25,0.75"]), data=st.data())
def test_route_sends_each_row_where_shard_of_and_s_targets_say(spec, data):
    """The router's kernel passes against the rule written out in numpy: an R tuple to
    :func:`shard_of`, an S tuple to every shard of :func:`s_targets`, a late one (by
    ``late_mask``, carried across chunks) to none and into ``late``; rows in arrival
    order. Int keys (small, and int64's ends) and float keys, one to five shards; a band
    no integer difference falls in (int keys: every S interval empty, S goes nowhere)."""
    pred = parse_predicate(spec)
    n = data.draw(st.integers(0, 60))
    floats = data.draw(st.booleans())
    if floats:
        keys = np.array(data.draw(st.lists(st.integers(-40, 40), min_size=n, max_size=n)),
                        np.float64) / 4
    else:
        keys = np.array(data.draw(st.lists(st.integers(-20, 20) | st.sampled_from(_EDGE_KEYS),
                                           min_size=n, max_size=n)), np.int64)
    stream = np.array(data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)), np.uint8)
    ts = np.array(data.draw(st.lists(st.integers(0, 30), min_size=n, max_size=n)), np.int64)
    k = data.draw(st.integers(1, 5))
    pool = keys if n else np.zeros(1, keys.dtype)
    bounds = np.sort(np.array(data.draw(st.lists(st.sampled_from(pool.tolist()),
                                                 min_size=k - 1, max_size=k - 1)), keys.dtype))
    lateness = data.draw(st.sampled_from([0, 3]))
    cut = data.draw(st.integers(0, n))
    router = Router(bounds, parse_window("time:5,5", lateness=lateness), pred)
    top = None
    for a, b in ((0, cut), (cut, n)):
        got = router.route(stream[a:b], keys[a:b], ts[a:b])
        late, top = late_mask(ts[a:b], top, lateness)
        is_r = stream[a:b] == 0
        to = np.zeros((k, b - a), dtype=bool)
        s_rows = np.flatnonzero(~is_r & ~late)
        to[:, s_rows] = s_targets(bounds, pred, keys[a:b][s_rows])
        owner = shard_of(bounds, keys[a:b])
        for j in range(k):
            want = np.flatnonzero(to[j] | (is_r & ~late & (owner == j)))
            np.testing.assert_array_equal(got.rows[j], want)
        for x, name in enumerate(("R", "S")):
            np.testing.assert_array_equal(got.late[name], np.flatnonzero(late & (stream[a:b] == x)))


def test_a_router_refuses_more_shards_than_its_kernel_addresses():
    with pytest.raises(ValueError, match="at most 64"):
        Router(np.arange(64), "time:5,5", "eq")


def test_the_routing_benchmark_runs_quick():
    """``benchmarks/routing.py --quick``: the kernel and the numpy rule route every chunk
    to the same rows (it asserts so), and it prints a row per predicate and K."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "benchmarks.routing", "--quick"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [line for line in p.stdout.splitlines() if line.startswith(("| eq", "| band"))]
    assert len(rows) == 4 and all(line.endswith("x |") for line in rows)


@pytest.mark.parametrize("dtype,spec", [("int64", "eq"), ("float64", "band:0.5")])
def test_warm_up_router_loads_its_kernels_for_the_joins_keys(dtype, spec):
    """In a fresh process (a sharded client loads no other kernel): after
    ``warm_up_router`` the routing kernel has the signature the join's first chunk
    needs, so that chunk does not load it (or set up Numba's typing) in the timed join;
    strided columns too (in-process shards plan on a sample, ``keys[::step]``)."""
    import subprocess
    import sys

    kernel = "route_eq_rows" if spec == "eq" else "route_rows"  # eq: S to one shard too
    code = ("import numpy as np\nfrom panjoin.sharding import Router, warm_up_router\n"
            f"from panjoin.sharding_kernels import {kernel} as route_rows\n"
            f"warm_up_router({dtype!r}, {spec!r})\nbefore = set(route_rows.signatures)\n"
            f"r = Router(np.array([3], {dtype!r}), 'time:5,5', {spec!r})\n"
            f"r.route(np.array([0, 1, 1], np.uint8), np.array([1, 4, 2], {dtype!r}), "
            "np.arange(3))\n"
            f"r.route(np.array([0, 0, 1, 1], np.uint8)[::2], np.array([1, 4, 2, 5], "
            f"{dtype!r})[::2], np.arange(4)[::2])\n"
            "print(len(before), set(route_rows.signatures) == before)")
    # Numba's kernels (the build compiled ahead of time would take the int64 calls)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PANJOIN_AOT": "0"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["1", "True"]
