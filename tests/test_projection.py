"""The projection model's arithmetic (issue 28, item 5) on a tiny saved run."""

from __future__ import annotations

import json

import pytest

from benchmarks.projection import best_k, costs, main, throughput

#: one workload of 1M tuples at N = 1 and 2: per tuple the manager 0.5 us, the workers
#: 0.9 us together, the client 0.2 us, 170 bytes on the wire (read at the largest N)
REC = {"workload": {"name": "tiny", "tuples": 1_000_000},
       "in_process": {"hosts": {"in-process": {"cpu_s": 0.6}}},
       "cluster": [{"n": 1, "wire_b_per_tuple": 99.0,
                    "hosts": {"manager": {"cpu_s": 9.0}, "worker0": {"cpu_s": 9.0},
                              "client": {"cpu_s": 9.0}}},
                   {"n": 2, "wire_b_per_tuple": 170.0,
                    "hosts": {"manager": {"cpu_s": 0.5}, "worker0": {"cpu_s": 0.4},
                              "worker1": {"cpu_s": 0.5}, "client": {"cpu_s": 0.2}}},
                   {"n": 3, "error": "failed", "same_pairs": False}]}


def test_costs_are_read_per_tuple_at_the_largest_n_that_ran():
    c = costs(REC)
    assert c["n"] == 2 and c["b"] == 170.0
    assert c["m"] == pytest.approx(0.5e-6) and c["w"] == pytest.approx(0.9e-6)
    assert c["c"] == pytest.approx(0.2e-6) and c["local"] == pytest.approx(0.6e-6)


def test_the_smallest_term_limits_and_is_named():
    c = costs(REC)
    # 8 hosts, one manager, 7 workers, 1 Gbit/s: min(2.0M, 7.8M, 5.0M, 2 x 125e6 / 170)
    t, lim = throughput(c, 8, 1, 125e6)
    assert lim == "network" and t == pytest.approx(2 * 125e6 / 170)
    # 10 Gbit/s: the manager's core, 1 / 0.5 us
    assert throughput(c, 8, 1, 1.25e9) == (pytest.approx(2e6), "manager")
    # two managers, 6 workers: 4.0M, 6.67M, 10M, 29.4M
    assert throughput(c, 8, 2, 1.25e9) == (pytest.approx(4e6), "manager")
    # the best K at 8 hosts, 10 Gbit/s: 3 (5 workers: 5.56M) beats 4 (4 workers: 4.44M)
    k, t, lim = best_k(c, 8, 1.25e9)
    assert (k, lim) == (3, "workers") and t == pytest.approx(5 / 0.9e-6)
    with pytest.raises(ValueError, match="no worker"):
        throughput(c, 2, 2, 1e9)


def test_the_table_is_labeled_a_model(tmp_path, capsys):
    path = tmp_path / "so.json"
    path.write_text(json.dumps([REC]))
    assert main(str(path)) == 0
    out = capsys.readouterr().out
    assert "A model, not a measurement" in out
    rows = [x for x in out.splitlines() if x.startswith("| tiny |")]
    assert len(rows) == 6 and sum("Gbit" in x for x in rows) == 6
