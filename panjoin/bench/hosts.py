"""Emulated hosts on one machine: a process per host, each in cgroups of its own (v1).

A small host is a share of this machine's CPU and memory: every process of a
benchmark gets a CPU quota of ``Q`` cores (the ``cpu`` controller's CFS quota:
``cpu.cfs_quota_us = Q x cpu.cfs_period_us``), optionally a memory limit (the
``memory`` controller; the kernel's OOM killer acts on the host, not the machine),
and its own ``cpuacct`` group, which counts the CPU-seconds of the host and any
child it starts. A process enters its host before it starts a thread: the command
is wrapped in a shell that writes its own pid into the host's ``cgroup.procs`` and
``exec``s the real command (the pid stays, the children inherit the groups)::

    with Hosts(quota=0.25) as hosts:             # /sys/fs/cgroup/{cpu,cpuacct,memory}/
        w = hosts.new("worker0")                 #     panjoin-hosts-<pid>/worker0
        subprocess.Popen(w.wrap(["panjoin", "worker", "--port", "0"]))
        ...
        w.usage()          # {"cpu_s": 1.9, "throttled_s": 5.2, "peak_mib": 310.0}
    # every group it made is gone (processes left in one are moved to the root first)

It needs root and the cgroup v1 ``cpu``, ``cpuacct`` and ``memory`` hierarchies
mounted under ``/sys/fs/cgroup`` (:func:`unsupported` says what is missing, so a
benchmark can refuse with that message instead of a traceback).
"""

from __future__ import annotations

import os
import shlex

CGROUP = "/sys/fs/cgroup"
CONTROLLERS = ("cpu", "cpuacct", "memory")


