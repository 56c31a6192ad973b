"""A "parallel for" over tiles for kernels that mix numba (nogil) passes and BLAS products.

``run_tiles(fn, ntiles)`` calls ``fn(i)`` for every tile: the caller and ``threads - 1`` helper
threads each take the next tile number until none are left, so a thread that the OS preempts (a
busy machine) delays one tile, not a whole barrier. numpy's BLAS runs on one thread meanwhile:
OpenBLAS's own workers spin-wait between calls, and on a machine with as many threads as cores
they would take the core the next tile needs.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import numpy as np

from ember.threads import blas_single_thread

_pool = None
_local = threading.local()


def scratch(shape: tuple[int, ...], slot: int = 0) -> np.ndarray:
    """A float32 work buffer of this shape, private to the calling thread and reused by it.

    ``slot`` tells apart buffers a tile uses at the same time (slot 0: the decoded weights,
    slot 1: a product to add up, ...).
    """
    n = 1
    for s in shape:
        n *= s
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    buf = bufs.get(slot)
    if buf is None or buf.size < n:
        buf = bufs[slot] = np.empty(max(n, 1), np.float32)
    return buf[:n].reshape(shape)


def _executor(helpers: int):
    """A process-wide pool of at least ``helpers`` helper threads."""
    global _pool
    if _pool is None or _pool._max_workers < helpers:
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(max(1, helpers), thread_name_prefix="ember-tiles")
    return _pool


def run_tiles(fn: Callable[[int], None], ntiles: int, threads: int | None = None) -> None:
    """fn(i) for i in range(ntiles) on up to ``threads`` threads (default: ember's setting).

    fn must release the GIL for its heavy part (numba nogil kernels, BLAS) and write disjoint
    outputs. The first error raised by a tile is raised here once all threads have stopped.
    """
    if threads is None:
        from ember.threads import get_num_threads

        threads = get_num_threads()
    threads = max(1, min(threads, ntiles))
    with blas_single_thread():
        if threads == 1:
            for i in range(ntiles):
                fn(i)
            return
        counter = itertools.count()  # next() is atomic under the GIL

        def work() -> None:
            while (i := next(counter)) < ntiles:
                fn(i)

        futures = [_executor(threads - 1).submit(work) for _ in range(threads - 1)]
        try:
            work()
        finally:
            for f in futures:
                f.result()
