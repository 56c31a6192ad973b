"""The official onnx.backend.test node cases on ember.onnx.backend: >= 90% of the NN set pass."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")

from ember.onnx import coverage  # noqa: E402


@pytest.fixture(scope="module")
def results():
    return coverage.run_cases()


def test_nn_set_pass_rate(results):
    nn = [r for r in results if r.in_nn_set]
    assert len(nn) > 1000  # the set is the broad one, not a hand-picked few
    passed = sum(r.ok for r in nn)
    assert passed / len(nn) >= 0.90, coverage.report(results, show_pass=False)


def test_every_family_is_covered(results):
    ok = {o for r in results if r.ok and r.in_nn_set for o in r.ops}
    for o in ["Conv", "ConvTranspose", "MaxPool", "AveragePool", "BatchNormalization", "Gemm",
              "MatMul", "Einsum", "ReduceSum", "Softmax", "LSTM", "GRU", "RNN", "Resize", "TopK",
              "NonMaxSuppression", "Attention", "RotaryEmbedding", "GatherND", "ScatterND",
              "LayerNormalization", "Slice", "Pad"]:  # fmt: skip
        assert o in ok, o


def test_report_lists_failures_by_reason(results):
    text = coverage.report(results)
    assert text.startswith("NN set: ") and "failures by reason" in text and "| Conv |" in text


def test_backend_api():
    import numpy as np

    from ember.onnx import backend
    from onnx import helper

    assert backend.supports_device("CPU") and not backend.supports_device("CUDA")
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1, alpha=0.5)
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in [(3, 4), (5, 4), (5,)])
    (y,) = backend.run_node(node, [a, b, c])
    np.testing.assert_allclose(y, 0.5 * a @ b.T + c, rtol=1e-5, atol=1e-6)
