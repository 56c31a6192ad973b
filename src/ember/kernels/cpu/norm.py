"""Normalisation kernels: RMS norm over the last dim (float32).

``rms_norm`` is the ``rms_norm`` op's kernel (``ember.nn.functional.rms_norm``): one numba pass
per row, on the calling thread (a decode step's rows are microseconds of work).
"""

from __future__ import annotations

import math

import numpy as np

from ember.kernels.cpu import have_numba, jit
from ember.kernels.registry import register
from ember.threads import get_num_threads

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
# pass per row for the mean, one for the variance and the affine, float32 sums vectorized (the
# mean kept float32: as float64 it made the two loops after it convert every element to double,
# 10.5 -> 5.8 us for 128 x 384 on one thread, ad-hoc timing). It
# runs on the calling thread until x has LAYER_NORM_PARALLEL elements, then as blocks of rows on
# ember's worker pool (``kernels.cpu.pool``), where the GEMMs around it run: as a numba
# ``prange`` region its second thread waited for the core the pool's worker spins on after a
# product (~0.2 ms), so it ran one-threaded below an audio window's 1500 x 384.
LAYER_NORM_PARALLEL = 1 << 16
POOL_ELEMENTS = 1 << 16  # elements a pool task normalises at most (~40 us)


def _layer_norm_rows(x, w, b, eps, out, r0, r1):  # pragma: no cover - compiled
    n = x.shape[1]
    for r in range(r0, r1):
        xr, yr = x[r], out[r]
        mu = np.float32(0.0)
        for c in range(n):
            mu += xr[c]
        mu = np.float32(mu / n)  # float32: mu / n is float64, and so were both loops after it
        var = np.float32(0.0)
        for c in range(n):
            d = xr[c] - mu
            var += d * d
        rstd = np.float32(1.0 / math.sqrt(var / n + eps))
        for c in range(n):
            yr[c] = (xr[c] - mu) * rstd * w[c] + b[c]


def _layer_norm_items_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover
    """Pool task: rows r0..r1-1 of the call described at p (x, w, b, out, rows, n, eps)."""
    rows, n = _ld(p, 4), _ld(p, 5)
    x = carray(_vptr(_ld(p, 0)), (rows, n), np.float32)
    w = carray(_vptr(_ld(p, 1)), (n,), np.float32)
    b = carray(_vptr(_ld(p, 2)), (n,), np.float32)
    out = carray(_vptr(_ld(p, 3)), (rows, n), np.float32)
    _ln_rows(x, w, b, np.int32(_ld(p, 6)).view(np.float32), out, r0, r1)


_ln_rows = _ld = _vptr = carray = None  # bound by _layer_norm_kernels
_LN: dict = {}


def _layer_norm_kernels() -> dict:
    """{"serial": the rows on the calling thread, "task": the pool task's address or 0}."""
    if not _LN:
        from ember.kernels.cpu import numba_or_none, pool

        nb = numba_or_none()
        fm = {"reassoc", "contract", "arcp", "nsz"}  # the row sums vectorize
        g = globals()
        g["_ln_rows"] = nb.njit(cache=True, nogil=True, fastmath=fm)(_layer_norm_rows)
        _LN["serial"], _LN["task"] = g["_ln_rows"], 0
        if pool.state() is not None:
            g["_ld"], g["_vptr"] = pool.intrinsics()
            g["carray"] = nb.carray
            sig = nb.types.void(*([nb.types.int64] * 12))
            task = nb.cfunc(sig, nopython=True, cache=True)(_layer_norm_items_py)
            _LN["cfunc"], _LN["task"] = task, task.address
    return _LN


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
    w = wb[0].reshape(d) if has_w else np.ones(d, _F32)
    b = wb[-1].reshape(d) if has_b else np.zeros(d, _F32)
    w, b = np.ascontiguousarray(w, _F32), np.ascontiguousarray(b, _F32)
    return layer_norm_last(x, w, b, eps)


def layer_norm_last(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """``layer_norm`` with w and b given as contiguous float32 (d,) arrays (a graph's constants).

    The ONNX graph's layer-norm nodes call this directly: the op's dispatch and the checks and
    copies of w and b were ~11 us of a ~33 us call on MiniLM's 128 x 384 (ad-hoc timing).
    """
    d = x.shape[-1]
    x2 = (x if x.flags.c_contiguous else np.ascontiguousarray(x)).reshape(-1, d)
    out = np.empty(x2.shape, _F32)
    k = _LN or _layer_norm_kernels()
    rows = x2.shape[0]
    threads = get_num_threads()
    if x2.size >= LAYER_NORM_PARALLEL and k["task"] and threads > 1:
        from ember.kernels.cpu import pool

        desc = np.array([x2.ctypes.data, w.ctypes.data, b.ctypes.data, out.ctypes.data, rows, d,
                         int(_F32(eps).view(np.int32))], np.int64)  # fmt: skip
        per = max(1, min(-(-rows // (4 * threads)), POOL_ELEMENTS // max(d, 1)))
        pool.run_items(k["task"], desc.ctypes.data, rows, per)
    else:
        k["serial"](x2, w, b, _F32(eps), out, 0, rows)
    return out.reshape(x.shape)
