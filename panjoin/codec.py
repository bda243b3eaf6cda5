"""The worker commands on the wire: one encoder and one decoder per message, for both ends.

The manager's gRPC backend encodes create / insert / probe / expire / promote
into ``panjoin.v1`` messages, the worker decodes them (checking everything a
bad client could get wrong, as ``ValueError``) and encodes its answers; the
two ends share this module and nothing else. Arrays go through
:mod:`panjoin.wire` (raw little-endian bytes, no per-element work).

    >>> import numpy as np
    >>> enc = encode_insert(3, np.array([1, 2]), np.zeros(2, np.int64), np.array([0, 1]),
    ...                     np.array([10, 11]))
    >>> decode_insert(worker_pb2.Insert.FromString(enc.tobytes()), "int64")[3].tolist()
    [10, 11]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from panjoin.backend import CreateSpec
from panjoin.proto.panjoin.v1 import common_pb2, worker_pb2
from panjoin.subwindow import INDEX_KINDS, Residual, WindowFilter
from panjoin.wire import Encoded, from_array, to_array

STREAM = {"R": common_pb2.STREAM_R, "S": common_pb2.STREAM_S}
STREAM_NAME = {v: k for k, v in STREAM.items()}
KEY_DTYPES = {"int64": "<i8", "float64": "<f8"}


class NotFound(ValueError):
    """A command names a subwindow this holder does not have (gRPC NOT_FOUND)."""


# ---------------------------------------------------------------------- create


def encode_create(spec: CreateSpec) -> worker_pb2.Create:
    msg = worker_pb2.Create(sub_id=spec.sub_id, stream=STREAM[spec.stream], index=spec.kind,
                            capacity=spec.capacity, key_dtype=spec.key_dtype,
                            partitions=spec.partitions, backup=spec.backup,
                            options={k: str(v) for k, v in spec.opts.items()})
    if spec.splitters is not None:
        msg.splitters.CopyFrom(to_array(spec.splitters))
    return msg


def decode_create(c: worker_pb2.Create) -> CreateSpec:
    if c.sub_id < 0:
        raise ValueError(f"subwindow id {c.sub_id} is negative")
    if c.stream not in STREAM_NAME:
        raise ValueError("stream must be STREAM_R or STREAM_S")
    if c.index not in INDEX_KINDS:
        raise ValueError(f"unknown index {c.index!r}; choose one of {', '.join(INDEX_KINDS)}")
    if c.key_dtype not in KEY_DTYPES:
        raise ValueError(f"key_dtype must be int64 or float64, not {c.key_dtype!r}")
    if c.capacity < 1 or c.partitions < 1:
        raise ValueError("capacity and partitions must be >= 1")
    opts: dict = {}
    for k, v in c.options.items():
        try:
            opts[k] = int(v)
        except ValueError:
            opts[k] = v
    spl = None
    if c.splitters.data:
        spl = from_array(c.splitters, KEY_DTYPES[c.key_dtype], "splitters")
    return CreateSpec(c.sub_id, STREAM_NAME[c.stream], c.index, int(c.capacity), c.key_dtype,
                      int(c.partitions), None, opts, splitters=spl, backup=c.backup)


# ---------------------------------------------------------------------- insert


def encode_insert(sub_id: int, keys, ts, seq, ids, key2=None) -> Encoded:
    """An Insert, written straight to the wire (:class:`panjoin.wire.Encoded`)."""
    enc = (Encoded(worker_pb2.Insert).scalar("sub_id", sub_id).array("keys", keys)
           .array("ts", ts).array("seq", seq).array("ids", ids))
    if key2 is not None:  # for a residual condition, checked by the worker's probe
        enc.array("key2", np.asarray(key2, dtype=np.float64))
    return enc


def decode_insert(c: worker_pb2.Insert, key_dtype: str):
    """(keys, ts, seq, ids, key2 or None), checked: one length, keys sorted."""
    keys = from_array(c.keys, KEY_DTYPES[str(key_dtype)], "keys")
    ts = from_array(c.ts, "<i8", "ts")
    seq = from_array(c.seq, "<i8", "seq")
    ids = from_array(c.ids, "<i8", "ids")
    if not (keys.shape == ts.shape == seq.shape == ids.shape):
        raise ValueError("keys, ts, seq and ids differ in length")
    key2 = None
    if c.HasField("key2"):
        key2 = from_array(c.key2, "<f8", "key2")
        if key2.shape != keys.shape:
            raise ValueError("key2 must have one value per key")
    if keys.size > 1 and np.any(keys[1:] < keys[:-1]):
        raise ValueError("insert batch is not sorted by key")
    return keys, ts, seq, ids, key2


# ---------------------------------------------------------------------- probe


def encode_probe(lo, hi, full: WindowFilter | None, res: Residual | None,
                 want_seq: bool = False) -> Encoded:
    """The part of a Probe shared by every worker it goes to (no sub_ids yet): each
    worker's message is a copy that appends its own sub_ids, flags and limits."""
    enc = (Encoded(worker_pb2.Probe).array("lo", lo).array("hi", hi)
           .scalar("filter_mode", full.mode if full is not None else 0)
           .scalar("want_seq", want_seq))
    if res is not None:
        enc.array("lo2", res.lo).array("hi2", res.hi)
    if full is not None:
        c0, c1, c2 = full.arrays(lo.shape[-1])
        enc.array("c0", c0).array("c1", c1).array("c2", c2)
    return enc


