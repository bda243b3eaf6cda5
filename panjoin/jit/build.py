"""``python -m panjoin.jit.build`` (``make aot``): compile the kernels of
:data:`panjoin.jit.ahead.EXPORTS` ahead of time into ``panjoin/jit/_ahead*.so``.

Each kernel is first compiled by Numba's JIT for the listed argument types (which
gives its return type), then exported with that signature to Numba's ahead-of-time
compiler (``numba.pycc``: LLVM, then gcc for the module's C wrapper), whose Python
wrappers are made to let go of the GIL (a ``nogil`` kernel's dispatcher does); the
stamp (:func:`panjoin.jit.ahead.stamp`) is written last, so a failed build leaves the
old module unused. About 15 s on a warm Numba cache.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from panjoin import jit
from panjoin.jit.ahead import EXPORTS, HERE, MODULE, module, specs, stamp, symbol

log = logging.getLogger("panjoin.jit")


def build(out_dir: str = HERE) -> str:
    """Compile :data:`EXPORTS` into ``out_dir`` (the package's own by default) and write
    the stamp beside it; returns the module's path."""
    import importlib

    jit.numba()  # every kernel module's globals Numba's, before pycc compiles them
    import numba.pycc.compiler as pycc_compiler
    from numba.core import sigutils
    from numba.pycc import CC

    stamp_file = os.path.join(out_dir, MODULE + ".json")
    if os.path.exists(stamp_file):
        os.remove(stamp_file)  # a failed build leaves no stamp: the old module is unused
    cc = CC(MODULE)
    cc.output_dir = out_dir
    cc.target_cpu = "host"  # as the JIT compiles (pycc's default, a generic x86-64, made
    # BI-Sort's float64 probe 1.5x slower); the stamp holds the CPU, a build elsewhere
    # is not used
    for qual in EXPORTS:
        mod_name, name = qual.rsplit(".", 1)
        kernel = getattr(importlib.import_module(mod_name), name)
        disp = kernel.dispatcher() if isinstance(kernel, jit.Kernel) else kernel
        for i, spec in enumerate(specs(qual)):
            args, _ = sigutils.normalize_signature(f"({spec},)")
            disp.compile(args)  # the return type, as the JIT types it
            cc.export(symbol(qual, i), disp.overloads[args].signature)(disp.py_func)
            log.info("%s(%s)", qual, spec)

    flags = pycc_compiler.Flags

    class ReleaseGil(flags):  # the exported wrappers let go of the GIL, as nogil kernels do
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.release_gil = True

    pycc_compiler.Flags = ReleaseGil
    try:
        cc.compile()
    finally:
        pycc_compiler.Flags = flags
    with open(stamp_file, "w") as f:
        json.dump(stamp(), f, indent=1)
    return os.path.join(out_dir, cc.output_file)


def main(argv=None) -> int:
    import argparse
    import time

    ap = argparse.ArgumentParser(
        prog="python -m panjoin.jit.build",
        description="Compile the kernels of an in-process BI-Sort join ahead of "
                    "time (needs a C compiler), so that a process runs them without "
                    "loading Numba.")
    ap.add_argument("--out-dir", default=HERE, help="where the module goes (default: the "
                    "package's own, where panjoin looks for it)")
    ap.add_argument("--check", action="store_true",
                    help="only say whether the build here is current (exit 1 if not)")
    args = ap.parse_args(argv)
    if args.check:
        ok = module() is not None
        print("ahead-of-time kernels: " + ("current" if ok else "missing or stale"))
        return 0 if ok else 1
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    t0 = time.perf_counter()
    log.info("compiling %d kernels ahead of time, %d signatures (Numba's pycc and the C "
             "compiler)", len(EXPORTS), sum(len(specs(q)) for q in EXPORTS))
    path = build(args.out_dir)
    print(f"built {path} in {time.perf_counter() - t0:.1f} s")  # (pycc silences logging)
    return 0


if __name__ == "__main__":
    sys.exit(main())
