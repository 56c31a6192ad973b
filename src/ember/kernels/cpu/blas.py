"""BLAS products on threads ember chooses: the ``linear`` op on plain float32 weights and the
``gemm`` op (the 2-d products of ``Linear``'s backward).

Left to itself, numpy's BLAS (OpenBLAS) runs every product above about 2^18 multiply-adds on
its own thread team. Its threads spin-wait between calls, and each call waits for its slowest
thread: with another process holding one of two cores, a QLoRA training step (about 1300 such
products: the adapters' rank-8 products and their gradients) took 90 s instead of 3.5. Here

- a product of fewer than TILED_WORK multiply-adds runs on the calling thread, BLAS on one
  thread (a rank-8 adapter's product is 2.4M multiply-adds: 50 us, less than a team costs);
- a larger one is cut into blocks of rows (of columns when it has fewer rows than columns),
  views of the operands and of the result, which the threads of ``tiles.run_tiles`` take in
  turn, one one-thread BLAS call each: a preempted thread holds back one block, and nobody
  spins waiting for it.

The references are numpy's own products.
"""

from __future__ import annotations

import numpy as np

from ember.kernels.cpu import gemm  # noqa: F401  (registers the packed GEMM first: tried first)
from ember.kernels.registry import register

_F32 = np.dtype(np.float32)
SERIAL_WORK = 1 << 18  # below this many multiply-adds OpenBLAS stays on the calling thread
TILED_WORK = 1 << 23  # from this many on, blocks on ember's threads (about 0.1 ms on one core)
BLOCK_WORK = 1 << 22  # multiply-adds per block, at most (and two blocks per thread at least)
MIN_BLOCK = 16  # rows or columns per block, at least
MIN_ROWS = 16  # the linear kernel takes products of this many rows of x or more


def gemm_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b for 2-d arrays (numpy's BLAS, as it threads itself)."""
    return np.matmul(a, b)


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """a @ b for 2-d float32 a (M, K) and b (K, N), any strides, on the threads chosen above."""
    from ember.threads import blas_single_thread, get_num_threads

    m, k = a.shape
    n = b.shape[1]
    if out is None:
        out = np.empty((m, n), _F32)
    work = m * n * k
    if work < SERIAL_WORK:
        return np.matmul(a, b, out=out)
    threads = get_num_threads()
    if work < TILED_WORK or threads == 1:
        with blas_single_thread():
            return np.matmul(a, b, out=out)
    from ember.kernels.cpu.tiles import run_tiles

    rows = m >= n
    size = m if rows else n
    blocks = max(2 * threads, -(-work // BLOCK_WORK))
    step = max(MIN_BLOCK, -(-size // blocks))

    def block(i: int) -> None:
        s = slice(i * step, min(size, i * step + step))
        if rows:
            np.matmul(a[s], b, out=out[s])
        else:
            np.matmul(a, b[:, s], out=out[:, s])

    run_tiles(block, -(-size // step), threads)
    return out


def _gemm_applies(a, b) -> bool:
    return a.ndim == 2 and b.ndim == 2 and a.shape[1] == b.shape[0]


@register("gemm", reference=gemm_reference, when=_gemm_applies)
def gemm_tiled(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b (float32, 2-d) with the threads of ``matmul``."""
    return matmul(a, b)


def linear_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """x @ w.T + b over the last dim of x (numpy)."""
    out = np.matmul(x, np.asarray(w).T)
    return out if b is None else out + b


def _linear_applies(x, w, b=None) -> bool:
    # a packed weight runs its own GEMM (kernels.cpu.gemm, registered first) where it can; a
    # few rows (a decode step's matrix-vector products, bound by reading the weight) keep
    # numpy's BLAS as it threads itself
    return (
        w.ndim == 2 and x.ndim >= 1 and x.shape[-1] == w.shape[1]
        and (b is None or b.shape == (w.shape[0],))
        and x.size >= MIN_ROWS * w.shape[1] and x.size * w.shape[0] >= SERIAL_WORK
    )  # fmt: skip


@register("linear", reference=linear_reference, when=_linear_applies)
def linear_blas(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """x @ w.T + b (float32) with the threads of ``matmul``."""
    n, k = w.shape
    lead = x.shape[:-1]
    out = matmul(x.reshape(-1, k), w.T)
    if b is not None:
        out += b
    return out.reshape(lead + (n,))
