"""``y = x @ W.T`` for a weight W stored as GGUF blocks: kernel choice, references, fallbacks.

Paths, picked by :func:`matmul_t`:

* M == 1 (decode) with a numba kernel for the type (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K): a
  matrix-vector kernel that reads the packed bytes once and never decodes the matrix. Weights
  under SERIAL_MAX_BYTES run on the calling thread alone (waking a second thread costs more
  than it saves, and on a busy machine the caller may wait a whole time slice for it); bigger
  ones hand row chunks to numba's threads dynamically.
* 1 < M <= SMALL_M: the matrix-vector kernel once per row of x.
* M > SMALL_M (prefill), or a type without a kernel: tiles of rows are decoded into small
  float32 buffers (numba for the five types above, numpy otherwise) and multiplied by BLAS.
  With several threads, each thread takes the next tile (decode + single-threaded BLAS) until
  none are left, so a thread that the OS preempts delays one tile, not every product.
* F32 weights go straight to BLAS on a view of the bytes.

:func:`matmul_t_ref` is the pure-numpy reference every kernel is tested against and the
path used when numba cannot be imported. numba is imported on the first kernel call only.
"""

from __future__ import annotations

import os
import types

import numpy as np

from ember import config
from ember.errors import DTypeError, ShapeError
from ember.quant.formats import as_bytes, block_format, dequantize

KERNEL_TYPES: tuple[str, ...] = ("Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")
TILE_ELEMENTS = 1 << 20  # a single-threaded prefill tile holds about this many float32 weights
THREAD_TILE_BYTES = 1 << 19  # a tile of a multi-threaded prefill: decoded rows stay in L2
SMALL_M = 8  # up to this many rows of x, matmul_t runs the matrix-vector kernel per row
SERIAL_MAX_BYTES = 1 << 22  # below this weight size the matrix-vector kernel runs on one thread
DYNAMIC_MIN_BYTES = 1 << 21  # from this weight size on, row chunks are scheduled dynamically

_UNIT = np.ones(32, np.float32)  # see the note above the dq_* kernels
_numba_kernels = None  # the module, once imported; False when numba is unavailable
_f16_lut: np.ndarray | None = None


def f16_table() -> np.ndarray:
    """float32 value of every fp16 bit pattern (256 KiB), built on first use."""
    global _f16_lut
    if _f16_lut is None:
        _f16_lut = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    return _f16_lut


def numba_kernels():
    """The numba kernel module, or None when numba is not importable (or EMBER_NO_NUMBA=1)."""
    global _numba_kernels
    if _numba_kernels is None:
        if config.NO_NUMBA:
            _numba_kernels = False
        else:
            from ember.kernels.cpu import numba_or_none

            numba_or_none()  # sets the OpenMP wait policy before numba starts its workers
            try:
                from ember.quant import _numba_kernels as mod
            except ImportError:  # numba missing or broken: the numpy references take over
                mod = False
            _numba_kernels = mod
    return _numba_kernels or None


