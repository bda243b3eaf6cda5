"""Kernels that run without loading Numba where an ahead-of-time build has them.

Every kernel is written once, as a Numba function, decorated with this package's
:func:`njit` instead of Numba's. A call of the kernel then runs:

1. the ahead-of-time build's machine code (:mod:`panjoin.jit.ahead`, ``make aot``),
   where the build compiled the kernel for exactly these argument types (the int64 or
   float64 keys in C-contiguous, writable arrays of an in-process join's one-thread
   path): a guard
   compares the arguments with the build's signature, and Numba is never imported;
2. otherwise Numba's JIT dispatcher, made for every kernel of the process at once the
   first time one is needed (:func:`numba`): compiled, or loaded from Numba's disk
   cache, as ``numba.njit`` always did.

Why: a ``panjoin replay`` of a 2M-tuple file spent a third of its 0.7 s importing
Numba (0.1 s) and setting up its CPU target at the first cached kernel (0.12 s), all of
it holding the GIL beside the file's read. The build covers what a BI-Sort file join
of int64 or float64 keys calls; anything else (strided or read-only arrays, parallel
kernels, an index the build left out) loads Numba and runs as before, with the same
results.

Until Numba is loaded a kernel module holds :class:`Kernel` objects, ``prange`` is
Python's ``range``, and Numba-only helpers (overloads, intrinsics) wait in
:func:`later`; loading Numba turns each module's kernels into dispatchers, its
``prange`` into Numba's and its helpers into Numba's objects, in place, so that kernels
calling kernels compile as they did. Two kinds stay :class:`Kernel` objects, which
Numba then types as their dispatchers: the build's (a caller in Python keeps the
compiled version: Numba loaded for some other kernel does not make it load these),
and parallel kernels (each call sets the calling thread's kernel threads,
:func:`set_threads`, Numba's setting being per thread). Example::

    from panjoin.jit import njit, prange

    @njit(cache=True, nogil=True)
    def total(a):
        s = 0
        for i in range(a.shape[0]):
            s += a[i]
        return s

``total(np.arange(4))`` is 6 either way; ``total.py_func`` is the Python function, and
any other attribute (``signatures``, ``overloads``) is the dispatcher's, which loads
Numba. ``PANJOIN_AOT=0`` turns the build off for a process.
"""

from __future__ import annotations

import sys
import threading

#: the stand-in for ``numba.prange`` until Numba loads (a kernel run as Python: a range)
prange = range

_LOCK = threading.RLock()
_KERNELS: list[Kernel] = []
_LATER: list[Later] = []
_ON_LOAD: list = []  # callables of (numba module), run once Numba is loaded
_MODULES: set[str] = set()  # modules whose globals hold kernels, ``prange`` or helpers
_NUMBA = None
_LOCAL = threading.local()  # a thread's kernel thread count (``set_threads``)


def njit(*args, **opts):
    """``numba.njit``'s decorator with its options (``@njit(**NJIT)``), for a kernel
    that runs ahead-of-time compiled where it can (a :class:`Kernel`); once Numba is
    loaded, Numba's own dispatcher for a kernel that is neither in the build nor
    parallel."""
    if args and callable(args[0]):
        return njit(**opts)(args[0])

    def wrap(fn):
        kernel = Kernel(fn, opts)
        if _NUMBA is not None and kernel._ahead is None and not kernel.parallel:
            return kernel.dispatcher()  # a module imported after Numba loaded
        return kernel

    return wrap


class Kernel:
    """A kernel before Numba is loaded: the ahead-of-time version for the build's
    argument types, else the JIT dispatcher (which loads Numba)."""

    def __init__(self, fn, opts):
        self.py_func = fn
        self.opts = opts
        self.parallel = bool(opts.get("parallel"))
        self._disp = None
        from panjoin.jit import ahead

        self._ahead = ahead.entry(fn.__module__, fn.__name__)  # [(guard, compiled)] or None
        self.__name__ = fn.__name__
        self.__qualname__ = fn.__qualname__
        self.__module__ = fn.__module__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        with _LOCK:
            _KERNELS.append(self)
            _MODULES.add(fn.__module__)
            if _NUMBA is not None:
                self._disp = _NUMBA.njit(**opts)(fn)

    def __call__(self, *args, **kwargs):
        if self._ahead is not None and not kwargs:
            for ok, compiled in self._ahead:
                if ok(args):
                    return compiled(*args)
        disp = self._disp or self.dispatcher()
        if self.parallel:
            _apply_threads(_NUMBA)
        return disp(*args, **kwargs)

    def dispatcher(self):
        """Numba's dispatcher of this kernel (loads Numba, once for every kernel)."""
        if self._disp is None:
            nb = numba()
            with _LOCK:  # made while another thread loaded Numba: missed by the round
                if self._disp is None:
                    _to_numba(sys.modules.get(self.__module__), nb)
                    self._disp = nb.njit(**self.opts)(self.py_func)
        return self._disp

    def __reduce__(self):  # pickled by name, as a function is
        return _by_name, (self.__module__, self.__name__)

    def __getattr__(self, name):  # signatures, overloads, compile, ...: the dispatcher's
        if name.startswith("__") or name in ("_disp", "_ahead", "py_func", "opts"):
            raise AttributeError(name)
        return getattr(self.dispatcher(), name)

    def __repr__(self) -> str:
        return f"<Kernel {self.__module__}.{self.__qualname__}>"


