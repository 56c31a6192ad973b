"""Numba kernels on packed GGUF blocks. Importing this module imports numba: do it lazily.

Every kernel sees the weight as a 3-d uint8 view ``w[row, block, byte]`` of the packed bytes
(never a copy, never the whole matrix decoded) and the input as ``x[block, element]`` float32.

Matrix-vector (``mv_*``): each output row keeps a small vector of float32 partial sums ``t``
(one lane per element position inside a block) and adds ``scale * q * x`` into it block after
block; the horizontal sum happens once per row. That keeps the inner loop a straight
multiply-add over contiguous lanes that LLVM vectorizes, with no per-block horizontal
reduction. Scales are fp16, decoded through a 65536-entry float32 table.

Row dequantization (``dq_*``): decode rows ``[r0, r1)`` into a float32 tile, which
``kernels.matmul_t`` then hands to BLAS for the prefill (M > 1) case.

The loops over rows run in ``prange`` over chunks of rows (``kernels.py`` asks for dynamic
scheduling on big matrices). Numba gives the parallel body ``noalias`` array arguments,
which is what lets LLVM vectorize the inner loops without run-time overlap checks.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

F32 = np.float32
U8 = np.uint8
_OPTS = dict(cache=True, nogil=True, fastmath=True)
PREFETCH_BYTES = 6144  # how far ahead of the read position the weight bytes are prefetched


@intrinsic
def _prefetch(typingctx, arr, i, j, k):
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
def _f16(lut, lo, hi):
    return lut[np.int64(lo) | (np.int64(hi) << 8)]


@njit(inline="always", **_OPTS)
def _scale_min_k4(w, n, b, j):
    """Six-bit scale and min number j of a Q4_K/Q5_K block (ggml get_scale_min_k4)."""
    if j < 4:
        return np.int64(w[n, b, 4 + j] & 63), np.int64(w[n, b, 8 + j] & 63)
    sc = np.int64(w[n, b, 8 + j] & 15) | (np.int64(w[n, b, j] >> 6) << 4)
    mn = np.int64(w[n, b, 8 + j] >> 4) | (np.int64(w[n, b, 4 + j] >> 6) << 4)
    return sc, mn


# ---------------------------------------------------------------- matrix-vector: y = W @ x


@njit(parallel=True, **_OPTS)
def mv_q8_0(w, lut, x, y, chunk):
    """Q8_0 blocks (d:f16, 32 x int8): y[n] = sum_b d * (q . x_b)."""
    n_rows, nb, bs = w.shape
    ahead = (PREFETCH_BYTES + bs - 1) // bs  # blocks
    for c in prange((n_rows + chunk - 1) // chunk):
        t = np.empty(32, np.float32)
        for n in range(c * chunk, min(n_rows, c * chunk + chunk)):
            t[:] = 0
            for b in range(nb):
                _prefetch(w, n, b + ahead, 0)
                d = _f16(lut, w[n, b, 0], w[n, b, 1])
                for j in range(32):
                    q = np.int8(w[n, b, 2 + j])
                    t[j] += d * (F32(q) * x[b, j])
            y[n] = t.sum()


@njit(parallel=True, **_OPTS)
def mv_q4_0(w, lut, x, y, chunk):
    """Q4_0 blocks (d:f16, 16 bytes of nibbles), value d * (q - 8); two rows at a time.

    Byte j holds elements j (low nibble) and j + 16 (high), so lane j accumulates
    d * (lo * x[j] + hi * x[j + 16] - 8 * (x[j] + x[j + 16])); aux[b, j] carries the last term.
    """
    n_rows, nb, bs = w.shape
    ahead = (PREFETCH_BYTES + bs - 1) // bs  # blocks
    aux = np.empty((nb, 16), np.float32)
    for b in range(nb):
        for j in range(16):
            aux[b, j] = F32(-8.0) * (x[b, j] + x[b, 16 + j])
    for c in prange((n_rows + chunk - 1) // chunk):
        t = np.empty(32, np.float32)
        r1 = min(n_rows, c * chunk + chunk)
        for n in range(c * chunk, r1, 2):
            n2 = min(n + 1, r1 - 1)
            t[:] = 0
            for b in range(nb):
                if (b & 1) == 0:
                    _prefetch(w, n, b + ahead, 0)
                    _prefetch(w, n2, b + ahead, 0)
                d = _f16(lut, w[n, b, 0], w[n, b, 1])
                e = _f16(lut, w[n2, b, 0], w[n2, b, 1])
                for j in range(16):
                    v = w[n, b, 2 + j]
                    u = w[n2, b, 2 + j]
                    xa = x[b, j]
                    xb = x[b, 16 + j]
                    o = aux[b, j]
                    t[j] += d * (o + F32(U8(v & 15)) * xa + F32(U8(v >> 4)) * xb)
                    t[16 + j] += e * (o + F32(U8(u & 15)) * xa + F32(U8(u >> 4)) * xb)
            y[n] = t[:16].sum()
            y[n2] = t[16:].sum()


@njit(parallel=True, **_OPTS)
def mv_q4_1(w, lut, x, y, chunk):
    """Q4_1 blocks (d:f16, m:f16, 16 bytes of nibbles), value d * q + m; two rows at a time.

    Lane j accumulates d * (lo * x[j] + hi * x[j + 16]) + m * aux[b, j], aux = x[j] + x[j + 16].
    """
    n_rows, nb, bs = w.shape
    ahead = (PREFETCH_BYTES + bs - 1) // bs  # blocks
    aux = np.empty((nb, 16), np.float32)
    for b in range(nb):
        for j in range(16):
            aux[b, j] = x[b, j] + x[b, 16 + j]
    for c in prange((n_rows + chunk - 1) // chunk):
        t = np.empty(32, np.float32)
        r1 = min(n_rows, c * chunk + chunk)
        for n in range(c * chunk, r1, 2):
            n2 = min(n + 1, r1 - 1)
            t[:] = 0
            for b in range(nb):
                if (b & 1) == 0:
                    _prefetch(w, n, b + ahead, 0)
                    _prefetch(w, n2, b + ahead, 0)
                d = _f16(lut, w[n, b, 0], w[n, b, 1])
                m = _f16(lut, w[n, b, 2], w[n, b, 3])
                e = _f16(lut, w[n2, b, 0], w[n2, b, 1])
                f = _f16(lut, w[n2, b, 2], w[n2, b, 3])
                for j in range(16):
                    v = w[n, b, 4 + j]
                    u = w[n2, b, 4 + j]
                    xa = x[b, j]
                    xb = x[b, 16 + j]
                    s = aux[b, j]
                    t[j] += d * (F32(U8(v & 15)) * xa + F32(U8(v >> 4)) * xb) + m * s
                    t[16 + j] += e * (F32(U8(u & 15)) * xa + F32(U8(u >> 4)) * xb) + f * s
            y[n] = t[:16].sum()
            y[n2] = t[16:].sum()


@njit(parallel=True, **_OPTS)
def mv_q4_k(w, lut, x, y, chunk):
    """Q4_K super-blocks (d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles)."""
    n_rows, nb, bs = w.shape
    ahead = (PREFETCH_BYTES + bs - 1) // bs  # blocks
    for c in prange((n_rows + chunk - 1) // chunk):
        t = np.empty(32, np.float32)
        for n in range(c * chunk, min(n_rows, c * chunk + chunk)):
            t[:] = 0
            for b in range(nb):
                _prefetch(w, n, b + ahead, 0)
                _prefetch(w, n, b + ahead, 64)
                _prefetch(w, n, b + ahead, 128)
                d = _f16(lut, w[n, b, 0], w[n, b, 1])
                dmin = _f16(lut, w[n, b, 2], w[n, b, 3])
                for g in range(4):
                    s0, m0 = _scale_min_k4(w, n, b, 2 * g)
                    s1, m1 = _scale_min_k4(w, n, b, 2 * g + 1)
                    d0 = d * F32(s0)
                    o0 = -(dmin * F32(m0))
                    d1 = d * F32(s1)
                    o1 = -(dmin * F32(m1))
                    for j in range(32):
                        v = w[n, b, 16 + 32 * g + j]
                        t[j] += (d0 * F32(U8(v & 15)) + o0) * x[b, 64 * g + j] + (
                            d1 * F32(U8(v >> 4)) + o1
                        ) * x[b, 64 * g + 32 + j]
            y[n] = t.sum()


@njit(parallel=True, **_OPTS)
def mv_q6_k(w, lut, x, y, chunk):
    """Q6_K super-blocks (ql:128, qh:64, 16 int8 scales, d): value = d * sc * (q - 32)."""
    n_rows, nb, bs = w.shape
    ahead = (PREFETCH_BYTES + bs - 1) // bs  # blocks
    for c in prange((n_rows + chunk - 1) // chunk):
        t = np.empty(16, np.float32)
        for n in range(c * chunk, min(n_rows, c * chunk + chunk)):
            t[:] = 0
            for b in range(nb):
                for line in range(4):
                    _prefetch(w, n, b + ahead, 64 * line)
                d = _f16(lut, w[n, b, 208], w[n, b, 209])
                for h in range(2):
                    for k in range(2):
                        s0 = d * F32(np.int8(w[n, b, 192 + 8 * h + k]))
                        s1 = d * F32(np.int8(w[n, b, 194 + 8 * h + k]))
                        s2 = d * F32(np.int8(w[n, b, 196 + 8 * h + k]))
                        s3 = d * F32(np.int8(w[n, b, 198 + 8 * h + k]))
                        o0 = F32(-32.0) * s0
                        o1 = F32(-32.0) * s1
                        o2 = F32(-32.0) * s2
                        o3 = F32(-32.0) * s3
                        base = 128 * h + 16 * k
                        for j in range(16):
                            a = w[n, b, 64 * h + 16 * k + j]
                            e = w[n, b, 64 * h + 32 + 16 * k + j]
                            hb = w[n, b, 128 + 32 * h + 16 * k + j]
                            q0 = F32(U8((a & 15) | ((hb & 3) << 4)))
                            q1 = F32(U8((e & 15) | (((hb >> 2) & 3) << 4)))
                            q2 = F32(U8((a >> 4) | (((hb >> 4) & 3) << 4)))
                            q3 = F32(U8((e >> 4) | (((hb >> 6) & 3) << 4)))
                            t[j] += (
                                (s0 * q0 + o0) * x[b, base + j]
                                + (s1 * q1 + o1) * x[b, base + 32 + j]
                                + (s2 * q2 + o2) * x[b, base + 64 + j]
                                + (s3 * q3 + o3) * x[b, base + 96 + j]
                            )
            y[n] = t.sum()


# ------------------------------------------------------- dequantize rows [r0, r1) to a tile
#
# ``unit`` is an array of ones (32 lanes). Multiplying by it changes nothing, but without a
# float load in the loop LLVM's cost model keeps these store-only loops scalar (measured:
# 2.8 -> 5.3 G weights/s for Q4_0 on one core). For the same reason Q8_0 converts its bytes
# as unsigned and fixes the sign with arithmetic: an int8 cast keeps the loop scalar.


@njit(parallel=True, **_OPTS)
def dq_q8_0(w, lut, unit, r0, r1, out):
    """Rows r0..r1 of a Q8_0 matrix into out[(r1 - r0), K]."""
    nb = w.shape[1]
    for i in prange(r1 - r0):
        n = r0 + i
        for b in range(nb):
            d = _f16(lut, w[n, b, 0], w[n, b, 1])
            d256 = F32(256.0) * d
            for j in range(32):
                v = w[n, b, 2 + j]  # int8 as uint8: value = v - 256 * (v >> 7), exact in f32
                out[i, 32 * b + j] = (d * F32(U8(v)) - d256 * F32(U8(v >> 7))) * unit[j]


@njit(parallel=True, **_OPTS)
def dq_q4_0(w, lut, unit, r0, r1, out):
    """Rows r0..r1 of a Q4_0 matrix into out."""
    nb = w.shape[1]
    for i in prange(r1 - r0):
        n = r0 + i
        for b in range(nb):
            d = _f16(lut, w[n, b, 0], w[n, b, 1])
            o = F32(-8.0) * d
            for j in range(16):
                v = w[n, b, 2 + j]
                out[i, 32 * b + j] = (d * F32(U8(v & 15)) + o) * unit[j]
                out[i, 32 * b + 16 + j] = (d * F32(U8(v >> 4)) + o) * unit[16 + j]


@njit(parallel=True, **_OPTS)
def dq_q4_1(w, lut, unit, r0, r1, out):
    """Rows r0..r1 of a Q4_1 matrix into out."""
    nb = w.shape[1]
    for i in prange(r1 - r0):
        n = r0 + i
        for b in range(nb):
            d = _f16(lut, w[n, b, 0], w[n, b, 1])
            m = _f16(lut, w[n, b, 2], w[n, b, 3])
            for j in range(16):
                v = w[n, b, 4 + j]
                out[i, 32 * b + j] = (d * F32(U8(v & 15)) + m) * unit[j]
                out[i, 32 * b + 16 + j] = (d * F32(U8(v >> 4)) + m) * unit[16 + j]


@njit(parallel=True, **_OPTS)
def dq_q4_k(w, lut, unit, r0, r1, out):
    """Rows r0..r1 of a Q4_K matrix into out."""
    nb = w.shape[1]
    for i in prange(r1 - r0):
        n = r0 + i
        for b in range(nb):
            d = _f16(lut, w[n, b, 0], w[n, b, 1])
            dmin = _f16(lut, w[n, b, 2], w[n, b, 3])
            for g in range(4):
                s0, m0 = _scale_min_k4(w, n, b, 2 * g)
                s1, m1 = _scale_min_k4(w, n, b, 2 * g + 1)
                d0 = d * F32(s0)
                o0 = dmin * F32(m0)
                d1 = d * F32(s1)
                o1 = dmin * F32(m1)
                for j in range(32):
                    v = w[n, b, 16 + 32 * g + j]
                    out[i, 256 * b + 64 * g + j] = (d0 * F32(U8(v & 15)) - o0) * unit[j]
                    out[i, 256 * b + 64 * g + 32 + j] = (d1 * F32(U8(v >> 4)) - o1) * unit[j]


@njit(parallel=True, **_OPTS)
def dq_q6_k(w, lut, unit, r0, r1, out):
    """Rows r0..r1 of a Q6_K matrix into out."""
    nb = w.shape[1]
    for i in prange(r1 - r0):
        n = r0 + i
        for b in range(nb):
            d = _f16(lut, w[n, b, 208], w[n, b, 209])
            for h in range(2):
                for k in range(2):
                    s0 = d * F32(np.int8(w[n, b, 192 + 8 * h + k]))
                    s1 = d * F32(np.int8(w[n, b, 194 + 8 * h + k]))
                    s2 = d * F32(np.int8(w[n, b, 196 + 8 * h + k]))
                    s3 = d * F32(np.int8(w[n, b, 198 + 8 * h + k]))
                    base = 256 * b + 128 * h + 16 * k
                    for j in range(16):
                        a = w[n, b, 64 * h + 16 * k + j]
                        e = w[n, b, 64 * h + 32 + 16 * k + j]
                        hb = w[n, b, 128 + 32 * h + 16 * k + j]
                        q0 = F32(U8((a & 15) | ((hb & 3) << 4))) - F32(32.0)
                        q1 = F32(U8((e & 15) | (((hb >> 2) & 3) << 4))) - F32(32.0)
                        q2 = F32(U8((a >> 4) | (((hb >> 4) & 3) << 4))) - F32(32.0)
                        q3 = F32(U8((e >> 4) | (((hb >> 6) & 3) << 4))) - F32(32.0)
                        out[i, base + j] = s0 * q0 * unit[j]
                        out[i, base + 32 + j] = s1 * q1 * unit[j]
                        out[i, base + 64 + j] = s2 * q2 * unit[j]
                        out[i, base + 96 + j] = s3 * q3 * unit[j]


MATVEC = {"Q8_0": mv_q8_0, "Q4_0": mv_q4_0, "Q4_1": mv_q4_1, "Q4_K": mv_q4_k, "Q6_K": mv_q6_k}
DEQUANT_ROWS = {"Q8_0": dq_q8_0, "Q4_0": dq_q4_0, "Q4_1": dq_q4_1, "Q4_K": dq_q4_k,
                "Q6_K": dq_q6_k}  # fmt: skip
