"""Kernels compiled ahead of time: the one-thread path of an in-process join of int64 or
float64 keys.

``python -m panjoin.jit.build`` (``make aot``, which ``make test`` and ``make demo``
run) compiles each kernel of :data:`EXPORTS` for the argument types listed, with
Numba's ahead-of-time compiler (``numba.pycc``; it needs a C compiler and Python's
headers), into one extension module beside this file, ``_ahead*.so``, whose functions
let go of the GIL as the kernels' ``nogil`` dispatchers do (two shards join side by
side). ``_ahead.json`` records what the build was made from (:func:`stamp`: the
kernels' sources, Python's and NumPy's versions, the CPU it was compiled for: the
host's, as the JIT compiles); a build that no longer
matches is not used (a warning says to run ``make aot``), since it would run old code.

:func:`entry` hands :class:`panjoin.jit.Kernel` the compiled functions, each with a guard
that admits exactly its argument types (numpy arrays of the dtype, dimensions and
layout, C-contiguous, aligned and writable; ``int`` or ``np.int64``; ``bool`` or
``np.bool_``); any other call goes to Numba. The signature ``"i8[::1], i8, b1"``
admits ``(np.zeros(3, np.int64), 2, True)``; a float64 array, a strided view or a
read-only array does not (a read-only one where :data:`READ_ONLY` says the kernel only
reads it does):

    >>> import numpy as np
    >>> ok = guard("i8[::1], i8, b1")
    >>> ok((np.zeros(3, np.int64), 2, True)), ok((np.zeros(3), 2, True))
    (True, False)
    >>> ok((np.zeros(6, np.int64)[::2], 2, True)), ok((np.zeros(3, np.int64), 2))
    (False, False)

Loading the module takes under a millisecond; Numba's import and its first cached
kernel took 0.2-0.25 s of a 2M-tuple replay's 0.7 s.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys

log = logging.getLogger("panjoin.jit")

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.dirname(HERE)
MODULE = "_ahead"
STAMP_FILE = os.path.join(HERE, MODULE + ".json")

# the argument types a file join calls each kernel with (BI-Sort, the manager's steps
# 1-2, the shards' router): what ``replay`` of such a file loaded from Numba's cache
# (equi and band, time and count windows, one engine and shards); ``K`` is the key
# type, built for each of :data:`KEY_TYPES`
EXPORTS = {
    "panjoin.bounds_kernels.float_bounds": "f8[::1], f8, f8, f8[::1], f8[::1]",
    "panjoin.key_sort_kernels.pack_rows": "i8[::1]",
    "panjoin.key_sort_kernels.unpack_rows": "i8[::1], i8, i8, i8[::1], i8[::1]",
    "panjoin.manager.kernels.late_rows": "i8[::1], i8, b1, i8, b1[::1]",
    "panjoin.manager.kernels.split_into":
        "u1[::1], K[::1], i8[::1], i8[::1], i8, i8, K[:, ::1], i8[:, ::1], i8[:, ::1], "
        "i8[:, ::1], i8[:, ::1], i8[::1]",
    "panjoin.manager.kernels.split_keys_into":
        "u1[::1], K[::1], i8, i8, K[:, ::1], i8[:, ::1], i8[:, ::1], i8[::1]",
    "panjoin.sharding_kernels.route_rows": "u1[::1], K[::1], b1[::1], K[::1], K[:, ::1], K[:, ::1]",
    "panjoin.sharding_kernels.route_eq_rows": "u1[::1], K[::1], b1[::1], K[::1]",
    "panjoin.sharding_kernels.gather_offsets":
        "i8[::1], i8[::1], i8[::1], i8[::1], i8, i8, i8, b1, u4[:, ::1]",
    "panjoin.subwindow.kernels.bisort.build_index": "K[::1], i8, i8, K[::1], i8",
    "panjoin.subwindow.kernels.bisort.build_levels": "K[::1], i8, K[::1], i8[::1], K, i8",
    "panjoin.subwindow.kernels.bisort.first_moved": "K[::1], i8, K",
    "panjoin.subwindow.kernels.bisort.merge_back":
        "K[::1], i8[::1], i8[::1], i8, K[::1], i8[::1], i8[::1], i8",
    "panjoin.subwindow.kernels.bisort.probe_pairs":
        "K[::1], i8[::1], i8[::1], i8, K[::1], i8, i8, K[::1], i8[::1], i8, K[::1], i8[::1], "
        "i8[::1], i8, K[:, ::1], K[:, ::1], i8, i8[::1], i8[::1], i8[::1]",
}
#: arguments a kernel only reads, by position: there the guard also admits a read-only
#: array (numpy.frombuffer of a message's bytes: the manager's stream column), which the
#: build's function reads as it would a writable one; elsewhere a read-only array goes
#: to Numba, which refuses a write to it (tests/test_jit_ahead.py has Numba compile each
#: kernel with these arguments typed read-only: one that writes them fails there)
READ_ONLY = {
    "panjoin.bounds_kernels.float_bounds": (0,),
    "panjoin.key_sort_kernels.pack_rows": (0,),
    "panjoin.key_sort_kernels.unpack_rows": (0, 3, 4),
    "panjoin.manager.kernels.late_rows": (0,),
    "panjoin.manager.kernels.split_into": (0, 1, 2, 3),
    "panjoin.manager.kernels.split_keys_into": (0, 1),
    "panjoin.sharding_kernels.route_rows": (0, 1, 2, 3, 4, 5),
    "panjoin.sharding_kernels.route_eq_rows": (0, 1, 2, 3),
    "panjoin.sharding_kernels.gather_offsets": (0, 1, 2, 3),
}
#: the key types a kernel with ``K`` in its arguments is built for (int64 first: a
#: call's guards are tried in this order)
KEY_TYPES = ("i8", "f8")


def specs(qualname: str) -> list[str]:
    """The argument types the build compiles a kernel for, one signature each."""
    template = EXPORTS[qualname]
    return [template.replace("K", t) for t in KEY_TYPES] if "K" in template else [template]


#: sources whose change makes a build stale: the kernels', the helpers they inline,
#: this list and the build (not panjoin/config.py: of it the kernels take only NJIT's
#: caching and GIL options, which a build does not use)
SOURCES = ("panjoin/jit/ahead.py", "panjoin/jit/build.py", "panjoin/bounds_kernels.py",
           "panjoin/manager/kernels.py", "panjoin/key_sort_kernels.py",
           "panjoin/sharding_kernels.py", "panjoin/subwindow/kernels")

_DTYPES = {"i8": "int64", "u1": "uint8", "b1": "bool", "f8": "float64", "u4": "uint32"}
_SCALARS = {"i8": "INT", "u1": "INT", "b1": "BOOL", "f8": "FLOAT"}


def _args(spec: str) -> list[str]:
    """``"i8[:, ::1], i8"`` -> ``["i8[:, ::1]", "i8"]`` (commas inside brackets kept)."""
    out, depth, cur = [], 0, ""
    for ch in spec:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()] if cur.strip() else out


def guard(spec: str, read_only: tuple[int, ...] = ()):
    """A function of an argument tuple: True where the build's function for ``spec``
    may run it (see the module's docstring); at the positions ``read_only`` an array may
    also be read-only (:data:`READ_ONLY`).

        >>> import numpy as np
        >>> ro = np.frombuffer(bytes(8), np.int64)
        >>> guard("i8[::1]")((ro,)), guard("i8[::1]", (0,))((ro,))
        (False, True)
    """
    import numpy as np

    env = {"nd": np.ndarray, "INT": (int, np.int64), "BOOL": (bool, np.bool_),
           "FLOAT": (float, np.float64)}
    conds = []
    for i, tok in enumerate(_args(spec)):
        if "[" in tok:
            dt, dims = tok.split("[", 1)
            env[f"d{i}"] = np.dtype(_DTYPES[dt])
            # carray: C-contiguous, aligned and writable; behaved: aligned and writable
            flags = (f"a[{i}].flags.c_contiguous and a[{i}].flags.aligned" if i in read_only
                     else f"a[{i}].flags.carray")
            conds.append(f"type(a[{i}]) is nd and a[{i}].ndim == {dims.count(',') + 1} and "
                         f"(a[{i}].dtype is d{i} or a[{i}].dtype == d{i}) and {flags}")
        else:
            conds.append(f"type(a[{i}]) in {_SCALARS[tok]}")
    src = f"def guard(a):\n    return len(a) == {len(conds)} and " + " and ".join(conds)
    exec(compile(src, f"<guard {spec}>", "exec"), env)
    return env["guard"]


def symbol(qualname: str, i: int = 0) -> str:
    """The compiled module's name for a kernel's ``i``-th signature: its dotted name
    with ``__`` for dots, and the signature's number."""
    return f"{qualname.replace('.', '__')}__{i}"


def _source_files() -> list[str]:
    files = []
    for rel in SOURCES:
        path = os.path.join(os.path.dirname(PACKAGE), rel)
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".py")]
        else:
            files.append(path)
    return files


