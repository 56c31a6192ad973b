"""Q8_0 kernels: blocks of 32 int8 values with one fp16 scale d (34 bytes), value d * q.

``linear_q8_0`` is the ``linear_q`` op's kernel for Q8_0 QTensors; the numpy reference is
``ember.quant.dequant``'s decoder (``dequantize_reference``), see ``_common`` for the rest.
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

dequantize_reference = DEQUANTIZERS["Q8_0"]  # (blocks, 34) uint8 -> (blocks, 32) float32


def _mv(w, lut, x, y, chunk):  # pragma: no cover - compiled
    """y[n] = sum_b d * (q . x_b)."""
    n_rows, nb, bs = w.shape
    ahead = (PREFETCH_BYTES + bs - 1) // bs  # blocks
    for c in prange((n_rows + chunk - 1) // chunk):
        t = np.empty(32, np.float32)
        for n in range(c * chunk, min(n_rows, c * chunk + chunk)):
            t[:] = 0
            for b in range(nb):
                prefetch(w, n, b + ahead, 0)
                d = f16(lut, w[n, b, 0], w[n, b, 1])
                for j in range(32):
                    q = np.int8(w[n, b, 2 + j])
                    t[j] += d * (F32(q) * x[b, j])
            y[n] = t.sum()


def _dq(w, lut, unit, r0, r1, out):  # pragma: no cover - compiled
    """Rows r0..r1 of W into out[(r1 - r0), K]."""
    nb = w.shape[1]
    for i in prange(r1 - r0):
        n = r0 + i
        for b in range(nb):
            d = f16(lut, w[n, b, 0], w[n, b, 1])
            d256 = F32(256.0) * d
            for j in range(32):
                v = w[n, b, 2 + j]  # int8 as uint8: value = v - 256 * (v >> 7), exact in f32
                out[i, 32 * b + j] = (d * F32(U8(v)) - d256 * F32(U8(v >> 7))) * unit[j]


Q8_0 = QuantKernels("Q8_0", mv=_mv, dq=_dq, dequantize_reference=dequantize_reference)
linear_q8_0 = Q8_0.register()
