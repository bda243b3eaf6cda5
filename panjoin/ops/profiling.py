"""A cProfile of every Python thread of a ``panjoin`` process, dumped at its exit.

``PANJOIN_PROFILE=DIR panjoin manager ...`` (any command) profiles the main thread
and every thread started after it (gRPC handler threads, feedback readers), one
``cProfile.Profile`` each (Python 3.11's profiler sees only the thread that enabled
it), and on a normal exit (SIGTERM included: ``serve_until_stopped`` returns) merges
them into ``DIR/<command>-<pid>.pstats``. ``PANJOIN_PROFILE_COMMANDS=manager,worker``
profiles only those commands (the variables pass to the processes a benchmark
starts). Threads of gRPC's C core do not show; their Python callbacks
(deserialisers, the request iterator) do, on the threads that run them. Times are
each thread's CPU time (``time.thread_time``), not wall time: a thread waiting on a
lock, or throttled by a CPU quota, adds nothing. Read it with::

    python -c "import pstats; pstats.Stats('DIR/manager-123.pstats')\\
        .sort_stats('tottime').print_stats(30)"

The profile costs the process about 2x its Python time: compare shares, not seconds.
"""

from __future__ import annotations

import os

ENV = "PANJOIN_PROFILE"


def install(command: str) -> str | None:
    """Profile this process if ``$PANJOIN_PROFILE`` names a folder; the file it will
    write at exit, or None."""
    folder = os.environ.get(ENV)
    only = os.environ.get(ENV + "_COMMANDS", "")
    if not folder or (only and command not in only.split(",")):
        return None
    # imported here: every command imports this module, few profile (5 ms of a start)
    import atexit
    import cProfile
    import pstats
    import sys
    import threading
    import time

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{command}-{os.getpid()}.pstats")
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()

    def start(*_):  # runs once in each new thread, before its target
        sys.setprofile(None)
        p = cProfile.Profile(time.thread_time)
        with lock:
            profiles.append(p)
        p.enable()

    def dump():
        threading.setprofile(None)
        with lock:
            taken = list(profiles)
        stats = None
        for p in taken:
            try:
                p.create_stats()  # a thread still running: its calls so far
            except Exception:  # noqa: BLE001 (a profile that never ran: nothing to add)
                continue
            if stats is None:
                stats = pstats.Stats(p)
            else:
                stats.add(p)
        if stats is not None:
            stats.dump_stats(path)
            print(f"panjoin {command}: profile of {len(taken)} threads in {path}",
                  file=sys.stderr)

    threading.setprofile(start)
    start()  # this thread
    atexit.register(dump)
    return path
