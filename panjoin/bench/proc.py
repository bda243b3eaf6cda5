"""A process's CPU-seconds and memory as Linux's /proc reports them, for benchmarks.

    >>> import os
    >>> cpu_seconds(os.getpid()) >= 0 and status_mib(os.getpid(), "VmRSS") > 0
    True
"""

from __future__ import annotations

import os


def cpu_seconds(pid: int) -> float:
    """User + system CPU-seconds of ``pid`` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        q = f.read().rsplit(")", 1)[1].split()  # the name in () may hold spaces
    return (int(q[11]) + int(q[12])) / os.sysconf("SC_CLK_TCK")


def status_mib(pid: int, field: str) -> float:
    """A memory line of /proc/PID/status in MiB, e.g. ``VmRSS`` or ``VmHWM`` (peak)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")
