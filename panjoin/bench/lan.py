"""An emulated LAN between emulated hosts: a network namespace per host on one bridge.

Each host (:class:`panjoin.bench.hosts.Host`) gets a network namespace with one
interface, ``eth0``, the end of a veth pair whose other end sits on a bridge in the
root namespace; the hosts reach each other (and the benchmark process, at the
bridge's address) only through it. A host's egress is shaped: ``tc`` with ``netem``
(a one-way delay and a rate) where the kernel has it, else ``tbf`` (the rate alone;
``delay_ms=0``). So a byte from one host to another crosses a real NIC-like device,
at most ``rate`` fast, ``delay`` late, and the bytes each host sent are counted by
its veth::

    with Hosts(quota=0.25) as hs, Lan(rate_mbit=2500) as lan:   # 10 Gbit/s x Q
        w = hs.new("worker0")
        lan.attach(w)            # w.netns = "pj-<pid>-worker0", w.ip = "10.77.N.2"
        subprocess.Popen(w.wrap(["panjoin", "worker", "--host", w.ip, ...]))
        lan.sent_bytes()         # every host's bytes sent, Ethernet headers included
    # every namespace, veth and the bridge it made are gone

Servers in a namespace listen on its address, off loopback: they need TLS and
client authentication (:mod:`panjoin.pki` makes a throwaway set). Needs root and
iproute2 (``ip``, ``tc``); :func:`unsupported` says what is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess

#: the bridge's /24 is 10.77.<pid % 250>.0: runs of other processes do not collide
NET = "10.77"


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True)


def _must(*cmd: str) -> None:
    p = _run(*cmd)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.strip()}")


def _qdisc(rate_mbit: float | None, delay_ms: float) -> list[str]:
    """The egress qdisc's tc arguments (after ``root``); empty: no shaping."""
    if delay_ms > 0:
        rate = [] if rate_mbit is None else ["rate", f"{rate_mbit:g}mbit"]
        return ["netem", "delay", f"{delay_ms:g}ms", *rate, "limit", "100000"]
    if rate_mbit is None:
        return []
    # a burst of 4 ms at the rate (the kernel's timer must be able to keep up) and a
    # queue of 20 ms before it drops
    burst = max(64 << 10, int(rate_mbit * 1e6 / 8 * 0.004))
    return ["tbf", "rate", f"{rate_mbit:g}mbit", "burst", str(burst), "latency", "20ms"]


def unsupported(rate_mbit: float | None = None, delay_ms: float = 0.0) -> str | None:
    """Why the LAN cannot be emulated here, or None when it can: root, iproute2,
    network namespaces, and the qdisc the shaping needs."""
    if os.geteuid() != 0:
        return "an emulated LAN needs root (network namespaces): run as root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"an emulated LAN needs '{tool}' (apt install iproute2)"
    probe = f"pj-probe-{os.getpid()}"
    p = _run("ip", "netns", "add", probe)
    if p.returncode:
        return f"cannot make a network namespace: {p.stderr.strip()}"
    try:
        q = _qdisc(rate_mbit, delay_ms)
        if q:
            p = _run("ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", *q)
            if p.returncode:
                if delay_ms > 0:
                    return (f"this kernel cannot delay packets (tc netem: {p.stderr.strip()}; "
                            "CONFIG_NET_SCH_NETEM): model the rate alone with a delay of 0 "
                            "(scale_out: --lan-delay-ms 0)")
                return f"this kernel cannot shape a rate (tc tbf: {p.stderr.strip()})"
    finally:
        _run("ip", "netns", "del", probe)
    return None


def remove_stale() -> list[str]:
    """Delete the namespaces and bridges of runs whose process is gone (a run killed
    with -9 cannot clean up after itself); returns their names."""
    gone = []
    for line in _run("ip", "netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) >= 3 and parts[0] == "pj" and parts[1].isdigit() and \
                not os.path.exists(f"/proc/{parts[1]}"):
            _run("ip", "netns", "del", name)
            gone.append(name)
    for line in _run("ip", "-o", "link", "show", "type", "bridge").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        pid = name.removeprefix("pjb")
        if name != pid and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _run("ip", "link", "del", name)
            gone.append(name)
    return gone


class Lan:
    """The namespaces, veths and bridge of one run; a context manager that removes
    them all. ``rate_mbit``: each host's egress rate (None: unshaped);
    ``delay_ms``: its one-way delay (needs netem)."""

    def __init__(self, rate_mbit: float | None = None, delay_ms: float = 0.0):
        why = unsupported(rate_mbit, delay_ms)
        if why is not None:
            raise RuntimeError(why)
        remove_stale()
        pid = os.getpid()
        self.rate_mbit, self.delay_ms = rate_mbit, delay_ms
        self.prefix = f"{NET}.{pid % 250}"
        self.bridge = f"pjb{pid}"
        self.gateway = f"{self.prefix}.1"
        self.netns: list[str] = []
        self.veths: list[str] = []
        _must("ip", "link", "add", self.bridge, "type", "bridge")
        try:
            _must("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _must("ip", "link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    def attach(self, host) -> str:
        """Give ``host`` a namespace on the LAN: sets ``host.netns`` and ``host.ip``
        (what its servers bind to), returns the IP."""
        i = len(self.netns)
        if i >= 250:
            raise ValueError("at most 250 hosts on one emulated LAN")
        ns = f"pj-{os.getpid()}-{host.name}"
        veth = f"pjv{os.getpid()}-{i}"[:15]
        ip = f"{self.prefix}.{i + 2}"
        _must("ip", "netns", "add", ns)
        self.netns.append(ns)
        _must("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        self.veths.append(veth)
        _must("ip", "link", "set", veth, "master", self.bridge)
        _must("ip", "link", "set", veth, "up")
        _must("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _must("ip", "-n", ns, "link", "set", "eth0", "up")
        _must("ip", "-n", ns, "link", "set", "lo", "up")
        q = _qdisc(self.rate_mbit, self.delay_ms)
        if q:
            _must("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", *q)
        host.netns, host.ip = ns, ip
        return ip

    def sent_bytes(self) -> int:
        """Bytes all hosts sent so far (their veths' receive counters in the root
        namespace: each byte once, Ethernet headers included)."""
        total = 0
        for v in self.veths:
            with open(f"/sys/class/net/{v}/statistics/rx_bytes") as f:
                total += int(f.read())
        return total

    def close(self) -> None:
        for ns in self.netns:  # the veth pair goes with its namespace end
            _run("ip", "netns", "del", ns)
        self.netns, self.veths = [], []
        _run("ip", "link", "del", self.bridge)

    def __enter__(self) -> Lan:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["Lan", "remove_stale", "unsupported"]
