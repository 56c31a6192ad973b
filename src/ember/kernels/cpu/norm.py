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


# --- layer_norm ------------------------------------------------------------------------------
# The ``layer_norm`` op's kernel (``ember.nn.functional.layer_norm`` over the last dim): one
# pass per row for the mean, one for the variance and the affine, float32 sums vectorized. It
# runs on the calling thread (between BLAS calls, where a hand-over to numba's threads costs
# more than a sentence's rows take) until x has LAYER_NORM_PARALLEL elements (an audio
# window's 1500 x 384), then on numba's threads.
LAYER_NORM_PARALLEL = 1 << 18
prange = range  # numba.prange once the kernels are built


def _layer_norm_rows(x, w, b, eps, out):  # pragma: no cover - compiled
    rows, n = x.shape
    for r in prange(rows):
        xr, yr = x[r], out[r]
        mu = np.float32(0.0)
        for c in range(n):
            mu += xr[c]
        mu /= n
        var = np.float32(0.0)
        for c in range(n):
            d = xr[c] - mu
            var += d * d
        rstd = np.float32(1.0 / math.sqrt(var / n + eps))
        for c in range(n):
            yr[c] = (xr[c] - mu) * rstd * w[c] + b[c]


_LN: dict = {}


def _layer_norm_kernel(parallel: bool):
    if not _LN:
        from ember.kernels.cpu import numba_or_none

        globals()["prange"] = numba_or_none().prange
        fm = {"reassoc", "contract", "arcp", "nsz"}  # the row sums vectorize
        _LN[False] = jit(_layer_norm_rows, fastmath=fm)
        _LN[True] = jit(_layer_norm_rows, suffix="parallel", fastmath=fm, parallel=True)
    return _LN[parallel]


def layer_norm_reference(x, *wb, view, axes, eps, pshape, has_w, has_b, stats=None, sink=None):
    """(x - mean) / sqrt(var + eps) * w + b over the last dim of float32 x (the reference)."""
    with np.errstate(invalid="ignore", over="ignore"):  # a NaN/inf row stays NaN, as the kernel's
        mu = x.mean(axis=-1, keepdims=True)
        xc = x - mu
        var = np.mean(xc * xc, axis=-1, keepdims=True)
        y = xc * (1.0 / np.sqrt(var + _F32(eps)))
    if has_w:
        y = y * wb[0]
    if has_b:
        y = y + wb[-1]
    return y.astype(_F32, copy=False)


def _layer_norm_applies(x, *wb, view, axes, eps, pshape, has_w, has_b, stats=None, sink=None):
    return view is None and stats is None and sink is None and axes == (x.ndim - 1,)


@register(
    "layer_norm",
    reference=layer_norm_reference,
    when=_layer_norm_applies,
    available=have_numba,
)
def layer_norm(x, *wb, view, axes, eps, pshape, has_w, has_b, stats=None, sink=None):
    """Layer norm of float32 x over its last dim, times w plus b (either may be absent)."""
    d = x.shape[-1]
    x2 = np.ascontiguousarray(x).reshape(-1, d)
    w = wb[0].reshape(d) if has_w else np.ones(d, _F32)
    b = wb[-1].reshape(d) if has_b else np.zeros(d, _F32)
    out = np.empty(x2.shape, _F32)
    _layer_norm_kernel(x2.size >= LAYER_NORM_PARALLEL)(x2, w, b, _F32(eps), out)
    return out.reshape(x.shape)
