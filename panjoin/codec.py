"""The worker commands on the wire: one encoder and one decoder per message, for both ends.

The manager's gRPC backend encodes create / batch / insert / probe / expire /
promote into ``panjoin.v1`` messages, the worker decodes them (checking everything a
bad client could get wrong, as ``ValueError``) and encodes its answers; the
two ends share this module and nothing else. Arrays go through
:mod:`panjoin.wire` (raw little-endian bytes, no per-element work). A batch's
columns travel once per worker in a Batch; the Insert and Probe commands name it.

    >>> import numpy as np
    >>> b = SortedBatch.of(3, "R", np.array([1, 2]), np.zeros(2), np.array([0, 1]),
    ...                    np.array([10, 11]), predicate="band:1", window="count:8,8")
    >>> back = decode_batch(worker_pb2.Batch.FromString(encode_batch(b).tobytes()))
    >>> back.ids.tolist(), str(back.predicate), back.probe_inputs()[0].tolist()
    ([10, 11], 'band:1', [[0, 1]])
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from panjoin.backend import CreateSpec, SortedBatch
from panjoin.proto.panjoin.v1 import common_pb2, worker_pb2
from panjoin.semantics import SpecError, parse_predicate, parse_window
from panjoin.subwindow import INDEX_KINDS, WindowFilter
from panjoin.wire import (
    NARROW_SPAN,
    Encoded,
    from_array,
    int_column,
    narrow,
    to_array,
    widen,
)

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
                            piece=spec.piece, options={k: str(v) for k, v in spec.opts.items()})
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
                      int(c.partitions), None, opts, splitters=spl, backup=c.backup,
                      piece=c.piece)


# ---------------------------------------------------------------------- batch


def encode_batch(batch: SortedBatch) -> Encoded:
    """A Batch, written straight to the wire (:class:`panjoin.wire.Encoded`): each
    worker's copy appends its own ``release_below``. Integer columns of span < 2^32 go
    as uint32 offsets from a base (:func:`panjoin.wire.narrow`): 16 bytes a tuple
    instead of 32 on an equi join of integer keys, to every worker the batch goes to."""
    n = batch.key.shape[0]
    ends = n and batch.key.dtype == np.int64 and batch.in_key_order
    keys = narrow(batch.key, *((int(batch.key[0]), int(batch.key[-1])) if ends else ()))
    return _encode_batch(batch, keys, narrow(batch.ts), narrow(batch.seq),
                         None if batch.ids_are_seq else narrow(batch.ids), batch.key2)


def encode_rows(batch: SortedBatch, rows: np.ndarray) -> Encoded:
    """The Batch of the rows at ``rows`` (ascending) of a batch in arrival order: a
    key-placement worker's rows, each column gathered, then narrowed. A stream's
    arrivals are numbered consecutively, so the rows' seqs are ``seq[0] + rows``: sent
    as the rows' offsets, not gathered; ts narrowed by its ends (:func:`_ts_ends`).
    Where every column of the whole batch spans less than 2^32 (:func:`row_bases`), the
    offsets are from the batch's least values, gathered and narrowed in one kernel pass
    (:func:`panjoin.sharding_kernels.gather_offsets`)."""
    n = len(batch)
    consecutive = n and int(batch.seq[-1]) - int(batch.seq[0]) == n - 1
    bases = row_bases(batch) if consecutive and rows.size else None
    key2 = None if batch.key2 is None else batch.key2.take(rows)
    if bases is not None:
        from panjoin.sharding_kernels import gather_offsets

        kb, tb, ib = bases
        with_ids = not batch.ids_are_seq
        out = np.empty((4 if with_ids else 3, rows.shape[0]), np.uint32)
        gather_offsets(batch.key, batch.ts, batch.ids if with_ids else batch.ts,
                       np.ascontiguousarray(rows, np.int64), kb, tb, ib, with_ids, out)
        return _encode_batch(batch, (out[0], kb), (out[1], tb),
                             (out[2], int(batch.seq[0]) + int(rows[0])),
                             (out[3], ib) if with_ids else None, key2)
    keys = narrow(batch.key.take(rows))
    ts = batch.ts.take(rows)
    ts = narrow(ts, *(_ts_ends(ts, batch.window) if ts.size else ()))
    if consecutive and rows.size:
        # (a batch's rows span far less than 2^32: always offsets)
        off, base = narrow(rows.astype(np.int64, copy=False), int(rows[0]), int(rows[-1]))
        seq = (off, base + int(batch.seq[0]))
    else:
        seq = narrow(batch.seq.take(rows))
    ids = None
    if not batch.ids_are_seq:
        ids = narrow(batch.ids.take(rows))
    return _encode_batch(batch, keys, ts, seq, ids, key2)


def _ts_ends(ts: np.ndarray, window) -> tuple[int, int]:
    """The least and greatest of rows' ts in arrival order: a count window's ts (opposite
    arrivals) never falls in arrival order, so its ends are its extremes (no pass)."""
    if window.kind == "count":
        return int(ts[0]), int(ts[-1])
    return int(ts.min()), int(ts.max())


def row_bases(batch: SortedBatch) -> tuple[int, int, int] | None:
    """The least key, ts (:func:`_ts_ends`) and id of a batch in arrival order whose
    int64 columns each span less than 2^32 (the bases of every worker's offsets), else
    None; found once a batch (its workers' rows share them)."""
    got = batch.memo.get("row_bases", False)
    if got is not False:
        return got
    got = None
    cols = (batch.key, batch.ts, batch.ids)
    if len(batch) and all(c.dtype == np.int64 and c.flags.c_contiguous for c in cols):
        spans = [(int(batch.key.min()), int(batch.key.max())), _ts_ends(batch.ts, batch.window)]
        spans.append((0, 0) if batch.ids_are_seq else
                     (int(batch.ids.min()), int(batch.ids.max())))
        if all(hi - lo < NARROW_SPAN for lo, hi in spans):
            got = tuple(lo for lo, _ in spans)
    batch.memo["row_bases"] = got
    return got


def _encode_batch(batch: SortedBatch, keys, ts, seq, ids, key2) -> Encoded:
    """The Batch of ``batch`` with these columns, each ``(array, base)``; ``ids`` None:
    they are the seqs (``ids_are_seq``), sent once."""
    enc = (Encoded(worker_pb2.Batch).scalar("batch_id", batch.batch_id)
           .scalar("stream", STREAM[batch.stream]).array("keys", keys[0])
           .array("ts", ts[0]).array("seq", seq[0]))
    if ids is not None:
        enc.array("ids", ids[0])
    if key2 is not None:  # for a residual condition, checked by the worker's probe
        enc.array("key2", np.asarray(key2, dtype=np.float64))
    return enc.message(worker_pb2.Batch(predicate=str(batch.predicate),
                                        window=str(batch.window), keys_base=keys[1],
                                        ts_base=ts[1], seq_base=seq[1],
                                        ids_base=0 if ids is None else ids[1],
                                        ids_are_seq=ids is None,
                                        arrival_order=not batch.in_key_order))


@lru_cache(maxsize=64)
def _join_spec(predicate: str, window: str):
    try:
        return parse_predicate(predicate), parse_window(window)
    except SpecError as e:
        raise ValueError(f"batch: {e}") from None


def decode_batch(c: worker_pb2.Batch) -> SortedBatch:
    """The batch, checked: an id > 0, one length, keys sorted, a known predicate and
    window, key2 iff the predicate has a residual. Narrowed columns come back int64.
    Rows sent in arrival order (``arrival_order``, key placement) come back sorted by
    key, ties by seq (:meth:`SortedBatch.sorted_by_key`), seqs ascending as sent."""
    if c.batch_id <= 0:
        raise ValueError(f"batch id {c.batch_id} must be > 0")
    if c.stream not in STREAM_NAME:
        raise ValueError("batch stream must be STREAM_R or STREAM_S")
    pred, window = _join_spec(c.predicate, c.window)
    if c.keys.dtype == "<u4":
        keys = widen(from_array(c.keys, "<u4", "keys"), c.keys_base, "keys")
    elif c.keys.dtype not in KEY_DTYPES.values():
        raise ValueError(f"keys: dtype {c.keys.dtype!r} must be <i8 (int64), <f8 (float64) "
                         "or <u4 (int64 keys narrowed: offsets from keys_base)")
    else:
        keys = from_array(c.keys, c.keys.dtype, "keys")
    ts = int_column(c.ts, c.ts_base, "ts")
    seq = int_column(c.seq, c.seq_base, "seq")
    if c.ids_are_seq:
        if c.HasField("ids") or c.ids_base:
            raise ValueError("a batch whose ids are its seqs (ids_are_seq) carries no ids")
        ids = seq  # one array: SortedBatch.ids_are_seq
    else:
        ids = int_column(c.ids, c.ids_base, "ids")
    if not (keys.ndim == 1 and keys.shape == ts.shape == seq.shape == ids.shape):
        raise ValueError("keys, ts, seq and ids differ in length")
    key2 = None
    if c.HasField("key2"):
        key2 = from_array(c.key2, "<f8", "key2")
        if key2.shape != keys.shape:
            raise ValueError("key2 must have one value per key")
    if (key2 is None) != (pred.residual is None):
        raise ValueError(f"predicate {pred} " + ("needs key2 on every batch" if key2 is None
                                                  else "has no residual: send no key2"))
    if c.arrival_order:
        if seq.size > 1 and np.any(seq[1:] <= seq[:-1]):
            raise ValueError("batch in arrival order: its seqs must be ascending")
        return SortedBatch(c.batch_id, STREAM_NAME[c.stream], keys, ts, seq, ids, key2, pred,
                           window, in_key_order=False).sorted_by_key()
    if keys.size > 1 and np.any(keys[1:] < keys[:-1]):
        raise ValueError("batch is not sorted by key")
    return SortedBatch(c.batch_id, STREAM_NAME[c.stream], keys, ts, seq, ids, key2, pred,
                       window)


def check_batch_for(batch: SortedBatch, sub_stream: str, key_dtype: str, sub_id: int,
                    probe: bool = False) -> None:
    """A batch fits a subwindow of ``sub_stream`` with ``key_dtype`` keys (ValueError if
    not): inserts go to the batch's own stream, probes to the other one."""
    if (batch.stream == sub_stream) == probe:
        raise ValueError(f"batch {batch.batch_id} of stream {batch.stream} cannot "
                         f"{'probe' if probe else 'be inserted into'} subwindow {sub_id} "
                         f"of stream {sub_stream}")
    if batch.key.dtype != np.dtype(key_dtype):
        raise ValueError(f"batch {batch.batch_id} has {batch.key.dtype} keys, subwindow "
                         f"{sub_id} holds {key_dtype} keys (a dtype mismatch)")


# ---------------------------------------------------------------------- probe


@dataclass
class ProbeRequest:
    targets: list  # [(sub_id, WindowFilter, seq_limit or None)]
    ranges: bool
    want_seq: bool
    id_pairs: bool = False  # answer (r_id, s_id): the ids themselves, oriented
    direct: bool = False  # (r_id, s_id) onto the session's Results stream, counts answered


def decode_probe(c: worker_pb2.Probe, batch: SortedBatch) -> ProbeRequest:
    """The probe's targets, each with its window filter (the batch's, or none)."""
    if len(c.filtered) not in (0, len(c.sub_ids)):
        raise ValueError("filtered must be empty or one flag per sub_id")
    if len(c.seq_limit) not in (0, len(c.sub_ids)):
        raise ValueError("seq_limit must be empty or one limit per sub_id")
    ranges = c.format == worker_pb2.RESULT_FORMAT_RANGES
    direct = c.format == worker_pb2.RESULT_FORMAT_DIRECT
    id_pairs = direct or c.format == worker_pb2.RESULT_FORMAT_ID_PAIRS
    if id_pairs and c.want_seq:
        raise ValueError("RESULT_FORMAT_ID_PAIRS and DIRECT answer ids only: want_seq "
                         "needs PAIRS")
    if ranges and batch.predicate.residual is not None:
        raise ValueError("a residual condition needs RESULT_FORMAT_PAIRS: ranges would "
                         "return candidates the residual rejects")
    full = batch.probe_inputs()[2]
    none = WindowFilter.none(len(batch))
    targets = []
    for i, sub_id in enumerate(c.sub_ids):
        filtered = c.filtered[i] if c.filtered else True
        targets.append((sub_id, full if filtered else none,
                        int(c.seq_limit[i]) if c.seq_limit else None))
    return ProbeRequest(targets, ranges, c.want_seq, id_pairs, direct)


def encode_answer(sub_id: int, pidx, ids, seq=None) -> worker_pb2.ProbeResult:
    r = worker_pb2.ProbeResult(sub_id=sub_id, probe_idx=to_array(pidx), ids=to_array(ids))
    if seq is not None:
        r.seq.CopyFrom(to_array(seq))
    return r


#: the Session metadata by which a manager has a session's probe pairs go to the join's
#: client (results past the manager: RESULT_FORMAT_DIRECT, ``Worker.Results``)
RESULTS_TOKEN_KEY = "panjoin-results-token"

#: an ID_PAIRS answer goes out in ProbeResults of at most this many pairs (2 MB)
ID_PAIRS_PIECE = 128 << 10


def piece_cuts(n: int, piece: int = ID_PAIRS_PIECE) -> list[tuple[int, int]]:
    """Where a probe target's ``n`` pairs are cut into pieces: ``[(start, end)]``, every
    piece ``piece`` pairs but the last. A worker cuts ID_PAIRS answers and DIRECT pairs
    so, and the manager cuts its references to DIRECT pairs at the same places.

    >>> piece_cuts(9, 4)
    [(0, 4), (4, 8), (8, 9)]
    """
    return [(a, min(n, a + piece)) for a in range(0, n, piece)]


def encode_id_pairs(sub_id: int, r_id, s_id) -> list[worker_pb2.ProbeResult]:
    """An ID_PAIRS answer: each pair's R id and S id, as the manager passes them on, in
    pieces of :data:`ID_PAIRS_PIECE` (``more`` on all but the last; one if empty)."""
    n = int(r_id.shape[0])
    cuts = piece_cuts(n) or [(0, 0)]
    return [worker_pb2.ProbeResult(sub_id=sub_id, r_id=to_array(r_id[a:b]),
                                   s_id=to_array(s_id[a:b]), more=b < n)
            for a, b in cuts]


def decode_id_pairs(r: worker_pb2.ProbeResult):
    return from_array(r.r_id, "<i8", "r_id"), from_array(r.s_id, "<i8", "s_id")


def is_id_pairs(r: worker_pb2.ProbeResult) -> bool:
    return r.HasField("r_id")  # set, if empty, on every ID_PAIRS answer


def encode_ranges(sub_id: int, rr) -> worker_pb2.ProbeResult:
    """BI-Sort's range answer: main-array ranges, plus the buffer's (probe_idx, seq)."""
    return worker_pb2.ProbeResult(sub_id=sub_id, probe_idx=to_array(rr.buf_probe_idx),
                                  seq=to_array(rr.buf_seq), start=to_array(rr.start),
                                  end=to_array(rr.end), range_probe_idx=to_array(rr.probe_idx))


def is_ranges(r: worker_pb2.ProbeResult) -> bool:
    return r.HasField("start")  # set, if empty, on every RANGES answer


def decode_answer(r: worker_pb2.ProbeResult):
    """(probe_idx, ids, seq or None) of a PAIRS answer."""
    seq = from_array(r.seq, "<i8")  # (empty when unset; a bytes field is read once)
    seq = seq if seq.size else None
    return from_array(r.probe_idx, "<i8"), from_array(r.ids, "<i8"), seq


def decode_ranges(r: worker_pb2.ProbeResult):
    from panjoin.subwindow.bi_sort import RangeResult

    return RangeResult(from_array(r.range_probe_idx, "<i8"), from_array(r.start, "<i8"),
                       from_array(r.end, "<i8"), from_array(r.probe_idx, "<i8"),
                       from_array(r.seq, "<i8"))
