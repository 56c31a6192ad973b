"""Q4_0 kernels: blocks of 32 4-bit values with one fp16 scale d (18 bytes), value d * (q - 8).

Byte j of a block holds elements j (low nibble) and j + 16 (high). ``linear_q4_0`` is the
``linear_q`` op's kernel for Q4_0 QTensors; the numpy reference is ``dequantize_reference``.
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

dequantize_reference = DEQUANTIZERS["Q4_0"]  # (blocks, 18) uint8 -> (blocks, 32) float32


def _mv(w, lut, x, y, chunk):  # pragma: no cover - compiled
    """y = W @ x, two rows at a time.

    Lane j accumulates d * (lo * x[j] + hi * x[j + 16] - 8 * (x[j] + x[j + 16])); aux[b, j]
    carries the last term.
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
                    prefetch(w, n, b + ahead, 0)
                    prefetch(w, n2, b + ahead, 0)
                d = f16(lut, w[n, b, 0], w[n, b, 1])
                e = f16(lut, w[n2, b, 0], w[n2, b, 1])
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


def _dq(w, lut, unit, r0, r1, out):  # pragma: no cover - compiled
    """Rows r0..r1 of W into out[(r1 - r0), K]."""
    nb = w.shape[1]
    for i in prange(r1 - r0):
        n = r0 + i
        for b in range(nb):
            d = f16(lut, w[n, b, 0], w[n, b, 1])
            o = F32(-8.0) * d
            for j in range(16):
                v = w[n, b, 2 + j]
                out[i, 32 * b + j] = (d * F32(U8(v & 15)) + o) * unit[j]
                out[i, 32 * b + 16 + j] = (d * F32(U8(v >> 4)) + o) * unit[16 + j]


Q4_0 = QuantKernels("Q4_0", mv=_mv, dq=_dq, dequantize_reference=dequantize_reference)
linear_q4_0 = Q4_0.register()
