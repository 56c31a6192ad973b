"""The transposed quantized product ``g @ W`` (the input gradient of ``x @ W.T``), op ``linear_q_t``.

Training adapters on a quantized base (QLoRA) sends every backward pass through ``g @ W`` with
W a QTensor of shape (N, K) and g the output gradient (M, N). W is never decoded whole: a tile of
rows at a time is dequantized into one reused float32 buffer (the format's numba row kernel) and
multiplied by BLAS, accumulating into the (M, K) result; the extra memory is one tile and one
(M, K) partial product, whatever the size of W.

:func:`matmul_qt_reference` is the numpy reference (gguf-compatible block decoding from
``ember.quant.formats``, same tiling); :func:`matmul_qt` picks the registered kernel as the
registry does for every op, or runs the reference.
"""

from __future__ import annotations

import numpy as np

from ember.errors import DTypeError, ShapeError
from ember.kernels import registry
from ember.kernels.cpu.quant._common import FORMATS, have_numba

F32 = np.float32
TILE_ELEMENTS = 1 << 18  # weights decoded per tile: a 1 MiB float32 buffer


def _tile_rows(n: int, k: int) -> int:
    return max(1, min(n, TILE_ELEMENTS // max(k, 1)))


def _check(g: np.ndarray, qweight, what: str) -> np.ndarray:
    if len(qweight.shape) != 2:
        raise ShapeError(f"{what}: needs a 2-d weight, this one is {qweight.shape}")
    n = qweight.shape[0]
    g = np.asarray(g)
    if g.dtype.kind != "f":
        raise DTypeError(f"{what}: g must be floating point, got {g.dtype}")
    if g.ndim != 2 or g.shape[1] != n:
        raise ShapeError(
            f"{what}: g of shape {g.shape} does not fit a {tuple(qweight.shape)} weight "
            f"(g @ W needs g of shape (M, {n}))"
        )
    return g


def matmul_qt_reference(g: np.ndarray, *, qweight) -> np.ndarray:
    """``g @ W`` (float32 (M, K)) for g (M, N), W decoded a tile of rows at a time (numpy)."""
    from ember.quant.formats import dequantize

    g = _check(g, qweight, "matmul_qt_reference")
    n, k = (int(s) for s in qweight.shape)
    out = np.zeros((g.shape[0], k), F32)
    if out.size == 0 or n == 0:
        return out
    w3 = qweight.blocks3d()
    step = _tile_rows(n, k)
    g32 = g.astype(F32, copy=False)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        rows = w3[r0:r1]
        tile = dequantize(rows.reshape(r1 - r0, -1), qweight.qtype, (r1 - r0, k))
        out += g32[:, r0:r1] @ tile
    return out


def matmul_qt_tiled(g: np.ndarray, *, qweight) -> np.ndarray:
    """``g @ W`` with the format's numba row dequantizer into one reused tile, BLAS products."""
    g = _check(g, qweight, "matmul_qt")
    registry.kernels("linear_q")  # imports the format modules (they fill FORMATS)
    fmt = FORMATS[qweight.qtype]
    n, k = (int(s) for s in qweight.shape)
    m = g.shape[0]
    out = np.zeros((m, k), F32)
    if out.size == 0 or n == 0:
        return out
    w3 = qweight.blocks3d()
    step = _tile_rows(n, k)
    tile = np.empty((step, k), F32)
    part = np.empty((m, k), F32)
    g32 = np.ascontiguousarray(g, dtype=F32)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        t = tile[: r1 - r0]
        fmt.dequantize_rows(w3, r0, r1, t)
        np.matmul(g32[:, r0:r1], t, out=part)
        out += part
    return out


def _when(g, *, qweight) -> bool:
    from ember.quant.qtensor import QTensor

    return (
        type(qweight) is QTensor and len(qweight.shape) == 2 and qweight.qtype in FORMATS
        and g.ndim == 2 and g.shape[1] == qweight.shape[0]
    )  # fmt: skip


registry.register(
    "linear_q_t",
    reference=matmul_qt_reference,
    name="linear_q_t_tiled",
    when=_when,
    available=have_numba,
)(matmul_qt_tiled)


def matmul_qt(qweight, g: np.ndarray) -> np.ndarray:
    """``g @ W`` for a 2-d QTensor W (N, K) and g (M, N): float32 (M, K), W never decoded whole."""
    g = _check(g, qweight, "matmul_qt")
    if g.dtype != F32:
        g = g.astype(F32)
    kernel = registry.pick("linear_q_t", "cpu", (g,), {"qweight": qweight})
    if kernel is not None:
        return kernel.fn(g, qweight=qweight)
    return matmul_qt_reference(g, qweight=qweight)
