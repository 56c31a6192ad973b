"""Special functions numpy lacks: erf and exact gelu.

``erf_numpy`` and ``gelu_numpy`` are the ops' numpy forwards (ember.ops.elementwise); the numba
ufuncs ``erf`` and ``gelu`` are their kernels (``gelu`` is registered in kernels.cpu.activation,
after its vectorised float32 kernel: it serves float64 and machines without vecmath).

float32 inputs use ``erf_f32``, a float32 rational approximation (Eigen's, also PyTorch's):
branch-free, so numba vectorizes it, and within float32 rounding of the true erf. float64
inputs go through ``math.erf`` (exact to double precision). ``erf_f32`` is written so that the
same code runs on numpy arrays (the reference and the fallback without numba) and, compiled by
numba, on scalars inside other kernels (the encoder's fused bias + gelu uses it).
"""

from __future__ import annotations

import math

import numpy as np

from ember.kernels.cpu import have_numba, numba_or_none
from ember.kernels.registry import register

# erf(x) ~ x * P(x^2) / Q(x^2) on [-4, 4] (|error| < 2e-7; Eigen's float erf, also PyTorch's)
_ERF_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
              -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
              -1.60960333262415e-02)  # fmt: skip
_ERF_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
             -7.37332916720468e-03, -1.42647390514189e-02)  # fmt: skip
# module-level float32 scalars: numba freezes them as float32 constants, numpy keeps float32
_A1, _A3, _A5, _A7, _A9, _A11, _A13 = (np.float32(c) for c in _ERF_ALPHA)
_B0, _B2, _B4, _B6, _B8 = (np.float32(c) for c in _ERF_BETA)
_FOUR, _NEG_FOUR = np.float32(4.0), np.float32(-4.0)
_HALF, _ONE, _RSQRT2_F32 = np.float32(0.5), np.float32(1.0), np.float32(1.0 / math.sqrt(2.0))
_RSQRT2 = 1.0 / math.sqrt(2.0)

_ufuncs: dict | None = None
_erf_f32_jit = None


def erf_f32(x):
    """erf in float32 (rational approximation); a float32 array in numpy or a scalar in numba."""
    # np.minimum/np.maximum propagate NaN (min/max would turn it into +-4); +-inf clamp to +-4
    x = np.minimum(np.maximum(x, _NEG_FOUR), _FOUR)
    x2 = x * x
    p = x2 * _A1 + _A3
    p = x2 * p + _A5
    p = x2 * p + _A7
    p = x2 * p + _A9
    p = x2 * p + _A11
    p = x2 * p + _A13
    q = x2 * _B0 + _B2
    q = x2 * q + _B4
    q = x2 * q + _B6
    q = x2 * q + _B8
    return x * p / q


def erf_f32_jit():
    """``erf_f32`` compiled by numba for use inside other numba kernels (None without numba).

    numba's on-disk cache does not see changes to a called function: after editing
    ``erf_f32``, clear the callers' caches (``__pycache__/*.nbi``) too.
    """
    global _erf_f32_jit
    if _erf_f32_jit is None:
        nb = numba_or_none()
        if nb is None:
            return None
        _erf_f32_jit = nb.njit(cache=True, nogil=True, inline="always")(erf_f32)
    return _erf_f32_jit


def _build() -> dict:
    """Compile (or load from cache) the ufuncs; {} when numba is unavailable."""
    nb = numba_or_none()
    if nb is None:
        return {}
    erf32 = erf_f32_jit()
    half, one, rsqrt2 = _HALF, _ONE, _RSQRT2_F32

    def erf32_u(v):  # pragma: no cover - compiled
        return erf32(v)

    def erf64_u(v):  # pragma: no cover - compiled
        return math.erf(v)

    def gelu32_u(v):  # pragma: no cover - compiled
        return half * v * (one + erf32(v * rsqrt2))

    def gelu64_u(v):  # pragma: no cover - compiled
        return 0.5 * v * (1.0 + math.erf(v * _RSQRT2))

    f32, f64 = ["float32(float32)"], ["float64(float64)"]
    vec = nb.vectorize
    return {
        "erf32": vec(f32, cache=True)(erf32_u),
        "erf64": vec(f64, cache=True)(erf64_u),
        "gelu32": vec(f32, cache=True)(gelu32_u),
        "gelu64": vec(f64, cache=True)(gelu64_u),
    }


def _ufunc(name: str):
    """The compiled ufunc, or None without numba."""
    global _ufuncs
    if _ufuncs is None:
        _ufuncs = _build()
    return _ufuncs.get(name) if _ufuncs else None


# --- numpy references -------------------------------------------------------------------------


def erf_reference(x: np.ndarray) -> np.ndarray:
    """erf elementwise through math.erf (slow, exact to double precision)."""
    return np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x.copy()


def gelu_reference(x: np.ndarray) -> np.ndarray:
    """Exact gelu, x * (1 + erf(x / sqrt 2)) / 2, through math.erf (slow)."""
    return 0.5 * x * (1 + erf_reference(x * x.dtype.type(_RSQRT2)))


def erf_numpy(x: np.ndarray) -> np.ndarray:
    """The erf op's numpy forward: ``erf_f32`` for float32, ``math.erf`` for float64."""
    return erf_f32(x) if x.dtype == np.float32 else erf_reference(x)


def gelu_numpy(x: np.ndarray, *, approximate: str = "none") -> np.ndarray:
    """The exact gelu op's numpy forward, through ``erf_numpy``."""
    if x.dtype == np.float32:
        return _HALF * x * (_ONE + erf_f32(x * _RSQRT2_F32))
    return gelu_reference(x)


# --- kernels: the ufuncs, one pass per array --------------------------------------------------


@register(
    "erf",
    name="erf_ufunc",
    reference=erf_numpy,
    dtypes=(np.float32, np.float64),
    available=have_numba,
)
def erf(x: np.ndarray) -> np.ndarray:
    """The error function of a float32/float64 array in one compiled pass."""
    return _ufunc("erf32" if x.dtype == np.float32 else "erf64")(x)


def gelu(x: np.ndarray, *, approximate: str) -> np.ndarray:
    """Exact (erf) gelu of a float32/float64 array in one compiled pass (-inf gives NaN).

    A kernel of the gelu op, registered in kernels.cpu.activation after its float32 one.
    """
    with np.errstate(invalid="ignore"):
        return _ufunc("gelu32" if x.dtype == np.float32 else "gelu64")(x)
