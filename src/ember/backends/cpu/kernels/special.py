"""Special functions numpy lacks: erf (numba vectorized ufunc; math.erf reference)."""

from __future__ import annotations

import math

import numpy as np

from ember.backends.cpu.kernels import numba_or_none

_erf_ufunc = None


def erf_reference(x: np.ndarray) -> np.ndarray:
    """erf elementwise through math.erf (slow, exact to double precision)."""
    return np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x.copy()


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, elementwise, for float32/float64 arrays."""
    global _erf_ufunc
    if _erf_ufunc is None:
        nb = numba_or_none()
        if nb is None:
            _erf_ufunc = erf_reference
        else:

            @nb.vectorize(["float32(float32)", "float64(float64)"], cache=True)
            def _erf(v):  # pragma: no cover - compiled
                return math.erf(v)

            _erf_ufunc = _erf
    return _erf_ufunc(x)
