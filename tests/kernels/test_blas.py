"""kernels.cpu.blas: BLAS products on ember's threads (one thread, or blocks on run_tiles) for the
``linear`` op on plain float32 weights and the ``gemm`` op of Linear's backward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember.kernels import registry
from ember.kernels.cpu import blas
from tests.helpers import check_kernel, picked_kernels

RNG = np.random.default_rng(4)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _kernel(op: str, name: str):
    return next(k for k in registry.kernels(op) if k.name == name)


@pytest.fixture(params=["serial", "blocks"])
def path(request, monkeypatch):
    """Products on the calling thread (BLAS on one thread), or in blocks of 3+ rows/columns
    (the tests' products are small: the thresholds move)."""
    monkeypatch.setattr(blas, "SERIAL_WORK", 0)
    if request.param == "blocks":
        monkeypatch.setattr(blas, "TILED_WORK", 0)
        monkeypatch.setattr(blas, "BLOCK_WORK", 50)
        monkeypatch.setattr(blas, "MIN_BLOCK", 3)
    return request.param


# (M, K) @ (K, N): tall, wide, ragged blocks, a single row / column, empty
GEMM_SHAPES = [(37, 13, 5), (5, 19, 41), (64, 64, 64), (1, 7, 30), (30, 7, 1), (0, 4, 6), (6, 0, 5)]


def test_gemm_matches_numpy_and_torch(path):
    k = _kernel("gemm", "gemm_tiled")
    cases = [(_f32(m, kk), _f32(kk, n)) for m, kk, n in GEMM_SHAPES]
    assert check_kernel(k, cases=cases, rtol=1e-5, atol=1e-5) >= len(cases)
    for a, b in cases:
        want = (torch.from_numpy(a).double() @ torch.from_numpy(b).double()).numpy()
        got = blas.matmul(a.T.copy().T, b[:, ::-1].copy()[:, ::-1])  # F-order, negative strides
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_linear_kernel_matches_reference_and_torch(path):
    k = _kernel("linear", "linear_blas")
    cases = []
    for shape, o in (((40, 13), 9), ((2, 9, 40), 37), ((17, 25), 70), ((4, 0, 8), 5)):
        x, w, b = _f32(*shape), _f32(o, shape[-1]), _f32(o)
        cases += [(x, w, b), (x, w)]
        want = torch.nn.functional.linear(*(torch.from_numpy(a).double() for a in (x, w, b)))
        np.testing.assert_allclose(k.fn(x, w, b), want.numpy(), rtol=1e-5, atol=1e-5)
    assert check_kernel(k, cases=cases, rtol=1e-5, atol=1e-5) >= len(cases)


def test_linear_trains_through_the_kernels(path, monkeypatch):
    """A recorded float32 linear runs linear_blas forward and the gemm kernel for both of its
    gradients; they equal torch's."""
    names = picked_kernels(monkeypatch)
    x, w, b, gy = _f32(3, 11, 20), _f32(30, 20), _f32(30), _f32(3, 11, 30)
    tx, tw, tb = (ember.from_numpy(a).requires_grad_() for a in (x, w, b))
    ember.nn.functional.linear(tx, tw, tb).backward(ember.from_numpy(gy))
    assert names == ["linear_blas", "gemm_tiled", "gemm_tiled"]
    rx, rw, rb = (torch.from_numpy(a).double().requires_grad_() for a in (x, w, b))
    torch.nn.functional.linear(rx, rw, rb).backward(torch.from_numpy(gy).double())
    for got, want in ((tx, rx), (tw, rw), (tb, rb)):
        np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_small_products_leave_the_kernels_out():
    """Below SERIAL_WORK multiply-adds (OpenBLAS stays on one thread by itself) or MIN_ROWS rows
    the op's own forward runs; other dtypes never take these kernels."""
    x, w = _f32(2, 8), _f32(4, 8)
    assert registry.pick("linear", "cpu", [x, w], {}) is None
    x, w = _f32(blas.MIN_ROWS - 1, 256), _f32(2048, 256)  # a few rows: not BLAS's threads
    small = registry.pick("linear", "cpu", [x, w], {})  # (kernels.cpu.matvec's, where it runs)
    assert small is None or small.name == "linear_f32_small"
    big = _f32(64, 64)
    assert registry.pick("linear", "cpu", [big, big], {}).name == "linear_blas"
    assert registry.pick("linear", "cpu", [big.astype(np.float64)] * 2, {}) is None
    assert registry.pick("gemm", "cpu", [big.astype(np.float64)] * 2, {}) is None


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_blocks_cover_the_product_once(threads, monkeypatch):
    """Large products are cut into row blocks (or column blocks when wider than tall), at least
    two per thread, each written once into its place."""
    monkeypatch.setattr(blas, "SERIAL_WORK", 0)
    monkeypatch.setattr(blas, "TILED_WORK", 0)
    monkeypatch.setattr(blas, "MIN_BLOCK", 1)
    from ember.kernels.cpu import tiles

    seen = []
    real = tiles.run_tiles
    monkeypatch.setattr(tiles, "run_tiles", lambda fn, n, t: seen.append(n) or real(fn, n, t))
    prev = ember.get_num_threads()
    ember.set_num_threads(threads)
    try:
        for a, b in ((_f32(90, 70), _f32(70, 50)), (_f32(20, 70), _f32(70, 90))):
            out = np.full((a.shape[0], b.shape[1]), np.nan, np.float32)
            got = blas.matmul(a, b, out=out)
            assert got is out
            np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)
    finally:
        ember.set_num_threads(prev)
    assert seen == ([] if threads == 1 else [n for n in seen if n >= 2 * threads])
    assert len(seen) == (0 if threads == 1 else 2)
