"""Spare arrays for new subwindows (panjoin.subwindow.spares): an expired hash table's
arrays come back cleared and serve the next table, which is then exactly as a new one
(its check() passes, its lookups match the nested loop, the engine's pairs match the
reference of DESIGN section 2 through many reuses); arrays something still refers to
are never reused; idle spares are freed; a latency-bound engine freezes the heap."""

import os
import subprocess
import sys
import time

import numpy as np

from panjoin.generate import generate
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window
from panjoin.subwindow import spares as spares_mod
from panjoin.subwindow.hash_table import HashTable
from panjoin.subwindow.nested_loop import NestedLoop
from panjoin.subwindow.spares import SPARES, Spares


def test_doctests():
    import doctest

    assert doctest.testmod(spares_mod).failed == 0


def _filled(ix, keys):
    n = keys.shape[0]
    ix.insert(keys, np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64))
    return ix


def test_a_reused_table_is_a_new_one():
    """Table A's arrays (full of A's keys and chains) go back; table B of the same
    capacity gets memory that held them, starts empty, and answers as a nested loop."""
    rng = np.random.default_rng(3)
    cap = 4096
    a = _filled(HashTable(cap), rng.integers(0, 500, cap))
    where = {a.slots.ctypes.data, a._flat.ctypes.data, a.keys.ctypes.data}
    a.release()
    SPARES.drain()
    assert len(a) == 0 and a.probe(np.zeros((1, 1), np.int64),
                                   np.zeros((1, 1), np.int64))[0].size == 0
    reused = False
    for _ in range(3):  # spares prepared ahead may come first; A's come within three
        b = HashTable(cap)
        reused |= b.slots.ctypes.data in where
        assert not b.slots.any()
        keys = rng.integers(0, 300, 3000)
        _filled(b, keys)
        b.check()
        ref = _filled(NestedLoop(cap), keys)
        probe = rng.integers(0, 300, (1, 200))
        got, want = b.probe(probe, probe), ref.probe(probe, probe)
        np.testing.assert_array_equal(np.sort(got[0] * cap + got[1]),
                                      np.sort(want[0] * cap + want[1]))
        b.release()
        SPARES.drain()
    assert reused


def test_an_array_still_referred_to_is_not_reused():
    sp = Spares()
    try:
        a = sp.zeros(1 << 12, np.int64)
        view = a[:8]
        sp.give_all([a])
        sp.drain()
        b = sp.zeros(1 << 12, np.int64)
        assert b.ctypes.data != a.ctypes.data
        view[0] = 5  # still the caller's memory
        assert sp.stats["in use"] == 1 and sp.stats["given"] == 0
    finally:
        sp.close()


def test_large_arrays_are_neither_kept_nor_prepared(monkeypatch):
    monkeypatch.setattr(spares_mod, "MAX_BYTES", 1 << 10)
    sp = Spares()
    try:
        a = sp.zeros(1 << 12, np.int64, ahead=2)  # 32 KiB > 1 KiB
        sp.give_all([a])
        del a
        sp.drain()
        assert sp.stats["given"] == 0 and not sp._ready
    finally:
        sp.close()


def test_idle_spares_are_freed(monkeypatch):
    monkeypatch.setattr(spares_mod, "IDLE_S", 0.05)
    sp = Spares()
    try:
        sp.zeros(1 << 10, np.int64, ahead=2)
        sp.drain()
        assert sum(len(v) for v in sp._ready.values()) == 2
        deadline = time.monotonic() + 10
        while sp._ready and time.monotonic() < deadline:  # the thread's idle sweep
            time.sleep(0.02)
        assert not sp._ready
    finally:
        sp.close()


def test_the_engine_reuses_hash_subwindows_exactly():
    """Count and time windows over many small hash subwindows: each new one takes an
    expired one's arrays, and the pairs are the reference's."""
    from panjoin.manager.engine import JoinEngine

    for window in ("count:700,500", "time:80,60"):
        ev = generate(20_000, "zipf", key_max=300, rate=10_000,
                      disorder_ms=20 if window.startswith("time") else 0, seed=11)
        lateness = 10 if window.startswith("time") else 0
        w = parse_window(window, lateness)
        ref = reference_join(ev.stream, ev.id, ev.key, ev.ts, w, parse_predicate("eq"))
        taken = SPARES.stats["taken"]
        eng = JoinEngine(w, "eq", index="hash", subwindow_size=128, batch_size=37, threads=1)
        for a in range(0, len(ev), 400):
            eng.push(ev.slice(a, a + 400))
            SPARES.drain()  # let the thread clear what came back, as time would
        eng.flush()
        r, s = eng.take_results()
        assert eng.backend.stats.expires > 100
        assert SPARES.stats["taken"] - taken > 100
        np.testing.assert_array_equal(sort_pairs(np.stack([r, s], axis=1)), ref.pairs)


def test_a_latency_bound_freezes_the_heap():
    """In a process of its own (freezing is for the process's life)."""
    code = ("import gc; from panjoin.manager.engine import JoinEngine; "
            "a = gc.get_freeze_count(); JoinEngine('count:1K,1K', 'eq'); "
            "b = gc.get_freeze_count(); JoinEngine('count:1K,1K', 'eq', max_latency_ms=5); "
            "print(a, b, gc.get_freeze_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    a, b, c = map(int, out)
    assert a == 0 and b == 0 and c > 10_000


def test_only_hash_subwindows_keep_their_arrays():
    """A BI-Sort store's ids (large subwindows, large batches: no create stall to hide)
    are freed at once, not kept as spares."""
    from panjoin.subwindow.store import SubwindowStore

    def handed():  # kept, or let go because enough of the shape are kept already
        return SPARES.stats["given"] + SPARES.stats["dropped"]

    before = handed()
    st = SubwindowStore("bisort", 1 << 12, "int64", 1)
    st.release()
    assert handed() == before
    st = SubwindowStore("hash", 1 << 12, "int64", 1)
    st.release()  # the table's three arrays and the store's ids
    assert handed() - before == 4


def test_the_spares_thread_runs_niced():
    """Clearing and mapping spares is background work: its thread runs at a lower
    priority than the batches (Linux: its own nice value)."""
    sp = Spares()
    seen = {}
    real_run = sp._run

    def run():
        import threading

        seen["tid"] = threading.get_native_id()
        real_run()

    sp._run = run
    try:
        sp.empty(1 << 12, np.int64, ahead=1)
        sp.drain()
        assert os.getpriority(os.PRIO_PROCESS, seen["tid"]) == spares_mod.NICE
    finally:
        sp.close()