def _blocks3d(raw: np.ndarray, qtype: str, n: int, k: int) -> np.ndarray:
    """A (rows, blocks per row, bytes per block) view of the packed bytes (no copy)."""
    fmt = block_format(qtype)
    return raw.reshape(n, k // fmt.block_size, fmt.type_size)


def _check(raw: np.ndarray, qtype: str, shape: tuple[int, ...], x: np.ndarray, what: str):
    if len(shape) != 2:
        raise ShapeError(f"{what}: the weight must be 2-d (out_features, in_features), got {shape}")
    n, k = shape
    u8 = as_bytes(raw, qtype, shape, what)
    if not isinstance(x, np.ndarray) or x.ndim != 2 or x.shape[1] != k:
        got = getattr(x, "shape", type(x).__name__)
        raise ShapeError(f"{what}: x must be (M, {k}) to multiply a ({n}, {k}) weight, got {got}")
    if x.dtype.kind not in "fiu":
        raise DTypeError(f"{what}: x must hold real numbers, got dtype {x.dtype}")
    return u8, n, k, np.ascontiguousarray(x, dtype=np.float32)


def matmul_t_ref(raw: np.ndarray, qtype: str, shape: tuple[int, int], x: np.ndarray) -> np.ndarray:
    """Reference ``x @ W.T``: decode tiles of W with numpy, multiply each with BLAS."""
    fmt = block_format(qtype)
    u8, n, k, x = _check(raw, fmt.name, tuple(shape), x, f"matmul_t_ref({fmt.name})")
    out = np.empty((x.shape[0], n), np.float32)
    if out.size == 0:
        return out
    if k == 0:
        out[:] = 0
        return out
    if fmt.name == "F32":
        return np.matmul(x, u8.view(np.float32).reshape(n, k).T, out=out)
    row_bytes = k // fmt.block_size * fmt.type_size
    rows = u8.reshape(n, row_bytes)
    tile = max(1, TILE_ELEMENTS // k)
    for r0 in range(0, n, tile):
        r1 = min(n, r0 + tile)
        w = dequantize(rows[r0:r1], fmt.name, (r1 - r0, k))
        out[:, r0:r1] = x @ w.T
    return out


def serial_kernel(mod, table: str, qtype: str):
    """A single-threaded copy of ``mod.<table>[qtype]`` (no thread pool involved), compiled once.

    numba's on-disk cache tells functions apart by qualified name, so the copy gets its own.
    """
    key = (table, qtype)
    k = _serial.get(key)
    if k is None:
        import numba

        par = getattr(mod, table)[qtype]
        f = par.py_func
        g = types.FunctionType(f.__code__, f.__globals__, f.__name__ + "_serial", f.__defaults__,
                               f.__closure__)  # fmt: skip
        g.__qualname__ = f.__qualname__ + "_serial"
        opts = {k: v for k, v in par.targetoptions.items() if k not in ("parallel", "nopython")}
        k = _serial[key] = numba.njit(cache=True, **opts)(g)
    return k


_serial: dict = {}


def matvec_blocks(mod, w3: np.ndarray, qtype: str, x: np.ndarray) -> np.ndarray:
    """Unchecked kernel call: w3 is the (N, blocks, bytes) view, x float32 of length K."""
    import numba  # already imported by the time a kernel module exists: a dict lookup

    n, nb, _ = w3.shape
    y = np.empty(n, np.float32)
    xb = x.reshape(nb, -1)
    threads = numba.get_num_threads()
    if threads == 1 or w3.nbytes < SERIAL_MAX_BYTES:
        # One thread: a team of one wakes no worker. (The parallel kernel, not a serial copy:
        # numba marks a parallel body's arrays noalias, and LLVM vectorizes it 15% better.)
        if threads > 1:
            numba.set_num_threads(1)
        try:
            mod.MATVEC[qtype](w3, f16_table(), xb, y, n)
        finally:
            if threads > 1:
                numba.set_num_threads(threads)
        return y
    chunk = max(4, -(-n // (8 * threads)))  # about 8 row chunks per thread
    if w3.nbytes < DYNAMIC_MIN_BYTES:
        mod.MATVEC[qtype](w3, f16_table(), xb, y, chunk)
        return y
    # Hand row chunks out one at a time so that a core busy with something else does not
    # hold back the whole product (static halves would wait for the slower core).
    old = numba.set_parallel_chunksize(1)
    try:
        mod.MATVEC[qtype](w3, f16_table(), xb, y, chunk)
    finally:
        numba.set_parallel_chunksize(old)
    return y


def matvec(raw: np.ndarray, qtype: str, shape: tuple[int, int], x: np.ndarray) -> np.ndarray:
    """``W @ x`` for one vector x of length K, by the numba kernel of ``qtype`` (shape (N,))."""
    fmt = block_format(qtype)
    x = np.asarray(x)
    u8, n, k, x2 = _check(raw, fmt.name, tuple(shape), x.reshape(1, -1), f"matvec({fmt.name})")
    mod = numba_kernels()
    if mod is None or fmt.name not in KERNEL_TYPES or n == 0 or k == 0:
        return matmul_t_ref(u8, fmt.name, (n, k), x2)[0]
    return matvec_blocks(mod, _blocks3d(u8, fmt.name, n, k), fmt.name, x2[0])


def dequantize_rows(raw: np.ndarray, qtype: str, shape: tuple[int, int], r0: int, r1: int,
                    out: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Rows ``[r0, r1)`` of W as float32 (numba where it has a kernel, numpy otherwise)."""
    fmt = block_format(qtype)
    n, k = shape
    u8 = as_bytes(raw, fmt.name, shape, f"dequantize_rows({fmt.name})")
    if not 0 <= r0 <= r1 <= n:
        raise ShapeError(f"dequantize_rows: row range [{r0}, {r1}) outside 0..{n}")
    if out is None:
        out = np.empty((r1 - r0, k), np.float32)
    elif out.shape != (r1 - r0, k) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ShapeError(
            f"dequantize_rows: out must be a C-contiguous float32 array of shape "
            f"{(r1 - r0, k)}, got {out.dtype} {out.shape}"
        )
    mod = numba_kernels()
    if mod is not None and fmt.name in KERNEL_TYPES and r1 > r0 and k > 0:
        mod.DEQUANT_ROWS[fmt.name](_blocks3d(u8, fmt.name, n, k), f16_table(), _UNIT, r0, r1, out)
        return out
    row_bytes = k // fmt.block_size * fmt.type_size
    rows = u8.reshape(n, row_bytes)[r0:r1]
    out[...] = dequantize(rows, fmt.name, (r1 - r0, k))
    return out


def matmul_t(raw: np.ndarray, qtype: str, shape: tuple[int, int], x: np.ndarray) -> np.ndarray:
    """``x @ W.T`` for x of shape (M, K) and W of logical shape (N, K) in ``qtype`` blocks."""
    fmt = block_format(qtype)
    u8, n, k, x = _check(raw, fmt.name, tuple(shape), x, f"matmul_t({fmt.name})")
    m = x.shape[0]
    mod = numba_kernels()
    if mod is None or fmt.name not in KERNEL_TYPES or n == 0 or k == 0 or m == 0:
        return matmul_t_ref(u8, fmt.name, (n, k), x)
    w3 = _blocks3d(u8, fmt.name, n, k)
    out = np.empty((m, n), np.float32)
    if m <= SMALL_M:  # a few rows: one bandwidth-bound pass over the packed weight per row
        for i in range(m):
            out[i] = matvec_blocks(mod, w3, fmt.name, x[i])
        return out
    # Prefill: decode tiles of rows into small float32 buffers and let BLAS multiply them. The
    # threads take tiles in turn, each decoding (numba, no GIL) and multiplying (one-thread
    # BLAS): OpenBLAS's own threads spin-wait, and on a busy machine one product then costs 7x.
    from ember.kernels.cpu.tiles import run_tiles, scratch
    from ember.threads import get_num_threads

    dq = _serial.get(("DEQUANT_ROWS", fmt.name)) or serial_kernel(mod, "DEQUANT_ROWS", fmt.name)
    threads = min(get_num_threads(), os.cpu_count() or 1)
    if threads > 1:
        rows = max(16, THREAD_TILE_BYTES // (4 * k) // 16 * 16)
    else:
        rows = max(1, TILE_ELEMENTS // k)
    lut = f16_table()

    def tile(i: int) -> None:  # decode rows [r0, r1) and multiply them
        r0, r1 = i * rows, min(n, i * rows + rows)
        w = scratch((r1 - r0, k))
        dq(w3, lut, _UNIT, r0, r1, w)
        np.matmul(x, w.T, out=out[:, r0:r1])

    run_tiles(tile, -(-n // rows), threads)
    return out
