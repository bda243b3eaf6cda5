"""The ``panjoin`` command as a process (the console script, ``python -m panjoin.cli``):
what a process does before the command's modules load and after the command returns.

Before: Python's cyclic garbage collector is off while the command's modules load
(Numba, pyarrow, gRPC and this project build some hundred thousand objects, none of
them garbage), and the objects built by then are frozen out of later collections
(``gc.freeze``), so a collection of the oldest generation no longer walks them all
again: on a 2M-tuple replay the collector's time fell from 45 to 30 ms, the whole
process to 0.94x. The collector is back on before the command runs, so a server that
runs for days collects its cycles as any Python process does. OpenBLAS gets one thread
unless the user chose (``OPENBLAS_NUM_THREADS``): nothing here calls BLAS, and the
thread numpy's import starts spins for about 0.1 s of CPU, which a host under a CPU
quota pays from its share. A file's in-process replay makes its threads share one
malloc arena (:func:`panjoin.config.prefault_heap`), before any thread allocates.

After: :func:`panjoin.cli.main.main`, then what the interpreter's exit does that anyone
sees (threads that are not daemons joined, with the hooks of ``concurrent.futures``;
the ``atexit`` handlers: logging's flush, ``multiprocessing``'s children, the profiler
of ``$PANJOIN_PROFILE``; the standard streams flushed) and out, without tearing down
every module and object one by one: Numba's and LLVM's take 0.2-0.5 s after a replay's
last line. A test calls :func:`panjoin.cli.main.main` and keeps its interpreter.
"""

from __future__ import annotations

import gc
import os


def entry() -> None:
    """Run the ``panjoin`` command in this process and leave it with its exit status."""
    gc.disable()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import atexit
    import contextlib
    import sys
    import threading

    if sys.argv[1:2] == ["replay"] and not {"--cluster", "--workers"} & set(sys.argv):
        from panjoin.config import one_malloc_arena

        one_malloc_arena()  # a file's join: see panjoin.config.prefault_heap

    from panjoin.config import numba_without_cffi

    numba_without_cffi()
    from panjoin.cli.main import main

    rc = main(before_run=_collect_from_here)
    with contextlib.suppress(AttributeError):  # CPython's own first step of its exit
        threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(rc if isinstance(rc, int) else 0 if rc is None else 1)


def _collect_from_here() -> None:
    """The collector back on, for what the command makes from now on."""
    gc.freeze()
    gc.enable()
