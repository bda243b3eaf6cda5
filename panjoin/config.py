"""One place for Numba options and the paper's tunables.

Every kernel module imports ``NJIT`` / ``NJIT_PAR`` from here, so switching caching,
``fastmath`` or threading for the whole project is a one-line change.
"""

import os

#: options for single-threaded kernels: compiled once, cached on disk, GIL released
NJIT = dict(cache=True, nogil=True)
#: options for the multi-threaded drivers (``prange`` over chunks of the probe batch)
NJIT_PAR = dict(cache=True, nogil=True, parallel=True)

#: the subwindow indexes, by the names every command, option and message uses
#: (:func:`panjoin.subwindow.make_index` builds them; this list imports nothing heavy,
#: so the CLI's parser has it without loading Numba)
INDEX_KINDS = ("rap", "wib", "bisort", "hash", "nested", "sortedlist", "bisort-opencl")
#: what a join may name: an index, or ``auto`` (the engine picks one per subwindow,
#: :mod:`panjoin.manager.index_choice`), the default
INDEX_CHOICES = ("auto", *INDEX_KINDS)
DEFAULT_INDEX = "auto"

#: default partition count P (paper: 64K for NSub = 8M)
DEFAULT_PARTITIONS = 1024
#: default subwindow size NSub in tuples
DEFAULT_SUBWINDOW = 1 << 16
#: default batch size NBat
DEFAULT_BATCH = 1 << 15
#: LLAT slack sigma: an entry holds (NSub / P) * sigma tuples (paper suggests 1.10-1.25)
LLAT_SIGMA = 1.25
#: BI-Sort insertion buffer size B (paper: 1K): the smallest default, see bisort_buffer
BISORT_BUFFER = 1024
#: the largest default B (see bisort_buffer)
BISORT_BUFFER_MAX = 1 << 14


