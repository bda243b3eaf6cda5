"""The job's copy of the window (ids and records) and its joined output records."""

from __future__ import annotations

import doctest
import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import spark_conn.joined
import spark_conn.record_window
from panjoin.semantics import parse_window
from spark_conn.joined import copy_spans, frame
from spark_conn.record_window import IdWindow, RecordWindow
from spark_conn.records import Parsed

I64 = st.integers(-(1 << 63), (1 << 63) - 1)


def test_doctests():
    assert doctest.testmod(spark_conn.joined).failed == 0
    assert doctest.testmod(spark_conn.record_window).failed == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(I64, I64, st.binary(max_size=12), st.binary(max_size=12)),
                max_size=20))
def test_frame_and_copy_write_each_pair_as_python_would(pairs):
    r = np.array([p[0] for p in pairs], np.int64)
    s = np.array([p[1] for p in pairs], np.int64)
    rrec, srec = [p[2] for p in pairs], [p[3] for p in pairs]
    out, offs, dr, ds = frame(r, s, np.array([len(x) for x in rrec], np.int64),
                              np.array([len(x) for x in srec], np.int64))
    for recs, at in ((rrec, dr), (srec, ds)):  # the records in one buffer, reversed
        starts, buf = [0] * len(recs), b""
        for i in reversed(range(len(recs))):
            starts[i], buf = len(buf), buf + recs[i]
        copy_spans(out, at, np.frombuffer(buf + b"\0", np.uint8), np.array(starts, np.int64),
                   np.array([len(x) for x in recs], np.int64))
    want = [b'{"r_id":%d,"s_id":%d,"r":%s,"s":%s}' % p for p in pairs]
    got = [out[offs[i]:offs[i + 1]].tobytes() for i in range(len(pairs))]
    assert got == want
    assert offs[-1] == len(out)


def test_id_window_rejects_repeated_ids_until_they_leave_the_window():
    def batch(stream, ids, ts):
        n = len(ids)
        return Parsed(np.array(stream, np.uint8), np.array(ids, np.int64),
                      np.zeros(n, np.int64), np.array(ts, np.int64),
                      pa.array([b"{}"] * n, pa.binary()), np.arange(n), [], {})

    w = IdWindow(parse_window("time:100,100", 10), 4)
    # within a batch: the second 5 of R; S may reuse R's ids
    assert w.add(batch([0, 0, 1, 0], [5, 6, 5, 5], [0, 1, 2, 3])).tolist() == [3]
    w.prune(3)
    # across batches: growing ids skip the lookup, a smaller one is found
    assert w.add(batch([0, 1, 0], [7, 5, 4], [4, 5, 6])).tolist() == [1]
    assert w.add(batch([0, 0], [6, 9], [7, 8])).tolist() == [0]
    w.drop(0, np.array([9]))  # a late tuple is not in the window
    w.prune(500)  # ids with ts <= 500 - 10 - 100 have left
    assert w.add(batch([0, 0, 1], [5, 9, 5], [500, 500, 500])).tolist() == []


@pytest.mark.parametrize("spec", ["time:40,25", "count:30,50"])
def test_id_window_equals_a_list_of_the_window_s_ids(spec):
    """Random micro-batches (ids reused, out-of-order ts, late tuples dropped) against
    a plain list of (id, ts) per stream pruned by the same rule: the same repeats are
    rejected and the same ids kept, whatever the chunks' bounds say."""
    w = parse_window(spec, 7 if spec.startswith("time") else 0)
    ids_w = IdWindow(w, 16)
    rng = np.random.default_rng(11)
    model = [[], []]  # per stream: [id, ts] in arrival order
    max_ts = None
    rejected = 0
    for b in range(60):
        n = int(rng.integers(0, 16))
        stream = rng.integers(0, 2, n).astype(np.uint8)
        ids = rng.integers(b, b + 40, n)  # mostly growing, with repeats and overlaps
        ts = np.sort(rng.integers(4 * b, 4 * b + 30, n))
        p = Parsed(stream, ids, np.zeros(n, np.int64), ts, pa.array([b"{}"] * n, pa.binary()),
                   np.arange(n), [], {})
        want = []
        for i in range(n):
            s = int(stream[i])
            if any(x[0] == ids[i] for x in model[s]):
                want.append(i)
            else:
                model[s].append([int(ids[i]), int(ts[i])])
        assert ids_w.add(p).tolist() == want, b
        rejected += len(want)
        late = [x for s in (0, 1) for x in model[s] if rng.random() < 0.05]
        for s in (0, 1):
            gone = np.array([x[0] for x in model[s] if x in late], np.int64)
            ids_w.drop(s, gone)
            model[s] = [x for x in model[s] if x not in late]
        if n:
            ids_w.prune(int(ts.max()))
            max_ts = int(ts.max()) if max_ts is None else max(max_ts, int(ts.max()))
        for s in (0, 1):
            if w.kind == "count":
                model[s] = model[s][-(w.size("RS"[s]) + 16):]
            elif max_ts is not None:
                model[s] = [x for x in model[s] if x[1] > max_ts - w.lateness - w.size("RS"[s])]
            assert ids_w.ids[s].tolist() == [x[0] for x in model[s]], (b, s)
    assert rejected > 20


