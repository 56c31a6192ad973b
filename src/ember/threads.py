"""One thread setting for BLAS (through threadpoolctl) and numba kernels together."""

from __future__ import annotations

import os

_threads: int | None = None
_limiter = None


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


def apply_numba_threads() -> None:
    """Give numba the thread count set here (kernels call this once numba is imported)."""
    if _threads is None:
        return
    import numba

    numba.set_num_threads(min(_threads, numba.config.NUMBA_NUM_THREADS))


def get_num_threads() -> int:
    """Threads ember's kernels use."""
    return _threads or os.cpu_count() or 1