def bisort_buffer(capacity: int) -> int:
    """The default insertion buffer B of a BI-Sort subwindow of ``capacity`` tuples:
    capacity / 16 within [BISORT_BUFFER, BISORT_BUFFER_MAX] (the OpenCL twin uses the
    same, so both lay out the main array alike).

    A batch of K <= B tuples costs about B / (4K) moves merging into the sorted buffer
    and M / (2B) when the buffer is merged into the M main rows: at NBat 1K into 256K
    rows, B = 1K moves 128 rows a tuple, 16K 9. A larger buffer costs probes little (it
    is sorted, and a full subwindow merges it); its memory is at most 1/16 of the
    main array's. Measured in-process (count:1M, eq, NSub 256K, NBat 1K, one run):
    insert time 6.2 -> 1.9 s, throughput 1.4x."""
    return max(BISORT_BUFFER, min(BISORT_BUFFER_MAX, capacity // 16))
#: WiB+-Tree internal node fan-out (paper: about 64 keys, cache resident)
WIB_FANOUT = 64


def thread_budget() -> tuple[int, str]:
    """The default probe threads and why: PANJOIN_THREADS, else the CPUs this process
    may use (its affinity and cgroup CPU quota, :mod:`panjoin.cpus`)."""
    env = os.environ.get("PANJOIN_THREADS")
    if env:
        n = max(1, int(env))
        return n, f"{n} thread{'s' if n != 1 else ''}: PANJOIN_THREADS={env}"
    from panjoin.cpus import cpu_budget

    b = cpu_budget()
    return b.threads, b.why


def wait_passively() -> None:
    """Numba's OpenMP threads (its ``omp`` threading layer, GNU OpenMP) sleep between
    kernels instead of spinning, for a join with no latency to hold (``panjoin replay``
    of a file without ``--max-latency``): there the next parallel kernel comes
    milliseconds later, and the spinning thread takes the core from the thread with work
    (the pairs writer, another process on a shared host). Measured, the 2M-tuple equi
    replay's engine, 2 threads, beside one busy core: 0.45-1.04 s spinning, 0.32-0.37 s
    passive; the whole replay on a quiet host: 0.89x the CPU, 0.97x the wall. Not for a
    stream with a latency bound: small BI-Sort batches then wait for a sleeping thread
    to wake (``bench latency --index bisort`` at 500K tuples/s: p50 2.4-2.6 ms against
    0.48 ms). Effective only before libgomp loads (it reads the environment once); a
    value the user set is kept."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def default_threads() -> int:
    """Threads to probe with when none are given (see :func:`thread_budget`)."""
    return thread_budget()[0]


_HEAP_FROZEN = False


def freeze_heap() -> None:
    """Take what the process holds by now (modules, Numba's kernels and type system, the
    warm-up's objects) out of the garbage collector's view (``gc.freeze``), once per
    process, for a join that holds a latency bound.

    Python's full collection walks every tracked object; after Numba's import that is
    hundreds of thousands: one full collection took 55-58 ms in the middle of an
    instrumented latency run at 1M tuples/s (``benchmarks/latency_stalls.py``; its p99
    41-45 ms, with the heap frozen 1.4-2.3 ms), and a plain 10 s run made 14 of 16-155 ms
    (3 with the heap frozen, none in its measured part). Frozen objects are still freed
    by reference counting; only cycles among them are never collected. Called by the
    engine under a latency bound and by the worker server as it starts serving."""
    global _HEAP_FROZEN
    if _HEAP_FROZEN:
        return
    _HEAP_FROZEN = True
    import gc

    gc.collect()
    gc.freeze()


class _NumbaWithoutCffi:
    """The import hook of :func:`numba_without_cffi` (a ``sys.meta_path`` finder that
    answers for one module only, once; it stays in the list, since the import system
    is iterating over it when it asks)."""

    MODULE = "numba.core.typing.cffi_utils"

    def __init__(self):
        self.done = False

    def find_spec(self, name, path=None, target=None):
        if name != self.MODULE or self.done:
            return None
        import importlib.util
        import sys

        self.done = True  # once, and never for the lookup below
        if "cffi" in sys.modules:  # the process uses cffi already: Numba may type it
            return None
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            sys.modules["cffi"] = None  # ``import cffi`` fails: Numba's cffi support is off
            try:
                run(module)
            finally:
                if sys.modules.get("cffi", 0) is None:
                    del sys.modules["cffi"]

        spec.loader.exec_module = exec_module
        return spec


def numba_without_cffi() -> None:
    """Spare a ``panjoin`` process Numba's cffi support, which no kernel here uses.

    The first kernel a process compiles or loads from the cache makes Numba's typing
    context import ``numba.core.typing.cffi_utils``, which builds a ``cffi.FFI()``: its C
    declaration parser (pycparser, and the regular expressions of its lexer) costs
    20-60 ms of every command's start (a replay of 2M tuples takes 0.8 s in all). This
    hook lets that one module find no cffi; cffi stays importable for everything else
    (grpc's TLS, a user's code), and where cffi was imported first nothing changes. The
    ``panjoin`` command installs it as it starts (a process of its own); a library
    user's process keeps Numba as it is."""
    import sys

    if not any(isinstance(f, _NumbaWithoutCffi) for f in sys.meta_path):
        sys.meta_path.insert(0, _NumbaWithoutCffi())


_ALLOCATOR_TUNED = False


def tune_allocator() -> None:
    """Keep batch-sized arrays on the heap (glibc only; elsewhere a no-op).

    Every batch makes dozens of short-lived arrays of a few hundred KiB. glibc serves
    those from fresh mmaps, or trims the heap once they are freed, so each one is
    page-faulted and zeroed by the kernel again: a third of the manager's CPU went
    there. A higher mmap threshold and trim threshold let the next batch reuse the
    same pages. Called by the engine and the worker; once per process;
    ``PANJOIN_TUNE_MALLOC=0`` leaves glibc's defaults."""
    global _ALLOCATOR_TUNED
    if _ALLOCATOR_TUNED or os.environ.get("PANJOIN_TUNE_MALLOC") == "0":
        return
    _ALLOCATOR_TUNED = True
    _mallopt(_M_MMAP_THRESHOLD, 16 << 20)
    _mallopt(_M_TRIM_THRESHOLD, 128 << 20)
    _mallopt(_M_TOP_PAD, 16 << 20)


#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -2, -3, -8


_LIBC: list = []  # [the C library's functions by name, or None], once a process


def _libc(name: str):
    """The C library's function ``name`` (typed for :func:`_mallopt`, :func:`_madvise`'s
    and :func:`_program_break`'s calls), or None where there is none. Looked up once,
    among the symbols the process has loaded (libc's among them), not by
    ``ctypes.util.find_library``, which runs ``ldconfig -p`` a call: 25-40 ms of a
    replay's start."""
    if not _LIBC:
        import ctypes

        try:
            lib = ctypes.CDLL(None, use_errno=True)
            fns = {"mallopt": lib.mallopt, "madvise": lib.madvise, "sbrk": lib.sbrk}
        except (OSError, AttributeError):
            fns = None
        else:
            fns["mallopt"].argtypes = [ctypes.c_int, ctypes.c_int]
            fns["madvise"].argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            fns["sbrk"].argtypes = [ctypes.c_ssize_t]
            fns["sbrk"].restype = ctypes.c_void_p
        _LIBC.append(fns)
    return None if _LIBC[0] is None else _LIBC[0].get(name)


def _mallopt(param: int, value: int) -> bool:
    """glibc's ``mallopt(param, value)``: True where it took it (False elsewhere)."""
    f = _libc("mallopt")
    try:
        return f is not None and bool(f(param, value))
    except (OSError, TypeError):
        return False


#: heap a file join's chunk row uses while it is joined (batches, the split's and the
#: sort's outputs, the shards' pieces, subwindows, pairs): the 2M- and 16M-tuple files
#: faulted 120-190 MB in their joins at chunks of 1M rows (eq, count and time windows)
PREFAULT_BYTES_PER_ROW = 160


def prefault_heap(nbytes: int):
    """Fault in about ``nbytes`` of the heap on a thread of its own, held until
    ``release()`` hands them back to the heap for a file join's arrays (glibc; elsewhere,
    or with ``PANJOIN_TUNE_MALLOC=0``, None). A fresh process's join otherwise takes each
    page of its working set from the kernel at first touch: the 2M-tuple eq-time join
    faulted 45K pages (180 MB) in 0.145 s, 0.095 s when run again in the process. Done
    while the process reads its file, on the CPU the read leaves; held until the read's
    own arrays are made, so the join gets them. For the pages to serve every thread,
    the process's threads share one malloc arena (glibc gives each new thread its own:
    a shard thread's arrays would fault in pages of its own), and the heap keeps twice
    ``nbytes`` before it trims."""
    if os.environ.get("PANJOIN_TUNE_MALLOC") == "0" or nbytes <= 0 or not one_malloc_arena():
        return None
    tune_allocator()
    _mallopt(_M_TRIM_THRESHOLD, max(128 << 20, 2 * nbytes))
    return _Prefault(nbytes)


def one_malloc_arena() -> bool:
    """The process's threads share glibc's main malloc arena (True; False elsewhere or
    with ``PANJOIN_TUNE_MALLOC=0``). Effective for the threads that have not yet
    allocated: a ``panjoin replay`` of a file sets it as its process starts
    (:mod:`panjoin.cli.process`), before numpy's and pyarrow's imports start theirs."""
    return os.environ.get("PANJOIN_TUNE_MALLOC") != "0" and _mallopt(_M_ARENA_MAX, 1)


class _Prefault:
    """:func:`prefault_heap`'s thread and its blocks."""

    def __init__(self, nbytes: int):
        import threading

        self.blocks: list = []
        self.thread = threading.Thread(target=self._touch, args=(nbytes,), daemon=True,
                                       name="panjoin-prefault")
        self.thread.start()

    def _touch(self, nbytes: int) -> None:
        import numpy as np

        # blocks of 1 MiB: from the heap (under the mmap threshold), in 4 KiB pages
        # (numpy asks for transparent huge pages from 4 MiB on, which may have the
        # kernel compact memory as it faults them); the kernel faults a block's whole
        # pages in one call (MADV_POPULATE_WRITE, Linux 5.14: 180 MB in 0.11 CPU-s
        # against 0.14 for a fault a page as numpy fills it), else numpy fills it
        # (letting go of the GIL)
        populate = _madvise()
        for _ in range(max(1, nbytes >> 20)):
            b = np.empty(1 << 17)
            a = b.ctypes.data
            lo, hi = (a + _PAGE - 1) & -_PAGE, (a + b.nbytes) & -_PAGE
            if populate is None or populate(lo, hi - lo, _MADV_POPULATE_WRITE) != 0:
                populate = None  # refused (an older kernel): fill this block and the rest
                b.fill(1.0)
            self.blocks.append(b)

    def release(self) -> None:
        """Wait for the thread, and free the blocks into the heap."""
        self.thread.join()
        self.blocks.clear()


#: madvise's MADV_HUGEPAGE and MADV_POPULATE_WRITE (Linux), and the page size they see
_MADV_HUGEPAGE, _MADV_POPULATE_WRITE = 14, 23
_PAGE = 4096


def _madvise():
    """libc's ``madvise(addr, length, advice)`` (it lets go of the GIL), or None."""
    return _libc("madvise")


def advise_heap_hugepages() -> None:
    """Ask for transparent huge pages on the heap as it is now (Linux; else a no-op).

    A library sharing the process may hand the heap's free pages back to the kernel
    (DuckDB calls ``malloc_trim``), after which every batch-sized array the engine
    makes is faulted in again, 4 KiB at a time: measured in the peer benchmark at W =
    256K, 18K faults and 12M tuples/s for the next join, against 600 faults and 19M/s.
    On an advised heap the same trim costs 4K faults (16M/s). numpy advises only
    arrays of 4 MiB and more; the engine's temporaries are smaller. The advice covers
    the heap as far as it reaches at the time of the call (the engine calls it as it
    starts): from its start, found once in ``/proc/self/maps`` (1-2 ms a read in a
    process with Numba's libraries mapped: a worker's warm-up made 47 engines), to the
    program break (``sbrk(0)``), and only when the heap has moved since the last call.
    ``PANJOIN_TUNE_MALLOC=0`` leaves the heap alone too."""
    if os.environ.get("PANJOIN_TUNE_MALLOC") == "0":
        return
    madvise, brk = _madvise(), _program_break()
    if madvise is None or brk is None or brk == _HEAP[1]:
        return
    if not _HEAP[0]:
        try:
            with open("/proc/self/maps") as f:
                heap = [line.split()[0] for line in f if line.rstrip().endswith("[heap]")]
        except OSError:
            return
        if not heap:
            return
        _HEAP[0] = int(heap[0].split("-")[0], 16)
    end = brk & -_PAGE
    if end > _HEAP[0]:
        madvise(_HEAP[0], end - _HEAP[0], _MADV_HUGEPAGE)
    _HEAP[1] = brk


#: the heap's start and the program break it was last advised up to
#: (:func:`advise_heap_hugepages`)
_HEAP = [0, 0]


def _program_break() -> int | None:
    """The heap's end as glibc's ``sbrk(0)`` says it (None where there is none)."""
    f = _libc("sbrk")
    return None if f is None else f(0) or None
