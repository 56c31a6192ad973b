"""The ``linear`` op's kernel for float32 weights and a few rows of x (decode steps), on the pool.

A decoder step multiplies one row (or a few) by every weight matrix: the product reads the
weight once and does two flops per float read, so it runs at memory speed, and the question is
only how many cores pull the weight through. numpy's one-thread BLAS (the decode loops run
their products on one BLAS thread: OpenBLAS's workers spin between calls and take the cores
from the kernels in between) pulls Whisper tiny's 51864 x 384 output projection (80 MB) in
2.3 ms here; this kernel splits the weight's rows over ember's worker pool
(``kernels.cpu.pool``: work claiming, a late thread never holds the caller up) in 1.3 ms at 2
threads, and a 384 x 384 product in 4 us instead of 6.

The loop is ``kernels.cpu.quant._idot``'s ``F32`` kernel: a weight row is read as K / 32
blocks of 32 floats (a view of the weight, no copy), each block's products with x summed in
vector lanes in a fixed order and added to the (weight row, x row) accumulator, the lanes
summed by a fixed tree at the end. So row i of an M-row product is bitwise the product of
x[i] alone, whatever M, the thread count or the split (batch invariance), and the result
differs from BLAS's only by the order of the float additions.

It applies to C-contiguous float32 (N, K) weights with K a multiple of 32 and at most
``MAX_ROWS`` rows of x; a ``PackedWeight`` keeps the packed GEMM (``kernels.cpu.gemm``),
larger products keep BLAS. ``prepare`` binds a captured step's product once (ember.nn.graph).
"""

from __future__ import annotations

import numpy as np

from ember.kernels.cpu import with_bias
from ember.kernels.cpu.gemm import PackedWeight, linear_reference
from ember.kernels.registry import register

MAX_ROWS = 16  # rows of x (the _idot kernels carry 4 at a time, a pool job up to 128)
_F32 = np.float32


def _blocks(w: np.ndarray) -> np.ndarray:
    """The weight's rows as (N, K / 32, 128) bytes: the F32 kernel's view of them."""
    n, k = w.shape
    return w.view(np.uint8).reshape(n, k // 32, 128)


def _applies(x, w, b=None) -> bool:
    if type(w) is PackedWeight or w.ndim != 2 or not w.flags.c_contiguous:
        return False
    n, k = w.shape
    return (
        n > 0 and k > 0 and k % 32 == 0 and x.ndim >= 1 and x.shape[-1] == k
        and 0 < x.size <= MAX_ROWS * k and (b is None or b.shape == (n,))
    )  # fmt: skip


def _available() -> bool:
    from ember.kernels.cpu.quant import _idot

    return _idot.state() is not None


def _prepare(out, x, w, b=None):
    """The product into out on these arrays, bound once (a captured step's ``linear``)."""
    from ember.kernels.cpu.quant import _idot

    n, k = w.shape
    ok = (
        x.dtype == _F32 and x.flags.c_contiguous and out.dtype == _F32 and out.flags.c_contiguous
        and out.shape == x.shape[:-1] + (n,)
    )  # fmt: skip
    if not ok:
        return None
    return with_bias(_idot.bind("F32", _blocks(w), x.reshape(-1, k), out.reshape(-1, n)), out, b)


@register(
    "linear",
    reference=linear_reference,
    name="linear_f32_small",
    when=_applies,
    available=_available,
    prepare=_prepare,
)
def linear_small(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """x @ w.T + b for float32 x of at most MAX_ROWS rows, on the worker pool."""
    from ember.kernels.cpu.quant import _idot

    n, k = w.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if not x2.flags.c_contiguous:
        x2 = np.ascontiguousarray(x2)
    out = np.empty((x2.shape[0], n), _F32)
    _idot.product("F32", _blocks(w), x2, out)
    if b is not None:
        out += b
    return out.reshape(lead + (n,))
