"""The transposed quantized product ``g @ W`` (the input gradient of ``x @ W.T``), op ``linear_q_t``.

Training adapters on a quantized base (QLoRA) sends every backward pass through ``g @ W`` with
W a QTensor of shape (N, K) and g the output gradient (M, N). W is never decoded whole unless it
fits one tile: a tile of rows at a time is dequantized into a reused float32 buffer (the format's
numba row kernel) and multiplied by BLAS, accumulating into the (M, K) result; the extra memory
is one tile and one partial product per thread, whatever the size of W.

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
# weights decoded per tile (a 4 MiB float32 buffer per thread): every projection of a small
# model (SmolLM2-135M's largest is 1536 x 576) decodes in one tile, and its product needs no sum
TILE_ELEMENTS = 1 << 20
TASKS_PER_THREAD = 2  # blocks of g's rows per thread (tasks are handed out as threads free up)
MIN_TASK_ROWS = 64  # ... of at least this many rows, so that each BLAS product stays efficient


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


def _plan(m: int, n: int, k: int, threads: int) -> tuple[int, int]:
    """(rows of g per task, rows of W per decoded tile) for g (m, n) @ W (n, k)."""
    tile = max(1, min(n, TILE_ELEMENTS // max(k, 1)))
    if threads == 1:
        return m, tile
    per = -(-m // (TASKS_PER_THREAD * threads))
    return max(MIN_TASK_ROWS, -(-per // 16) * 16), tile


def matmul_qt_tiled(g: np.ndarray, *, qweight) -> np.ndarray:
    """``g @ W`` on ember's threads: each task takes a block of g's rows and runs down W a tile of
    rows at a time, decoding the tile (the format's one-thread numba kernel) into a buffer of its
    own and adding its BLAS product (BLAS on one thread) into its block of the result.

    The tasks are handed out one at a time (``tiles.run_tiles``): a thread that the OS preempts
    holds back one task, and no thread spins waiting for it. Every task decodes all of W
    (decoding runs at about 20 G weights/s, 2-3% of the products' time); a task's block of the
    result is written by it alone, so nothing is summed across threads.
    """
    g = _check(g, qweight, "matmul_qt")
    registry.kernels("linear_q")  # imports the format modules (they fill FORMATS)
    fmt = FORMATS[qweight.qtype]
    n, k = (int(s) for s in qweight.shape)
    m = g.shape[0]
    if m == 0 or k == 0 or n == 0:
        return np.zeros((m, k), F32)
    from ember.kernels.cpu.quant import _panels

    panels = _panels_only(qweight)
    if panels is None:
        w3 = qweight.blocks3d()
        return _matmul_qt_tiled(fmt, g, m, n, k, lambda r0, r1: w3[r0:r1], 1)
    # decoded from the panels the forward runs on, a tile at a time: ``data`` would keep a
    # second copy of a weight held only as panels, and a memory-mapped one would fault its
    # pages back in (QLoRA on the bundled model peaked at 555 MiB instead of 475)
    qtype, nb = qweight.qtype, k // fmt.block_size
    rows = lambda r0, r1: _panels.unpack_rows(panels, qtype, nb, r0, r1)  # noqa: E731
    return _matmul_qt_tiled(fmt, g, m, n, k, rows, _panels.ROWS)


def _panels_only(qweight) -> np.ndarray | None:
    """The panels a weight's forward runs on when its GGUF bytes are not in memory (held only
    as panels, or memory-mapped pages given back), else None."""
    from ember.memory import file_backed

    packed, data = qweight._packed, qweight._data
    if packed is None or (data is not None and (packed[0] is not data or not file_backed(data))):
        return None
    return packed[1]


def _matmul_qt_tiled(fmt, g: np.ndarray, m: int, n: int, k: int, rows, align: int) -> np.ndarray:
    """g @ W with W's rows [r0, r1) as (r1 - r0, blocks, bytes) from ``rows`` (r0 a multiple
    of ``align``)."""
    import os

    from ember.kernels.cpu.quant import packed
    from ember.kernels.cpu.quant._common import UNIT, f16_table
    from ember.kernels.cpu.tiles import run_tiles, scratch
    from ember.threads import get_num_threads

    out = np.empty((m, k), F32)
    g32 = np.ascontiguousarray(g, dtype=F32)
    if m >= packed.MIN_ROWS and packed.available():
        return packed.matmul_qt(fmt, g32, k, rows, align)  # the packed GEMM's microkernels
    threads = max(1, min(get_num_threads(), os.cpu_count() or 1))
    mrows, step = _plan(m, n, k, threads)
    step = max(align, step // align * align)
    dq, lut = fmt._dq1, f16_table()

    def task(i: int) -> None:
        m0, m1 = i * mrows, min(m, i * mrows + mrows)
        o = out[m0:m1]
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            t = scratch((r1 - r0, k))
            w = rows(r0, r1)
            dq(w if w.flags.c_contiguous else np.ascontiguousarray(w), lut, UNIT, 0, r1 - r0, t)
            if r0 == 0:
                np.matmul(g32[m0:m1, r0:r1], t, out=o)
            else:
                part = scratch((m1 - m0, k), 1)
                np.matmul(g32[m0:m1, r0:r1], t, out=part)
                o += part

    run_tiles(task, -(-m // mrows), threads)
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