def unsupported(root: str = CGROUP) -> str | None:
    """Why emulated hosts cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "emulated hosts need root (cgroups): run as root, or in a VM where you are"
    for c in CONTROLLERS:
        path = os.path.join(root, c)
        if not os.path.isfile(os.path.join(path, "cgroup.procs")):
            return (f"emulated hosts need the cgroup v1 '{c}' controller mounted at {path} "
                    "(this machine has cgroup v2 only, or a different layout)")
        if not os.access(path, os.W_OK):
            return f"{path} is not writable: cannot make a cgroup for a host"
    return None


def _write(path: str, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def _read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().split()[0])


class Host:
    """One emulated host: its cgroup in each controller."""

    def __init__(self, name: str, dirs: dict[str, str], quota: float | None,
                 memory_mib: float | None):
        self.name = name
        self.dirs = dirs
        self.quota = quota
        self.memory_mib = memory_mib
        self.netns: str | None = None  # its network namespace (panjoin.bench.lan)
        self.ip = "127.0.0.1"  # where its servers listen
        for d in dirs.values():
            os.makedirs(d)
        if quota is not None:
            period = _read_int(os.path.join(dirs["cpu"], "cpu.cfs_period_us"))
            _write(os.path.join(dirs["cpu"], "cpu.cfs_quota_us"), max(1000, int(quota * period)))
        if memory_mib is not None:
            _write(os.path.join(dirs["memory"], "memory.limit_in_bytes"),
                   int(memory_mib * 2**20))
        self._start = self._counters()

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` as a command that first moves itself into this host (and into its
        network namespace, if it has one)."""
        enter = "; ".join(f"echo $$ > {shlex.quote(os.path.join(d, 'cgroup.procs'))}"
                          for d in self.dirs.values())
        # into the namespace after the cgroups: `ip netns exec` remounts /sys for it
        ns = "" if self.netns is None else f"ip netns exec {shlex.quote(self.netns)} "
        return ["sh", "-c", f'{enter} && exec {ns}"$@"', "sh", *cmd]

    def _counters(self) -> tuple[float, float]:
        cpu = _read_int(os.path.join(self.dirs["cpuacct"], "cpuacct.usage")) / 1e9
        throttled = 0.0
        with open(os.path.join(self.dirs["cpu"], "cpu.stat")) as f:
            for line in f:
                k, v = line.split()
                if k == "throttled_time":
                    throttled = int(v) / 1e9
        return cpu, throttled

    def mark(self) -> None:
        """Count CPU and throttling from now on (e.g. after a warm-up)."""
        self._start = self._counters()
        _write(os.path.join(self.dirs["memory"], "memory.max_usage_in_bytes"), 0)

    def usage(self) -> dict:
        """CPU-seconds and time throttled since :meth:`mark` (or creation), and the
        host's peak memory (RSS and page cache, as the memory controller counts it)."""
        cpu, thr = self._counters()
        peak = _read_int(os.path.join(self.dirs["memory"], "memory.max_usage_in_bytes"))
        return {"cpu_s": cpu - self._start[0], "throttled_s": thr - self._start[1],
                "peak_mib": peak / 2**20}

    def oom_kills(self) -> int:
        """How often the kernel killed a process of this host for its memory limit."""
        with open(os.path.join(self.dirs["memory"], "memory.oom_control")) as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        return 0

    def pids(self) -> list[int]:
        with open(os.path.join(self.dirs["cpu"], "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]

    def remove(self, root: str) -> None:
        """Move whatever still runs here to the root groups, then delete the groups."""
        for c, d in self.dirs.items():
            if not os.path.isdir(d):
                continue
            with open(os.path.join(d, "cgroup.procs")) as f:
                left = f.read().split()
            for pid in left:
                try:
                    _write(os.path.join(root, c, "cgroup.procs"), pid)
                except OSError:  # it ended meanwhile
                    pass
            os.rmdir(d)


def remove_stale(root: str = CGROUP) -> list[str]:
    """Remove the groups of runs whose process is gone (a run killed with -9 cannot
    clean up after itself); returns the parent groups removed. A group that still
    holds a process stays."""
    gone = []
    for c in CONTROLLERS:
        base = os.path.join(root, c)
        for name in os.listdir(base) if os.path.isdir(base) else ():
            pid = name.removeprefix("panjoin-hosts-")
            if name == pid or not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
                continue
            parent = os.path.join(base, name)
            try:
                for child in os.listdir(parent):
                    if os.path.isdir(os.path.join(parent, child)):
                        os.rmdir(os.path.join(parent, child))
                os.rmdir(parent)
                gone.append(parent)
            except OSError:  # a process still in it
                continue
    return gone


class Hosts:
    """The emulated hosts of one benchmark run, under one parent group per controller
    (``panjoin-hosts-<pid>``); a context manager that removes every group it made."""

    def __init__(self, quota: float | None = None, memory_mib: float | None = None,
                 root: str = CGROUP):
        why = unsupported(root)
        if why is not None:
            raise RuntimeError(why)
        if quota is not None and not quota > 0:
            raise ValueError(f"a host's CPU quota must be positive (cores), got {quota}")
        if memory_mib is not None and not memory_mib > 0:
            raise ValueError(f"a host's memory limit must be positive (MiB), got {memory_mib}")
        self.root = root
        self.quota, self.memory_mib = quota, memory_mib
        remove_stale(root)
        self.parent = f"panjoin-hosts-{os.getpid()}"
        self.hosts: dict[str, Host] = {}
        self.made: list[str] = []
        for c in CONTROLLERS:
            d = os.path.join(root, c, self.parent)
            os.makedirs(d, exist_ok=True)
            self.made.append(d)

    def new(self, name: str, quota: float | None = None,
            memory_mib: float | None = None) -> Host:
        """A host with the run's quota and memory limit (or these)."""
        if name in self.hosts:
            raise ValueError(f"host {name!r} exists already")
        dirs = {c: os.path.join(self.root, c, self.parent, name) for c in CONTROLLERS}
        try:
            h = Host(name, dirs, quota if quota is not None else self.quota,
                     memory_mib if memory_mib is not None else self.memory_mib)
        except BaseException:
            for d in dirs.values():
                if os.path.isdir(d):
                    os.rmdir(d)
            raise
        self.hosts[name] = h
        return h

    def close(self) -> None:
        for h in self.hosts.values():
            h.remove(self.root)
        self.hosts.clear()
        for d in self.made:
            if os.path.isdir(d):
                os.rmdir(d)
        self.made = []

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["CONTROLLERS", "Host", "Hosts", "remove_stale", "unsupported"]
