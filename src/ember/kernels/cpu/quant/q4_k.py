"""Q4_K kernels: super-blocks of 256 4-bit values (144 bytes), value d * sc * q - dmin * m.

Layout: d:f16, dmin:f16, 12 bytes of eight 6-bit (scale, min) pairs, 128 bytes of nibbles; 32
bytes g hold sub-block 2g (low nibbles) and 2g + 1 (high). ``linear_q4_k`` is the ``linear_q``
op's kernel for Q4_K QTensors; the numpy reference is ``dequantize_reference``.
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
    scale_min_k4,
)
from ember.quant.dequant import DEQUANTIZERS

dequantize_reference = DEQUANTIZERS["Q4_K"]  # (blocks, 144) uint8 -> (blocks, 256) float32


def _mv(w, lut, x, y, chunk):  # pragma: no cover - compiled
    """y = W @ x."""
    n_rows, nb, bs = w.shape
    ahead = (PREFETCH_BYTES + bs - 1) // bs  # blocks
    for c in prange((n_rows + chunk - 1) // chunk):
        t = np.empty(32, np.float32)
        for n in range(c * chunk, min(n_rows, c * chunk + chunk)):
            t[:] = 0
            for b in range(nb):
                prefetch(w, n, b + ahead, 0)
                prefetch(w, n, b + ahead, 64)
                prefetch(w, n, b + ahead, 128)
                d = f16(lut, w[n, b, 0], w[n, b, 1])
                dmin = f16(lut, w[n, b, 2], w[n, b, 3])
                for g in range(4):
                    s0, m0 = scale_min_k4(w, n, b, 2 * g)
                    s1, m1 = scale_min_k4(w, n, b, 2 * g + 1)
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


def _dq(w, lut, unit, r0, r1, out):  # pragma: no cover - compiled
    """Rows r0..r1 of W into out[(r1 - r0), K]."""
    nb = w.shape[1]
    for i in prange(r1 - r0):
        n = r0 + i
        for b in range(nb):
            d = f16(lut, w[n, b, 0], w[n, b, 1])
            dmin = f16(lut, w[n, b, 2], w[n, b, 3])
            for g in range(4):
                s0, m0 = scale_min_k4(w, n, b, 2 * g)
                s1, m1 = scale_min_k4(w, n, b, 2 * g + 1)
                d0 = d * F32(s0)
                o0 = dmin * F32(m0)
                d1 = d * F32(s1)
                o1 = dmin * F32(m1)
                for j in range(32):
                    v = w[n, b, 16 + 32 * g + j]
                    out[i, 256 * b + 64 * g + j] = (d0 * F32(U8(v & 15)) - o0) * unit[j]
                    out[i, 256 * b + 64 * g + 32 + j] = (d1 * F32(U8(v >> 4)) - o1) * unit[j]


Q4_K = QuantKernels("Q4_K", mv=_mv, dq=_dq, dequantize_reference=dequantize_reference)
linear_q4_k = Q4_K.register()
