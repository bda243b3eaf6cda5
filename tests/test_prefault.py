"""A file join's heap faulted in ahead (panjoin.config.prefault_heap): once released,
its pages serve another thread's arrays without page faults (one malloc arena), and a
replay that prefaults finds the reference's pairs."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from panjoin.events import read_events, read_pairs
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window

#: in a fresh process: page faults of a new thread that makes and fills 48 MiB of
#: arrays, after a prefault of 64 MiB (argv[1] "1"; "2": with a kernel that refuses
#: MADV_POPULATE_WRITE, so the prefault fills its blocks) or without one ("0")
_FAULTS = """
import json, sys, threading
from panjoin import config
from panjoin.config import one_malloc_arena, prefault_heap
import numpy as np
one_malloc_arena()
if sys.argv[1] == "2":
    config._madvise = lambda: (lambda *args: -1)
if sys.argv[1] != "0":
    prefault_heap(64 << 20).release()
out = {}
def work():
    def faults():
        return int(open("/proc/thread-self/stat").read().rsplit(")", 1)[1].split()[7])
    f0 = faults()
    arrays = [np.ones(1 << 17) for _ in range(48)]
    out["faults"] = faults() - f0
threading.Thread(target=work).start()
import time
while "faults" not in out:
    time.sleep(0.01)
print(json.dumps(out))
"""


def _faults(mode: str) -> int:
    run = subprocess.run([sys.executable, "-c", _FAULTS, mode],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)["faults"]


def test_prefaulted_pages_serve_another_threads_arrays():
    """Faulted in by the kernel's populate, or filled where a kernel refuses it."""
    pages = (48 << 20) // 4096
    cold, warm, filled = _faults("0"), _faults("1"), _faults("2")
    assert cold > pages // 2, f"{cold} faults for {pages} pages: the control faulted nothing"
    assert warm < pages // 10, f"{warm} faults for {pages} pages after the prefault"
    assert filled < pages // 10, f"{filled} faults for {pages} pages after a filled prefault"


def test_a_replay_that_prefaults_finds_the_reference(gen_file, tmp_path):
    events = gen_file("--n", "30000", "--key-max", "3000", "--rate", "1000",
                      "--disorder-ms", "20", "--seed", "11")
    out = tmp_path / "pairs.parquet"
    run = subprocess.run([sys.executable, "-m", "panjoin.cli", "replay", str(events),
                          "--window", "time:2000,3000", "--predicate", "band:2", "--out",
                          str(out), "--no-progress"], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "prefault" in run.stdout  # the wall line's phase
    t = read_events(events)
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window("time:2000,3000"),
                         parse_predicate("band:2"))
    assert np.array_equal(sort_pairs(read_pairs(out)), ref.pairs)


def test_mallopt_takes_settings_without_a_library_search():
    """glibc's mallopt is found among the process's own symbols: it takes a setting
    (returns True) and runs no ``ldconfig`` (ctypes.util.find_library's, 25-40 ms a
    call at a replay's start)."""
    import platform

    import pytest

    from panjoin import config

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    code = ("import subprocess, sys\n"
            "def refuse(*a, **k):\n"
            "    raise AssertionError('a subprocess was started')\n"
            "subprocess.Popen = refuse\n"
            "from panjoin import config\n"
            "print(config._mallopt(config._M_TOP_PAD, 16 << 20))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
    assert config._mallopt(config._M_TOP_PAD, 16 << 20)


#: in a fresh process: the heap advised, grown by 64 MiB of arrays, advised again
#: (argv[1] == "1") or not; prints each [heap] mapping's "hg" flag (huge pages advised)
_ADVISED = """
import json, sys
import numpy as np
from panjoin.config import advise_heap_hugepages, tune_allocator
tune_allocator()
advise_heap_hugepages()
keep = [np.ones(1 << 17) for _ in range(64)]
if sys.argv[1] == "1":
    advise_heap_hugepages()
flags, cur = [], None
for line in open("/proc/self/smaps"):
    parts = line.split()
    if parts[0] == "VmFlags:":
        if cur == "[heap]":
            flags.append("hg" in parts[1:])
    elif "-" in parts[0] and not parts[0].endswith(":"):
        cur = parts[5] if len(parts) > 5 else ""
print(json.dumps(flags))
"""


def test_the_heap_is_advised_as_far_as_it_has_grown():
    """Each call advises the heap up to the program break (its start read once): the
    part grown since the first call is covered by the second, and not without it."""
    import os

    import pytest

    if not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
        pytest.skip("no transparent huge pages on this kernel")

    def flags(again: bool) -> list[bool]:
        run = subprocess.run([sys.executable, "-c", _ADVISED, "1" if again else "0"],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout)

    once, twice = flags(False), flags(True)
    assert once[0] and not all(once), once  # the grown part is not advised yet
    assert twice and all(twice), twice
