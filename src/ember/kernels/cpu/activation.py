"""Activation kernels: exact (erf) GELU on float32 arrays.

``gelu`` is the ``gelu`` op's kernel (``ember.nn.functional.gelu``, approximate="none"): the
array is cut into chunks and each chunk goes through vecmath's ``ember_gelu_row`` (exact GELU
at the CPU's full vector width, erf from ``special.erf_f32``'s constants). Small arrays run on
the calling thread, large ones (an encoder's MLP activations) on numba's threads.
"""

from __future__ import annotations

import numpy as np

from ember.kernels.cpu import have_numba, jit, special, vecmath
from ember.kernels.cpu.special import gelu_reference as _gelu_exact
from ember.kernels.registry import register

_F32 = np.float32
# elements from which the chunks go to numba's threads: below that the pass runs on the calling
# thread, between BLAS calls, where waking numba's pool costs more than it saves (MiniLM's
# 494 x 1536 activations: 157 vs 182 ms per 32-sentence batch at 2 threads)
GELU_PARALLEL = 1 << 22
CHUNK = 4096  # elements per row call (16 KB: in L1 while it is copied and transformed)
prange = range  # numba.prange once the kernels are built
_gelu_row = None  # vecmath's ember_gelu_row, bound before compiling


def _gelu_chunks(x, out, chunk):  # pragma: no cover - compiled
    n = x.shape[0]
    oa = out.ctypes.data
    for c in prange((n + chunk - 1) // chunk):
        s = c * chunk
        e = min(n, s + chunk)
        out[s:e] = x[s:e]
        _gelu_row(oa + s * 4, e - s, oa, 0)


_K: dict = {}


def _kernel(parallel: bool):
    if not _K:
        from ember.kernels.cpu import numba_or_none

        nb = numba_or_none()
        if nb is None or vecmath.symbols() is None:  # the row kernel's symbol must be registered
            raise RuntimeError("gelu kernel called without numba or vecmath (see available)")
        i8 = nb.types.int64
        g = globals()
        g["prange"] = nb.prange
        g["_gelu_row"] = nb.types.ExternalFunction("ember_gelu_row", nb.types.void(i8, i8, i8, i8))
        fn = vecmath.keyed(_gelu_chunks, vecmath)  # links vecmath's symbols: keyed cache name
        _K[False] = jit(fn)
        _K[True] = jit(fn, suffix="parallel", parallel=True)
    return _K[parallel]


def gelu_reference(x: np.ndarray, *, approximate: str) -> np.ndarray:
    """x * (1 + erf(x / sqrt 2)) / 2 through math.erf (slow, exact)."""
    with np.errstate(invalid="ignore"):  # gelu(-inf) = -inf * 0: NaN, as the kernel's
        return _gelu_exact(x)


@register(
    "gelu",
    reference=gelu_reference,
    when=lambda x, *, approximate: approximate == "none",
    available=lambda: have_numba() and vecmath.symbols() is not None,
)
def gelu(x: np.ndarray, *, approximate: str) -> np.ndarray:
    """Exact GELU of a float32 array (a new array of x's shape, in x's memory order)."""
    perm = np.argsort([-abs(st) for st in x.strides], kind="stable") if x.ndim > 1 else None
    dense = x.transpose(perm) if perm is not None else x
    if not dense.flags.c_contiguous:  # strided: one copy into C order
        perm, dense = None, np.ascontiguousarray(x)
    flat = dense.reshape(-1)
    out = np.empty(flat.shape, _F32)
    if flat.size:
        _kernel(flat.size >= GELU_PARALLEL)(flat, out, CHUNK)
    out = out.reshape(dense.shape)
    return out if perm is None else out.transpose(np.argsort(perm))  # e.g. channels-last stays


register(
    "gelu",
    name="gelu_ufunc",
    reference=special.gelu_numpy,
    dtypes=(np.float32, np.float64),
    when=lambda x, *, approximate: approximate == "none",
    available=have_numba,
)(special.gelu)  # float64, or float32 where vecmath's rows are missing: numba's ufunc
