"""Kernels compiled ahead of time (panjoin/jit): the build's guard admits exactly its
argument types; a join of int64 keys runs without loading Numba and finds the
reference's pairs, as the JIT's kernels do on every key distribution, window and
predicate, in one engine and in shards; any other call loads Numba and gets its
result; the compiled functions let go of the GIL; a stale build is not used."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading

import numpy as np
import pytest

from panjoin import jit
from panjoin.jit import ahead

pytestmark = pytest.mark.usefixtures("aot_built")


def _python(code: str, aot: bool = True, timeout: int = 900) -> str:
    """``code``'s output, run in a fresh interpreter (with the build unless ``aot`` is
    False); the test fails with its stderr if it fails."""
    import os

    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, "PANJOIN_AOT": "1" if aot else "0"})
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


@pytest.mark.parametrize("args,ok", [
    ((np.zeros(3, np.int64), 2, np.zeros(2, np.int64)), True),
    ((np.zeros(3, np.int64), np.int64(2), np.zeros(2, np.int64)), True),
    ((np.zeros(3, np.float64), 2, np.zeros(2, np.int64)), False),  # dtype
    ((np.zeros(3, np.int32), 2, np.zeros(2, np.int64)), False),
    ((np.zeros(6, np.int64)[::2], 2, np.zeros(2, np.int64)), False),  # strided
    ((np.zeros((2, 3), np.int64), 2, np.zeros(2, np.int64)), False),  # 2-d for 1-d
    ((np.zeros(3, np.int64), 2.0, np.zeros(2, np.int64)), False),  # a float for an int
    ((np.zeros(3, np.int64), True, np.zeros(2, np.int64)), False),  # a bool for an int
    ((np.zeros(3, np.int64), 2), False),  # arity
    ((np.zeros(3, np.int64), 2, np.zeros(2, np.int64), 1), False),
    (([0, 0, 0], 2, np.zeros(2, np.int64)), False),  # not an array
])
def test_the_guard_admits_exactly_the_builds_types(args, ok):
    assert ahead.guard("i8[::1], i8, i8[::1]")(args) is ok


def test_the_guard_refuses_read_only_non_contiguous_and_byte_swapped_arrays():
    g = ahead.guard("i8[:, ::1], b1, u1[::1]")
    good = np.zeros((2, 4), np.int64)
    assert g((good, True, np.zeros(3, np.uint8)))
    assert g((good, np.bool_(False), np.zeros(3, np.uint8)))
    ro = good.copy()
    ro.flags.writeable = False
    assert not g((ro, True, np.zeros(3, np.uint8)))
    assert not g((np.asfortranarray(np.zeros((4, 2), np.int64)).T[:, :], 1, np.zeros(3, np.uint8)))
    assert not g((np.zeros((2, 8), np.int64)[:, ::2], True, np.zeros(3, np.uint8)))
    assert not g((good.astype(">i8"), True, np.zeros(3, np.uint8)))
    assert not g((good, 1, np.zeros(3, np.uint8)))  # an int for a bool


def test_the_guard_admits_read_only_arrays_where_the_kernel_only_reads():
    ro = np.frombuffer(bytes(24), np.int64)  # as a message's column is decoded
    w = np.zeros(3, np.int64)
    g = ahead.guard("i8[::1], i8, i8[::1]", read_only=(0,))
    assert g((ro, 2, w)) and g((w, 2, w))
    assert not g((w, 2, ro)), "a read-only array where the kernel may write"
    assert not g((np.zeros(6, np.int64)[::2], 2, w)), "read-only admits, strided does not"


_READ_ONLY = r"""
import numpy as np
from panjoin import jit
from panjoin.jit import ahead
nb = jit.numba()
SCALARS = {"f8": nb.types.float64, "i8": nb.types.int64, "b1": nb.types.boolean}
failed = []
for qual, positions in ahead.READ_ONLY.items():
    mod, name = qual.rsplit(".", 1)
    kernel = getattr(__import__(mod, fromlist=[name]), name)
    for spec in ahead.specs(qual):
        sig = []
        for i, tok in enumerate(ahead._args(spec)):
            if "[" in tok:
                dt, dims = tok.split("[", 1)
                sig.append(nb.types.Array(nb.from_dtype(np.dtype(ahead._DTYPES[dt])),
                                          dims.count(",") + 1, "C", readonly=i in positions))
            else:
                sig.append(SCALARS[tok])
        try:
            disp = kernel.dispatcher() if isinstance(kernel, jit.Kernel) else kernel
            disp.compile(tuple(sig))
        except Exception as e:  # a write to a read-only argument: a typing error
            failed.append(f"{qual} {spec}: {type(e).__name__}: {str(e)[:300]}")
