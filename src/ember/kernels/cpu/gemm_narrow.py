"""The packed GEMM for narrow outputs: panels of one vector (16 columns on AVX-512, 8 on AVX2).

kernels.cpu.gemm's microkernels hold MR rows x NV vectors (12 x 2 zmm on AVX-512: 32 columns);
a product with at most 16 outputs filled half of each tile and paid for the other half: twice
the FMAs, and a masked epilogue whose stores dominated short products. PP-OCRv4 det's 640x640
RGB stem (3x3 stride 2, 3 -> 16 channels: 102400 rows, K = 27) took 1.66 ms on one thread with
32-column panels, 0.6 ms with these (ad-hoc timing of the product alone). A weight with at most
``width()`` outputs is packed into panels of that width (``gemm.PackedWeight``), and
``gemm.gemm`` hands such panels here.

The microkernels are gemm's own IR (``gemm._kernel_ir`` with one vector per row, compiled by
``gemm.jit_ir``) under other names; each tile runs the whole K at once (no blocking of K: a
panel of K x 16 floats stays in L2), with bias, residual and ReLU/ReLU6 in its store. Rows go
to ember's worker pool (kernels.cpu.pool) in blocks of ``ROWS``, or run on the calling thread
below ``gemm.SERIAL_BELOW`` multiply-adds.
"""

from __future__ import annotations

import threading

import numpy as np

from ember.kernels.cpu import gemm as G

MR = 12  # rows per tile: 12 accumulators (+ the B vector and a broadcast) in 16 or 32 registers
ROWS = 192  # rows a pool task computes
_STATE: dict = {}
_LOCK = threading.Lock()
_n1 = _n2 = _n3 = _n4 = _n5 = _n6 = _n7 = _n8 = _n9 = _n10 = _n11 = _n12 = None  # bound by _build
_micro = _rows = _ld = None  # compiled / bound by _build


def _micro_py(m, args):  # pragma: no cover - compiled
    """The narrow microkernel for m rows (1..MR)."""
    if m == 12:
        _n12(*args)
    elif m == 11:
        _n11(*args)
    elif m == 10:
        _n10(*args)
    elif m == 9:
        _n9(*args)
    elif m == 8:
        _n8(*args)
    elif m == 7:
        _n7(*args)
    elif m == 6:
        _n6(*args)
    elif m == 5:
        _n5(*args)
    elif m == 4:
        _n4(*args)
    elif m == 3:
        _n3(*args)
    elif m == 2:
        _n2(*args)
    else:
        _n1(*args)


def _rows_py(q0, q1, aa, ra, ta, nt, kc, ba, oa, o, bsa, rsa, flags, act):  # pragma: no cover
    """Rows [q0, q1) of the product, tiles of MR rows over all of K (addresses as in gemm)."""
    lo = np.float32(-np.inf if act == 0 else 0.0)
    hi = np.float32(6.0 if act == 2 else np.inf)
    for p in range(q0, q1, MR):
        off = p * o * 4
        args = (aa, ra + p * 8, ta, nt, kc, ba, oa + off, o, o, bsa, rsa + off, flags, lo, hi)
        _micro(min(MR, q1 - p), args + (ba, 0))


def _task_py(p, a1, a2, r0, r1, a5, a6, a7, a8, a9, a10, a11):  # pragma: no cover - compiled
    """Row blocks r0..r1-1 of the product whose parameter block is at p."""
    m = _ld(p, 12)
    for blk in range(r0, r1):
        q0 = blk * ROWS
        _rows(q0, min(m, q0 + ROWS), _ld(p, 0), _ld(p, 1), _ld(p, 2), _ld(p, 3), _ld(p, 4),
              _ld(p, 5), _ld(p, 6), _ld(p, 7), _ld(p, 8), _ld(p, 9), _ld(p, 10), _ld(p, 11))  # fmt: skip


def _build() -> dict:
    from numba import types

    from ember.kernels.cpu import numba_or_none, pool

    if G.isa() is None:
        return {"ok": False}
    nb = numba_or_none()
    w = G.ISAS[G.isa()][0]
    names = [f"ember_sgemmn_{m}" for m in range(1, MR + 1)]
    irs = [G._kernel_ir(m, 1, w).replace(f"@ember_sgemm_{m}(", f"@{n}(") for m, n in
           zip(range(1, MR + 1), names)]  # fmt: skip
    engine = G.jit_ir(irs, names)
    i64 = types.int64
    sig = types.void(*([i64] * 12), types.float32, types.float32, i64, i64)
    g = globals()
    for m, n in zip(range(1, MR + 1), names):
        g[f"_n{m}"] = types.ExternalFunction(n, sig)
    g["_micro"] = nb.njit(nogil=True, cache=True)(_micro_py)
    g["_rows"] = nb.njit(nogil=True, cache=True)(_rows_py)
    st = {"ok": True, "engine": engine, "width": w, "rows": g["_rows"], "task": 0}
    if pool.state() is not None:
        g["_ld"] = pool.intrinsics()[0]
        task = nb.cfunc(types.void(*([i64] * 12)), nopython=True, cache=True)(_task_py)
        st.update(cfunc=task, task=task.address)
    return st


def _state() -> dict | None:
    from ember.kernels.cpu import built_once

    return built_once(_STATE, _LOCK, _build)


def width() -> int | None:
    """The narrow panel width on this CPU (one vector of floats), or None (no microkernels)."""
    st = _state()
    return None if st is None else st["width"]


def gemm(a, rowoff, tapoff, kc, packed, bias, res, act: int, out, span=None, threads=None):
    """gemm.gemm on narrow panels (packed.shape[2] == width()): the same operands and result."""
    from ember.threads import get_num_threads

    nr = width()
    G._check(a, rowoff, tapoff, kc, packed, bias, res, out, nr, span)
    m, o = out.shape
    if m == 0:
        return out
    threads = max(1, get_num_threads() if threads is None else threads)
    flags = 6 if res is not None else 2
    r = out if res is None else res
    args = (a.ctypes.data, rowoff.ctypes.data, tapoff.ctypes.data, len(tapoff), kc,
            packed.ctypes.data, out.ctypes.data, o, bias.ctypes.data, r.ctypes.data, flags, act)  # fmt: skip
    st = _state()
    if threads == 1 or not st["task"] or m * packed.shape[1] * nr < G.SERIAL_BELOW:
        st["rows"](0, m, *args)
        return out
    from ember.kernels.cpu import pool

    params = np.array([*args, m], np.int64)
    pool.run_items(st["task"], params.ctypes.data, -(-m // ROWS), 1)
    return out
