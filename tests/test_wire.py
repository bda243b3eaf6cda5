"""The wire: Encoded messages parse, with the generated classes, to exactly what the
generated classes would have built (arrays of every allowed dtype and shape, empty ones,
merged parts), and a batch round-trips through the worker's decoders to the same
columns, key intervals and window bounds."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import panjoin.wire as wire_mod
from panjoin import codec
from panjoin.backend import SortedBatch
from panjoin.proto.panjoin.v1 import common_pb2, worker_pb2
from panjoin.subwindow.kernels import window as W
from panjoin.wire import Encoded, from_array, to_array

DTYPES = [np.int64, np.float64, np.uint8, np.uint64, np.bool_]


def test_the_wire_module_examples_hold():
    assert doctest.testmod(wire_mod).failed == 0


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(DTYPES).flatmap(lambda dt: hnp.arrays(
    dt, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))),
       st.integers(0, 2**62))
def test_an_encoded_array_is_the_message_to_array_builds(a, sub_id):
    enc = Encoded(worker_pb2.Batch).scalar("batch_id", sub_id).array("keys", a)
    got = worker_pb2.Batch.FromString(enc.tobytes())
    want = worker_pb2.Batch(batch_id=sub_id, keys=to_array(a))
    assert got == want
    assert got.HasField("keys")
    back = from_array(got.keys)
    assert back.dtype == a.dtype.newbyteorder("<")
    if a.ndim == 1 or a.size:  # a 0-d or empty n-d array comes back by its shape
        np.testing.assert_array_equal(back.reshape(a.shape), a)


def test_big_endian_and_strided_arrays_go_out_little_endian_and_packed():
    a = np.arange(10, dtype=">i8")[::2]
    got = worker_pb2.Batch.FromString(Encoded(worker_pb2.Batch).array("ids", a).tobytes())
    assert got.ids.dtype == "<i8"
    assert from_array(got.ids).tolist() == [0, 2, 4, 6, 8]


def test_concatenated_encodings_merge_and_wrapping_nests_them():
    base = Encoded(worker_pb2.Batch).array("keys", np.array([1, 2])).scalar("batch_id", 3)
    one = base.copy().message(worker_pb2.Batch(release_below=3, predicate="eq"))
    two = base.copy().message(worker_pb2.Batch(batch_id=4))
    prefix = worker_pb2.Command(command_id=77).SerializeToString()
    cmd = worker_pb2.Command.FromString(one.wrap(worker_pb2.Command, "batch", prefix).tobytes())
    assert cmd.command_id == 77 and cmd.WhichOneof("cmd") == "batch"
    assert (cmd.batch.batch_id, cmd.batch.release_below, cmd.batch.predicate) == (3, 3, "eq")
    assert from_array(cmd.batch.keys).tolist() == [1, 2]
    assert worker_pb2.Batch.FromString(two.tobytes()).batch_id == 4  # the later field wins
    assert len(base.parts) == 3 and base.nbytes == len(base.tobytes())  # copies left it alone
    # commands appended to one message: a repeated field, in order
    many = Encoded(worker_pb2.Commands)
    for cid, enc in ((1, one), (2, two)):
        many.extend(enc.wrap(worker_pb2.Command, "batch",
                             worker_pb2.Command(command_id=cid).SerializeToString())
                    .wrap(worker_pb2.Commands, "commands"))
    got = worker_pb2.Commands.FromString(many.tobytes())
    assert [(c.command_id, c.batch.batch_id) for c in got.commands] == [(1, 3), (2, 4)]


def test_a_zero_scalar_is_left_out_as_protobuf_leaves_it():
    enc = Encoded(worker_pb2.Batch).scalar("batch_id", 0)
    assert enc.tobytes() == worker_pb2.Batch(batch_id=0).SerializeToString() == b""


@pytest.mark.parametrize("key_dtype", ["int64", "float64"])
@pytest.mark.parametrize("predicate", ["band:3", "eq&band2:0.5"])
def test_a_batch_round_trips_through_the_workers_decoder(key_dtype, predicate):
    rng = np.random.default_rng(1)
    keys = np.sort(rng.integers(-(2**62), 2**62, 100)).astype(key_dtype)
    ts, seq, ids = (rng.integers(-(2**63), 2**63 - 1, 100) for _ in range(3))
    key2 = rng.normal(size=100) if "&" in predicate else None
    b = SortedBatch.of(2**40, "S", keys, ts, seq, ids, key2, predicate=predicate,
                       window="time:1000,2000")
    got = codec.decode_batch(worker_pb2.Batch.FromString(codec.encode_batch(b).tobytes()))
    assert (got.batch_id, got.stream, got.predicate, got.window) == \
        (b.batch_id, b.stream, b.predicate, b.window)
    for g, w in zip(got.columns(), b.columns(), strict=True):
        if w is None:
            assert g is None
        else:
            np.testing.assert_array_equal(g, w)
    # the worker derives what the manager used to send: the same bounds and filter
    for g, w in zip(got.probe_inputs(), b.probe_inputs(), strict=True):
        if isinstance(w, np.ndarray):
            np.testing.assert_array_equal(g, w)
        elif w is not None:
            for ga, wa in zip(vars(g).values(), vars(w).values(), strict=True):
                np.testing.assert_array_equal(ga, wa)


def test_a_batch_part_is_its_seq_range_in_key_order():
    b = SortedBatch.of(1, "R", np.array([1, 2, 3, 4]), np.zeros(4), np.array([12, 10, 13, 11]),
                       np.array([5, 6, 7, 8]), predicate="eq", window="count:9,9")
    key, _, seq, ids, _ = b.columns(10, 12)
    assert key.tolist() == [2, 4] and seq.tolist() == [10, 11] and ids.tolist() == [6, 8]
    assert b.columns(10, 14)[0] is b.key  # the whole batch: no copy
    assert b.columns(20, 30)[0].size == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=0, max_size=40), st.booleans())
def test_a_batch_sent_in_arrival_order_arrives_sorted_and_remembers_its_rows(keys, floats):
    """Key placement: the manager sends a worker its rows in arrival order, the worker
    sorts them by key (ties in arrival order) and keeps where each row was as sent."""
    n = len(keys)
    key = np.array(keys, np.float64 if floats else np.int64)
    sent = SortedBatch(4, "S", key, np.arange(n) * 10, np.arange(100, 100 + n),
                       np.arange(n) + 7, None, *codec._join_spec("band:1", "time:9,9"),
                       in_key_order=False)
    raw = codec.encode_batch(sent).tobytes()
    got = codec.decode_batch(worker_pb2.Batch.FromString(raw))
    order = np.argsort(key, kind="stable")
    assert got.in_key_order and np.array_equal(got.sent, order)
    assert np.array_equal(got.key, key[order]) and np.array_equal(got.ids, order + 7)
    assert np.array_equal(got.seq, order + 100) and np.array_equal(got.ts, order * 10)


@pytest.mark.parametrize("arrival", [False, True])
def test_a_batch_whose_ids_are_its_seqs_sends_them_once(arrival):
    """ids_are_seq: one column on the wire, one array at the worker (sorted or rows)."""
    rng = np.random.default_rng(5)
    n = 300
    keys = rng.integers(-50, 50, n)
    seq = np.arange(n) * 3 + 1000  # a key placement's rows: seqs with gaps
    spec = codec._join_spec("band:1", "count:9,9")
    if arrival:
        b = SortedBatch(3, "S", keys, np.arange(n), seq, seq, None, *spec, in_key_order=False)
        rows = np.flatnonzero(rng.random(n) < 0.5)
        raw, want = codec.encode_rows(b, rows).tobytes(), rows
    else:
        order = np.argsort(keys, kind="stable")
        sseq = seq[order]
        b = SortedBatch(3, "S", keys[order], np.arange(n), sseq, sseq, None, *spec)
        raw, want = codec.encode_batch(b).tobytes(), order
    assert b.ids_are_seq
    msg = worker_pb2.Batch.FromString(raw)
    assert msg.ids_are_seq and not msg.HasField("ids")
    got = codec.decode_batch(msg)
    assert got.ids is got.seq and got.rows(1, 5).ids_are_seq
    if arrival:
        want = want[np.argsort(keys[want], kind="stable")]
    np.testing.assert_array_equal(got.seq, seq[want])
    np.testing.assert_array_equal(got.key, keys[want])
    # a copy of the column is not the same array: sent as ids, as before
    b.ids = b.ids.copy()
    assert not worker_pb2.Batch.FromString(
        (codec.encode_rows(b, rows) if arrival else codec.encode_batch(b)).tobytes()).ids_are_seq
    msg.ids.CopyFrom(to_array(np.arange(5)))  # ids_are_seq and ids both: refused
    with pytest.raises(ValueError, match="ids_are_seq"):
        codec.decode_batch(msg)


def test_a_batch_in_arrival_order_must_have_ascending_seqs():
    b = SortedBatch.of(1, "R", np.array([2, 1]), np.zeros(2), np.array([5, 4]), np.arange(2),
                       predicate="eq", window="count:9,9")
    b.in_key_order = False
    raw = codec.encode_batch(b).tobytes()
    with pytest.raises(ValueError, match="ascending"):
        codec.decode_batch(worker_pb2.Batch.FromString(raw))


@pytest.mark.parametrize("mode", [W.COUNT, W.TIME])
def test_a_probe_names_its_batch_and_each_target_gets_its_filter(mode):
    window = "count:5,7" if mode == W.COUNT else "time:5,7"
    b = SortedBatch.of(3, "R", np.array([1, 2]), np.array([100, 200]), np.array([8, 9]),
                       np.array([0, 1]), predicate="band:1", window=window)
    msg = worker_pb2.Probe(batch_id=3, sub_ids=[1, 2], filtered=[True, False],
                           seq_limit=[10, 20], want_seq=True)
    req = codec.decode_probe(worker_pb2.Probe.FromString(msg.SerializeToString()), b)
    assert req.want_seq and not req.ranges
    (s1, f1, l1), (s2, f2, l2) = req.targets
    assert (s1, l1, s2, l2) == (1, 10, 2, 20) and f2.mode == W.NONE and f1.mode == mode
    # probing S from R: S's window (7) reaches back, R's (5) forward
    if mode == W.COUNT:
        assert (f1.c0.tolist(), f1.c1.tolist(), f1.c2.tolist()) == \
            ([93, 193], [100, 200], [13, 14])
    else:
        assert (f1.c0.tolist(), f1.c1.tolist()) == ([94, 194], [104, 204])


def test_an_array_message_field_of_the_wrong_type_is_refused():
    with pytest.raises(KeyError):
        Encoded(common_pb2.Array).array("nope", np.zeros(1))


@pytest.mark.parametrize("span", [0, 1000, 2**32 - 1, 2**32])
@pytest.mark.parametrize("low", [-(2**63), -5, 0, 2**63 - 2**32])
def test_narrow_batch_columns_round_trip_and_halve_the_bytes(span, low):
    """Integer columns of span < 2^32 go as uint32 offsets from a base (int64's ends
    included), wider ones as int64; the worker gets the same int64 columns back."""
    rng = np.random.default_rng(span + 7)
    n = 64
    hi = min(low + span, 2**63 - 1)
    col = rng.integers(low, hi, n, endpoint=True, dtype=np.int64)
    col[0], col[-1] = low, hi  # the whole span
    keys = np.sort(col)
    b = SortedBatch.of(5, "R", keys, col, col[::-1].copy(), col.copy(), predicate="eq",
                       window="count:8,8")
    raw = codec.encode_batch(b).tobytes()
    msg = worker_pb2.Batch.FromString(raw)
    narrow = hi - low < 2**32
    for name in ("keys", "ts", "seq", "ids"):
        assert getattr(msg, name).dtype == ("<u4" if narrow else "<i8")
    got = codec.decode_batch(msg)
    for g, w in zip(got.columns()[:4], b.columns()[:4], strict=True):
        assert g.dtype == np.int64
        np.testing.assert_array_equal(g, w)
    if narrow:  # the point: half the bytes to every worker the batch goes to
        assert len(raw) < 4 * n * 4 + 200 < 4 * n * 8


def test_a_narrow_column_that_overflows_int64_is_refused():
    msg = worker_pb2.Batch(batch_id=1, stream=common_pb2.STREAM_R, predicate="eq",
                           window="count:8,8", keys=to_array(np.array([0], np.int64)),
                           ts=to_array(np.array([0], np.int64)),
                           seq=to_array(np.array([5], np.uint32)),
                           ids=to_array(np.array([0], np.int64)), seq_base=2**63 - 3)
    with pytest.raises(ValueError, match="seq: base .* overflows int64"):
        codec.decode_batch(msg)


def test_a_pushed_key_of_a_named_only_dtype_is_refused():
    """uint32 is decoded only where a field asks for it (a Batch's narrowed columns)."""
    with pytest.raises(wire_mod.WireError, match="dtype"):
        from_array(to_array(np.array([1], np.uint32)), None, "key")


def test_narrow_and_widen_round_trip_at_the_ends():
    from panjoin.wire import NARROW_SPAN, WireError, int_column, narrow, widen

    top = np.iinfo(np.int64).max
    for col in [np.array([0, NARROW_SPAN - 1]), np.array([top - 5, top]),
                np.array([-top - 1, -top - 1 + 7]), np.array([-3, 4, 0])]:
        a, base = narrow(col)
        assert a.dtype == np.uint32 and np.array_equal(widen(a, base, "c"), col)
        assert np.array_equal(int_column(to_array(a), base, "c"), col)
    wide, base = narrow(np.array([0, NARROW_SPAN]))
    assert wide.dtype == np.int64 and base == 0
    with pytest.raises(WireError, match="overflows"):
        widen(np.array([0, 9], np.uint32), top - 3, "c")
    with pytest.raises(WireError, match="a base"):
        int_column(to_array(np.array([1, 2])), 5, "c")


_I64 = np.iinfo(np.int64)


@pytest.mark.parametrize("key_dtype", [np.int64, np.float64])
def test_a_workers_rows_encode_as_the_gathered_batch_would(key_dtype):
    rng = np.random.default_rng(3)
    n = 500
    keys = rng.integers(-(2**40), 2**40, n).astype(key_dtype)
    ids = rng.integers(_I64.min, _I64.max, n)  # too wide to narrow
    b = SortedBatch(7, "R", keys, rng.integers(0, 10**6, n) + 10**15, np.arange(n) + 99,
                    ids, rng.normal(size=n), *codec._join_spec("band:2&band2:1", "time:9,9"),
                    in_key_order=False)
    rows = np.flatnonzero(rng.random(n) < 0.3)
    raw = codec.encode_rows(b, rows).tobytes()
    got = codec.decode_batch(worker_pb2.Batch.FromString(raw))
    order = np.argsort(keys[rows], kind="stable")  # the worker sorts what it gets
    for g, w in zip(got.columns(), (keys, b.ts, b.seq, ids, b.key2), strict=True):
        np.testing.assert_array_equal(g, w[rows][order])
    msg = worker_pb2.Batch.FromString(raw)
    assert msg.ts.dtype == "<u4" and msg.ids.dtype == "<i8"  # narrowed where it fits


@pytest.mark.parametrize("gaps", [False, True])
def test_a_count_windows_rows_encode_their_seqs_and_ts_by_their_ends(gaps):
    """Consecutive seqs go as the rows' offsets (``seq[0] + row``), a count window's ts
    (opposite arrivals, never falling) narrowed by its ends; seqs with gaps gathered."""
    rng = np.random.default_rng(4)
    n = 400
    seq = (np.cumsum(rng.integers(1, 3, n)) if gaps else np.arange(n)) + (1 << 40)
    opp = np.cumsum(rng.integers(0, 3, n)) + 10**12
    b = SortedBatch(2, "S", rng.integers(-99, 99, n), opp, seq, rng.integers(-9, 9, n) << 50,
                    None, *codec._join_spec("eq", "count:9,9"), in_key_order=False)
    for rows in (np.flatnonzero(rng.random(n) < 0.4), np.arange(0), np.array([n - 1])):
        msg = worker_pb2.Batch.FromString(codec.encode_rows(b, rows).tobytes())
        assert rows.size == 0 or msg.seq.dtype == msg.ts.dtype == "<u4"
        got = codec.decode_batch(msg)
        order = np.argsort(b.key[rows], kind="stable")
        for g, w in zip(got.columns(), (b.key, opp, seq, b.ids), strict=False):
            np.testing.assert_array_equal(g, w[rows][order])


@pytest.mark.parametrize("window", ["count:9,9", "time:9,9"])
@pytest.mark.parametrize("low", [-(2**63), -77, 2**63 - 2**32])
@pytest.mark.parametrize("ids_are_seq", [False, True])
def test_a_workers_rows_gathered_in_one_pass_are_the_gathered_columns(window, low, ids_are_seq):
    """Where the whole batch's columns span < 2^32 a worker's rows go as offsets from
    the batch's least values, gathered and narrowed in one kernel pass
    (``codec.row_bases``): the same columns at the worker as numpy's path sends, at
    both ends of int64; a span of 2^32 takes numpy's path."""
    rng = np.random.default_rng(abs(low) % 1000 + len(window))
    n = 700
    top = min(low + 2**32 - 1, 2**63 - 1)
    keys = rng.integers(low, top, n, endpoint=True)
    keys[3], keys[9] = low, top  # the whole span
    ts = (np.cumsum(rng.integers(0, 3, n)) if window.startswith("count")
          else rng.integers(0, 2**32 - 1, n)) + low
    seq = np.arange(n) + (1 << 40)
    ids = seq if ids_are_seq else rng.integers(low, top, n, endpoint=True)
    spec = codec._join_spec("eq", window)
    for wide in (False, True):
        k = keys.copy()
        if wide:
            k[5] = low + 2**32 if low < 0 else low - 1  # one key too far: numpy's path
        b = SortedBatch(2, "S", k, ts, seq, ids, None, *spec, in_key_order=False)
        for rows in (np.flatnonzero(rng.random(n) < 0.3), np.array([n - 1]), np.arange(n)):
            msg = worker_pb2.Batch.FromString(codec.encode_rows(b, rows).tobytes())
            assert (codec.row_bases(b) is None) == wide
            if not wide:  # offsets from the whole batch's least key, not the rows'
                assert msg.keys_base == low and msg.keys.dtype == msg.ts.dtype == "<u4"
            got = codec.decode_batch(msg)
            assert got.ids_are_seq == ids_are_seq
            order = np.argsort(k[rows], kind="stable")
            for g, w in zip(got.columns()[:4], (k, ts, seq, ids), strict=True):
                np.testing.assert_array_equal(g, w[rows][order])
