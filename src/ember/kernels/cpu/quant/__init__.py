"""Quantized kernels, one module per GGUF block format, behind the ``linear_q`` op.

``q8_0``, ``q4_0``, ``q4_1``, ``q4_k``, ``q5_k``, ``q6_k``: each holds its numba bodies
(matrix-vector, row dequantization) and its numpy reference, bundled in a
``_common.QuantKernels`` (which adds the small-batch and prefill paths) and registered as ``linear_<format>`` for the ``linear_q`` op (the
``QLinear`` Function of ``ember.ops.linalg``) under "the weight is a 2-d QTensor of this
format, x is float32". What they share (checks, f16 table, the threading split, the prefill
tiles, the references) is in ``_common``.

:func:`matmul_t` and :func:`dequantize_rows` serve ``QTensor.matmul_t`` and
``QTensor.dequantize_rows``: the same kernels, picked by the same registry.
"""

from __future__ import annotations

import numpy as np

from ember import config
from ember.errors import DTypeError, ShapeError
from ember.kernels import registry

KERNEL_TYPES: tuple[str, ...] = ("Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")
_F32 = np.dtype(np.float32)


def matmul_t(qweight, x: np.ndarray) -> np.ndarray:
    """``x @ W.T`` for a 2-d QTensor W and x of shape (..., K): float32 (..., N).

    The ``linear_q`` kernel that applies runs (as ``F.linear`` would pick it), else the numpy
    reference.
    """
    if len(qweight.shape) != 2:
        raise ShapeError(f"QTensor.matmul_t: needs a 2-d weight, this one is {qweight.shape}")
    n, k = qweight.shape
    if type(x) is not np.ndarray or x.dtype != _F32:
        x = np.asarray(x)
        if x.dtype.kind not in "fiub":
            raise DTypeError(f"QTensor.matmul_t: x must be real, got dtype {x.dtype}")
        x = x.astype(_F32)
    if x.ndim == 0 or x.shape[-1] != k:
        raise ShapeError(
            f"QTensor.matmul_t: x of shape {x.shape} does not fit a ({n}, {k}) weight "
            f"(x @ W.T needs x.shape[-1] == {k})"
        )
    kw = {"qweight": qweight}
    kernel = registry.pick("linear_q", "cpu", (x,), kw)
    if kernel is not None:
        return kernel.fn(x, qweight=qweight)
    from ember.kernels.cpu.quant._common import linear_reference

    return linear_reference(x, qweight=qweight)


def invariant_rows(qweight) -> int:
    """Up to how many rows of x each row of ``x @ W.T`` is bitwise that row's product alone.

    The ``_idot`` formats carry up to ``_idot.MAX_M`` rows through one kernel that treats each
    row as it would alone; the others run one matrix-vector pass per row up to ``SMALL_M``.
    """
    from ember.kernels.cpu.quant import _idot
    from ember.kernels.cpu.quant._common import FORMATS, SMALL_M

    registry.kernels("linear_q")  # imports the format modules (they fill FORMATS)
    fmt = FORMATS.get(qweight.qtype)
    if fmt is not None and config.KERNELS != "reference" and fmt.small_kernel():
        return _idot.MAX_M
    return SMALL_M


def invariant_at_any_rows(qweight) -> bool:
    """Whether each row of ``x @ W.T`` is bitwise that row's product alone however many rows x
    has (the panel kernels, ``_pdot``: a prompt's rows too, not only a decode batch's)."""
    from ember.kernels.cpu.quant._common import FORMATS

    registry.kernels("linear_q")  # imports the format modules (they fill FORMATS)
    fmt = FORMATS.get(qweight.qtype)
    return fmt is not None and config.KERNELS != "reference" and fmt.panel_dot()


def stack(qweights: list):
    """One 2-d QTensor of the rows of QTensors of one format and width (``inference.stack``'s
    q/k/v and gate/up): only the kernels' panels where products run on panels (no GGUF-order
    copy), else the concatenated blocks."""
    from ember.kernels.cpu.quant import _panels
    from ember.kernels.cpu.quant._common import FORMATS
    from ember.quant.qtensor import QTensor

    registry.kernels("linear_q")  # imports the format modules (they fill FORMATS)
    q0 = qweights[0]
    fmt = FORMATS.get(q0.qtype)
    if fmt is not None and config.KERNELS != "reference" and fmt.panel_dot():
        return _panels.stacked(qweights)
    data = np.concatenate([w.data.reshape(w.shape[0], -1) for w in qweights])
    return QTensor(data, q0.qtype, (sum(w.shape[0] for w in qweights), q0.shape[1]))


def unpacked(qweight) -> np.ndarray:
    """The GGUF blocks of a QTensor that holds only a kernel's copy (``QTensor.packed_only``)."""
    from ember.kernels.cpu.quant import _panels

    return _panels.unpacked(qweight)


def dequantize_rows(qweight, r0: int, r1: int, out: np.ndarray | None = None) -> np.ndarray:
    """Rows ``[r0, r1)`` of a 2-d QTensor as float32, by its format's kernel where it has one."""
    from ember.kernels.cpu.quant._common import FORMATS

    if len(qweight.shape) != 2:
        raise ShapeError(f"dequantize_rows: needs a 2-d weight, this one is {qweight.shape}")
    registry.kernels("linear_q")  # imports the format modules (they fill FORMATS)
    fmt = FORMATS.get(qweight.qtype)
    n, k = qweight.shape
    if fmt is not None and config.KERNELS != "reference":
        return fmt.dequantize_rows(qweight.blocks3d(), r0, r1, out)
    from ember.quant.formats import dequantize

    r0, r1 = int(r0), int(r1)
    if not 0 <= r0 <= r1 <= n:
        raise ShapeError(f"dequantize_rows: row range [{r0}, {r1}) outside 0..{n}")
    w3 = qweight.blocks3d()[r0:r1]
    rows = dequantize(w3.reshape(r1 - r0, w3.shape[1] * w3.shape[2]), qweight.qtype, (r1 - r0, k))
    if out is None:
        return rows
    if out.shape != rows.shape or out.dtype != _F32:
        raise ShapeError(
            f"dequantize_rows: out must be a float32 array of shape {rows.shape}, "
            f"got {out.dtype} {out.shape}"
        )
    out[...] = rows
    return out
