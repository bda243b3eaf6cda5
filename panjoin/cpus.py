"""How many CPUs this process may use: its affinity and its cgroup CPU quota.

``os.cpu_count()`` is the host's core count. A container (or a ``systemd`` slice, or
``panjoin.bench.hosts``) that allows 0.25 core still shows every core there, and a
thread per core then spends the quota in a fraction of each period and waits out
the rest throttled: a join under a 0.25-core quota took 18.8 s with a thread per
core against 7.6 s with one (issue 31). So, as container-aware runtimes do (Java's
``UseContainerSupport``, Go's ``automaxprocs``), the default thread count is::

    threads = max(1, min(CPUs in the affinity mask, ceil(quota / period)))

over the quota of the process's cgroup *and every ancestor's* (a parent's quota
limits its children too; the smallest wins). Both layouts are read:

* cgroup v2: ``cpu.max`` holds ``"<quota> <period>"`` or ``"max <period>"`` (none);
* cgroup v1: ``cpu.cfs_quota_us`` (``-1`` = none) and ``cpu.cfs_period_us`` in the
  ``cpu`` controller's hierarchy.

The group's directory is its path in ``/proc/self/cgroup`` under the mount point
that ``/proc/self/mountinfo`` gives for that hierarchy, less the mount's root (in a
container the hierarchy is often mounted from the container's own group)::

    /proc/self/cgroup   1:cpu:/jobs/a
    mountinfo           ... / /sys/fs/cgroup/cpu ... - cgroup cgroup rw,cpu
    read                /sys/fs/cgroup/cpu/jobs/a/cpu.cfs_quota_us, then jobs/, then /

Rounding up: a 1.5-core quota gives 2 threads, 0.25 gives 1. Rounding down would
leave half a core idle at 1.5 (one thread can use one core), while two threads
overrun 1.5 cores by a third at worst and the scheduler throttles that smoothly;
Java rounds up too (Go's automaxprocs rounds down). Files that are missing or
unreadable count as no limit. The parsing is :func:`cgroup_quota` on the files'
texts; :func:`cpu_budget` reads the real ones.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterator
from typing import NamedTuple


class Quota(NamedTuple):
    """A CPU quota in cores, and the file that set it."""

    cores: float
    source: str


class CpuBudget(NamedTuple):
    """The threads to use, from ``affinity`` CPUs and a ``quota`` (None: no quota)."""

    threads: int
    affinity: int
    quota: Quota | None

    @property
    def why(self) -> str:
        """E.g. ``2 threads: cgroup quota 1.5 cores (<file>), 2 CPUs in affinity``."""
        cpus = f"{self.affinity} CPU{'s' if self.affinity != 1 else ''} in affinity"
        head = f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        if self.quota is None:
            return f"{head}: {cpus}, no cgroup CPU quota"
        return f"{head}: cgroup quota {self.quota.cores:g} cores ({self.quota.source}), {cpus}"


def threads_for(affinity: int, quota: float | None) -> int:
    """Threads for ``affinity`` CPUs under a quota of ``quota`` cores (rounded up).

    >>> threads_for(2, 0.25), threads_for(2, 1.5), threads_for(2, None), threads_for(8, 2.0)
    (1, 2, 2, 2)
    """
    if quota is None:
        return max(1, affinity)
    return max(1, min(affinity, math.ceil(quota)))


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as octal escapes
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts(mountinfo: str) -> Iterator[tuple[str, str, str, set[str]]]:
    """(fstype, root, mount point, super options) of each line of a mountinfo."""
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if sep and len(f) >= 5 and len(r) >= 3:
            yield r[0], _unescape(f[3]), _unescape(f[4]), set(r[2].split(","))


def _groups(proc_cgroup: str) -> tuple[dict[str, str], str | None]:
    """The v1 group of each controller, and the v2 group (None without one)."""
    v1: dict[str, str] = {}
    v2 = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[1] == "":
            v2 = parts[2]
        else:
            for c in parts[1].split(","):
                v1[c] = parts[2]
    return v1, v2


def _dirs(mountpoint: str, root: str, group: str) -> list[str]:
    """The group's directory and its ancestors' under one mount, innermost first
    (none when the group lies outside what the mount shows)."""
    if root != "/":
        if group != root and not group.startswith(root.rstrip("/") + "/"):
            return []
        group = group[len(root):]
    parts = [p for p in group.split("/") if p]
    return [os.path.join(mountpoint, *parts[:i]) for i in range(len(parts), -1, -1)]


def _int(text: str | None) -> int | None:
    try:
        return int(text.split()[0]) if text else None
    except ValueError:
        return None


def cgroup_quota(proc_cgroup: str, mountinfo: str,
                 read: Callable[[str], str | None]) -> Quota | None:
    """The smallest CPU quota over the process's cgroup and its ancestors, v1 and v2,
    from the texts of ``/proc/self/cgroup`` and ``/proc/self/mountinfo``; ``read(path)``
    gives a file's text or None when it is missing. None: no quota anywhere.

    >>> v1 = "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\\n"
    >>> files = {"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\\n",
    ...          "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\\n",
    ...          "/sys/fs/cgroup/cpu/job/cpu.cfs_quota_us": "150000\\n",
    ...          "/sys/fs/cgroup/cpu/job/cpu.cfs_period_us": "100000\\n"}
    >>> cgroup_quota("1:cpu:/job\\n", v1, files.get)
    Quota(cores=1.5, source='/sys/fs/cgroup/cpu/job/cpu.cfs_quota_us')
    >>> v2 = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\\n"
    >>> cgroup_quota("0::/a\\n", v2, {"/sys/fs/cgroup/a/cpu.max": "25000 100000\\n"}.get)
    Quota(cores=0.25, source='/sys/fs/cgroup/a/cpu.max')
    >>> print(cgroup_quota("0::/a\\n", v2, {"/sys/fs/cgroup/a/cpu.max": "max 100000\\n"}.get))
    None
    """
    v1, v2 = _groups(proc_cgroup)
    best: Quota | None = None
    for fstype, root, mountpoint, opts in _mounts(mountinfo):
        if fstype == "cgroup" and "cpu" in opts and "cpu" in v1:
            for d in _dirs(mountpoint, root, v1["cpu"]):
                src = os.path.join(d, "cpu.cfs_quota_us")
                q, p = _int(read(src)), _int(read(os.path.join(d, "cpu.cfs_period_us")))
                if q is not None and p and q > 0:
                    best = min(best or Quota(math.inf, ""), Quota(q / p, src))
        elif fstype == "cgroup2" and v2 is not None:
            for d in _dirs(mountpoint, root, v2):
                src = os.path.join(d, "cpu.max")
                fields = (read(src) or "").split()
                if len(fields) == 2 and fields[0] != "max":
                    q, p = _int(fields[0]), _int(fields[1])
                    if q is not None and p and q > 0:
                        best = min(best or Quota(math.inf, ""), Quota(q / p, src))
    return best


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # missing (no such controller here), or not ours to read
        return None


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (taskset, cpuset), else the host's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def cpu_budget() -> CpuBudget:
    """The threads this process should use by default, and why (reads the real files)."""
    quota = cgroup_quota(_read("/proc/self/cgroup") or "", _read("/proc/self/mountinfo") or "",
                         _read)
    n = affinity_cpus()
    return CpuBudget(threads_for(n, quota.cores if quota else None), n, quota)


def available_cpus() -> int:
    """:func:`cpu_budget`'s thread count: what a thread pool should default to."""
    return cpu_budget().threads


__all__ = ["CpuBudget", "Quota", "affinity_cpus", "available_cpus", "cgroup_quota",
           "cpu_budget", "threads_for"]
