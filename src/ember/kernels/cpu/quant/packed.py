"""Products of many rows with a quantized weight on ember's packed GEMM (kernels.cpu.gemm).

A prompt's prefill and a training step multiply hundreds of rows by each weight: ``x @ W.T``
forward and, for QLoRA's input gradient, ``g @ W`` (op ``linear_q_t``). A quantized weight
keeps no float32 panels (they would be a float32 copy of the model), so each product decodes W,
a tile of at most TILE_WEIGHTS weights at a time (every projection of a small model in one),
straight into the panel layout of the GEMM's microkernels, then multiplies:

1. decode: two tasks per thread, each a run of rows of W (a multiple of PACK_ROWS) that it
   decodes (the format's one-thread row kernel) into a buffer of its own and copies into the
   shared panels: for ``x @ W.T`` the panels hold W's rows as columns (a transposing copy),
   for ``g @ W`` its rows as rows;
2. multiply: TASKS_PER_THREAD tasks per thread of MB_ROWS or more rows of x (or g; a few rows
   split the panels instead), each one call of the GEMM on the calling thread, straight into
   its rows of the result (with several tiles, summed or copied there).

Both are ``tiles.run_tiles`` tasks, handed out as threads free up, with no thread team that
spins or waits on a preempted thread. The microkernels use the CPU's full vector width
(AVX-512 here), whatever width numpy's BLAS was built or told (OPENBLAS_CORETYPE) to use.

``available()`` is False without numba or the microkernels; the callers then keep their BLAS
paths. The formats' references (``linear_reference``, ``matmul_qt_reference``) are what the
tests compare these with.
"""

from __future__ import annotations

import numpy as np

_F32 = np.float32
TILE_WEIGHTS = 1 << 20  # weights decoded into panels per tile (4 MiB float32)
PACK_ROWS = 64  # decode tasks take a multiple of this many rows of W (of every panel width)
MB_ROWS = 64  # rows of x (or g) per multiply task, at least
TASKS_PER_THREAD = 4  # multiply tasks per thread, at least (panels split when rows are few)
MIN_ROWS = 32  # fewer rows of x than this: decoding into panels costs more than it saves
_K: dict = {}


def available() -> bool:
    """Whether the packed GEMM's microkernels run here (numba, llvmlite, AVX2+FMA)."""
    from ember.kernels.cpu import gemm

    return gemm.microkernels_available()


def _pack_t_py(tile, pan, r0):  # pragma: no cover - compiled by numba
    """The tile's rows (rows r0.. of W, r0 a multiple of nr) as columns of the panels:
    pan[r // nr, :, r % nr] = W[r]. 16 values of a row at a time (twice as fast as a row)."""
    rows, k = tile.shape
    nr = pan.shape[2]
    k16 = k - k % 16
    for i0 in range(0, rows, nr):
        j = (r0 + i0) // nr
        nc = min(nr, rows - i0)
        for kb in range(0, k16, 16):
            for c in range(nc):
                for kk in range(16):
                    pan[j, kb + kk, c] = tile[i0 + c, kb + kk]
        for c in range(nc):
            for kk in range(k16, k):
                pan[j, kk, c] = tile[i0 + c, kk]


def _pack_py(tile, pan, r0):  # pragma: no cover - compiled by numba
    """Rows r0.. of W as rows of the panels: pan[p, r, :] = W[r, p * nr : (p + 1) * nr]."""
    rows, k = tile.shape
    panels, _, nr = pan.shape
    for i in range(rows):
        for p in range(panels):
            c0 = p * nr
            nc = min(nr, k - c0)
            for c in range(nc):
                pan[p, r0 + i, c] = tile[i, c0 + c]
            for c in range(nc, nr):
                pan[p, r0 + i, c] = 0.0


def _kernels() -> dict:
    if not _K:
        from ember.kernels.cpu import jit

        _K["t"] = jit(_pack_t_py)
        _K["n"] = jit(_pack_py)
    return _K


def _threads() -> int:
    import os

    from ember.threads import get_num_threads

    return max(1, min(get_num_threads(), os.cpu_count() or 1))


