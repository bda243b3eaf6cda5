"""What ``panjoin replay`` pays around the join: the modules its process imports (no
pandas, which pyarrow's first numpy conversion would pull in; no grpc in-process)
and the Arrow/numpy conversions that avoid them, on real files in a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from panjoin.events import read_events, read_pairs
from panjoin.events.arrays import _arrow, _np
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window

#: runs replay in this interpreter, then prints which of these modules it imported
_PROBE = """
import json, sys
from panjoin.cli.main import main
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "loaded": [m for m in ("pandas", "grpc", "google.protobuf",
                                                  "pyarrow.compute", "spark_conn.cli",
                                                  "panjoin.cli.bench", "tomllib", "tqdm",
                                                  "numpy.random", "cProfile")
                                        if m in sys.modules]}))
"""


@pytest.fixture(scope="module")
def events(gen_file):
    return gen_file("--n", "4000", "--key-max", "80", "--rate", "1000",
                    "--disorder-ms", "30", "--seed", "5")


def _replay_in_a_process(*argv) -> dict:
    run = subprocess.run([sys.executable, "-c", _PROBE, "replay", *map(str, argv),
                          "--no-progress"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("window,pred", [("count:300,200", "eq"), ("time:60,90", "band:2")])
def test_replay_imports_no_pandas_nor_grpc_and_writes_the_reference(events, tmp_path, window, pred):
    out, late = tmp_path / "pairs.parquet", tmp_path / "late.parquet"
    got = _replay_in_a_process(events, "--window", window, "--predicate", pred, "--out", out,
                               "--late-out", late)
    assert got["rc"] == 0
    # neither pandas nor grpc nor protobuf: no channel in-process; Arrow's compute
    # functions only to write the late tuples' stream tags (--late-out); no tqdm
    # under --no-progress; the kernels' warm-up draws no random numbers (numpy.random's
    # import: 15-25 ms), and a process that profiles nothing imports no profiler
    assert got["loaded"] == ["pyarrow.compute"]
    t = read_events(events)
    ref = reference_join(t.stream, t.id, t.key, t.ts, parse_window(window),
                         parse_predicate(pred))
    assert np.array_equal(sort_pairs(read_pairs(out)), ref.pairs)


def test_a_parquet_files_join_imports_none_of_arrows_compute_functions(events, tmp_path):
    """Reading, checking and joining a Parquet file, and writing its pairs, need none
    of pyarrow.compute (20 ms of every start): its stream tags are mapped on the
    dictionary's few values."""
    got = _replay_in_a_process(events, "--window", "time:60,90", "--predicate", "eq",
                               "--out", tmp_path / "pairs.parquet")
    assert got["rc"] == 0 and got["loaded"] == []


#: runs replay here, then prints on which threads Numba loaded (or compiled) kernels
_THREADS = """
import json, sys, threading
from numba.core import dispatcher
seen = []
compile = dispatcher.Dispatcher.compile
def traced(self, sig):
    n = len(self.overloads)
    out = compile(self, sig)
    if len(self.overloads) > n:
        seen.append([threading.current_thread().name, self.py_func.__qualname__])
    return out
dispatcher.Dispatcher.compile = traced
from panjoin.cli.main import main
print(json.dumps({"rc": main(sys.argv[1:]), "loaded": seen}))
"""


@pytest.fixture(scope="module")
def float_events(gen_file):
    return gen_file("--n", "4000", "--key-max", "80", "--float-keys",
                    "--seed", "6")


@pytest.fixture(scope="module")
def key2_events(gen_file):
    return gen_file("--n", "4000", "--key-max", "80", "--key2-max", "100", "--rate", "1000",
                    "--seed", "7")