@dataclass
class ProbeRequest:
    lo: np.ndarray
    hi: np.ndarray
    res: Residual | None
    targets: list  # [(sub_id, WindowFilter, seq_limit or None)]
    ranges: bool
    want_seq: bool


def decode_probe(c: worker_pb2.Probe, key_dtype: str) -> ProbeRequest:
    if len(c.filtered) not in (0, len(c.sub_ids)):
        raise ValueError("filtered must be empty or one flag per sub_id")
    if len(c.seq_limit) not in (0, len(c.sub_ids)):
        raise ValueError("seq_limit must be empty or one limit per sub_id")
    want = KEY_DTYPES[str(key_dtype)]
    lo = from_array(c.lo, want, "lo")
    hi = from_array(c.hi, want, "hi")
    if lo.ndim == 1:
        lo, hi = lo[None, :], hi[None, :]
    if lo.shape != hi.shape:
        raise ValueError("lo and hi differ in shape")
    n = lo.shape[1]
    full = WindowFilter.none(n)
    if c.filter_mode:
        cols = [from_array(a, "<i8", nm) for a, nm in ((c.c0, "c0"), (c.c1, "c1"), (c.c2, "c2"))]
        if any(x.shape != (n,) for x in cols):
            raise ValueError("c0, c1, c2 must have one value per probe tuple")
        full = WindowFilter(int(c.filter_mode), *cols)
    none = WindowFilter.none(n)
    res = None
    if c.HasField("lo2") or c.HasField("hi2"):
        lo2 = from_array(c.lo2, "<f8", "lo2")
        hi2 = from_array(c.hi2, "<f8", "hi2")
        if lo2.ndim == 1:
            lo2, hi2 = lo2[None, :], hi2[None, :]
        if lo2.shape != hi2.shape or lo2.shape[1] != n:
            raise ValueError("lo2 and hi2 must both be (n_bands2, n) for n probe tuples")
        res = Residual(lo2, hi2)
    ranges = c.format == worker_pb2.RESULT_FORMAT_RANGES
    if ranges and res is not None:
        raise ValueError("a residual (lo2, hi2) needs RESULT_FORMAT_PAIRS: ranges would "
                         "return candidates the residual rejects")
    targets = []
    for i, sub_id in enumerate(c.sub_ids):
        filtered = c.filtered[i] if c.filtered else bool(c.filter_mode)
        targets.append((sub_id, full if filtered else none,
                        int(c.seq_limit[i]) if c.seq_limit else None))
    return ProbeRequest(lo, hi, res, targets, ranges, c.want_seq)


def encode_answer(sub_id: int, pidx, ids, seq=None) -> worker_pb2.ProbeResult:
    r = worker_pb2.ProbeResult(sub_id=sub_id, probe_idx=to_array(pidx), ids=to_array(ids))
    if seq is not None:
        r.seq.CopyFrom(to_array(seq))
    return r


def encode_ranges(sub_id: int, rr) -> worker_pb2.ProbeResult:
    """BI-Sort's range answer: main-array ranges, plus the buffer's (probe_idx, seq)."""
    return worker_pb2.ProbeResult(sub_id=sub_id, probe_idx=to_array(rr.buf_probe_idx),
                                  seq=to_array(rr.buf_seq), start=to_array(rr.start),
                                  end=to_array(rr.end), range_probe_idx=to_array(rr.probe_idx))


def is_ranges(r: worker_pb2.ProbeResult) -> bool:
    return r.HasField("start")  # set, if empty, on every RANGES answer


def decode_answer(r: worker_pb2.ProbeResult):
    """(probe_idx, ids, seq or None) of a PAIRS answer."""
    seq = from_array(r.seq, "<i8") if r.seq.data else None
    return from_array(r.probe_idx, "<i8"), from_array(r.ids, "<i8"), seq


def decode_ranges(r: worker_pb2.ProbeResult):
    from panjoin.subwindow.bi_sort import RangeResult

    return RangeResult(from_array(r.range_probe_idx, "<i8"), from_array(r.start, "<i8"),
                       from_array(r.end, "<i8"), from_array(r.probe_idx, "<i8"),
                       from_array(r.seq, "<i8"))
