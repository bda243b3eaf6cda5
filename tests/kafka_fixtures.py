"""Session-wide real brokers for the Kafka and Spark tests: import the fixtures
(``from kafka_fixtures import broker``) into a test module. ``broker`` runs each
test on noida-db and on Tansu; topics get unique names so tests share a broker."""

from __future__ import annotations

import uuid

import pytest

from panjoin.kafka.broker import start_broker

_BROKERS: dict = {}


@pytest.fixture(scope="session")
def brokers():
    yield _BROKERS
    for b in _BROKERS.values():
        b.stop()
    _BROKERS.clear()


@pytest.fixture(params=["noida", "tansu"])
def broker(request, brokers):
    kind = request.param
    b = brokers.get(kind)
    if b is None or not b.alive():
        b = brokers[kind] = start_broker(kind)
    return b


def topic(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


class RangesFrame:
    """What Spark hands foreachBatch with the ranges source: one row per partition range
    (``Pipeline.process`` driven without Spark, with Spark's own plans)."""

    columns = ["topic", "partition", "start", "end"]

    def __init__(self, ranges: dict):
        self.rows = [(t, int(p), a, e) for t, ps in ranges.items() for p, (a, e) in ps.items()]

    def select(self, *_):
        return self

    def collect(self):
        return self.rows
