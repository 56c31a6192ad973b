"""Kernels of the index-target cross-entropy over rows of logits (``F.cross_entropy``'s class-
index path and ``F.linear_cross_entropy``, through ``nn.functional.loss._CERows``).

A language model's loss reads a (tokens, vocabulary) float32 array: 512 x 49152 is 100 MB. The
numpy path works a chunk of rows at a time (a row at a time at that width) with a dozen array
passes per chunk; here one numba pass per row does each half, on the threads of
``tiles.run_tiles`` a block of rows at a time:

- ``ce_lse``: each row's max and log-sum-exp (the sum kept in float64);
- ``ce_grad``: ``(softmax(z) * s - onehot(t) * b) * gl`` per row (float64 arithmetic on the
  float32 softmax, as the numpy path's), written over the logits themselves when asked; rows
  that are not counted (ignore_index) become zeros.

exp is ``attention.expf`` (Cephes' expf, branch-free so that the loops vectorize: numba's
np.exp calls libm's scalar expf); a NaN in a row makes its results NaN, as numpy's.

Label smoothing keeps the numpy path. ``*_reference`` are the numpy versions the tests compare
with.
"""

from __future__ import annotations

import numpy as np

from ember.kernels.cpu import have_numba, jit
from ember.kernels.registry import register

_F32 = np.dtype(np.float32)
ROW_BLOCK_ELEMENTS = 1 << 19  # logits per task (2 MiB): 10 rows of a 49152-word vocabulary


_expf = None  # attention.expf (branch-free: vectorizes), bound before compiling


def _lse_py(z, r0, r1, m, logs):  # pragma: no cover - compiled by numba
    c = z.shape[1]
    lanes = np.empty(16, np.float32)
    c16 = c - c % 16
    for i in range(r0, r1):
        # the max in 16 lanes (a plain max() loop stays scalar); a NaN sticks in its lane
        lanes[:] = -np.inf
        for j in range(0, c16, 16):
            for u in range(16):
                v = z[i, j + u]
                lanes[u] = v if v > lanes[u] or v != v else lanes[u]
        mx = np.float32(-np.inf)
        for u in range(16):
            mx = lanes[u] if lanes[u] > mx or lanes[u] != lanes[u] else mx
        for j in range(c16, c):
            v = z[i, j]
            mx = v if v > mx or v != v else mx
        acc = 0.0
        for j in range(c):
            acc += _expf(z[i, j] - mx)
        m[i] = mx
        logs[i] = np.float32(np.log(acc)) if mx == mx else mx


def _grad_py(z, m, logs, s, b, gl, tc, valid, out, r0, r1):  # pragma: no cover - numba
    c = z.shape[1]
    for i in range(r0, r1):
        if not valid[i]:
            for j in range(c):
                out[i, j] = 0.0
            continue
        mi, li, si, gi, t = m[i], logs[i], s[i], gl[i], tc[i]
        zt = (z[i, t] - mi) - li  # read before the row is overwritten (out may be z)
        nan = li - li  # NaN for a row holding a NaN (expf clamps its argument)
        for j in range(c):
            p = _expf((z[i, j] - mi) - li) + nan
            out[i, j] = np.float32(p * si * gi)
        out[i, t] = np.float32(((_expf(zt) + nan) * si - b[i]) * gi)


_K: dict = {}


def _kernel(name: str):
    if not _K:
        from ember.kernels.cpu import attention, numba_or_none, vecmath

        nb = numba_or_none()
        globals()["_expf"] = nb.njit(cache=True, nogil=True, inline="always")(attention.expf)
        # the kernels inline attention's expf: cache them under names keyed on its source
        _K["lse"] = jit(vecmath.keyed(_lse_py, attention))
        _K["grad"] = jit(vecmath.keyed(_grad_py, attention))
    return _K[name]


def _blocks(z: np.ndarray):
    n, c = z.shape
    step = max(1, ROW_BLOCK_ELEMENTS // max(c, 1))
    return step, -(-n // step)


def lse_reference(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(max, log-sum-exp of z - max) of each row of z (N, C), float32 (N,) each."""
    m = z.max(axis=-1, keepdims=True) if z.size else np.zeros((z.shape[0], 1), z.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        logs = np.log(np.exp(z - m).sum(axis=-1, dtype=np.float64))
    return m[:, 0].astype(_F32), logs.astype(_F32)


def _lse_when(z) -> bool:
    return z.ndim == 2 and z.shape[1] > 0


@register("ce_lse", reference=lse_reference, when=_lse_when, available=have_numba)
def ce_lse(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``lse_reference`` a block of rows per task."""
    from ember.kernels.cpu.tiles import run_tiles

    n = z.shape[0]
    m, logs = np.empty(n, _F32), np.empty(n, _F32)
    step, nblocks = _blocks(z)
    k = _kernel("lse")
    run_tiles(lambda i: k(z, i * step, min(n, i * step + step), m, logs), nblocks)
    return m, logs


def grad_reference(z, m, logs, s, b, gl, tc, valid, out=None) -> np.ndarray:
    """``(softmax(z_i) * s_i - onehot(tc_i) * b_i) * gl_i`` per row i of z (N, C) float32, from
    each row's max m and log-sum-exp logs; rows not ``valid`` are zeros. Into ``out`` (which
    may be z) when given."""
    p = np.exp((z - m[:, None]) - logs[:, None])
    d = p * s[:, None]
    rows = np.arange(z.shape[0])
    d[rows, tc] -= b
    if out is None:
        out = np.empty(z.shape, _F32)
    with np.errstate(invalid="ignore"):
        np.multiply(d, gl[:, None], out=out, casting="unsafe")
    out[~valid] = 0
    return out


def _grad_when(z, m, logs, s, b, gl, tc, valid, out=None) -> bool:
    n = z.shape[0] if z.ndim == 2 else -1
    return (
        z.ndim == 2 and z.dtype == _F32 and z.shape[1] > 0
        and all(a.shape == (n,) for a in (m, logs, s, b, gl, tc, valid))
        and m.dtype == _F32 and logs.dtype == _F32 and tc.dtype.kind == "i"
        and valid.dtype == np.bool_
        and (out is None or (out.shape == z.shape and out.dtype == _F32))
    )  # fmt: skip


@register("ce_grad", reference=grad_reference, when=_grad_when, dtypes=None, available=have_numba)
def ce_grad(z, m, logs, s, b, gl, tc, valid, out=None) -> np.ndarray:
    """``grad_reference`` a block of rows per task."""
    from ember.kernels.cpu.tiles import run_tiles

    n = z.shape[0]
    if out is None:
        out = np.empty(z.shape, _F32)
    f64 = np.float64
    s, b, gl = (np.ascontiguousarray(a, f64) for a in (s, b, gl))
    tc = np.ascontiguousarray(tc, np.int64)
    step, nblocks = _blocks(z)
    k = _kernel("grad")
    run_tiles(lambda i: k(z, m, logs, s, b, gl, tc, valid, out, i * step, min(n, i * step + step)),
              nblocks)  # fmt: skip
    return out
