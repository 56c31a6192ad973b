"""BF16/F16 weights read from their 16-bit bytes (kernels.cpu.quant.half): the products against a
float64 product of the same weights, rows bitwise as each row alone, the captured-step binding,
and the loader keeping a bfloat16/float16 model's linears 16-bit."""

import ml_dtypes
import numpy as np
import pytest

import ember
from ember import nn
from ember.kernels import registry
from ember.kernels.cpu.quant import bf16dot, half, matmul_t
from ember.kernels.cpu.quant._common import SMALL_M
from ember.quant import QTensor
from ember.quant.nn import QLinear
from tests.helpers import check_kernel, threads_set

pytestmark = pytest.mark.skipif(half.state() is None, reason="no AVX2 / llvmlite here")
DTYPES = {"BF16": ml_dtypes.bfloat16, "F16": np.float16}


def _weight(rng, qtype, n, k):
    w = (rng.standard_normal((n, k)) * rng.uniform(0.1, 10, (n, 1))).astype(DTYPES[qtype])
    return w, QTensor(w.reshape(-1).view(np.uint8), qtype, (n, k))


@pytest.mark.parametrize("qtype", list(DTYPES))
@pytest.mark.parametrize("n, k", [(1, 32), (37, 64), (300, 576), (5, 1536)])
def test_products_match_float64_and_each_row_alone(qtype, n, k):
    rng = np.random.default_rng(n + k)
    w, q = _weight(rng, qtype, n, k)
    for m in (1, 4, 5, 8, 9, 17, 64, 70):
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[:, ::5] *= 100
        dot = half._dot(qtype, m)  # x rounded to bf16 for vdpbf16ps
        xr = bf16_float(bf16dot.bf16_round_reference(x)) if dot else x
        exact = xr.astype(np.float64) @ w.astype(np.float64).T
        terms = np.abs(xr.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
        for threads in (1, 2):
            with threads_set(threads):
                y = matmul_t(q, x)
                assert (np.abs(y - exact) <= 2e-6 * terms + 1e-30).all()
                route = half._route(qtype, m)
                if m <= SMALL_M:  # every row as alone (the server's batched decode)
                    assert route == "rows"
                if route == "rows":
                    alone = np.concatenate([matmul_t(q, x[i : i + 1]) for i in range(m)])
                    np.testing.assert_array_equal(y, alone)
                if route in ("dot", "float"):  # a row's result does not depend on its place
                    np.testing.assert_array_equal(matmul_t(q, x[::-1])[::-1], y)


def test_registered_kernel_shapes_bias_and_limits():
    (kernel,) = [k for k in registry.kernels("linear_q") if k.name == "linear_half"]
    rng = np.random.default_rng(1)
    _, q = _weight(rng, "BF16", 40, 96)
    b = rng.standard_normal(40).astype(np.float32)
    cases = [((rng.standard_normal(s).astype(np.float32),), {"qweight": q}) for s in
             [(96,), (1, 96), (3, 96), (2, 5, 96)]]  # fmt: skip
    cases += [((rng.standard_normal((4, 96)).astype(np.float32), b), {"qweight": q})]
    check_kernel(kernel, _path_reference, cases=cases, rtol=1e-5, atol=1e-4)
    for m in (SMALL_M + 1, half.MAX_ROWS + 1, 200):  # a prompt: vdpbf16ps, or BLAS's tiles
        x = rng.standard_normal((m, 96)).astype(np.float32)
        check_kernel(kernel, _path_reference, cases=[((x,), {"qweight": q}), ((x, b), {"qweight": q})],
                     rtol=1e-5, atol=1e-4)  # fmt: skip
    _, odd = _weight(rng, "F16", 8, 48)  # rows not a whole number of 32-value blocks
    assert not kernel.when(np.ones((1, 48), np.float32), qweight=odd)


def _path_reference(x, b=None, *, qweight):
    """The registered reference, or where x is rounded to bf16 for vdpbf16ps, float64
    (bf16-rounded x) @ W.T + b: what its products round to float32."""
    n, k = qweight.shape
    if not half._dot(qweight.qtype, x.size // k):
        return kernel_reference(x, b, qweight=qweight)
    w16 = np.asarray(qweight.data).view(np.uint16).reshape(n, k)
    y = bf16dot.reference(w16, x.reshape(-1, k)).reshape(x.shape[:-1] + (n,))
    return (y if b is None else y + b).astype(np.float32)


def kernel_reference(x, b=None, *, qweight):
    return half._reference(x, b, qweight=qweight)


def bf16_float(h):
    return bf16dot.bf16_to_float(h)


def test_bound_product_reads_x_when_called():
    rng = np.random.default_rng(2)
    w, q = _weight(rng, "F16", 70, 64)
    x = np.zeros((3, 64), np.float32)
    out = np.empty((3, 70), np.float32)
    run = half.prepare(out, x, qweight=q)
    for _ in range(2):
        x[...] = rng.standard_normal((3, 64))
        run()
        np.testing.assert_array_equal(out, matmul_t(q, x))


def test_a_bfloat16_checkpoint_keeps_its_linears_16_bit():
    from ember.models._weights import assign_weights

    rng = np.random.default_rng(3)
    with ember.device("meta"):
        model = nn.Sequential(nn.Embedding(10, 32), nn.Linear(32, 64), nn.Linear(64, 48))
    weights = {
        "0.weight": rng.standard_normal((10, 32)).astype(ml_dtypes.bfloat16),
        "1.weight": rng.standard_normal((64, 32)).astype(ml_dtypes.bfloat16),
        "1.bias": rng.standard_normal(64).astype(ml_dtypes.bfloat16),
        "2.weight": rng.standard_normal((48, 64)).astype(np.float16),
        "2.bias": np.zeros(48, np.float16),
    }
    assign_weights(model, weights)
    assert isinstance(model[1], QLinear) and model[1].weight.qtype == "BF16"
    assert isinstance(model[2], QLinear) and model[2].weight.qtype == "F16"
    assert np.shares_memory(np.asarray(model[1].weight.data), weights["1.weight"])
    ids = ember.tensor([[1, 2, 3]])
    h = weights["0.weight"].astype(np.float64)[[1, 2, 3]]
    h = h @ weights["1.weight"].astype(np.float64).T + weights["1.bias"].astype(np.float64)
    want = h @ weights["2.weight"].astype(np.float64).T
    with ember.no_grad():
        got = model(ids).numpy()[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    float_model = nn.Sequential(nn.Embedding(10, 32), nn.Linear(32, 64), nn.Linear(64, 48))
    assign_weights(float_model, weights, dtype=ember.float32)  # asked for: float32 copies
    assert type(float_model[1]) is nn.Linear and float_model[1].weight.dtype == ember.float32
