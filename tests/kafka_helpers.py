"""Helpers for the Kafka and Spark tests (the broker fixtures are in ``conftest.py``)."""

from __future__ import annotations

import uuid


def topic(name: str) -> str:
    """A unique topic name, so that tests can share a broker."""
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