print("\n".join(failed) or "ok")
"""


def test_the_read_only_arguments_are_never_written():
    """Numba compiles every kernel of ``READ_ONLY`` with those arguments typed
    read-only: one that writes to such an argument fails to type."""
    out = _python(_READ_ONLY)
    assert out.strip() == "ok", out


def test_the_manager_decodes_a_message_into_the_builds_kernels():
    """The manager's JoinInput columns are views of the message's bytes (read-only):
    its step 1 still runs the build's kernels, without loading Numba mid-join."""
    code = ("import sys, numpy as np\n"
            "from panjoin.wire import from_array, to_array\n"
            "from panjoin.manager.engine import JoinEngine\n"
            "from panjoin.backend import NullBackend\n"
            "stream = from_array(to_array((np.arange(4000) % 2).astype(np.uint8)), '|u1')\n"
            "assert not stream.flags.writeable\n"
            "for w in ('count:1K,1K', 'time:500,500'):\n"
            "    e = JoinEngine(w, 'eq', index='nested', batch_size=512, subwindow_size=256,\n"
            "                   backend=NullBackend())\n"
            "    e.push_arrays(stream, np.arange(4000), np.arange(4000) % 97, np.arange(4000))\n"
            "    e.flush()\n"
            "print('numba' in sys.modules)")
    assert _python(code).split() == ["False"]


def test_every_export_is_in_the_build_and_its_kernel_holds_it():
    for qual in ahead.EXPORTS:
        mod, name = qual.rsplit(".", 1)
        found = ahead.entry(mod, name)
        assert found is not None and len(found) == len(ahead.specs(qual)), \
            f"{qual} is not in the build"
        kernel = getattr(__import__(mod, fromlist=[name]), name)
        assert isinstance(kernel, jit.Kernel) and kernel._ahead is not None, qual


#: joins in one process: prints the pairs' digest per case and whether Numba loaded
_JOINS = r"""
import hashlib, json, sys
import numpy as np
from panjoin.generate import generate
from panjoin.manager.engine import JoinEngine
from panjoin.manager.sharded_engine import ShardedEngine
from panjoin.reference import reference_join, sort_pairs
from panjoin.semantics import parse_predicate, parse_window, I64_MAX, I64_MIN
from panjoin import jit

EXTREMES = np.array([I64_MIN, I64_MIN + 1, -2, 0, 3, I64_MAX - 1, I64_MAX], dtype=np.int64)
out = {}
for dist in ("uniform", "zipf", "increasing", "equal", "extreme", "float"):
    t = generate(3000, dist if dist in ("zipf", "increasing", "equal") else "uniform",
                 key_min=-20, key_max=60, seed=4, rate=1000, disorder_ms=25)
    if dist == "extreme":
        t.key = EXTREMES[np.abs(t.key) % len(EXTREMES)]
    if dist == "float":
        t.key = t.key * 0.25 + 0.1  # equal keys, band edges hit exactly
    for window in ("count:400,300", "time:300,200"):
        for pred in ("eq", "band:3", "bands:-9,-6;2,4"):
            w = parse_window(window, 10 if window.startswith("time") else 0)
            p = parse_predicate(pred)
            for shards in (1, 2):
                if shards == 1:
                    eng = JoinEngine(w, p, index="bisort", batch_size=64, subwindow_size=150,
                                     threads=1)
                elif window.startswith("time"):
                    eng = ShardedEngine(w, p, np.array([np.median(t.key)], t.key.dtype),
                                        index="bisort", batch_size=64, subwindow_size=150)
                else:
                    continue
                got = []
                for a in range(0, len(t), 500):
                    eng.push(t.slice(a, a + 500))
                    got += eng.take_result_pieces()
                eng.flush()
                got += eng.take_result_pieces()
                if shards > 1:
                    eng.close()
                none = [np.zeros(0, np.int64)]
                pairs = sort_pairs(np.stack([np.concatenate(none + [g[0] for g in got]),
                                             np.concatenate(none + [g[1] for g in got])], axis=1))
                ref = reference_join(t.stream, t.id, t.key, t.ts, w, p)
                assert np.array_equal(pairs, ref.pairs), (dist, window, pred, shards)
                key = f"{dist} {window} {pred} {shards}"
                out[key] = [len(pairs), hashlib.sha256(pairs.tobytes()).hexdigest()]
print(json.dumps({"numba": "numba" in sys.modules, "jit": jit.loaded(), "pairs": out}))
"""


def _joins(aot: bool) -> dict:
    return json.loads(_python(_JOINS, aot).strip().splitlines()[-1])


def test_a_join_of_int64_or_float64_keys_runs_without_numba_and_as_the_jit_does():
    """Every distribution (extreme int64 keys and float keys included), count and time
    windows, equi and band predicates, one engine and two shards: the reference's pairs
    (checked in the process), the same with the build as with Numba's JIT, and Numba
    never imported with the build."""
    compiled, jitted = _joins(True), _joins(False)
    assert compiled["pairs"] == jitted["pairs"] and len(compiled["pairs"]) == 54
    assert not compiled["numba"] and not compiled["jit"], "the join loaded Numba"
    assert jitted["jit"]


