"""Event files to topics and back, on both real brokers (noida-db and Tansu)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from kafka_helpers import topic

from panjoin.cli.main import main
from panjoin.events import write_events
from panjoin.generate import generate
from panjoin.kafka import io


@pytest.mark.parametrize("float_keys", [False, True])
def test_produce_then_read_back_every_record(broker, float_keys):
    ev = generate(600, "zipf", float_keys=float_keys, payload=True, seed=3)
    r, s = topic("R"), topic("S")
    counts = io.produce_events(broker.bootstrap, ev, r, s, partitions=2)
    assert counts == {r: ev.counts()[0], s: ev.counts()[1]}
    for code, t in ((0, r), (1, s)):
        msgs = io.read_topic(broker.bootstrap, t)
        recs = [json.loads(m.value()) for m in msgs]
        rows = np.flatnonzero(ev.stream == code)
        got = sorted((x["id"], x["key"], x["ts"], x["payload"]) for x in recs)
        want = sorted(zip(ev.id[rows].tolist(), ev.key[rows].tolist(), ev.ts[rows].tolist(),
                          ev.payload.take(rows).to_pylist(), strict=True))
        assert got == want  # float keys bit-exact through JSON
        # Kafka timestamp = event time
        assert all(m.timestamp()[1] == json.loads(m.value())["ts"] for m in msgs)
        # per partition, records keep the stream's arrival order
        for p in (0, 1):
            ids = [json.loads(m.value())["id"] for m in msgs if m.partition() == p]
            pos = {int(i): k for k, i in enumerate(ev.id[rows])}
            assert [pos[i] for i in ids] == sorted(pos[i] for i in ids)


def test_end_offsets_exact_after_each_produce_batch(broker):
    # Tansu's ListOffsets reports one produce batch short; a fetch knows the truth
    t = topic("E")
    io.create_topics(broker.bootstrap, [t], partitions=1)
    p = io.producer(broker.bootstrap)
    total = 0
    for n in (1, 4, 7):
        for i in range(n):
            p.produce(t, b"x%d" % i)
        assert p.flush(30) == 0
        total += n
        assert io.end_offsets(broker.bootstrap, t) == {0: (0, total)}
    assert len(io.read_topic(broker.bootstrap, t)) == total


def test_cli_produce_and_consume(broker, tmp_path, capsys):
    ev = generate(300, "uniform", seed=5, payload=True)
    path = tmp_path / "ev.parquet"
    write_events(ev, path)
    r, s = topic("R"), topic("S")
    assert main(["kafka", "produce", str(path), "--bootstrap-servers", broker.bootstrap,
                 "--r-topic", r, "--s-topic", s]) == 0
    out = tmp_path / "r.parquet"
    assert main(["kafka", "consume", r, "--bootstrap-servers", broker.bootstrap,
                 "--out", str(out)]) == 0
    t = pq.read_table(out)
    rows = ev.stream == 0
    assert t.column("id").to_pylist() == ev.id[rows].tolist()
    assert t.column("key").to_pylist() == ev.key[rows].tolist()
    assert t.column("kafka_timestamp").to_pylist() == ev.ts[rows].tolist()
    assert f"{rows.sum():,} records of {r}" in capsys.readouterr().out


def test_missing_topic_is_a_clear_error(broker):
    with pytest.raises(io.KafkaIOError, match="does not exist"):
        io.end_offsets(broker.bootstrap, topic("nope"))
