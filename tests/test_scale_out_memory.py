"""The scale-out benchmark's memory mode, quick (issue 28, item 3): windows held under a
per-host memory limit give the pairs of an unlimited run, on real worker processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from panjoin.bench.hosts import unsupported

WHY = unsupported()


@pytest.mark.skipif(WHY is not None, reason=f"no emulated hosts here: {WHY}")
def test_the_quick_memory_mode_holds_windows_with_the_same_pairs(tmp_path):
    out = tmp_path / "mem.json"
    p = subprocess.run([sys.executable, "-m", "benchmarks.scale_out", "--memory", "--quick",
                        "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = json.loads(out.read_text())
    assert rec["memory_mib"] == 512 and [r["n"] for r in rec["results"]] == [0, 1, 2]
    for r in rec["results"]:
        # held: the replay ended well, nobody was OOM-killed, the pairs are the reference's
        assert r["largest"] >= 1 << 17, r
        assert all(x["outcome"] in ("held", "refused") and x["oom"] == 0 for x in r["runs"])
    assert not [d for d in os.listdir("/sys/fs/cgroup/memory") if d.startswith("panjoin-hosts")]