@pytest.mark.parametrize("spec", ["time:40,25", "count:30,50"])
def test_record_window_keeps_every_record_a_future_tuple_can_pair_with(spec):
    """Random micro-batches (out of order, ids reused once they left the window): after
    each, every tuple that can still pair with a future one (DESIGN section 2) is found
    with its own record, the newest tuple of a reused id wins, and the window is not
    much larger than that."""
    w = parse_window(spec, 7 if spec.startswith("time") else 0)
    rw = RecordWindow(w, 16)
    rng = np.random.default_rng(5)
    seen = [[], []]  # per stream: (id, ts, record) in arrival order
    max_ts = 0
    for b in range(40):
        n = int(rng.integers(1, 16))
        st = rng.integers(0, 2, n).astype(np.uint8)
        ts = np.maximum(0, b * 10 + rng.integers(-8, 8, n))
        ids = rng.permutation(100)[:n] + 1000 * b  # distinct, none reused soon
        if b % 5 == 4:
            ids[0] = seen[int(st[0])][0][0] if seen[int(st[0])] else ids[0]  # a long-gone id
        recs = [b"r%d-%d" % (b, i) for i in range(n)]
        perm = rng.permutation(n)  # the tuples in another order than their records
        rw.add(Parsed(st[perm], ids[perm], np.zeros(n, np.int64), ts[perm],
                      pa.array(recs, pa.binary()), perm, [], {}))
        for i in range(n):
            seen[int(st[i])].append((int(ids[i]), int(ts[i]), recs[i]))
        max_ts = max(max_ts, int(ts.max()))
        rw.prune(int(ts.max()))
        for x in (0, 1):
            if w.kind == "time":
                live = [t for t in seen[x] if t[1] > max_ts - w.lateness - w.size("RS"[x])]
            else:
                live = seen[x][-w.size("RS"[x]):]
            newest = {i: r for i, _, r in seen[x]}  # the last tuple of each id wins
            live = [t for t in live if newest[t[0]] == t[2]]
            if live:
                got = rw.lookup(x, np.array([t[0] for t in live], np.int64)).to_pylist()
                assert got == [t[2] for t in live]
            kept = sum(len(c[1]) for c in rw.chunks[x])
            assert kept <= len(live) + 2 * 16 + 16  # whole chunks only, at most a few more
    with pytest.raises(RuntimeError, match="left the job's window"):
        rw.lookup(0, np.array([-1], np.int64))


def test_joined_records_are_each_pairs_two_records():
    """Pairs whose records lie in several micro-batches' buffers, in any order."""
    rw = RecordWindow(parse_window("time:1000,1000", 0), 8)
    recs = {}
    for b in range(3):
        n = 6
        st_ = np.array([0, 1, 0, 1, 0, 1], np.uint8)
        ids = np.arange(n, dtype=np.int64) + 10 * b
        vals = [json.dumps({"id": int(i), "b": b, "s": int(x)}).encode()
                for i, x in zip(ids, st_, strict=True)]
        perm = np.array([5, 3, 1, 0, 2, 4])
        rw.add(Parsed(st_[perm], ids[perm], np.zeros(n, np.int64), np.full(n, b, np.int64),
                      pa.array(vals, pa.binary()), perm, [], {}))
        recs.update({(int(x), int(i)): v for x, i, v in zip(st_, ids, vals, strict=True)})
        rw.prune(b)
    r = np.array([0, 22, 12, 4, 0], np.int64)
    s = np.array([25, 1, 13, 13, 3], np.int64)
    got = rw.joined(r, s).to_pylist()
    for i, g in enumerate(got):
        d = json.loads(g)
        assert (d["r_id"], d["s_id"]) == (r[i], s[i])
        assert g == b'{"r_id":%d,"s_id":%d,"r":%s,"s":%s}' % (
            r[i], s[i], recs[(0, int(r[i]))], recs[(1, int(s[i]))])
    assert rw.joined(np.zeros(0, np.int64), np.zeros(0, np.int64)).to_pylist() == []
    with pytest.raises(RuntimeError, match="left the job's window"):
        rw.joined(np.array([1], np.int64), np.array([1], np.int64))  # 1 is an S id
