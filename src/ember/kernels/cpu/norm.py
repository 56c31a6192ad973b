"""Normalisation kernels: RMS norm over the last dim (float32).

``rms_norm`` is the ``rms_norm`` op's kernel (``ember.nn.functional.rms_norm``): one numba pass
per row, on the calling thread (a decode step's rows are microseconds of work).
"""

from __future__ import annotations

import math

import numpy as np

from ember.kernels.cpu import have_numba, jit
from ember.kernels.registry import register

_F32 = np.float32


def _rms_norm_rows(x, w, eps, out):  # pragma: no cover - compiled
    rows, n = x.shape
    for r in range(rows):
        ss = np.float32(0.0)
        for c in range(n):
            ss += x[r, c] * x[r, c]
        inv = np.float32(1.0 / math.sqrt(ss / n + eps))
        for c in range(n):
            out[r, c] = (x[r, c] * inv) * w[c]


_rows = jit(_rms_norm_rows)


def rms_norm_reference(x: np.ndarray, w: np.ndarray | None = None, *, n: int, eps: float):
    """x * rsqrt(mean(x**2, -1) + eps) * w in float32 (the kernel's reference)."""
    with np.errstate(invalid="ignore", over="ignore"):  # a NaN/inf row stays NaN, as the kernel's
        r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + _F32(eps))
        y = x * r
    if w is not None:
        y = y * w
    return y.astype(_F32, copy=False)


@register(
    "rms_norm",
    reference=rms_norm_reference,
    when=lambda x, w=None, *, n, eps: n == 1,
    available=have_numba,
)
def rms_norm(x: np.ndarray, w: np.ndarray | None = None, *, n: int, eps: float) -> np.ndarray:
    """RMS norm of float32 x over its last dim, times w (None: no scale); a new array."""
    d = x.shape[-1]
    x2 = np.ascontiguousarray(x).reshape(-1, d)
    out = np.empty(x2.shape, _F32)
    _rows(x2, np.ones(d, _F32) if w is None else w, _F32(eps), out)
    return out.reshape(x.shape)