def stamp() -> dict:
    """What a build is made from: a hash of :data:`SOURCES`, Python's and NumPy's
    versions (the module's ABI; it does not need Numba to run), the CPU."""
    import numpy as np

    h = hashlib.sha256()
    root = os.path.dirname(PACKAGE)
    for path in _source_files():
        h.update(os.path.relpath(path, root).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read())
    return {"sources": h.hexdigest(), "python": sys.version.split()[0],
            "numpy": np.__version__, "cpu": _cpu()}


def _cpu() -> str:
    """This CPU's model and instruction set (the build is compiled for the host's, as
    the JIT is): a hash of the first processor's model and flags in /proc/cpuinfo."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            first = f.read().split("\n\n", 1)[0]
    except OSError:
        first = platform.processor()
    keep = [ln for ln in first.splitlines()
            if ln.split(":")[0].strip() in ("vendor_id", "model name", "flags", "Features")]
    return platform.machine() + "-" + hashlib.sha256("\n".join(keep).encode()).hexdigest()[:16]


_UNSET = object()
_LOADED = _UNSET


def module():
    """The build's extension module, or None: not built, stale, or ``PANJOIN_AOT=0``."""
    global _LOADED
    if _LOADED is not _UNSET:
        return _LOADED
    _LOADED = None
    if os.environ.get("PANJOIN_AOT", "1") == "0":
        return None
    try:
        with open(STAMP_FILE) as f:
            built = json.load(f)
    except (OSError, ValueError):
        return None  # never built here: Numba runs every kernel
    now = stamp()
    if built != now:
        changed = ", ".join(k for k in now if built.get(k) != now[k])
        log.warning("the ahead-of-time kernels were built from other %s: Numba runs every "
                    "kernel (run `make aot` to rebuild them)", changed)
        return None
    import importlib

    try:
        _LOADED = importlib.import_module(f"panjoin.jit.{MODULE}")
    except ImportError as e:
        log.warning("the ahead-of-time kernels do not load (%s): Numba runs every kernel "
                    "(run `make aot` to rebuild them)", e)
    return _LOADED


def entry(module_name: str, name: str):
    """``[(guard, compiled function)]`` for a kernel the build has, one a signature;
    else None."""
    qual = f"{module_name}.{name}"
    if qual not in EXPORTS:
        return None
    mod = module()
    if mod is None:
        return None
    found = [(guard(spec, READ_ONLY.get(qual, ())), getattr(mod, symbol(qual, i), None))
             for i, spec in enumerate(specs(qual))]
    return [f for f in found if f[1] is not None] or None