def _decode(fmt, w3, r0: int, r1: int, pan: np.ndarray, transpose: bool, threads: int) -> None:
    """Rows [r0, r1) of W into the panels (row r0 at panel row/column 0)."""
    from ember.kernels.cpu.quant._common import UNIT, f16_table
    from ember.kernels.cpu.tiles import run_tiles, scratch

    k = w3.shape[1] * fmt.block_size
    dq, lut = fmt._dq1, f16_table()
    pack = _kernels()["t" if transpose else "n"]

    # two tasks per thread, of a multiple of PACK_ROWS rows (a task costs ~10 us of Python)
    step = max(1, -(-(r1 - r0) // (2 * threads * PACK_ROWS))) * PACK_ROWS

    def task(i: int) -> None:
        a = r0 + i * step
        b = min(r1, a + step)
        t = scratch((b - a, k))
        dq(w3, lut, UNIT, a, b, t)
        pack(t, pan, a - r0)

    run_tiles(task, -(-(r1 - r0) // step), threads)


def _split(m: int, panels: int, threads: int) -> tuple[int, int]:
    """(rows of x, panels) per multiply task: MB_ROWS rows or more while there are
    TASKS_PER_THREAD tasks per thread; fewer rows than that (a short prompt) split the panels."""
    if threads == 1:
        return m, panels
    want = TASKS_PER_THREAD * threads
    mb = max(MB_ROWS, -(-m // want))
    groups = min(panels, -(-want // -(-m // mb)))
    return mb, -(-panels // groups)


def _multiply(a, lda: int, col0: int, kc: int, pan, m: int, o: int, out, add: bool, threads: int):
    """out[:, :o] (+)= A @ panels on run_tiles tasks; A[i, :] = a[i * lda + col0 : ... + kc]."""
    from ember.kernels.cpu import gemm
    from ember.kernels.cpu.tiles import run_tiles, scratch

    nr = pan.shape[2]
    mb, pg = _split(m, pan.shape[0], threads)
    nm, ng = -(-m // mb), -(-pan.shape[0] // pg)
    tap = np.zeros(1, np.int64)
    bias = np.zeros(pg * nr, _F32)
    rowoff = np.arange(m, dtype=np.int64) * lda + col0
    direct = not add and ng == 1 and out.flags.c_contiguous

    def task(i: int) -> None:
        mi, gi = divmod(i, ng)
        m0, m1 = mi * mb, min(m, mi * mb + mb)
        c0, c1 = gi * pg * nr, min(o, (gi + 1) * pg * nr)
        rows = rowoff[m0:m1]
        dst = out[m0:m1] if direct else scratch((m1 - m0, c1 - c0), 1)
        span = (m0 * lda + col0, (m1 - 1) * lda + col0)
        panels = pan[gi * pg : gi * pg + pg]
        gemm.gemm(a, rows, tap, kc, panels, bias, None, 0, dst, span, threads=1)
        if add:
            out[m0:m1, c0:c1] += dst
        elif not direct:
            out[m0:m1, c0:c1] = dst

    run_tiles(task, nm * ng, threads)


def _tile_rows(n: int, k: int, nr: int) -> int:
    return max(nr, min(n, TILE_WEIGHTS // max(k, 1)) // nr * nr)


def matmul_t(fmt, w3: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``x @ W.T`` for x (M, K) C-contiguous float32 and W the (N, blocks, bytes) QTensor view."""
    from ember.kernels.cpu import gemm
    from ember.kernels.cpu.tiles import scratch

    m, k = x.shape
    n = w3.shape[0]
    nr = gemm.panel_width()
    out = np.empty((m, n), _F32)
    if m == 0 or n == 0:
        return out
    threads = _threads()
    step = _tile_rows(n, k, nr)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        panels, rem = divmod(r1 - r0, nr)
        pan = scratch((panels + (rem > 0), k, nr), 2)
        if rem:
            pan[-1, :, rem:] = 0  # the last panel's padding columns
        _decode(fmt, w3, r0, r1, pan, True, threads)
        dst = out if r1 - r0 == n else out[:, r0:r1]
        _multiply(x.reshape(-1), k, 0, k, pan, m, r1 - r0, dst, False, threads)
    return out


def matmul_qt(fmt, g: np.ndarray, k: int, rows, align: int = 1) -> np.ndarray:
    """``g @ W`` for g (M, N) C-contiguous float32 and W (N, k) given by ``rows(r0, r1)``: its
    rows [r0, r1) as (r1 - r0, blocks, bytes) GGUF blocks, r0 a multiple of ``align`` (a view
    of the QTensor's blocks, or a weight's ``_panels`` unpacked a tile at a time)."""
    from ember.kernels.cpu import gemm
    from ember.kernels.cpu.tiles import scratch

    m, n = g.shape
    nr = gemm.panel_width()
    out = np.empty((m, k), _F32)
    if m == 0 or k == 0 or n == 0:
        out[...] = 0
        return out
    threads = _threads()
    step = max(1, min(n, TILE_WEIGHTS // max(k, 1)))
    step = max(align, step // align * align)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        pan = scratch((-(-k // nr), r1 - r0, nr), 2)
        w = rows(r0, r1)
        _decode(fmt, w if w.flags.c_contiguous else np.ascontiguousarray(w), 0, r1 - r0, pan,
                False, threads)  # fmt: skip
        _multiply(g.reshape(-1), n, r0, r1 - r0, pan, m, k, out, r0 > 0, threads)
    return out