class Later:
    """A Numba-only helper (an ``@intrinsic``, an ``@overload``'s registration) made
    when Numba loads: ``make()`` is called then, and the module global that held this
    stand-in holds its result."""

    def __init__(self, make, module: str):
        self.make = make
        self.value = None
        with _LOCK:
            _LATER.append(self)
            _MODULES.add(module)

    def __call__(self, *args, **kwargs):
        raise NotImplementedError("a Numba helper: it runs inside kernels only")


def later(make):
    """Decorate a function that builds a Numba-only helper (it imports Numba inside);
    its result replaces the stand-in once Numba loads (see :class:`Later`); with Numba
    loaded, the result itself."""
    if _NUMBA is not None:
        return make()
    return Later(make, make.__module__)


def on_numba(callback) -> None:
    """Call ``callback(numba)`` once Numba is loaded (now, if it is)."""
    with _LOCK:
        if _NUMBA is None:
            _ON_LOAD.append(callback)
            return
    callback(_NUMBA)


def forget_on_numba(callback) -> None:
    """Drop a callback :func:`on_numba` still holds (Numba never loaded)."""
    with _LOCK:
        if callback in _ON_LOAD:
            _ON_LOAD.remove(callback)


def loaded() -> bool:
    """Numba is loaded in this process."""
    return _NUMBA is not None


def numba():
    """The ``numba`` module, loaded once; every kernel made so far gets its dispatcher,
    and every module of kernels its Numba objects, before any of them compiles."""
    global _NUMBA, prange
    if _NUMBA is not None:
        return _NUMBA
    with _LOCK:
        if _NUMBA is not None:
            return _NUMBA
        import numba as nb
        from numba.core import types
        from numba.extending import typeof_impl

        @typeof_impl.register(Kernel)
        def _typeof_kernel(val, c):  # a kernel calling one: as its dispatcher
            return types.Dispatcher(val.dispatcher())

        for item in _LATER:
            item.value = item.make()
        for k in _KERNELS:
            k._disp = nb.njit(**k.opts)(k.py_func)
        for name in _MODULES:
            _to_numba(sys.modules.get(name), nb)
        prange = nb.prange  # for the modules imported from now on
        _NUMBA = nb
        _apply_threads(nb)
        callbacks, _ON_LOAD[:] = list(_ON_LOAD), []
    for cb in callbacks:
        cb(nb)
    return nb


def _to_numba(mod, nb) -> None:
    """A kernel module's globals as Numba compiles them (see the module's docstring)."""
    if mod is None:
        return
    glob = vars(mod)
    for key, val in list(glob.items()):
        if isinstance(val, Kernel):
            if val._ahead is None and not val.parallel and val._disp is not None:
                glob[key] = val._disp
        elif isinstance(val, Later):
            if val.value is not None:
                glob[key] = val.value
        elif val is range and key == "prange":
            glob[key] = nb.prange


def _by_name(module: str, name: str):
    import importlib

    return getattr(importlib.import_module(module), name)


def set_threads(n: int) -> None:
    """The kernel threads this thread's parallel kernels use (``numba.set_num_threads``,
    a per-thread setting); kept until Numba loads, when it would start Numba's pool."""
    _LOCAL.threads = int(n)
    if _NUMBA is not None:
        _apply_threads(_NUMBA)


def _apply_threads(nb) -> None:
    n = getattr(_LOCAL, "threads", None)
    if n is not None:
        n = min(n, nb.config.NUMBA_NUM_THREADS)
        if nb.get_num_threads() != n:
            nb.set_num_threads(n)
