"""Where a command's wall time goes: named phases, printed as one line.

Each phase is timed with ``perf_counter``; the time Numba spends compiling or
loading kernels from its disk cache (the ``numba:compiler_lock`` event, held for
both) on the thread that made the :class:`Phases` is taken out of whichever phase
paid it and shown as ``load kernels``.
``other`` is the rest of the process's life so far (interpreter start, imports,
argument checks), from the process's start time in ``/proc``:

    >>> ph = Phases()
    >>> with ph:
    ...     with ph.phase("read"):
    ...         pass
    ...     ph.add("join", 1.9)
    >>> ph.line().startswith("wall ")
    True

A real line: ``wall 3.10 s: read 0.35, validate 0.05, load kernels 0.20, join 1.73,
write 0.60, other 0.17``.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from contextlib import contextmanager

#: printed in this order; phases not in it follow in the order they ran
ORDER = ("read", "validate", "start workers", "load kernels", "join", "write")


class Phases:
    """Seconds per named phase; a context manager that listens to Numba's compiler lock."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self._listener = None

    def __enter__(self) -> Phases:
        from panjoin import jit

        self._thread = threading.get_ident()
        jit.on_numba(self._listen)  # no Numba loaded: the kernels ahead of time load none
        return self

    def _listen(self, numba) -> None:
        from numba.core import event

        self._listener = _ThreadTimer(event.Listener)(self._thread)
        event.register("numba:compiler_lock", self._listener)

    def __exit__(self, *exc) -> None:
        from panjoin import jit

        jit.forget_on_numba(self._listen)
        if self._listener is not None:
            from numba.core import event

            event.unregister("numba:compiler_lock", self._listener)

    def _kernel_s(self) -> float:
        lis = self._listener
        return lis.duration if lis is not None else 0.0

    @contextmanager
    def phase(self, name: str):
        k0, t0 = self._kernel_s(), time.perf_counter()
        try:
            yield
        finally:
            dk = self._kernel_s() - k0
            self.seconds[name] += time.perf_counter() - t0 - dk
            if dk:
                self.seconds["load kernels"] += dk

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds

    def move(self, src: str, dst: str, seconds: float) -> None:
        """Count ``seconds`` of phase ``src`` as ``dst`` (a split measured inside it)."""
        if seconds:
            self.seconds[src] -= seconds
            self.seconds[dst] += seconds

    def line(self, note: str = "") -> str:
        names = [n for n in ORDER if n in self.seconds] + \
                [n for n in self.seconds if n not in ORDER]
        total = sum(self.seconds.values())
        wall = process_age_s()
        parts = [f"{n} {self.seconds[n]:.2f}" for n in names]
        if wall is not None and wall > total:
            parts.append(f"other {wall - total:.2f}")
        else:
            wall = total
        return f"wall {wall:.2f} s: " + ", ".join(parts) + (f" ({note})" if note else "")


def _ThreadTimer(base):
    """A Numba event listener (``base``: ``numba.core.event.Listener``, imported late)
    that adds up the time the events of one thread last (the :class:`Phases`' thread):
    kernels loaded on another thread (replay's loader, while this one reads the file)
    are not taken out of this thread's phases."""

    class ThreadTimer(base):
        def __init__(self, thread: int):
            self.thread = thread
            self.duration = 0.0
            self._depth = 0
            self._t0 = 0.0

        def on_start(self, event):
            if threading.get_ident() == self.thread:
                if self._depth == 0:
                    self._t0 = time.perf_counter()
                self._depth += 1

        def on_end(self, event):
            if threading.get_ident() == self.thread:
                self._depth -= 1
                if self._depth == 0:
                    self.duration += time.perf_counter() - self._t0

    return ThreadTimer


def process_age_s() -> float | None:
    """Seconds since this process started (Linux ``/proc``, 10 ms ticks), else None."""
    try:
        with open("/proc/self/stat") as f:
            # the command name may hold spaces: fields count from after its ')'
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None
