"""The linear op's float32 kernel for a few rows of x on the worker pool (kernels.cpu.matvec):
the reference on awkward shapes, rows bitwise alone whatever the batch, split or thread count,
the bound product of a captured step, and the op choosing it only where it applies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember.kernels import registry
from ember.kernels.cpu import gemm as G
from ember.kernels.cpu import matvec
from ember.kernels.cpu.quant import _idot
from ember.nn import functional as F
from tests.helpers import _thread_counts, check_kernel, threads_set

pytestmark = pytest.mark.skipif(_idot.state() is None, reason="no AVX2 / llvmlite here")
RNG = np.random.default_rng(11)


def _kernel():
    return next(k for k in registry.kernels("linear") if k.name == "linear_f32_small")


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_matches_the_reference():
    cases = []
    for lead, n, k in (((1,), 1, 32), ((3,), 77, 64), ((2, 5), 129, 96), ((16,), 40, 1536),
                       ((1, 1), 3000, 384), ((7,), 5, 32 * 13)):  # fmt: skip
        x, w = _f32(*lead, k), _f32(n, k)
        cases += [(x, w), (x, w, _f32(n))]
    check_kernel(_kernel(), cases=cases, rtol=1e-5, atol=1e-4)


def test_matches_torch_and_keeps_nan_and_inf():
    x, w, b = _f32(4, 256), _f32(33, 256), _f32(33)
    x[1, 7], x[2, 100] = np.nan, np.inf
    got = matvec.linear_small(x, w, b)
    want = torch.nn.functional.linear(*(torch.from_numpy(a) for a in (x, w, b))).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = np.isfinite(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-5, atol=1e-4)


def test_rows_are_bitwise_alone_whatever_the_batch_split_and_threads(monkeypatch):
    w, b = _f32(301, 192), _f32(301)
    x = _f32(16, 192)
    with threads_set(1):
        alone = np.stack([matvec.linear_small(x[i : i + 1], w, b)[0] for i in range(16)])
    for threads in _thread_counts():
        for chunk_bytes in (1, 5000, 1 << 40):  # chunks of two rows, a few, one
            monkeypatch.setattr(_idot, "CHUNK_BYTES", chunk_bytes)
            with threads_set(threads):
                for m in (1, 3, 4, 5, 16):
                    got = matvec.linear_small(x[:m], w, b)
                    np.testing.assert_array_equal(got, alone[:m], err_msg=f"M={m} {threads} thr")


def test_the_bound_product_reads_x_when_it_runs():
    """A captured step's product (prepare): bitwise the kernel's, on whatever x then holds."""
    w, b = _f32(1000, 384), _f32(1000)
    for bias in (None, b):
        x = _f32(1, 1, 384)
        out = np.empty((1, 1, 1000), np.float32)
        run = matvec._prepare(out, x, w, *(() if bias is None else (bias,)))
        for _ in range(3):
            x[...] = _f32(1, 1, 384)
            run()
            np.testing.assert_array_equal(out, matvec.linear_small(x, w, bias))
    x = _f32(2, 384)
    assert matvec._prepare(np.empty((2, 1000), np.float64), x, w) is None  # not float32 out
    strided = _f32(2, 768)[:, ::2]  # x not C-contiguous
    assert matvec._prepare(np.empty((2, 1000), np.float32), strided, w) is None


def test_the_op_takes_it_for_a_few_rows_only():
    k = _kernel()
    w, b = _f32(50, 64), _f32(50)
    for m, takes in ((1, True), (16, True), (17, False)):
        assert k.applies([_f32(m, 64), w, b], {}) is takes
    assert not k.applies([_f32(2, 48), _f32(50, 48)], {})  # K not a multiple of 32
    assert not k.applies([_f32(2, 64), np.asfortranarray(w)], {})  # a transposed weight
    assert not k.applies([_f32(2, 64), G.PackedWeight(w)], {})  # the packed GEMM's
    assert registry.pick("linear", "cpu", [_f32(2, 64), G.PackedWeight(w)], {}).name != k.name
    x = ember.from_numpy(_f32(3, 64))
    with ember.no_grad():
        got = F.linear(x, ember.from_numpy(w), ember.from_numpy(b)).numpy()
    np.testing.assert_array_equal(got, matvec.linear_small(x.numpy(), w, b))


def test_avx2_kernel_and_numpy_fallback_in_fresh_processes():
    """8 float lanes (what an AVX2-only CPU runs), forced by EMBER_SGEMM_ISA; =none: no kernel."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    avx2 = (
        "from tests.kernels import test_matvec as t\n"
        "t.test_matches_the_reference()\n"
        "t.test_the_bound_product_reads_x_when_it_runs()\n"
    )
    none = (
        "import numpy as np, ember\n"
        "from ember.kernels.cpu import matvec\n"
        "from ember.kernels import registry\n"
        "x, w = np.ones((2, 64), np.float32), np.ones((3, 64), np.float32)\n"
        "assert not matvec._available() and registry.pick('linear', 'cpu', [x, w], {}) is None\n"
        "with ember.no_grad():\n"
        "    y = ember.nn.functional.linear(ember.from_numpy(x), ember.from_numpy(w)).numpy()\n"
        "assert (y == 64).all()\n"
    )
    for isa, code in (("avx2", avx2), ("none", none)):
        env = {**os.environ, "EMBER_SGEMM_ISA": isa}
        subprocess.run([sys.executable, "-c", code], env=env, cwd=root, check=True, timeout=300)
