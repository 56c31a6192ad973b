"""numba building blocks shared by the quantized kernels. Importing this module imports numba.

The format modules never import it themselves: their kernel bodies name ``_common.f16`` and
friends, which ``_common`` loads from here when numba first compiles one of them.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_OPTS = dict(cache=True, nogil=True, fastmath=True)


@intrinsic
def prefetch(typingctx, arr, i, j, k):
    """Prefetch the cache line holding arr[i, j, k] (no bounds: a prefetch never faults)."""
    sig = types.void(arr, i, j, k)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        strides = cgutils.unpack_tuple(builder, ary.strides, aryty.ndim)
        off = builder.add(
            builder.add(builder.mul(args[1], strides[0]), builder.mul(args[2], strides[1])),
            builder.mul(args[3], strides[2]),
        )
        i8p = ir.IntType(8).as_pointer()
        ptr = builder.inttoptr(builder.add(builder.ptrtoint(ary.data, off.type), off), i8p)
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])  # read, keep in all levels, data
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always", **_OPTS)
def f16(lut, lo, hi):
    """The fp16 value of the little-endian bytes (lo, hi), through the 65536-entry table."""
    return lut[np.int64(lo) | (np.int64(hi) << 8)]


@njit(inline="always", **_OPTS)
def scale_min_k4(w, n, b, j):
    """Six-bit scale and min number j of a Q4_K/Q5_K block (ggml get_scale_min_k4)."""
    if j < 4:
        return np.int64(w[n, b, 4 + j] & 63), np.int64(w[n, b, 8 + j] & 63)
    sc = np.int64(w[n, b, 8 + j] & 15) | (np.int64(w[n, b, j] >> 6) << 4)
    mn = np.int64(w[n, b, 8 + j] >> 4) | (np.int64(w[n, b, 4 + j] >> 6) << 4)
    return sc, mn