_FALLBACK = r"""
import json, sys
import numpy as np
from panjoin.subwindow.kernels.bisort import first_moved
a = first_moved(np.arange(10, dtype=np.int64), 10, 5)
a += first_moved(np.arange(10, dtype=np.float64), 10, 5.0)
before = "numba" in sys.modules
b = first_moved(np.arange(10, dtype=np.float32), 10, np.float32(5.0))
c = first_moved(np.arange(20, dtype=np.int64)[::2], 10, 5)
print(json.dumps({"a": int(a), "b": int(b), "c": int(c), "before": before,
                  "after": "numba" in sys.modules}))
"""


def test_a_call_the_build_lacks_loads_numba_and_gets_its_result():
    got = json.loads(_python(_FALLBACK))
    from panjoin.subwindow.kernels.bisort import first_moved

    py = first_moved.py_func
    assert got["a"] == py(np.arange(10, dtype=np.int64), 10, 5) + \
        py(np.arange(10, dtype=np.float64), 10, 5.0)
    assert got["b"] == py(np.arange(10, dtype=np.float32), 10, np.float32(5.0))
    assert got["c"] == py(np.arange(20, dtype=np.int64)[::2], 10, 5)
    assert not got["before"] and got["after"]


def test_the_compiled_kernels_let_go_of_the_gil():
    """While a compiled merge of 8M rows runs on a thread, this thread runs Python
    (held, the GIL would stop it from the merge's start to its end)."""
    n = 1 << 22
    fn = ahead.entry("panjoin.subwindow.kernels.bisort", "merge_back")[0][1]
    mk = np.zeros(2 * n, np.int64)
    mk[:n] = np.arange(0, 2 * n, 2)
    mt, ms = np.zeros(2 * n, np.int64), np.zeros(2 * n, np.int64)
    rk = np.arange(1, 2 * n, 2, dtype=np.int64)
    rt, rs = np.zeros(n, np.int64), np.zeros(n, np.int64)
    started, done = threading.Event(), threading.Event()

    def merge():
        started.set()
        fn(mk, mt, ms, n, rk, rt, rs, n)
        done.set()

    th = threading.Thread(target=merge)
    th.start()
    started.wait()
    count = 0
    while not done.is_set():
        count += 1
    th.join()
    assert np.array_equal(mk, np.arange(2 * n)), "the merge went wrong"
    assert count > 10_000, f"this thread ran {count} loops during the merge: the GIL was held"


def test_a_stale_build_is_not_used(tmp_path, monkeypatch, caplog):
    stale = tmp_path / "_ahead.json"
    built = json.loads(open(ahead.STAMP_FILE).read())
    stale.write_text(json.dumps({**built, "sources": "0" * 64}))
    monkeypatch.setattr(ahead, "STAMP_FILE", str(stale))
    monkeypatch.setattr(ahead, "_LOADED", ahead._UNSET)
    with caplog.at_level(logging.WARNING, logger="panjoin.jit"):
        assert ahead.module() is None
    assert "make aot" in caplog.text and "sources" in caplog.text
    monkeypatch.setattr(ahead, "_LOADED", ahead._UNSET)
    monkeypatch.setenv("PANJOIN_AOT", "0")
    assert ahead.module() is None
    monkeypatch.setattr(ahead, "_LOADED", ahead._UNSET)


def test_a_kernel_keeps_its_python_function_and_hands_the_rest_to_numba():
    from panjoin.subwindow.kernels.bisort import first_moved

    assert first_moved.py_func.__name__ == "first_moved"
    assert first_moved.__name__ == "first_moved" and "first_moved" in repr(first_moved)
    first_moved(np.arange(8, dtype=np.float32), 8, np.float32(2.0))  # Numba's: not built
    assert any("float32" in str(s) for s in first_moved.signatures)


def test_a_kernel_pickles_by_name():
    """Spark's cloudpickle and multiprocessing carry a kernel as they carry a function:
    by its module and name (its compiled function and guard are not picklable)."""
    import pickle

    import cloudpickle

    from panjoin.subwindow.kernels.bisort import first_moved

    assert pickle.loads(pickle.dumps(first_moved)) is first_moved
    call = cloudpickle.loads(cloudpickle.dumps(lambda a: first_moved(a, a.size, 2)))
    assert call(np.arange(5, dtype=np.int64)) == 3


def test_modules_imported_after_numba_loaded_keep_the_build_and_numbas_prange():
    """A kernel module imported once Numba is loaded (an index made later in a process
    whose other kernels loaded it): its kernels in the build stay :class:`Kernel`
    objects (the build still runs them), its parallel kernels use Numba's ``prange``
    (Python's ``range`` would run them on one thread), the rest are Numba's."""
    code = ("from panjoin import jit\njit.numba()\n"
            "from panjoin.subwindow.kernels.wib import probe\n"
            "from panjoin.manager import kernels\n"
            "from panjoin.subwindow.kernels import search\n"
            "print(probe.prange.__module__, type(kernels.late_rows).__name__,\n"
            "      kernels.late_rows._ahead is not None, type(probe.wib_probe).__name__,\n"
            "      type(search.gallop_left).__name__)")
    assert _python(code).split() == ["numba.misc.special", "Kernel", "True", "Kernel",
                                  "CPUDispatcher"]
