"""The ``panjoin`` process's exit (:func:`panjoin.cli.main.entry`): out without tearing
down the interpreter, but after what its exit would have done that anyone sees."""

from __future__ import annotations

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
        from panjoin.cli.main import entry
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
