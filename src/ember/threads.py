"""One thread setting for BLAS (through threadpoolctl) and numba kernels together."""

from __future__ import annotations

import contextlib
import os

_threads: int | None = None
_limiter = None
_blas_libs: list | None = None


def set_num_threads(n: int) -> None:
    """Use n threads in BLAS and in numba kernels (default: the machine's cores)."""
    global _threads, _limiter
    if n < 1:
        raise ValueError(f"set_num_threads: n must be >= 1, got {n}")
    _threads = int(n)
    from threadpoolctl import threadpool_limits

    _limiter = threadpool_limits(limits=_threads)
    import sys

    if "numba" in sys.modules:
        apply_numba_threads()
    pool = sys.modules.get("ember.kernels.cpu.pool")
    if pool is not None:
        pool.reconfigure()


def apply_numba_threads() -> None:
    """Give numba the thread count set here (kernels call this once numba is imported)."""
    if _threads is None:
        return
    import numba

    numba.set_num_threads(min(_threads, numba.config.NUMBA_NUM_THREADS))


def get_num_threads() -> int:
    """Threads ember's kernels use."""
    return _threads or os.cpu_count() or 1


@contextlib.contextmanager
def blas_single_thread():
    """numpy's BLAS on one thread inside the block (when ember's own threads, or none, should run)."""
    global _blas_libs
    if _blas_libs is None:
        try:
            from threadpoolctl import ThreadpoolController

            _blas_libs = ThreadpoolController().select(user_api="blas").lib_controllers
        except Exception:  # noqa: BLE001 - no threadpoolctl/BLAS info: leave BLAS alone
            _blas_libs = []
    libs = [c for c in _blas_libs if c.get_num_threads() != 1]
    saved = [c.get_num_threads() for c in libs]
    for c in libs:
        c.set_num_threads(1)
    try:
        yield
    finally:
        for c, n in zip(libs, saved):
            c.set_num_threads(n)
