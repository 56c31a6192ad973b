"""Q4_1 kernels: blocks of 32 4-bit values with fp16 scale d and min m (20 bytes), value d * q + m.

Byte j of a block holds elements j (low nibble) and j + 16 (high). ``linear_q4_1`` is the
``linear_q`` op's kernel for Q4_1 QTensors; the numpy reference is ``dequantize_reference``.
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

dequantize_reference = DEQUANTIZERS["Q4_1"]  # (blocks, 20) uint8 -> (blocks, 32) float32


def _mv(w, lut, x, y, chunk):  # pragma: no cover - compiled
    """y = W @ x, two rows at a time.

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
                    prefetch(w, n, b + ahead, 0)
                    prefetch(w, n2, b + ahead, 0)
                d = f16(lut, w[n, b, 0], w[n, b, 1])
                m = f16(lut, w[n, b, 2], w[n, b, 3])
                e = f16(lut, w[n2, b, 0], w[n2, b, 1])
                f = f16(lut, w[n2, b, 2], w[n2, b, 3])
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


def _dq(w, lut, unit, r0, r1, out):  # pragma: no cover - compiled
    """Rows r0..r1 of W into out[(r1 - r0), K]."""
    nb = w.shape[1]
    for i in prange(r1 - r0):
        n = r0 + i
        for b in range(nb):
            d = f16(lut, w[n, b, 0], w[n, b, 1])
            m = f16(lut, w[n, b, 2], w[n, b, 3])
            for j in range(16):
                v = w[n, b, 4 + j]
                out[i, 32 * b + j] = (d * F32(U8(v & 15)) + m) * unit[j]
                out[i, 32 * b + 16 + j] = (d * F32(U8(v >> 4)) + m) * unit[16 + j]


Q4_1 = QuantKernels("Q4_1", mv=_mv, dq=_dq, dequantize_reference=dequantize_reference)
linear_q4_1 = Q4_1.register()
