"""A small "parallel for" for fused inference: helper threads + the caller share a task counter.

Fused layers cut their work into blocks (rows of output pixels, or column slices of a GEMM) and
run ``pool.run(fn, ntasks)``: every thread takes the next block number until none are left, so a
thread that the OS preempts (a busy machine) delays one block, not a whole barrier. Each block
calls single-threaded BLAS (``blas_single_thread``) and numba kernels compiled with nogil, so the
threads really run at once and there is one thread pool in play instead of BLAS's plus numba's.
"""

from __future__ import annotations

import itertools
import threading
from contextlib import contextmanager

_POOLS: dict = {}
_LOCK = threading.Lock()
_BLAS = None


class _Job:
    def __init__(self, fn, ntasks: int) -> None:
        self.fn, self.ntasks = fn, ntasks
        self.counter = itertools.count()
        self.done = 0
        self.lock = threading.Lock()
        self.finished = threading.Event()
        self.error: BaseException | None = None

    def work(self) -> None:
        while True:
            i = next(self.counter)  # atomic under the GIL
            if i >= self.ntasks:
                return
            try:
                self.fn(i)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller
                self.error = self.error or e
            with self.lock:
                self.done += 1
                if self.done == self.ntasks:
                    self.finished.set()


class WorkerPool:
    """n threads in all (n - 1 helpers + the caller) running the blocks of one job at a time."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._cv = threading.Condition()
        self._job: _Job | None = None
        self._gen = 0
        for k in range(n - 1):
            threading.Thread(target=self._helper, name=f"ember-fuse-{k}", daemon=True).start()

    def _helper(self) -> None:
        seen = 0
        while True:
            with self._cv:
                while self._gen == seen:
                    self._cv.wait()
                seen, job = self._gen, self._job
            if job is not None:
                job.work()

    def run(self, fn, ntasks: int) -> None:
        """fn(i) for i in range(ntasks), spread over the pool; re-raises the first error."""
        if ntasks <= 0:
            return
        if self.n == 1 or ntasks == 1:
            for i in range(ntasks):
                fn(i)
            return
        job = _Job(fn, ntasks)
        with self._cv:
            self._job = job
            self._gen += 1
            self._cv.notify_all()
        job.work()
        job.finished.wait()
        if job.error is not None:
            raise job.error


def get_pool() -> WorkerPool:
    """The pool for ember's current thread count (ember.set_num_threads)."""
    from ember.threads import get_num_threads

    n = max(1, get_num_threads())
    pool = _POOLS.get(n)
    if pool is None:
        with _LOCK:
            pool = _POOLS.get(n) or WorkerPool(n)
            _POOLS[n] = pool
    return pool


def _numpy_blas() -> list:
    global _BLAS
    if _BLAS is None:
        try:
            from threadpoolctl import ThreadpoolController

            libs = ThreadpoolController().select(user_api="blas").lib_controllers
            _BLAS = [c for c in libs if "numpy" in c.filepath] or list(libs)
        except Exception:  # noqa: BLE001 - no threadpoolctl/BLAS info: leave BLAS alone
            _BLAS = []
    return _BLAS


@contextmanager
def blas_single_thread():
    """numpy's BLAS on one thread inside the block (the pool supplies the parallelism)."""
    libs = [c for c in _numpy_blas() if c.get_num_threads() != 1]
    saved = [c.get_num_threads() for c in libs]
    for c in libs:
        c.set_num_threads(1)
    try:
        yield
    finally:
        for c, n in zip(libs, saved):
            c.set_num_threads(n)
