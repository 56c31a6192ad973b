"""Kernels of the ``gated_act`` op (``ember.nn.functional.swiglu`` / ``geglu``): act(gate) * up.

The gate of a gated feed-forward (SwiGLU: silu, GeGLU: gelu, exact or tanh-approximated) in one
pass over float32 gate and up arrays of one shape (strided views allowed), instead of an
activation pass, a product pass and the temporary between them. Small arrays (a decode step)
take a numba loop on the calling thread; from NUMPY_MIN elements on, silu runs as in-place numpy
passes (numpy's exp is SIMD, numba's calls expf per element). Up to ``LOOP_ROWS`` rows always
take the loop: the two exps round differently, and a decode batch's row must get the numbers it
gets alone (a batching server's promise), however many rows share its forward.
"""

from __future__ import annotations

import math

import numpy as np

from ember.kernels.cpu import have_numba, jit
from ember.kernels.registry import register

NUMPY_MIN = 1 << 14  # from this many elements on, silu runs as numpy passes
LOOP_ROWS = 16  # ... but never for this many rows or fewer (decode batches)
_F32 = np.float32
_ACTS = ("silu", "gelu_tanh", "gelu")
_C = math.sqrt(2.0 / math.pi)


def _glu_py(g, u, kind, out):  # pragma: no cover - compiled
    rows, n = g.shape
    one, half = np.float32(1.0), np.float32(0.5)
    c, a = np.float32(0.7978845608028654), np.float32(0.044715)
    r2 = np.float32(0.7071067811865476)
    for r in range(rows):
        for j in range(n):
            x = g[r, j]
            if kind == 0:
                y = x / (one + np.exp(-x))
            elif kind == 1:
                y = half * x * (one + np.tanh(c * (x + a * x * x * x)))
            else:
                y = half * x * (one + math.erf(x * r2))
            out[r, j] = y * u[r, j]


_glu = jit(_glu_py)


def gated_act_reference(g: np.ndarray, u: np.ndarray, *, act: str) -> np.ndarray:
    """act(g) * u in float32 (silu: in place on one temporary)."""
    with np.errstate(over="ignore", invalid="ignore"):  # NaN/inf stay as the kernel's do
        if act == "silu":
            t = np.negative(g, dtype=_F32)
            np.exp(t, out=t)
            t += _F32(1.0)
            np.divide(g, t, out=t)
            t *= u
            return t
        gf = g.astype(np.float64)
        if act == "gelu_tanh":
            y = 0.5 * gf * (1.0 + np.tanh(_C * (gf + 0.044715 * gf**3)))
        else:
            y = 0.5 * gf * (1.0 + np.vectorize(math.erf, otypes=[np.float64])(gf / math.sqrt(2.0)))
        return (y * u).astype(_F32)


def _when(g, u, *, act) -> bool:
    return act in _ACTS and g.shape == u.shape and g.ndim >= 1


@register("gated_act", reference=gated_act_reference, when=_when, available=have_numba)
def gated_act(g: np.ndarray, u: np.ndarray, *, act: str) -> np.ndarray:
    """act(g) * u for float32 arrays of one shape; a new array."""
    n = g.shape[-1]
    if act == "silu" and g.size >= NUMPY_MIN and g.size > LOOP_ROWS * n:
        return gated_act_reference(g, u, act=act)
    out = np.empty(g.shape, _F32)
    if out.size:
        _glu(g.reshape(-1, n), u.reshape(-1, n), _ACTS.index(act), out.reshape(-1, n))
    return out


# --- the gradient of silu(g) * u (op ``gated_act_grad``: SwiGLU's backward in training) ------

GRAD_BLOCK_ELEMENTS = 1 << 16  # elements per task of the gradient (run_tiles)
_expf = None  # attention.expf (branch-free: vectorizes), bound before compiling


def _silu_grad_py(gr, g, u, dg, du, r0, r1):  # pragma: no cover - compiled
    n = g.shape[1]
    one = np.float32(1.0)
    for r in range(r0, r1):
        for j in range(n):
            x = g[r, j]
            s = one / (one + _expf(-x))
            e = gr[r, j]
            dg[r, j] = e * u[r, j] * (s * (one + x * (one - s)))
            du[r, j] = e * (x * s)


_G: dict = {}


def _grad_kernel():
    if not _G:
        from ember.kernels.cpu import attention, numba_or_none, vecmath

        nb = numba_or_none()
        globals()["_expf"] = nb.njit(cache=True, nogil=True, inline="always")(attention.expf)
        _G["silu"] = jit(vecmath.keyed(_silu_grad_py, attention))  # inlines attention's expf
    return _G["silu"]


def gated_act_grad_reference(grad, g, u, *, act: str) -> tuple[np.ndarray, np.ndarray]:
    """(d/dg, d/du) of silu(g) * u for the output gradient grad, float32 (numpy)."""
    with np.errstate(over="ignore", invalid="ignore"):
        s = 1 / (1 + np.exp(-g))
        y = g * s
        dy = s * (1 + g * (1 - s))
        return (grad * u * dy).astype(_F32), (grad * y).astype(_F32)


def _grad_when(grad, g, u, *, act) -> bool:
    return act == "silu" and g.shape == u.shape == grad.shape and g.ndim >= 1


@register(
    "gated_act_grad", reference=gated_act_grad_reference, when=_grad_when, available=have_numba
)
def gated_act_grad(grad, g, u, *, act: str) -> tuple[np.ndarray, np.ndarray]:
    """``gated_act_grad_reference`` in one pass, blocks of rows on ``tiles.run_tiles``."""
    from ember.kernels.cpu.tiles import run_tiles

    n = g.shape[-1]
    dg, du = np.empty(g.shape, _F32), np.empty(g.shape, _F32)
    if not g.size:
        return dg, du
    args = [a.reshape(-1, n) for a in (grad, g, u, dg, du)]
    rows = args[1].shape[0]
    step = max(1, GRAD_BLOCK_ELEMENTS // n)
    k = _grad_kernel()
    run_tiles(lambda i: k(*args, i * step, min(rows, i * step + step)), -(-rows // step))
    return dg, du
