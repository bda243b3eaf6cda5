"""Failover without the manager's copy: primary/backup subwindows on real workers, kill -9.

Each subwindow has a primary on one worker and a backup (a log of the same
inserts) on the next; a worker killed at any point of the run has its
primaries' backups promoted and its unanswered probes replayed with their
seq limits, so the result equals the brute-force reference. The manager keeps
no per-tuple state (measured with tracemalloc).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from panjoin.generate import generate
from panjoin.launch import start_workers
from panjoin.manager.engine import JoinEngine
from panjoin.manager.grpc_backend import GrpcBackend, WorkerError
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window


@pytest.fixture(scope="module")
def events():
    return generate(2400, "zipf", key_min=0, key_max=80, rate=1000, seed=11, disorder_ms=20)


def _pairs(r, s):
    return sort_pairs(np.stack([r, s], axis=1))


def _reference(events, window, pred):
    return reference_join(events.stream, events.id, events.key, events.ts, window,
                          parse_predicate(pred)).pairs


CHUNK = 300


# kill_at: before any push, early, mid-run, before the last push and flush
@pytest.mark.parametrize("index,window,kill_at", [
    ("bisort", "count:200,150", 0), ("bisort", "count:200,150", 3),
    ("bisort", "time:180,140", 7), ("rap", "time:180,140", 3), ("wib", "count:200,150", 5),
    ("nested", "count:200,150", 1)])
def test_a_worker_killed_at_any_point_loses_and_doubles_nothing(events, index, window,
                                                                 kill_at):
    w = parse_window(window, 15 if window.startswith("time") else 0)
    ws = start_workers(3)
    backend = GrpcBackend([x.address for x in ws], deadline=20)
    rs, ss = [], []
    try:
        eng = JoinEngine(w, "band:2", index=index, subwindow_size=40, partitions=4,
                         batch_size=48, backend=backend, n_workers=3)
        for k, a in enumerate(range(0, len(events), CHUNK)):
            if k == kill_at:
                ws[1].kill()  # SIGKILL with commands in flight (results not yet taken)
            eng.push(events.slice(a, min(len(events), a + CHUNK)))
            if k % 2:
                r, s = eng.take_results()
                rs.append(r)
                ss.append(s)
        eng.flush()
        r, s = eng.take_results()
        rs.append(r)
        ss.append(s)
        assert backend.alive_workers() == [0, 2]
        if kill_at > 0:  # killed before any push, it is simply never used
            assert backend.failovers >= 1 and backend.promoted >= 1
    finally:
        backend.close()
        for x in ws:
            x.stop()
    got = _pairs(np.concatenate(rs), np.concatenate(ss))
    want = _reference(events, w, "band:2")
    assert len(want) > 0
    assert np.array_equal(got, want)


def test_two_workers_killed_one_after_the_other(events):
    """The second loss finds subwindows whose backup is gone: those made after the first
    loss have new backups, older ones must have expired or the join says so."""
    w = parse_window("count:120,120")
    ws = start_workers(3)
    backend = GrpcBackend([x.address for x in ws], deadline=20)
    try:
        eng = JoinEngine(w, "eq", index="bisort", subwindow_size=30, partitions=4,
                         batch_size=32, backend=backend, n_workers=3)
        eng.push(events.slice(0, 600))
        ws[0].kill()
        eng.push(events.slice(600, 1500))  # the window slides past every old subwindow
        eng.take_results()
        ws[2].kill()
        eng.push(events.slice(1500, len(events)))
        eng.flush()
        eng.take_results()
        assert backend.alive_workers() == [1] and backend.failovers == 2
    finally:
        backend.close()
        for x in ws:
            x.stop()


@pytest.mark.parametrize("placement", ["time", "key"])
def test_one_replica_means_a_lost_worker_ends_the_join_with_a_clear_error(events, placement):
    """With one copy (--replicas 1, or key placement: every worker holds a piece of
    every subwindow) a lost worker fails the join: DATA_LOSS, saying what survives one."""
    from panjoin.manager.key_placement import KeyPlacedBackend

    ws = start_workers(2)
    placed = KeyPlacedBackend if placement == "key" else GrpcBackend
    backend = placed([x.address for x in ws], deadline=20, replicas=1)
    try:
        eng = JoinEngine("count:200,200", "eq", index="bisort", subwindow_size=40,
                         partitions=4, batch_size=32, backend=backend, n_workers=2)
        eng.push(events.slice(0, 600))
        eng.take_results()
        assert not backend.backup  # no backups were made
        ws[0].kill()
        with pytest.raises(WorkerError, match="no other copy.*--replicas 2") as e:
            eng.push(events.slice(600, 1200))
            eng.flush()
            eng.take_results()
        assert e.value.code == "DATA_LOSS"
    finally:
        backend.close()
        for x in ws:
            x.stop()


def _held_bytes(address_list, window: int, events) -> int:
    """Python-heap bytes the manager holds after a cluster join has filled its window."""
    backend = GrpcBackend(address_list, replicas=2)
    try:
        eng = JoinEngine(f"count:{window},{window}", "band:1", index="bisort",
                         batch_size=1024, backend=backend, n_workers=len(address_list))
        tracemalloc.start()
        for a in range(0, len(events), 8192):
            eng.push(events.slice(a, min(len(events), a + 8192)))
            eng.take_results()
        eng.flush()
        eng.take_results()
        backend.sync()
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return held
    finally:
        backend.close()


def test_the_manager_holds_no_tuple_of_the_window():
    """Window 4K vs 64K tuples per stream: the manager's heap grows by under 1 byte per
    window tuple (it used to keep ids, payloads and a copy of every insert, ~128 B)."""
    ws = start_workers(2)
    try:
        addrs = [x.address for x in ws]
        ev = generate(1 << 18, "uniform", key_min=0, key_max=1 << 30, seed=3)
        small = _held_bytes(addrs, 1 << 12, ev)
        big = _held_bytes(addrs, 1 << 16, ev)
    finally:
        for x in ws:
            x.stop()
    grown = big - small
    assert grown < 2 * (1 << 16), (small, big)  # both streams: 2 x 64K window tuples