@pytest.mark.parametrize("index,pred,floats,window", [
    ("bisort", "band:3", False, "count:300,200"), ("rap", "eq", False, "count:300,200"),
    ("auto", "eq", False, "count:300,200"), ("bisort", "band:3", True, "count:300,200"),
    ("auto", "band:3&band2:20", False, "count:300,200"),
    # in shards: the router's kernels, and the shards' on their own threads
    ("auto", "eq", False, "time:300,200"), ("auto", "band:3&band2:20", False, "time:300,200"),
])
@pytest.mark.parametrize("aot", [False, True], ids=["jit", "aot"])
def test_the_join_finds_its_kernels_loaded(events, float_events, key2_events, tmp_path, index,
                                           pred, floats, window, aot, aot_built):
    """In-process, the kernels load on the loader thread while the file is read (for
    the file's key type, and key2 where the predicate has a residual): the join itself
    (the main thread, a shard's thread) loads none. With the kernels compiled ahead of
    time (:mod:`panjoin.jit.ahead`), a BI-Sort join loads none at all."""
    path = key2_events if "&" in pred else float_events if floats else events
    shards = ["--shards", "2"] if window.startswith("time") else []
    run = subprocess.run([sys.executable, "-c", _THREADS, "replay", str(path), "--window",
                          window, "--predicate", pred, "--index", index,
                          "--threads", "1", "--out", str(tmp_path / "p.parquet"),
                          *shards, "--no-progress", "-v"],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PANJOIN_AOT": "1" if aot else "0"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert not shards or "2 shards by key" in run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0
    if aot and index != "rap" and "&" not in pred:  # BI-Sort, int64 or float64 keys
        assert got["loaded"] == [], "a join the build covers loaded kernels from Numba"
    else:
        assert got["loaded"]
    elsewhere = [k for thread, k in got["loaded"] if thread != "panjoin-load-kernels"]
    assert elsewhere == [], f"the join loaded {elsewhere} itself"


@pytest.mark.parametrize("dtype", [np.int64, np.uint8, np.float64, np.int32])
def test_arrow_and_back_without_pyarrows_conversion(dtype):
    v = np.arange(-3 if np.dtype(dtype).kind != "u" else 0, 20).astype(dtype)
    a = _arrow(v)
    assert a.type == pa.from_numpy_dtype(np.dtype(dtype)) and a.null_count == 0
    assert a.equals(pa.array(v))
    back = _np(a.slice(3, 9))  # an offset into the buffer
    assert back.dtype == v.dtype and np.array_equal(back, v[3:12])
    assert np.array_equal(_np(pa.chunked_array([a.slice(0, 4), a.slice(7)])),
                          np.concatenate([v[:4], v[7:]]))


def test_bool_masks_unpack_at_any_offset():
    bits = np.random.default_rng(1).random(77) < 0.4
    arr = pa.array(bits)
    for start in (0, 1, 5, 8, 13):
        got = _np(arr.slice(start))
        assert got.dtype == bool and np.array_equal(got, bits[start:])
    assert _np(arr.slice(3, 0)).size == 0
    with_null = pa.array([True, None, False])  # nulls: pyarrow's own conversion
    assert list(_np(with_null)) == [True, None, False]


@pytest.mark.parametrize("n", [0, 5, 300_000])
def test_pairs_files_are_delta_encoded_and_read_back_exactly(tmp_path, n):
    import pyarrow.parquet as pq

    from panjoin.events import write_pairs

    rng = np.random.default_rng(n)
    r = np.sort(rng.integers(0, 1 << 40, n))
    s = rng.integers(-(1 << 62), 1 << 62, n)
    pay = pa.array([f"p{i}" for i in range(n)], pa.string())
    out = tmp_path / "pairs.parquet"
    write_pairs(out, r, s, pay, pay)
    back = pq.read_table(out)
    assert np.array_equal(read_pairs(out), np.stack([r, s], axis=1).reshape(-1, 2))
    assert back.column("r_payload").combine_chunks().equals(pay)
    if n:
        meta = pq.ParquetFile(out).metadata.row_group(0)
        ids = [meta.column(j) for j in range(2)]
        assert all("DELTA_BINARY_PACKED" in c.encodings and "RLE_DICTIONARY" not in c.encodings
                   and c.compression == "UNCOMPRESSED" for c in ids)


def test_bad_input_is_told_without_waiting_for_the_kernels(events, tmp_path, monkeypatch):
    """The loader thread may compile for minutes on a cold cache: an input error (here a
    residual on key2 for a file without it) is reported while it still runs."""
    import threading

    import panjoin.cli.replay as replay_mod
    from panjoin.cli.main import main

    release, started, finished = threading.Event(), threading.Event(), threading.Event()

    def slow_warm_join(*_):
        started.set()
        release.wait(30)
        finished.set()

    monkeypatch.setattr(replay_mod, "_warm_join", slow_warm_join)
    try:
        with pytest.raises(SystemExit, match="no key2 column"):
            main(["replay", str(events), "--window", "count:300,200", "--predicate",
                  "band:3&band2:1", "--out", str(tmp_path / "p.parquet"), "--no-progress"])
        # told while it loads: the loader (which first generates its warm-up tuples) is
        # still held in its join, so the error did not wait for it
        assert not finished.is_set()
        assert started.wait(30) and not finished.is_set()
    finally:
        release.set()


#: the ``panjoin`` command as its console script runs it (``entry``), reporting at exit
#: whether Numba's cffi support was loaded with cffi's C parser, and that cffi is still
#: there for the rest of the process
_CFFI = """
import atexit, json, sys
def report():
    from numba.core.typing import cffi_utils
    parser = "pycparser" in sys.modules
    import cffi
    print(json.dumps({"supported": cffi_utils.SUPPORTED, "parser": parser,
                      "ffi": type(cffi.FFI()).__name__}), flush=True)
atexit.register(report)
sys.argv = ["panjoin", *sys.argv[1:]]
from panjoin.cli.process import entry
entry()
"""


def test_the_command_loads_its_kernels_without_numbas_cffi_support(events, tmp_path):
    """Numba's typing context builds a cffi.FFI (its C parser) as the first kernel loads:
    the ``panjoin`` command spares itself that, and cffi stays importable after it."""
    run = subprocess.run([sys.executable, "-c", _CFFI, "replay", str(events), "--window",
                          "count:300,200", "--predicate", "eq", "--out",
                          str(tmp_path / "p.parquet"), "--no-progress"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got == {"supported": False, "parser": False, "ffi": "FFI"}


def test_a_process_that_imported_cffi_first_keeps_numbas_cffi_support():
    code = ("import cffi, sys\nfrom panjoin.config import numba_without_cffi\n"
            "numba_without_cffi()\nfrom numba.core.typing import cffi_utils\n"
            "print(cffi_utils.SUPPORTED)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "True"
