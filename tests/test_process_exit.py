"""The ``panjoin`` process (:func:`panjoin.cli.process.entry`): the garbage collector off
while the command's modules load, on (startup's objects frozen) while it runs; its exit
without tearing down the interpreter, but after what its exit would have done that
anyone sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap


def _run(tmp_path, argv: list[str]) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import atexit, sys, threading, time
        def late():  # a thread that is not a daemon: the exit waits for it
            time.sleep(0.5)
            open({str(tmp_path / "thread")!r}, "w").write("done")
        threading.Thread(target=late).start()
        atexit.register(lambda: print("atexit ran", file=sys.stderr))
        sys.argv = ["panjoin", *{argv!r}]
        from panjoin.cli.process import entry
        entry()
        print("never here")
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)


def test_exit_joins_threads_runs_atexit_flushes_and_keeps_the_code(tmp_path):
    out = tmp_path / "ev.parquet"
    r = _run(tmp_path, ["gen", str(out), "--n", "1000"])
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "thread").read_text() == "done"
    assert "atexit ran" in r.stderr and "never here" not in r.stdout
    assert out.exists() and "1000" in r.stdout  # buffered output reached the pipe

    (tmp_path / "thread").unlink()
    r = _run(tmp_path, ["replay", str(tmp_path / "missing.parquet"), "--window",
                        "count:10,10", "--predicate", "eq", "--out", str(tmp_path / "o")])
    assert r.returncode == 2 and "file not found" in r.stderr  # main's code, kept
    assert (tmp_path / "thread").read_text() == "done" and "atexit ran" in r.stderr


def test_the_collector_is_off_while_loading_and_on_for_the_command(tmp_path):
    """Seen from inside: while the arguments are parsed (every command's module is
    loaded by then) the collector is off; when the command runs it is on, with the
    objects built so far frozen out of its collections; OpenBLAS gets one thread."""
    code = textwrap.dedent(f"""
        import atexit, gc, json, os, sys
        import panjoin.cli.main as m
        seen = {{}}
        real = m.parse
        def parse(argv):
            seen["parsing"] = gc.isenabled()
            args = real(argv)
            run = args.run
            def running(a):
                seen["running"], seen["frozen"] = gc.isenabled(), gc.get_freeze_count()
                return run(a)
            args.run = running
            return args
        m.parse = parse
        atexit.register(lambda: print(json.dumps(
            {{**seen, "blas": os.environ.get("OPENBLAS_NUM_THREADS")}}), flush=True))
        sys.argv = ["panjoin", "gen", {str(tmp_path / "ev.parquet")!r}, "--n", "100"]
        from panjoin.cli.process import entry
        entry()
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env={k: v for k, v in os.environ.items()
                                         if k != "OPENBLAS_NUM_THREADS"})
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["parsing"] is False and seen["running"] is True
    assert seen["frozen"] > 10_000 and seen["blas"] == "1"
