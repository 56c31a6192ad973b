"""Q8_0's product for 1..16 rows of float32 x (``_idot``'s "Q8_0F" kernels, no quantized x;
what Q8_0 runs under ``EMBER_QUANT_DOT=float``).

Against a float64 product of the dequantized weight (float32 rounding only), batch invariance
(row i of an M-row product is bitwise x[i] alone, at every thread count and split), non-finite
rows kept to themselves, and which product Q8_0 picks.
"""

import numpy as np
import pytest

from ember import config
from ember.kernels import registry
from ember.kernels.cpu.quant import _common, _idot
from ember.quant import QTensor, quantize_array
from tests.helpers import _thread_counts, check_kernel, threads_set
from tests.quant.conftest import random_blocks

pytestmark = pytest.mark.skipif(_idot.state() is None, reason="no AVX2 / llvmlite here")


@pytest.fixture(autouse=True)
def _float_x(monkeypatch):
    """Q8_0 products keep float x (EMBER_QUANT_DOT=float; the default quantizes x to int8)."""
    monkeypatch.setattr(config, "QUANT_DOT", "float")


def _q8():
    registry.kernels("linear_q")  # imports the format modules
    return _common.FORMATS["Q8_0"]


def _w3(rng, n, k, real=False):
    """(n, K/32, 34) Q8_0 blocks: random bytes (every code, -128 too) or quantized floats."""
    if real:
        w = rng.standard_normal((n, k)).astype(np.float32)
        w[0] *= 30
        return QTensor(quantize_array(w, "Q8_0"), "Q8_0", (n, k)).blocks3d()
    return random_blocks(rng, "Q8_0", n * k // 32).reshape(n, k // 32, 34)


def _x(rng, m, k):
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, ::7] *= 10
    return x


def _exact(w3, x):
    wf = _q8().dequantize_rows_reference(w3, 0, w3.shape[0]).astype(np.float64)
    return np.asarray(x, np.float64) @ wf.T, np.abs(np.asarray(x, np.float64)) @ np.abs(wf).T


@pytest.fixture(params=["one chunk", "small chunks"])
def schedule(request, monkeypatch):
    """How kernels.cpu.pool splits the weight's rows: one chunk, or chunks of two rows (which
    the worker threads share with the caller)."""
    monkeypatch.setattr(_idot, "CHUNK_BYTES", 1 << 40 if request.param == "one chunk" else 1)
    return request.param


def test_q8_0_picks_the_float_x_kernel(monkeypatch):
    assert _q8().small_kernel() == "Q8_0F"  # float activations (this module's fixture)
    assert not _q8().int_dot()
    monkeypatch.setattr(config, "QUANT_DOT", "int8")  # the default: int8 activations
    assert _q8().small_kernel() == "Q8_0" and _q8().int_dot()


@pytest.mark.parametrize("k", [32, 96, 576, 1536])
@pytest.mark.parametrize("n", [1, 7, 37])
def test_matches_float64(k, n, schedule):
    rng = np.random.default_rng(k + n)
    for real in (False, True):
        w3 = _w3(rng, n, k, real)
        for m in (1, 2, 5, 16):
            x = _x(rng, m, k)
            exact, terms = _exact(w3, x)
            y = _q8().matmul_t(w3, x)
            assert y.dtype == np.float32 and y.shape == (m, n)
            # float32 products of exact weights, summed in 8-16 lanes then a tree
            assert (np.abs(y - exact) <= 2e-6 * terms + 1e-30).all()


@pytest.mark.parametrize("threads", _thread_counts())
def test_batch_invariance(threads, schedule):
    qk = _q8()
    rng = np.random.default_rng(11)
    n, k = 75, 96  # rows not a multiple of any chunk
    w3 = _w3(rng, n, k)
    x = _x(rng, 23, k)
    with threads_set(1):
        alone = np.stack([qk.matmul_t(w3, x[i : i + 1])[0] for i in range(len(x))])
    q = QTensor(w3.reshape(-1), "Q8_0", (n, k))
    with threads_set(threads):
        for m in range(1, 17):
            for start in (0, 23 - m):
                got = qk.matmul_t(w3, x[start : start + m])
                np.testing.assert_array_equal(got, alone[start : start + m], err_msg=f"M={m}")
        np.testing.assert_array_equal(qk.linear(x[4], qweight=q), alone[4])
        got = qk.linear(x[:6].reshape(2, 3, k), qweight=q)
        np.testing.assert_array_equal(got.reshape(6, n), alone[:6])


def test_linear_q_registered_kernel():
    (kernel,) = [k for k in registry.kernels("linear_q") if k.name == "linear_q8_0"]
    rng = np.random.default_rng(5)
    n, k = 38, 576
    q = QTensor(quantize_array(rng.standard_normal((n, k)).astype(np.float32), "Q8_0"), "Q8_0",
                (n, k))  # fmt: skip
    b = rng.standard_normal(n).astype(np.float32)
    for shape in [(k,), (1, k), (3, k), (16, k), (2, 3, k)]:
        x = _x(rng, int(np.prod(shape[:-1], dtype=int)), k).reshape(shape)
        check_kernel(kernel, cases=[((x,), {"qweight": q}), ((x, b), {"qweight": q})],
                     rtol=2e-5, atol=2e-4)  # fmt: skip


def test_non_finite_rows():
    qk = _q8()
    rng = np.random.default_rng(9)
    w3 = _w3(rng, 9, 96)
    x = _x(rng, 5, 96)
    x[1, 40] = np.nan
    x[3, 3] = np.inf
    x[4, 95] = -np.inf
    y = qk.matmul_t(w3, x)
    assert np.isnan(y[1]).all() and not np.isfinite(y[[3, 4]]).any()
    with threads_set(1):
        for i in (0, 2):
            np.testing.assert_array_equal(y[i], qk.matmul_t(w3, x[i : i + 1])[0])
