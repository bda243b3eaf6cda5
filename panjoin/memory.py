"""How much memory this process may still use: its cgroup's limit and the host's free memory.

The memory counterpart of :mod:`panjoin.cpus`. ``MemAvailable`` is what the host has
left; a container (or a ``systemd`` slice, or an emulated host of
:mod:`panjoin.bench.hosts`) with a limit of 256 MiB still shows the host's gigabytes
there, and a join sized by them is killed by the kernel's OOM killer halfway instead
of refused at the start. So the memory a process may still use is::

    left = min(MemAvailable, min over its cgroup and every ancestor of
                             (limit - working set))

where a group's working set is what its processes hold now (this one included: the
interpreter, the loaded kernels and, for ``panjoin replay``, the event file): its
usage less the inactive file cache, which the kernel reclaims before it would
OOM-kill anyone (the kubelet and cAdvisor count it so: an event file just read
leaves its pages in the group's cache, and counting them would refuse windows that
fit). Both layouts are read, in the group's directory that :mod:`panjoin.cpus`
finds through ``/proc/self/cgroup`` and ``/proc/self/mountinfo``:

* cgroup v1: ``memory.limit_in_bytes`` (no limit: a huge number, about 2^63),
  ``memory.usage_in_bytes`` and ``total_inactive_file`` of ``memory.stat`` in the
  ``memory`` controller's hierarchy;
* cgroup v2: ``memory.max`` (``max`` = none), ``memory.current`` and
  ``inactive_file`` of ``memory.stat``.

Example: a worker in ``1:memory:/hosts/w0`` whose ``memory.limit_in_bytes`` is
256 MiB and whose working set is 96 MiB, on a host with 20 GiB
available, may still use 160 MiB; its default budget for subwindows is
``MEMORY_SHARE`` (80%) of that (:func:`panjoin.limits.default_memory_limit`).

Files that are missing or unreadable count as no limit. The parsing is
:func:`cgroup_memory` on the files' texts; :func:`memory_budget` reads the real ones.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

from panjoin.cpus import _dirs, _groups, _int, _mounts, _read

#: a v1 limit at or above this is "no limit" (the kernel writes 2^63 rounded to pages)
NO_LIMIT = 1 << 62


class CgroupMemory(NamedTuple):
    """A cgroup's memory limit and working set (bytes: usage less inactive file cache),
    and the file that set the limit."""

    limit: int
    usage: int
    source: str

    @property
    def left(self) -> int:
        return max(0, self.limit - self.usage)


def fmt_bytes(n: float) -> str:
    """Bytes for a person: ``fmt_bytes(3 << 30) == '3.0 GiB'``."""
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} PiB"


class MemoryBudget(NamedTuple):
    """What this process may still use (bytes), from ``available`` (the host's
    MemAvailable) and ``cgroup`` (None: no limit)."""

    left: int
    available: int
    cgroup: CgroupMemory | None

    @property
    def why(self) -> str:
        """E.g. ``160.0 MiB: cgroup limit 256.0 MiB, 96.0 MiB used (<file>), host 20.0 GiB``."""
        host = f"host MemAvailable {fmt_bytes(self.available)}"
        if self.cgroup is None:
            return f"{fmt_bytes(self.left)}: {host}, no cgroup memory limit"
        c = self.cgroup
        return (f"{fmt_bytes(self.left)}: cgroup limit {fmt_bytes(c.limit)}, "
                f"{fmt_bytes(c.usage)} used ({c.source}), {host}")


def _stat(text: str | None, key: str) -> int:
    """One counter of a ``memory.stat`` text (0 when absent)."""
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return _int(v) or 0
    return 0


def cgroup_memory(proc_cgroup: str, mountinfo: str,
                  read: Callable[[str], str | None]) -> CgroupMemory | None:
    """The group with the least memory left over the process's cgroup and its ancestors,
    v1 and v2, from the texts of ``/proc/self/cgroup`` and ``/proc/self/mountinfo``;
    ``read(path)`` gives a file's text or None when it is missing. None: no limit.

    >>> v1 = "32 31 0:29 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\\n"
    >>> files = {"/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\\n",
    ...          "/sys/fs/cgroup/memory/job/memory.limit_in_bytes": "268435456\\n",
    ...          "/sys/fs/cgroup/memory/job/memory.usage_in_bytes": "100663296\\n"}
    >>> m = cgroup_memory("4:memory:/job\\n", v1, files.get); m.left >> 20, m.source
    (160, '/sys/fs/cgroup/memory/job/memory.limit_in_bytes')
    >>> files["/sys/fs/cgroup/memory/job/memory.stat"] = "cache 1\\ntotal_inactive_file 33554432\\n"
    >>> cgroup_memory("4:memory:/job\\n", v1, files.get).left >> 20  # 32 MiB of it reclaimable
    192
    >>> v2 = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\\n"
    >>> cgroup_memory("0::/a\\n", v2, {"/sys/fs/cgroup/a/memory.max": "1048576\\n",
    ...                                "/sys/fs/cgroup/a/memory.current": "0\\n"}.get).limit
    1048576
    >>> print(cgroup_memory("0::/a\\n", v2, {"/sys/fs/cgroup/a/memory.max": "max\\n"}.get))
    None
    """
    v1, v2 = _groups(proc_cgroup)
    best: CgroupMemory | None = None
    for fstype, root, mountpoint, opts in _mounts(mountinfo):
        if fstype == "cgroup" and "memory" in opts and "memory" in v1:
            dirs, files = _dirs(mountpoint, root, v1["memory"]), (
                "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        elif fstype == "cgroup2" and v2 is not None:
            dirs, files = _dirs(mountpoint, root, v2), ("memory.max", "memory.current",
                                                        "inactive_file")
        else:
            continue
        for d in dirs:
            src = os.path.join(d, files[0])
            limit = _int(read(src))  # "max" (v2) parses as None: no limit
            if limit is None or limit >= NO_LIMIT:
                continue
            usage = _int(read(os.path.join(d, files[1]))) or 0
            usage -= min(usage, _stat(read(os.path.join(d, "memory.stat")), files[2]))
            m = CgroupMemory(limit, usage, src)
            if best is None or m.left < best.left:
                best = m
    return best


def mem_available() -> int:
    """The host's ``MemAvailable`` (bytes), else its physical memory."""
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_budget() -> MemoryBudget:
    """What this process may still use, and why (reads the real files)."""
    cg = cgroup_memory(_read("/proc/self/cgroup") or "", _read("/proc/self/mountinfo") or "",
                       _read)
    avail = mem_available()
    return MemoryBudget(min(avail, cg.left) if cg is not None else avail, avail, cg)


__all__ = ["CgroupMemory", "MemoryBudget", "cgroup_memory", "fmt_bytes", "mem_available",
           "memory_budget"]
