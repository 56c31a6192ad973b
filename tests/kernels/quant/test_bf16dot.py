"""BF16 weights times many rows of x by vdpbf16ps (kernels.cpu.quant.bf16dot): x's rounding
against a numpy twin, the products against float64 of the rounded operands on awkward shapes,
rows independent of their place and of the thread count, and the fallbacks (EMBER_HALF_DOT=float,
the AVX2 family) in fresh processes."""

import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ember.kernels.cpu.quant import bf16dot, half, matmul_t
from ember.kernels.cpu.quant._common import SMALL_M
from ember.quant import QTensor
from tests.helpers import threads_set

needs_bf16 = pytest.mark.skipif(not bf16dot.available(), reason="no AVX-512 BF16 here")
needs_avx512 = pytest.mark.skipif(not bf16dot.float_available(), reason="no AVX-512 here")
ROOT = Path(__file__).resolve().parents[3]


def _weight(rng, n, k):
    w = rng.standard_normal((n, k)) * rng.uniform(0.1, 10, (n, 1))
    return w.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def _bound(x, w16):
    """float32 accumulation's bound: two roundings per lane and 32-value step, then 16 lanes."""
    xr = bf16dot.bf16_to_float(bf16dot.bf16_round_reference(x)).astype(np.float64)
    terms = np.abs(xr) @ np.abs(bf16dot.bf16_to_float(w16).astype(np.float64)).T
    return (x.shape[1] / 16 + 20) * 2.0**-24 * terms + 1e-37


