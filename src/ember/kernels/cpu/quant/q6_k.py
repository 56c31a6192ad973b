"""Q6_K kernels: super-blocks of 256 6-bit values (210 bytes), value d * sc * (q - 32).

Layout: ql:128 bytes of low nibbles, qh:64 bytes of high 2-bit pairs, 16 int8 scales (one per
16 elements), d:f16. ``linear_q6_k`` is the ``linear_q`` op's kernel for Q6_K QTensors; the
numpy reference is ``dequantize_reference``.
"""

from __future__ import annotations

import numpy as np

from ember.kernels.cpu.quant._common import (
    F32,
    PREFETCH_BYTES,
    U8,
    QuantKernels,
    f16,
    prange,
    prefetch,
)
from ember.quant.dequant import DEQUANTIZERS

dequantize_reference = DEQUANTIZERS["Q6_K"]  # (blocks, 210) uint8 -> (blocks, 256) float32


def _mv(w, lut, x, y, chunk):  # pragma: no cover - compiled
    """y = W @ x (16 lanes: a scale covers 16 elements)."""
    n_rows, nb, bs = w.shape
    ahead = (PREFETCH_BYTES + bs - 1) // bs  # blocks
    for c in prange((n_rows + chunk - 1) // chunk):
        t = np.empty(16, np.float32)
        for n in range(c * chunk, min(n_rows, c * chunk + chunk)):
            t[:] = 0
            for b in range(nb):
                for line in range(4):
                    prefetch(w, n, b + ahead, 64 * line)
                d = f16(lut, w[n, b, 208], w[n, b, 209])
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


def _dq(w, lut, unit, r0, r1, out):  # pragma: no cover - compiled
    """Rows r0..r1 of W into out[(r1 - r0), K]."""
    nb = w.shape[1]
    for i in prange(r1 - r0):
        n = r0 + i
        for b in range(nb):
            d = f16(lut, w[n, b, 208], w[n, b, 209])
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


Q6_K = QuantKernels("Q6_K", mv=_mv, dq=_dq, dequantize_reference=dequantize_reference)
linear_q6_k = Q6_K.register()
