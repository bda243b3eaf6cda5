"""Prometheus metrics of a running cluster (issue 30, item 1).

Real worker processes and a real manager process (``panjoin.launch``), each with
``--metrics-port 0``; the test scrapes ``/metrics`` over HTTP during and after a join,
parses the text with prometheus_client's parser and checks the counters against what
was pushed and what the reference join (:mod:`panjoin.reference`) produces. The
pipeline job's metrics are checked in tests/test_pipeline.py, on the Spark run it makes
anyway (``_check_metrics``).
"""

import subprocess
import sys
import time

import numpy as np
import pytest
from metrics_helpers import one, scrape, total

from panjoin.client import Client
from panjoin.generate import generate
from panjoin.launch import start_manager, start_workers
from panjoin.reference import reference_join
from panjoin.semantics import parse_predicate, parse_window

WINDOW, PRED = "time:400,400", "band:2"


@pytest.fixture(scope="module")
def cluster():
    ws = start_workers(2, worker_args=[["--metrics-port", "0"]] * 2)
    m = None
    try:
        m = start_manager([w.address for w in ws], args=["--metrics-port", "0"])
        yield ws, m
    finally:
        for p in [m, *ws]:
            if p is not None:
                p.stop()


def reference(ev):
    return reference_join(ev.stream, ev.id, ev.key, ev.ts, parse_window(WINDOW),
                          parse_predicate(PRED))


def test_ready_lines_name_the_metrics_ports(cluster):
    ws, m = cluster
    for p in (m, *ws):
        assert p.metrics is not None and p.metrics.startswith("127.0.0.1:")
        assert p.metrics != p.address


def test_counters_equal_what_was_pushed_and_produced(cluster):
    ws, m = cluster
    ev = generate(4000, "zipf", key_min=0, key_max=80, rate=1000, seed=11, disorder_ms=40)
    half = 2000
    first, whole = reference(ev.slice(0, half)), reference(ev)
    before = scrape(m.metrics)
    base = {k: total(before, k) for k in ("panjoin_pairs_out_total", "panjoin_batches_total",
                                          "panjoin_pair_latency_seconds_count")}
    base_in = {s: total(before, "panjoin_tuples_in_total", stream=s) for s in "RS"}
    with Client(m.address) as c:
        jid = c.open(WINDOW, PRED, "bisort", batch_size=256)
        sess = c.session(jid)
        try:
            sess.send(1, ev.slice(0, half), flush=True)
            # during the join: its own series, and the workers hold its subwindows
            s = scrape(m.metrics)
            for x, name in enumerate("RS"):
                assert one(s, "panjoin_join_tuples_in_total", join_id=jid, stream=name) == \
                    int((ev.stream[:half] == x).sum())
                assert one(s, "panjoin_join_late_total", join_id=jid, stream=name) == \
                    first.late_ids[name].size
            assert one(s, "panjoin_join_pairs_out_total", join_id=jid) == len(first.pairs)
            held = total(s, "panjoin_join_window_tuples", join_id=jid)
            assert held > 0
            st = c.status(jid)
            assert held == st.window_r + st.window_s
            assert total(s, "panjoin_join_subwindows", join_id=jid) == \
                st.subwindows_r + st.subwindows_s
            for w in ws:  # each worker's subwindows are named under its address
                assert total(s, "panjoin_join_subwindows", join_id=jid, worker=w.address) > 0
            assert one(s, "panjoin_join_held_bytes", join_id=jid) > 0
            assert one(s, "panjoin_joins_open") >= 1
            for w in ws:
                ws_ = scrape(w.metrics)
                assert one(ws_, "panjoin_worker_sessions") >= 1
                assert total(ws_, "panjoin_worker_subwindows") > 0
                assert total(ws_, "panjoin_worker_tuples") > 0
                assert one(ws_, "panjoin_worker_held_bytes") > 0
                assert one(ws_, "panjoin_worker_insert_seconds_total") > 0
                assert one(ws_, "panjoin_worker_commands_total") > 0

            sess.send(2, ev.slice(half, len(ev)), flush=True)
            s = scrape(m.metrics)
            assert one(s, "panjoin_join_pairs_out_total", join_id=jid) == len(whole.pairs)
            batches = one(s, "panjoin_join_batches_total", join_id=jid)
        finally:
            sess.close()
    # after the join: the manager's totals keep it, its own series are gone
    s = scrape(m.metrics)
    assert not [k for k in s if dict(k[1]).get("join_id") == jid]
    for x, name in enumerate("RS"):
        assert total(s, "panjoin_tuples_in_total", stream=name) - base_in[name] == \
            int((ev.stream == x).sum())
    assert total(s, "panjoin_pairs_out_total") - base["panjoin_pairs_out_total"] == \
        len(whole.pairs)
    assert total(s, "panjoin_batches_total") - base["panjoin_batches_total"] == batches
    # every pair was timed once; every batch once
    assert total(s, "panjoin_pair_latency_seconds_count") - \
        base["panjoin_pair_latency_seconds_count"] == len(whole.pairs)
    assert one(s, "panjoin_batch_seconds_count") == one(s, "panjoin_batches_total")
    assert one(s, "panjoin_batch_seconds_bucket", le="+Inf") == \
        one(s, "panjoin_batch_seconds_count")
    assert one(s, "panjoin_failovers_total") == 0
    # the workers release the join's sessions; their seconds stay counted
    for w in ws:
        deadline = time.monotonic() + 90
        while (ws_ := scrape(w.metrics)) and one(ws_, "panjoin_worker_sessions") > 0:
            assert time.monotonic() < deadline, "the worker kept the join's session"
            time.sleep(0.2)
        assert total(ws_, "panjoin_worker_subwindows") == 0
        assert one(ws_, "panjoin_worker_probe_seconds_total") > 0


