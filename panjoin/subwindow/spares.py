"""Spare arrays for new subwindows, cleared off the batch's path.

A subwindow's index allocates its arrays when the subwindow is created, and a hash
table's slots must start zeroed. Either the allocator hands out fresh pages (the kernel
zeroes each on its first touch: the random inserts of the next batches fault in
thousands of pages, or stall on a transparent huge page's compaction, 40-80 ms
measured here) or memory it had already (then ``calloc`` clears all of it inside the
create: 6-8 ms for the 16 MB of slots of a 512K-row table, in the engine at 1M
tuples/s). Either way the batch that creates a subwindow, or the few after it, stall,
and at 1M tuples/s with a 5 ms bound those stalls were the p99.

So an expired subwindow gives its arrays back (:meth:`Spares.give_all`), a background
thread clears them (numpy's fill releases the GIL: the batches go on meanwhile) and
keeps them for the next subwindow of the same shape (:meth:`Spares.zeros`,
:meth:`Spares.empty`). A window creates subwindows about as often as they expire, so
in steady state each new one reuses memory that is mapped and cleared already. When
none is ready the array is allocated as before; a caller may ask for spares of the
shape to be prepared ahead (a hash table, the small-batch index, asks for two: the
window's first fill, and both streams' subwindows filling at once). What is kept is
bounded: at most :data:`KEEP` arrays of a shape, none larger than :data:`MAX_BYTES`
(a large subwindow's batches are large too, and its create is a small share of them),
and spares not taken for :data:`IDLE_S` seconds are freed.

    >>> sp = Spares()
    >>> a = sp.zeros(1 << 16, np.int64); a[5] = 7; where = a.ctypes.data
    >>> arrays = [a]; del a
    >>> sp.give_all(arrays); sp.drain()
    >>> b = sp.zeros(1 << 16, np.int64)
    >>> b.ctypes.data == where, int(b[5])
    (True, 0)
    >>> view = b[:10]; sp.give_all([b])      # a view still holds it: not kept
    >>> sp.stats["given"], sp.stats["in use"]
    (1, 1)
    >>> sp.close()
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
import time

import numpy as np

#: spares kept per (length, dtype): a subwindow of each stream may need two of a shape
#: (a hash table's keys and its store's ids)
KEEP = 4
#: larger arrays are neither kept nor prepared
MAX_BYTES = 64 << 20
#: spares not taken for this long are freed
IDLE_S = 10.0
#: the nice value of the thread that clears and maps spares
NICE = 19


class Spares:
    """A pool of cleared arrays by shape, filled by a background thread; see the module
    docstring. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        # by (length, dtype): cleared arrays with when they became ready; arrays queued
        self._ready: dict[tuple, list[tuple[float, np.ndarray]]] = {}
        self._coming: dict[tuple, int] = {}
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self.stats = {"taken": 0, "allocated": 0, "given": 0, "dropped": 0, "in use": 0}

    def zeros(self, n: int, dtype, ahead: int = 0) -> np.ndarray:
        """An array of ``n`` zeros: a spare if one is ready, else a new one; then up to
        ``ahead`` spares of its shape are prepared for the next subwindows."""
        return self._take(int(n), np.dtype(dtype), True, ahead)

    def empty(self, n: int, dtype, ahead: int = 0) -> np.ndarray:
        """An array of ``n`` elements, contents undefined (its pages mapped if a spare);
        ``ahead`` as for :meth:`zeros`."""
        return self._take(int(n), np.dtype(dtype), False, ahead)

    def give_all(self, arrays: list[np.ndarray]) -> None:
        """Arrays of an expired subwindow (the list empties): each one that nothing else
        refers to (no view of it either) is kept, cleared in the background, for the next
        subwindow of its shape; the rest are let go."""
        while arrays:
            arr = arrays.pop()
            # 2: ``arr`` here and getrefcount's argument; a view or a holder adds one
            if sys.getrefcount(arr) > 2:
                self.stats["in use"] += 1
                continue
            self._give(arr)
            del arr

    def _give(self, arr: np.ndarray) -> None:
        key = (arr.shape[0], arr.dtype)
        if arr.ndim != 1 or arr.base is not None or arr.nbytes > MAX_BYTES:
            return
        with self._lock:
            self._evict(time.monotonic())
            if self._held(key) >= KEEP:
                self.stats["dropped"] += 1
                return
            self._coming[key] = self._coming.get(key, 0) + 1
            self.stats["given"] += 1
        self._submit(arr)

    def drain(self) -> None:
        """Wait until the background thread has done what was asked of it (tests)."""
        self._jobs.join()

    def close(self) -> None:
        """Free every spare and stop the thread."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
        with self._lock:
            self._ready.clear()
            self._coming.clear()

    # ------------------------------------------------------------------ internals

    def _held(self, key) -> int:
        return len(self._ready.get(key, ())) + self._coming.get(key, 0)

    def _take(self, n: int, dtype: np.dtype, zeroed: bool, ahead: int) -> np.ndarray:
        now = time.monotonic()
        key = (n, dtype)
        out = None
        with self._lock:
            self._evict(now)
            got = self._ready.get(key)  # every spare is cleared: it serves "empty" too
            if got:
                self.stats["taken"] += 1
                out = got.pop()[1]
            else:
                self.stats["allocated"] += 1
            more = 0
            if n * dtype.itemsize <= MAX_BYTES:
                more = max(0, min(ahead, KEEP) - self._held(key))
                if more:
                    self._coming[key] = self._coming.get(key, 0) + more
        if out is None:
            out = np.zeros(n, dtype) if zeroed else np.empty(n, dtype)
        for _ in range(more):  # the next subwindows of this shape find them ready
            self._submit(np.empty(n, dtype))
        return out

    def _evict(self, now: float) -> None:
        for key in list(self._ready):
            kept = [(t, a) for t, a in self._ready[key] if now - t < IDLE_S]
            if kept:
                self._ready[key] = kept
            else:
                del self._ready[key]

    def _submit(self, arr: np.ndarray) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="panjoin-spares",
                                                    daemon=True)
                    self._thread.start()
        self._jobs.put(arr)

    def _run(self) -> None:
        # background work: the memsets (36 MB for a 512K-row hash table) run where the
        # batches leave a core idle, not in their time slices (Linux: a thread's nice)
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        while True:
            try:
                arr = self._jobs.get(timeout=IDLE_S)
            except queue.Empty:  # nothing asked for a while: free what nobody took
                with self._lock:
                    self._evict(time.monotonic())
                continue
            try:
                if arr is None:
                    return
                arr.fill(0)  # releases the GIL; maps every page of a new array too
                key = (arr.shape[0], arr.dtype)
                with self._lock:
                    if self._coming.get(key, 0):
                        self._coming[key] -= 1
                    self._ready.setdefault(key, []).append((time.monotonic(), arr))
            finally:
                self._jobs.task_done()


#: the process's spares (subwindow indexes take and give through it)
SPARES = Spares()
