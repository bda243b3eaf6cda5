"""The Kafka bulk path: record batches in Numba, the Fetcher and the BatchWriter, checked
against librdkafka on both real brokers (noida-db and Tansu)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka_helpers import topic

from panjoin.kafka import io, protocol
from panjoin.kafka import record_batch as rb
from panjoin.kafka.fetcher import Fetcher, value_buffers
from panjoin.kafka.writer import BatchWriter, chunks, runs


def _buffers(vals: list[bytes]):
    offs = np.zeros(len(vals) + 1, np.int64)
    offs[1:] = np.cumsum([len(v) for v in vals])
    return np.frombuffer(b"".join(vals) or b"\0", np.uint8)[:offs[-1]], offs


def test_crc32c_known_value_and_every_tail_length():
    assert int(rb.crc32c(np.frombuffer(b"123456789", np.uint8), 0, 9)) == 0xE3069283

    def bitwise(data):  # the definition, a bit at a time
        c = 0xFFFFFFFF
        for byte in data:
            c ^= byte
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        return c ^ 0xFFFFFFFF

    x = np.random.default_rng(1).integers(0, 256, 200).astype(np.uint8)
    for a, n in [(0, 0), (3, 1), (3, 7), (5, 8), (5, 9), (1, 16), (2, 17), (0, 200)]:
        assert int(rb.crc32c(x, a, a + n)) == bitwise(x[a:a + n].tolist()), (a, n)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=80), st.integers(0, 10**12),
       st.integers(0, 10**6), st.integers(0, 10**13))
def test_encode_then_scan_gives_the_values_back(vals, batch, seq0, stamp):
    data, offs = _buffers(vals)
    buf = rb.encode(data, offs, 0, len(vals), str(batch).encode(), seq0, stamp)
    o, ts, ks, kl, vs, vl, nxt, flags = rb.scan(buf, 0, 1 << 62)
    assert flags == 0 and nxt == len(vals)
    assert o.tolist() == list(range(len(vals))) and (ts == stamp).all() and (kl == -1).all()
    d, g = rb.gather(buf, vs, vl)
    assert [bytes(d[g[i]:g[i + 1]]) for i in range(len(vals))] == vals
    # the batch's checksum covers attributes..end
    assert int.from_bytes(buf[17:21].tobytes(), "big") == int(rb.crc32c(buf, 21, len(buf)))


def test_scan_stops_before_a_cut_batch_and_keeps_the_offsets_asked_for():
    one, offs = _buffers([b"a", b"bb", b"ccc"])
    b1 = rb.encode(one, offs, 0, 3, b"1", 0, 5)
    b2 = b1.copy()
    b2[0:8] = np.frombuffer((3).to_bytes(8, "big"), np.uint8)  # base offset 3
    both = np.concatenate([b1, b2])
    o, *_, nxt, flags = rb.scan(both, 1, 5)  # offsets 1..4 of 0..5
    assert o.tolist() == [1, 2, 3, 4] and nxt == 6 and flags == 0
    o, *_, nxt, flags = rb.scan(both[:-5], 0, 100)  # the second batch cut short
    assert o.tolist() == [0, 1, 2] and nxt == 3 and flags == 0
    o, *_, nxt, _ = rb.scan(both[:20], 0, 100)  # not even one whole batch
    assert len(o) == 0 and nxt == 0


def test_runs_and_chunks_cover_every_position_once():
    keep = np.array([True, True, False, True, False, False, True])
    assert runs(keep) == [(0, 2), (3, 4), (6, 7)]
    offs = np.cumsum([0] + [100] * 50)
    pieces = chunks(offs, 5, 50, 1000)
    assert pieces[0][0] == 5 and pieces[-1][1] == 50
    assert all(a < b for a, b in pieces)
    assert all(x[1] == y[0] for x, y in zip(pieces, pieces[1:], strict=False))
    assert max(b - a for a, b in pieces) == 1000 // (100 + 48)
    assert chunks(np.array([0, 5000, 5001]), 0, 2, 1000) == [(0, 1), (1, 2)]


def _produce(bootstrap, t, n, parts, **conf):
    """n records round-robin over the partitions: some without value, some without key,
    some with headers; Kafka timestamps 1000 + i. Returns them by partition."""
    p = io.producer(bootstrap, **conf)
    want = {q: [] for q in range(parts)}
    for i in range(n):
        v = None if i % 97 == 5 else b'{"id":%d,"pad":"%s"}' % (i, b"x" * (i % 13))
        k = None if i % 3 == 0 else b"k%d" % i
        p.produce(t, v, key=k, partition=i % parts, timestamp=1000 + i,
                  headers=[("h", b"1")] if i % 5 == 0 else None)
        want[i % parts].append((1000 + i, k, v))
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    return want


def _rows(table: pa.Table) -> list:
    return list(zip(table.column("timestamp").to_pylist(), table.column("key").to_pylist(),
                    table.column("value").to_pylist(), strict=True))


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_fetcher_reads_ranges_like_librdkafka(broker, compression):
    """Consecutive micro-batch ranges of two partitions, then a seek back, an empty range
    and a give-back (unread): each range gives exactly its records, with offsets,
    timestamps, null keys and values as librdkafka reads them. Compressed batches are
    read through librdkafka."""
    a = topic("A")
    io.create_topics(broker.bootstrap, [a], partitions=2)
    want = _produce(broker.bootstrap, a, 3000, 2, **{"compression.type": compression})
    f = Fetcher(broker.bootstrap)
    try:
        # the log's ends, found by fetches past a (possibly short) high watermark
        assert f.end_offsets(a) == {0: (0, 1500), 1: (0, 1500)}
        cuts = [0, 7, 8, 600, 601, 1100, 1500]
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            got = f.read([(a, 0, lo, hi), (a, 1, lo, lo)])
            assert got[(a, 0)].column("offset").to_pylist() == list(range(lo, hi))
            assert _rows(got[(a, 0)]) == want[0][lo:hi]
            assert got[(a, 1)].num_rows == 0
        got = f.read([(a, 0, 3, 9), (a, 1, 0, 1500)])  # a seek back; partition 1 whole
        assert _rows(got[(a, 0)]) == want[0][3:9] and _rows(got[(a, 1)]) == want[1]
        got = f.read([(a, 0, 9, 700)])
        f.unread(got)  # a read-ahead that guessed wrong gives its records back
        got = f.read([(a, 0, 9, 12), (a, 1, 1500, 1500)])
        assert _rows(got[(a, 0)]) == want[0][9:12]
        assert _rows(f.read([(a, 0, 12, 700)])[(a, 0)]) == want[0][12:700]
        assert (f.fell_back > 0) == (compression != "none")
    finally:
        f.close()


def test_fetcher_skips_transaction_markers_and_aborted_records(brokers):
    """Committed and aborted transactions between plain records, on noida-db (Tansu keeps
    aborted records visible, see panjoin.kafka.broker): the Fetcher reads what a read
    committed librdkafka consumer reads, markers and aborted records left out."""
    from panjoin.kafka.broker import start_broker

    b = brokers.get("noida")
    if b is None or not b.alive():
        b = brokers["noida"] = start_broker("noida")
    t = topic("T")
    io.create_topics(b.bootstrap, [t], partitions=1)
    plain = io.producer(b.bootstrap)
    tx = io.producer(b.bootstrap, **{"transactional.id": topic("tx")})
    tx.init_transactions(30)
    for k in range(3):
        for i in range(5):
            plain.produce(t, b"p%d-%d" % (k, i))
        assert plain.flush(30) == 0
        tx.begin_transaction()
        for i in range(4):
            tx.produce(t, b"t%d-%d" % (k, i))
        if k == 1:
            tx.abort_transaction(30)
        else:
            tx.commit_transaction(30)
    ends = io.end_offsets(b.bootstrap, t)
    want = [m.value() for m in io.read_topic(b.bootstrap, t)]
    assert b"t1-0" not in want and b"t0-0" in want and b"t2-3" in want
    f = Fetcher(b.bootstrap)
    try:
        got = f.read([(t, 0, 0, ends[0][1])])[(t, 0)]
        assert got.column("value").to_pylist() == want
        # noida-db hides aborted records itself; a broker that lists aborted transactions
        # instead has the range read by librdkafka (read committed)
        key, todo, out = (t, 0), {(t, 0): ends[0][1]}, {(t, 0): []}
        f.pos[key] = 3
        f._absorb(key, protocol.FetchedPartition(0, ends[0][1], [(7, 8)], None), todo, out)
        assert not todo and f.fell_back == 1 and f.pos[key] == ends[0][1]
        assert out[key][0].column("value").to_pylist() == want[3:]
    finally:
        f.close()


def test_batch_writer_output_reads_back_with_checksums(broker):
    """Values written as record batches (several per partition, over three partitions)
    read back with librdkafka checking every CRC, with the pipeline's batch and seq
    headers; positions in ``skip`` are not written."""
    o = topic("O")
    io.create_topics(broker.bootstrap, [o], partitions=3)
    vals = [b"v%d-" % i + b"y" * (i % 500) for i in range(20000)]
    w = BatchWriter(broker.bootstrap, max_batch_bytes=50_000, in_flight=3)
    try:
        arr = pa.array(vals, pa.binary()).slice(10)  # a slice: offsets must shift
        assert w.write(o, arr, batch=41, skip={0, 5, 19989, 70000}) == len(vals) - 10 - 3
        assert w.write(o, pa.array([b""], pa.binary()), batch=42) == 1
    finally:
        w.close()
    c = io.consumer(broker.bootstrap, **{"enable.partition.eof": True, "check.crcs": True})
    try:
        got = []
        for q, (lo, end) in io.end_offsets(broker.bootstrap, o).items():
            msgs = io.read_range(c, o, q, lo, end)
            assert msgs, f"partition {q} got nothing: batches go round-robin"
            got += msgs
    finally:
        c.close()
    seen = {}
    for m in got:
        h = dict(m.headers())
        seen[(int(h[io.BATCH_HEADER]), int(h[io.SEQ_HEADER]))] = m.value() or b""
    want = {(41, i): vals[i + 10] for i in range(len(vals) - 10) if i not in (0, 5, 19989)}
    want[(42, 0)] = b""
    assert seen == want and len(got) == len(want)


def test_value_buffers_of_a_sliced_array():
    arr = pa.array([b"ab", b"cde", b"f"], pa.binary()).slice(1)
    d, o = value_buffers(arr)
    assert [bytes(d[o[i]:o[i + 1]]) for i in range(2)] == [b"cde", b"f"]
