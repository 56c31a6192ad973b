"""Activation kernels: exact (erf) GELU on float32 arrays.

``gelu`` is the ``gelu`` op's kernel (``ember.nn.functional.gelu``, approximate="none"): the
array is cut into chunks and each chunk goes through vecmath's ``ember_gelu_row`` (exact GELU
at the CPU's full vector width, erf from ``special.erf_f32``'s constants). Small arrays run on
the calling thread, larger ones (an encoder's MLP activations) as chunks on ember's worker pool
(``kernels.cpu.pool``), the pool the GEMMs before and after them run on: as a numba ``prange``
region its second thread waited for the core that the pool's worker spins on after a product
(~0.2 ms), so it ran only from 4M elements, and one-threaded below (ViT-B/16's 197 x 3072
activations: 0.37 ms a layer one-threaded, 0.2 ms on the pool).
"""

from __future__ import annotations

import numpy as np

from ember.kernels.cpu import have_numba, special, vecmath
from ember.kernels.cpu.special import gelu_reference as _gelu_exact
from ember.kernels.registry import register
from ember.threads import get_num_threads

_F32 = np.float32
# elements from which the chunks go to the pool: below that the pass (~25 us) runs on the
# calling thread
GELU_PARALLEL = 1 << 16
CHUNK = 4096  # elements per row call (16 KB: in L1 while it is copied and transformed)
POOL_CHUNKS = 16  # row calls a pool task makes at most (~40 us: kernels.cpu.pool_tasks)
_gelu_row = _ld = _vptr = carray = None  # vecmath's ember_gelu_row etc., bound before compiling


def _gelu_chunks(x, out, chunk, c0, c1):  # pragma: no cover - compiled
    """Chunks c0..c1-1 of x (chunk elements each) into out, through GELU."""
    n = x.shape[0]
    oa = out.ctypes.data
    copy = x.ctypes.data != oa  # in place: no copy
    for c in range(c0, c1):
        s = c * chunk
        e = min(n, s + chunk)
        if copy:
            out[s:e] = x[s:e]
        _gelu_row(oa + s * 4, e - s, oa, 0)


def _gelu_items_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover
    """Pool task: chunks r0..r1-1 of the call described at p (x, out, n, chunk)."""
    n = _ld(p, 2)
    x = carray(_vptr(_ld(p, 0)), (n,), np.float32)
    out = carray(_vptr(_ld(p, 1)), (n,), np.float32)
    _chunks(x, out, _ld(p, 3), r0, r1)


_chunks = None  # _gelu_chunks compiled
_K: dict = {}


def _kernels() -> dict:
    """{"serial": the chunks on the calling thread, "task": the pool task's address or 0}."""
    if not _K:
        from ember.kernels.cpu import numba_or_none, pool

        nb = numba_or_none()
        if nb is None or vecmath.symbols() is None:  # the row kernel's symbol must be registered
            raise RuntimeError("gelu kernel called without numba or vecmath (see available)")
        i8 = nb.types.int64
        g = globals()
        g["_gelu_row"] = nb.types.ExternalFunction("ember_gelu_row", nb.types.void(i8, i8, i8, i8))
        fn = vecmath.keyed(_gelu_chunks, vecmath)  # links vecmath's symbols: keyed cache name
        g["_chunks"] = nb.njit(cache=True, nogil=True)(fn)
        _K["serial"], _K["task"] = g["_chunks"], 0
        if pool.state() is not None:
            g["_ld"], g["_vptr"] = pool.intrinsics()
            g["carray"] = nb.carray
            sig = nb.types.void(*([i8] * 12))
            task = nb.cfunc(sig, nopython=True, cache=True)(vecmath.keyed(_gelu_items_py, vecmath))
            _K["cfunc"], _K["task"] = task, task.address
    return _K


def gelu_reference(x: np.ndarray, *, approximate: str) -> np.ndarray:
    """x * (1 + erf(x / sqrt 2)) / 2 through math.erf (slow, exact)."""
    with np.errstate(invalid="ignore"):  # gelu(-inf) = -inf * 0: NaN, as the kernel's
        return _gelu_exact(x)


def _gelu_flat(flat: np.ndarray, out: np.ndarray) -> None:
    """out = GELU(flat) (1-D float32, contiguous; out may be flat itself)."""
    n = flat.size
    k = _kernels()
    chunks = -(-n // CHUNK)
    threads = get_num_threads()
    if n >= GELU_PARALLEL and k["task"] and threads > 1:
        from ember.kernels.cpu import pool

        desc = np.array([flat.ctypes.data, out.ctypes.data, n, CHUNK], np.int64)
        per = max(1, min(POOL_CHUNKS, chunks // (4 * threads)))
        pool.run_items(k["task"], desc.ctypes.data, chunks, per)
    elif n:
        k["serial"](flat, out, CHUNK, 0, chunks)


def gelu_inplace_available() -> bool:
    """Whether ``gelu_inplace`` runs here (numba and vecmath's row kernels)."""
    return have_numba() and vecmath.symbols() is not None


def gelu_inplace(x: np.ndarray) -> np.ndarray:
    """Exact GELU of a C-contiguous float32 array, written over it (a GEMM's fresh output: no
    second array to allocate and touch, 74 MB a layer in the Whisper tiny encoder at b8)."""
    if x.dtype != _F32 or not x.flags.c_contiguous:
        raise ValueError("gelu_inplace: a C-contiguous float32 array expected")
    flat = x.reshape(-1)
    _gelu_flat(flat, flat)
    return x


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
    _gelu_flat(flat, out)
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