def test_late_totals_match_the_reference(cluster):
    _, m = cluster
    ev = generate(1500, "uniform", key_min=0, key_max=50, rate=1000, seed=3, disorder_ms=80)
    ref = reference(ev)
    assert sum(v.size for v in ref.late_ids.values()) > 0  # the test needs late tuples
    before = scrape(m.metrics)
    with Client(m.address) as c:
        r, _s, late = c.join(ev, WINDOW, PRED, "bisort")
    s = scrape(m.metrics)
    for name in "RS":
        got = total(s, "panjoin_late_total", stream=name) - \
            total(before, "panjoin_late_total", stream=name)
        assert got == ref.late_ids[name].size == late[name].size
    assert np.isclose(total(s, "panjoin_pairs_out_total") - total(before,
                      "panjoin_pairs_out_total"), r.size)


def test_metrics_are_off_by_default():
    from workers.server import serve

    server, _ = serve(0)
    try:
        assert server.metrics_port is None
    finally:
        server.stop(None)


# ---------------------------------------------------------------------- panjoin status


def status_cmd(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "panjoin.cli", "status", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_status_command_shows_the_joins_and_workers(cluster):
    """``panjoin status`` (issue 30, item 3) against the same running cluster."""
    ws, m = cluster
    ev = generate(2000, "zipf", key_min=0, key_max=80, rate=1000, seed=5)
    ref = reference(ev)
    with Client(m.address) as c:
        jid = c.open(WINDOW, PRED, "bisort", batch_size=256)
        sess = c.session(jid)
        try:
            sess.send(1, ev, flush=True)
            st = c.status(jid)
            p = status_cmd(m.address)
            assert p.returncode == 0, p.stderr
            lines = p.stdout.splitlines()
            row = next(x for x in lines if x.startswith(jid)).split()
            # JOIN WINDOW TUPLES-IN PAIRS LATE SUBWINDOWS WORKERS MEMORY
            assert row[1] == WINDOW
            assert int(row[2]) == len(ev) and int(row[3]) == len(ref.pairs)
            assert int(row[4]) == sum(v.size for v in ref.late_ids.values())
            assert row[5] == f"{st.subwindows_r}/{st.subwindows_s}" and row[6] == "2/2"
            for w in ws:
                wrow = next(x for x in lines if x.startswith(w.address)).split()
                assert int(wrow[1]) > 0 and int(wrow[2]) > 0 and int(wrow[-1]) >= 1
            # --watch redraws: the screen is cleared at every refresh
            proc = subprocess.Popen([sys.executable, "-m", "panjoin.cli", "status", m.address,
                                     "--watch", "0.3"], stdout=subprocess.PIPE, text=True)
            try:
                seen = ""
                deadline = time.monotonic() + 120
                while seen.count("\x1b[2J") < 2:
                    assert time.monotonic() < deadline, seen
                    seen += proc.stdout.readline()
            finally:
                proc.terminate()
                proc.wait(timeout=30)
                proc.stdout.close()
            assert jid in seen
        finally:
            sess.close()
    p = status_cmd(m.address)
    assert p.returncode == 0 and jid not in p.stdout and "0 joins open" in p.stdout


def test_status_command_says_why_it_cannot_reach_the_manager():
    p = status_cmd("127.0.0.1:1")
    assert p.returncode == 1 and "UNAVAILABLE" in p.stderr
