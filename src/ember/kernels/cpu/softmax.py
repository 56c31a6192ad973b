"""Softmax over the last axis of a float32 array, for the ONNX ``Softmax`` node.

Each row is copied to the output and goes through vecmath's ``ember_softmax_row`` (exp at the
CPU's full vector width, returns the row's sum), then is scaled by 1 / sum. numpy's softmax
(max, subtract, exp, sum, divide: five passes, exp at numpy's own width) took 160 us alone and
~210 in the model for PP-OCRv4's recognizer's (1, 40, 6625) class scores; this kernel 75 us on
one thread, 42 on the pool (2 threads), ~54 in the model (ad-hoc timings). Small arrays run on
the calling thread, larger ones as blocks of rows on ember's worker pool (``kernels.cpu.pool``,
where the GEMM before them ran), like ``activation.gelu``.
"""

from __future__ import annotations

import numpy as np

from ember.kernels.cpu import have_numba, vecmath
from ember.threads import get_num_threads

_F32 = np.float32
SOFTMAX_PARALLEL = 1 << 16  # elements from which rows go to the pool
POOL_ELEMENTS = 1 << 16  # elements a pool task takes at most
_softmax_row = _ld = _vptr = carray = (
    None  # vecmath's ember_softmax_row etc., bound before compiling
)


def _softmax_rows(x, out, r0, r1):  # pragma: no cover - compiled
    """Rows r0..r1-1 of x (rows, n) into out, as softmax."""
    n = x.shape[1]
    oa = out.ctypes.data
    for r in range(r0, r1):
        for c in range(n):
            out[r, c] = x[r, c]
        inv = np.float32(1.0) / _softmax_row(oa + r * n * 4, n, np.float32(1.0))
        for c in range(n):
            out[r, c] *= inv


def _softmax_items_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover
    """Pool task: rows r0..r1-1 of the call described at p (x, out, rows, n)."""
    rows, n = _ld(p, 2), _ld(p, 3)
    x = carray(_vptr(_ld(p, 0)), (rows, n), np.float32)
    out = carray(_vptr(_ld(p, 1)), (rows, n), np.float32)
    _rows(x, out, r0, r1)


_rows = None  # _softmax_rows compiled
_K: dict = {}


def available() -> bool:
    """Whether ``softmax_last`` runs here (numba and vecmath's row kernels)."""
    return have_numba() and vecmath.symbols() is not None


def _kernels() -> dict:
    """{"serial": the rows on the calling thread, "task": the pool task's address or 0}."""
    if not _K:
        from ember.kernels.cpu import numba_or_none, pool

        nb = numba_or_none()
        if nb is None or vecmath.symbols() is None:
            raise RuntimeError("softmax kernel called without numba or vecmath (see available)")
        i8, f4 = nb.types.int64, nb.types.float32
        g = globals()
        g["_softmax_row"] = nb.types.ExternalFunction("ember_softmax_row", f4(i8, i8, f4))
        fm = {"nsz", "arcp", "contract"}  # the copy and the scaling vectorize
        fn = vecmath.keyed(_softmax_rows, vecmath)  # links vecmath's symbols: keyed cache name
        g["_rows"] = nb.njit(cache=True, nogil=True, fastmath=fm)(fn)
        _K["serial"], _K["task"] = g["_rows"], 0
        if pool.state() is not None:
            g["_ld"], g["_vptr"] = pool.intrinsics()
            g["carray"] = nb.carray
            sig = nb.types.void(*([i8] * 12))
            task = nb.cfunc(sig, nopython=True, cache=True)(
                vecmath.keyed(_softmax_items_py, vecmath)
            )
            _K["cfunc"], _K["task"] = task, task.address
    return _K


def softmax_reference(x: np.ndarray) -> np.ndarray:
    """softmax of x over its last axis in float64, as float32."""
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(_F32)


def softmax_last(x: np.ndarray) -> np.ndarray:
    """softmax of float32 x over its last axis (a new C-contiguous array)."""
    n = x.shape[-1]
    x2 = (x if x.flags.c_contiguous else np.ascontiguousarray(x)).reshape(-1, n)
    out = np.empty(x2.shape, _F32)
    rows = x2.shape[0]
    if rows and n:
        k = _kernels()
        threads = get_num_threads()
        if x2.size >= SOFTMAX_PARALLEL and k["task"] and threads > 1:
            from ember.kernels.cpu import pool

            desc = np.array([x2.ctypes.data, out.ctypes.data, rows, n], np.int64)
            per = max(1, min(-(-rows // (4 * threads)), POOL_ELEMENTS // n))
            pool.run_items(k["task"], desc.ctypes.data, rows, per)
        else:
            k["serial"](x2, out, 0, rows)
    return out.reshape(x.shape)
