"""ember's worker pool (ember.kernels.cpu.pool): results that do not depend on who ran them.

The pool's jobs are the _idot products: every split (one chunk, chunks of two rows), thread
count, solo run and forked child must give bitwise the product of one thread, and a worker must
actually take part when there is one.
"""

import os
import time

import numpy as np
import pytest

import ember
from ember.kernels.cpu import pool
from ember.kernels.cpu.quant import _idot
from tests.helpers import threads_set
from tests.quant.conftest import random_blocks

pytestmark = pytest.mark.skipif(_idot.state() is None, reason="no AVX2 / llvmlite here")


def _operands(rng, m, n=75, k=96, qtype="Q4_1"):
    bs = _idot.SPECS[qtype][1]
    w3 = random_blocks(rng, qtype, n * k // 32).reshape(n, k // 32, bs)
    x = rng.standard_normal((m, k)).astype(np.float32)
    return w3, x


def _product(qtype, w3, x):
    y = np.empty((x.shape[0], w3.shape[0]), np.float32)
    _idot.product(qtype, w3, x, y)
    return y


def test_splits_and_threads_agree_bitwise(monkeypatch):
    rng = np.random.default_rng(0)
    for qtype in _idot.SPECS:
        for m in (1, 3, 4, 9, 40, 130):  # one group of x rows, several, more than a job carries
            w3, x = _operands(rng, m, qtype=qtype)
            with threads_set(1):
                monkeypatch.setattr(_idot, "CHUNK_BYTES", 1 << 40)
                want = _product(qtype, w3, x)
            for threads in (1, 2):
                with threads_set(threads):
                    for chunk_bytes in (1, 700, 1 << 40):  # chunks of 2 rows, a few, one
                        monkeypatch.setattr(_idot, "CHUNK_BYTES", chunk_bytes)
                        got = _product(qtype, w3, x)
                        np.testing.assert_array_equal(got, want, err_msg=f"{qtype} M={m}")


def test_a_worker_takes_part():
    rng = np.random.default_rng(1)
    w3, x = _operands(rng, 4, n=4000, k=576)
    with threads_set(2):
        want = _product("Q4_1", w3, x)
        before = pool.stats()["worker_jobs"]
        deadline = time.monotonic() + 20
        while pool.stats()["worker_jobs"] == before and time.monotonic() < deadline:
            np.testing.assert_array_equal(_product("Q4_1", w3, x), want)
        assert pool.stats()["worker_jobs"] > before
        assert pool.stats()["workers"] == 1


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux CPU affinity and two CPUs",
)
def test_a_worker_leaves_its_masters_cpu():
    rng = np.random.default_rng(2)
    w3, x = _operands(rng, 4, n=4000, k=576)
    allowed = os.sched_getaffinity(0)
    cpu = min(allowed)
    with threads_set(2):
        want = _product("Q4_1", w3, x)
        worker = pool.state()["threads"][0].native_id
        os.sched_setaffinity(0, {cpu})  # the calling thread only
        try:
            os.sched_setaffinity(worker, {cpu})  # both on one CPU: the worker must move
            deadline = time.monotonic() + 20
            while cpu in os.sched_getaffinity(worker) and time.monotonic() < deadline:
                np.testing.assert_array_equal(_product("Q4_1", w3, x), want)
                time.sleep(0.001)
            assert os.sched_getaffinity(worker) == allowed - {cpu}
        finally:
            os.sched_setaffinity(0, allowed)
            os.sched_setaffinity(worker, allowed)


def test_solo_jobs_run_on_the_caller_alone():
    rng = np.random.default_rng(2)
    w3, x = _operands(rng, 5, n=501, qtype="Q4_0")
    with threads_set(2):
        want = _product("Q4_0", w3, x)
        ctrl = pool.ctrl()
        ctrl[pool.SOLO] = 3  # as after a long wait for a preempted worker
        jobs = pool.stats()["jobs"]
        for _ in range(3):
            np.testing.assert_array_equal(_product("Q4_0", w3, x), want)
        assert ctrl[pool.SOLO] == 0 and pool.stats()["jobs"] == jobs  # nothing published
        np.testing.assert_array_equal(_product("Q4_0", w3, x), want)
        assert pool.stats()["jobs"] == jobs + 1


def test_thread_count_follows_set_num_threads():
    old = ember.get_num_threads()
    try:
        ember.set_num_threads(1)
        pool.ctrl()
        assert pool.stats()["workers"] == 0
        ember.set_num_threads(2)
        pool.ctrl()
        assert pool.stats()["workers"] == min(2, os.cpu_count() or 1) - 1
    finally:
        ember.set_num_threads(old)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_computes_without_its_parents_workers():
    rng = np.random.default_rng(3)
    w3, x = _operands(rng, 6, n=300, qtype="Q8_0")
    with threads_set(2):
        want = _product("Q8_0", w3, x)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: the parent's worker threads are not here
            try:
                ok = np.array_equal(_product("Q8_0", w3, x), want)
                pool.ctrl()  # starts the child's own worker
                ok = ok and np.array_equal(_product("Q8_0", w3, x), want)
                os.write(w, b"1" if ok else b"0")
            finally:
                os._exit(0)
        os.close(w)
        got = os.read(r, 1)
        os.waitpid(pid, 0)
        os.close(r)
    assert got == b"1"


def test_products_from_several_python_threads_never_mix():
    """Threads calling products at once: one holds the pool's job block, the others run their
    jobs alone on blocks of their own; every result is the one-thread product."""
    import threading

    rng = np.random.default_rng(4)
    jobs = [_operands(rng, m, n=n, k=576, qtype=q) for m, n, q in
            ((1, 3000, "Q4_1"), (5, 1333, "Q8_0"), (3, 2901, "Q4_0"), (8, 640, "Q4_1"))]  # fmt: skip
    qtypes = ["Q4_1", "Q8_0", "Q4_0", "Q4_1"]
    with threads_set(1):
        want = [_product(q, w3, x) for q, (w3, x) in zip(qtypes, jobs)]
    bad: list = []

    def hammer(i: int) -> None:
        q, (w3, x) = qtypes[i], jobs[i]
        for _ in range(100):
            if not np.array_equal(_product(q, w3, x), want[i]):
                bad.append(i)
                return

    with threads_set(2):
        threads = [threading.Thread(target=hammer, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not bad
