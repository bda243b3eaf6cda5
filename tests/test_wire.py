"""The wire: Encoded messages parse, with the generated classes, to exactly what the
generated classes would have built (arrays of every allowed dtype and shape, empty ones,
merged parts), and the codec's bulk encoders round-trip through the worker's decoders."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import panjoin.wire as wire_mod
from panjoin import codec
from panjoin.proto.panjoin.v1 import common_pb2, worker_pb2
from panjoin.subwindow import Residual, WindowFilter
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
    enc = Encoded(worker_pb2.Insert).scalar("sub_id", sub_id).array("keys", a)
    got = worker_pb2.Insert.FromString(enc.tobytes())
    want = worker_pb2.Insert(sub_id=sub_id, keys=to_array(a))
    assert got == want
    assert got.HasField("keys")
    back = from_array(got.keys)
    assert back.dtype == a.dtype.newbyteorder("<")
    if a.ndim == 1 or a.size:  # a 0-d or empty n-d array comes back by its shape
        np.testing.assert_array_equal(back.reshape(a.shape), a)


def test_big_endian_and_strided_arrays_go_out_little_endian_and_packed():
    a = np.arange(10, dtype=">i8")[::2]
    got = worker_pb2.Insert.FromString(Encoded(worker_pb2.Insert).array("ids", a).tobytes())
    assert got.ids.dtype == "<i8"
    assert from_array(got.ids).tolist() == [0, 2, 4, 6, 8]


def test_concatenated_encodings_merge_and_a_frame_nests_them():
    base = Encoded(worker_pb2.Probe).array("lo", np.array([1, 2])).scalar("want_seq", True)
    one = base.copy().message(worker_pb2.Probe(sub_ids=[3], seq_limit=[9]))
    two = base.copy().message(worker_pb2.Probe(sub_ids=[4, 5], filtered=[True, False]))
    prefix = worker_pb2.Command(command_id=77).SerializeToString()
    cmd = worker_pb2.Command.FromString(
        one.frame(prefix, "probe", worker_pb2.Command.DESCRIPTOR.fields_by_name))
    assert cmd.command_id == 77 and cmd.WhichOneof("cmd") == "probe"
    assert list(cmd.probe.sub_ids) == [3] and list(cmd.probe.seq_limit) == [9]
    assert cmd.probe.want_seq and from_array(cmd.probe.lo).tolist() == [1, 2]
    p2 = worker_pb2.Probe.FromString(two.tobytes())
    assert list(p2.sub_ids) == [4, 5] and list(p2.filtered) == [True, False]
    assert len(base.parts) == 3 and base.nbytes == len(base.tobytes())  # copies left it alone


def test_a_zero_scalar_is_left_out_as_protobuf_leaves_it():
    enc = Encoded(worker_pb2.Insert).scalar("sub_id", 0)
    assert enc.tobytes() == worker_pb2.Insert(sub_id=0).SerializeToString() == b""


@pytest.mark.parametrize("key_dtype", ["int64", "float64"])
def test_insert_round_trips_through_the_workers_decoder(key_dtype):
    rng = np.random.default_rng(1)
    keys = np.sort(rng.integers(-(2**62), 2**62, 100)).astype(key_dtype)
    ts, seq, ids = (rng.integers(-(2**63), 2**63 - 1, 100) for _ in range(3))
    key2 = rng.normal(size=100)
    enc = codec.encode_insert(2**40, keys, ts, seq, ids, key2)
    got = codec.decode_insert(worker_pb2.Insert.FromString(enc.tobytes()), key_dtype)
    for g, w in zip(got, (keys, ts, seq, ids, key2), strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("mode", [W.NONE, W.COUNT, W.TIME])
def test_probe_round_trips_through_the_workers_decoder(mode):
    rng = np.random.default_rng(2)
    n = 50
    lo = np.sort(rng.integers(-(2**62), 2**62, (2, n)), axis=1)
    hi = lo + 5
    cs = [rng.integers(-(2**63), 2**63 - 1, n) for _ in range(3)]
    full = None if mode == W.NONE else WindowFilter(mode, *cs)
    res = Residual(rng.normal(size=(1, n)), rng.normal(size=(1, n)) + 1)
    base = codec.encode_probe(lo, hi, full, res, want_seq=True)
    msg = base.copy().message(worker_pb2.Probe(sub_ids=[1, 2], filtered=[True, False],
                                               seq_limit=[10, 20]))
    req = codec.decode_probe(worker_pb2.Probe.FromString(msg.tobytes()), "int64")
    np.testing.assert_array_equal(req.lo, lo)
    np.testing.assert_array_equal(req.hi, hi)
    np.testing.assert_array_equal(req.res.lo, res.lo)
    np.testing.assert_array_equal(req.res.hi, res.hi)
    assert req.want_seq and not req.ranges
    (s1, f1, l1), (s2, f2, l2) = req.targets
    assert (s1, l1, s2, l2) == (1, 10, 2, 20) and f2.mode == W.NONE
    assert f1.mode == mode
    if mode != W.NONE:
        for got, want in zip((f1.c0, f1.c1, f1.c2), cs, strict=True):
            np.testing.assert_array_equal(got, want)


def test_an_array_message_field_of_the_wrong_type_is_refused():
    with pytest.raises(KeyError):
        Encoded(common_pb2.Array).array("nope", np.zeros(1))
