"""Low-level pieces the index kernels share: int64 bounds, typed key helpers, prefetch.

One home for what RaP-Table, WiB+-Tree and their Python classes used to define each on
their own:

- ``I64_MIN``, ``I64_MAX``: the int64 key range (RaP-Table's s_0 and empty-histogram
  sentinels, WiB+-Tree's key successor, the symmetric hash join's pruning bounds);
- :func:`lowest` and :func:`key_after`, Numba-only functions that pick the int64 or the
  float64 variant of the few lines that differ between key types (a kernel is
  specialised per key dtype);
- :func:`prefetch_read` / :func:`prefetch_write`: ``llvm.prefetch`` of one array
  element, a hint that lets a kernel keep several cache misses in flight (RaP-Table
  prefetches the partition a probe reaches next, WiB+-Tree the leaves its lookahead
  finds). They never change a result.

Example (inside a kernel): ``lowest(keys)`` is I64_MIN for int64 keys and -inf for
float64 ones; ``key_after(7)`` is ``(True, 8)``, ``key_after(I64_MAX)`` is
``(False, I64_MAX)``, ``key_after(1.0)`` is ``(True, 1.0000000000000002)``.
"""

import numpy as np

from panjoin.jit import later

I64_MIN = int(np.iinfo(np.int64).min)
I64_MAX = int(np.iinfo(np.int64).max)


# --------------------------------------------------------------------------- typed keys


def lowest(arr):
    """Smallest value of arr's dtype (I64_MIN or -inf); inside Numba kernels only."""
    raise NotImplementedError("lowest runs inside Numba kernels only")


def key_after(x):
    """(True, smallest key > x) or (False, x) when x is the largest key of its type;
    inside Numba kernels only."""
    raise NotImplementedError("key_after runs inside Numba kernels only")


@later  # Numba's typing of the two, registered when Numba loads (panjoin.jit)
def _typed_keys():
    from numba import types
    from numba.extending import overload

    @overload(lowest)
    def _lowest_impl(arr):
        if isinstance(arr.dtype, types.Integer):
            return lambda arr: I64_MIN
        return lambda arr: -np.inf

    @overload(key_after)
    def _key_after_impl(x):
        if isinstance(x, types.Float):
            def impl(x):
                y = np.nextafter(x, np.inf)
                return y < np.inf, y  # keys are finite: nothing can follow the largest double
            return impl

        def impl_int(x):
            if x == I64_MAX:
                return False, x
            return True, x + 1
        return impl_int


# --------------------------------------------------------------------------- prefetch


def _prefetch_intrinsic(rw):
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    def prefetch(typingctx, arr, idx):
        sig = types.void(arr, idx)

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]],
                                           wraparound=False)
            i8p = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
            # (address, read 0 / write 1, high temporal locality, data cache)
            builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, rw),
                              ir.Constant(i32, 3), ir.Constant(i32, 1)])
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(prefetch)


#: ``prefetch_read(arr, i)``: ask for the cache line of 1-d ``arr[i]`` (a hint only)
prefetch_read = later(lambda: _prefetch_intrinsic(0))
#: ``prefetch_write(arr, i)``: the same, for a line about to be written
prefetch_write = later(lambda: _prefetch_intrinsic(1))