@needs_bf16
def test_rounding_of_x_matches_numpy():
    special = np.array([0x3F808000, 0x3F818000, 0x3F80_8001, 0x3F80_7FFF, 0x7F7FFFFF, 0xFF7FFFFF,
                        0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFA00000, 0x80000000,
                        0, 0x00000001, 0x807FFFFF, 0x00800000], np.uint32)  # fmt: skip
    rng = np.random.default_rng(0)
    for m, k in [(1, 1), (3, 16), (2, 33), (5, 100)]:
        x = rng.standard_normal((m, k)).astype(np.float32) * 1e3
        x.reshape(-1)[: len(special)] = special[: x.size].view(np.float32)
        got = bf16dot.round_x(x)
        assert got.shape == (m, -(-k // 32) * 32) and got.ctypes.data % 64 == 0
        want = bf16dot.bf16_round_reference(x)
        nan = np.isnan(x)
        np.testing.assert_array_equal(got[:, :k][~nan], want[~nan])
        assert np.isnan(bf16dot.bf16_to_float(got[:, :k][nan])).all()  # NaN kept
        assert (got[:, k:] == 0).all()  # the padding multiplies as zeros
    y = bf16dot.bf16_to_float(bf16dot.bf16_round_reference(special.view(np.float32)))
    assert y[0] == 1.0 and y[1] == np.float32(1.015625) and y[4] == np.inf  # ties to even


KS = [1, 3, 15, 31, 33, 100, 2050, 32 * bf16dot.K_STEPS, 32 * bf16dot.K_STEPS + 7]


@needs_bf16
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("n", [1, 5, 6, 7, 50])
def test_products_match_float64_of_the_rounded_operands(n, k):
    rng = np.random.default_rng(n * 1000 + k)
    w16 = _weight(rng, n, k)
    for m in (1, 17, 100, 300):
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[:, ::5] *= 100
        want = bf16dot.reference(w16, x)
        bound = _bound(x, w16)
        got = {}
        for threads in (1, 2):
            with threads_set(threads):
                got[threads] = bf16dot.matmul_t(w16, x)
            assert got[threads].dtype == np.float32 and got[threads].shape == (m, n)
            assert (np.abs(got[threads] - want) <= bound).all(), (m, threads)
        np.testing.assert_array_equal(got[1], got[2])  # the tasks split, the arithmetic does not
        perm = rng.permutation(m)
        np.testing.assert_array_equal(bf16dot.matmul_t(w16, x[perm]), got[2][perm])


@needs_avx512
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("qtype", ["BF16", "F16"])
def test_float_x_products_match_float64(qtype, k):
    rng = np.random.default_rng(k)
    n = 13
    w = rng.standard_normal((n, k)) * rng.uniform(0.1, 10, (n, 1))
    w16 = (w.astype(ml_dtypes.bfloat16) if qtype == "BF16" else w.astype(np.float16)).view(
        np.uint16
    )
    wf = (bf16dot.bf16_to_float(w16) if qtype == "BF16" else w16.view(np.float16)).astype(
        np.float64
    )
    for m in (1, 17, 100, 300):
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[:, ::5] *= 100
        exact = x.astype(np.float64) @ wf.T
        bound = (k / 16 + 20) * 2.0**-24 * (np.abs(x.astype(np.float64)) @ np.abs(wf).T) + 1e-37
        got = {}
        for threads in (1, 2):
            with threads_set(threads):
                got[threads] = bf16dot.matmul_t_float(qtype, w16, x)
            assert (np.abs(got[threads] - exact) <= bound).all(), (m, threads)
        np.testing.assert_array_equal(got[1], got[2])
        perm = rng.permutation(m)
        np.testing.assert_array_equal(bf16dot.matmul_t_float(qtype, w16, x[perm]), got[2][perm])
    if k > 1:  # x need not be contiguous (it is copied)
        x = rng.standard_normal((40, 2 * k)).astype(np.float32)[:, ::2]
        want = bf16dot.matmul_t_float(qtype, w16, np.ascontiguousarray(x))
        np.testing.assert_array_equal(bf16dot.matmul_t_float(qtype, w16, x), want)


@needs_bf16
def test_blocks_of_x_and_nonfinite_values():
    rng = np.random.default_rng(5)
    n, k, m = 45, 3100, 250  # several blocks of x rows (X_BYTES) and of K (K_STEPS)
    assert m * 2 * k > bf16dot.X_BYTES and k > 32 * bf16dot.K_STEPS
    w16 = _weight(rng, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[7, 11], x[200, 3099] = np.nan, np.inf
    got = bf16dot.matmul_t(w16, x)
    want = bf16dot.reference(w16, x)
    finite = np.isfinite(want)
    assert np.isnan(got[7]).all() and not finite[7].any() and not finite[200].any()
    assert (np.abs(got[finite] - want[finite]) <= _bound(x, w16)[finite]).all()
    assert (np.isinf(got[200]) | np.isnan(got[200])).all()
    assert bf16dot.matmul_t(w16, x[:0]).shape == (0, n)


@needs_bf16
def test_linear_of_a_bf16_qtensor_rounds_x_above_small_m():
    rng = np.random.default_rng(6)
    n, k = 70, 96
    w16 = _weight(rng, n, k)
    q = QTensor(w16.reshape(-1).view(np.uint8), "BF16", (n, k))
    b = rng.standard_normal(n).astype(np.float32)
    for m in (SMALL_M, SMALL_M + 1, 300):
        x = rng.standard_normal((m, k)).astype(np.float32)
        y = half.linear(x, b, qweight=q)
        if m > SMALL_M:
            np.testing.assert_array_equal(y, bf16dot.matmul_t(w16, x) + b)
        else:
            np.testing.assert_array_equal(y, np.concatenate([matmul_t(q, r[None]) for r in x]) + b)
    out = np.empty((SMALL_M + 1, n), np.float32)
    assert half.prepare(out, np.zeros((SMALL_M + 1, k), np.float32), qweight=q) is None
    f16 = QTensor(w16.view(np.float16).astype(np.float16).reshape(-1).view(np.uint8), "F16", (n, k))
    x = rng.standard_normal((100, k)).astype(np.float32)
    assert half._route("F16", 100) == "float"  # F16: float32 x by the widened weights
    np.testing.assert_array_equal(
        half.linear(x, qweight=f16), bf16dot.matmul_t_float("F16", w16, x)
    )


_FALLBACK = (
    "import numpy as np\n"
    "from ember.kernels.cpu.quant import bf16dot, half, matmul_t\n"
    "from ember.quant import QTensor\n"
    "from tests.kernels.quant import test_bf16dot as t\n"
    "assert not bf16dot.available()\n"
    "routes = {half._route('BF16', m) for m in (17, 100, 300)}\n"
    "assert routes == ({'float'} if bf16dot.float_available() else {'rows', 'blas'}), routes\n"
    "rng = np.random.default_rng(7)\n"
    "for n, k, m in [(37, 64, 17), (300, 576, 100), (5, 1536, 300)]:\n"
    "    w16 = t._weight(rng, n, k)\n"
    "    q = QTensor(w16.reshape(-1).view(np.uint8), 'BF16', (n, k))\n"
    "    x = rng.standard_normal((m, k)).astype(np.float32)\n"
    "    w = bf16dot.bf16_to_float(w16).astype(np.float64)\n"
    "    exact = x.astype(np.float64) @ w.T\n"
    "    terms = np.abs(x.astype(np.float64)) @ np.abs(w).T\n"
    "    assert (np.abs(matmul_t(q, x) - exact) <= 2e-6 * terms).all()  # x not rounded\n"
)


@pytest.mark.parametrize("env", [{"EMBER_HALF_DOT": "float"}, {"EMBER_SGEMM_ISA": "avx2"}])
def test_fallback_keeps_x_float32_in_a_fresh_process(env):
    env = {**os.environ, **env}
    subprocess.run([sys.executable, "-c", _FALLBACK], env=env, cwd=ROOT, check=True, timeout=300)
