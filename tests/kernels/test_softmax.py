"""The last-axis softmax kernel (ONNX Softmax's float32 path) against a float64 reference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ember.kernels.cpu import softmax as S

pytestmark = pytest.mark.skipif(not S.available(), reason="no numba or vecmath here")
RNG = np.random.default_rng(7)


@pytest.mark.parametrize("shape", [(1,), (3, 1), (2, 15), (1, 40, 6625), (3, 7, 33), (5, 17)])
@pytest.mark.parametrize("pool_from", [1, 1 << 40])  # pool tasks from any size / never
def test_softmax_last_against_float64(shape, pool_from, monkeypatch):
    monkeypatch.setattr(S, "SOFTMAX_PARALLEL", pool_from)
    monkeypatch.setattr(S, "POOL_ELEMENTS", 64)  # several rows per task, and one-row tasks
    x = (RNG.standard_normal(shape) * 6 + 2).astype(np.float32)
    x[..., 0] = 80.0  # a large score: the max subtraction matters
    for v in (x, np.asfortranarray(x)):  # a non-contiguous input is copied
        got = S.softmax_last(v)
        assert got.shape == v.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, S.softmax_reference(x), rtol=2e-6, atol=1e-7)


def test_softmax_last_large_negative_and_empty():
    x = np.array([[-1e30, 0.0, -1e30], [-50.0, -50.0, -50.0]], np.float32)
    np.testing.assert_allclose(S.softmax_last(x), [[0, 1, 0], [1 / 3] * 3], atol=1e-7)
    assert S.softmax_last(np.zeros((0, 4), np.float32)).shape == (0, 4)


def test_onnx_softmax_node_uses_it_on_the_last_axis():
    onnx = pytest.importorskip("onnx")
    import ember.onnx
    from onnx import TensorProto, helper

    for opset, axis in ((13, -1), (13, 2), (11, 2), (13, 1), (11, 1)):
        node = helper.make_node("Softmax", ["x"], ["y"], axis=axis)
        g = helper.make_graph(
            [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        )  # fmt: skip
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        x = RNG.standard_normal((3, 4, 9)).astype(np.float32) * 4
        got = ember.onnx.load(m.SerializeToString()).run({"x": x})["y"].numpy()
        if axis in (-1, 2):
            want = S.softmax_reference(x)
        elif opset >= 13:
            want = np.moveaxis(S.softmax_reference(np.moveaxis(x, 1, -1)), -1, 1)
        else:  # opset < 13: the dims from axis on, flattened
            want = S.softmax_reference(x.reshape(3, -1)).reshape(x.shape)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7, err_msg=f"{opset} {axis}")
    del onnx


def test_avx2_rows_in_a_fresh_process():
    """8-wide vecmath rows (an AVX2-only CPU)."""
    code = (
        "import pytest\n"
        "from ember.kernels.cpu import vecmath\n"
        "from tests.kernels import test_softmax as t\n"
        "assert vecmath.symbols()['width'] == 8\n"
        "for shape in [(3, 7, 33), (1, 40, 6625)]:\n"
        "    for p in (1, 1 << 40):\n"
        "        t.test_softmax_last_against_float64(shape, p, pytest.MonkeyPatch())\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "EMBER_SGEMM_ISA": "avx2"}
    subprocess.run([sys.executable, "-c", code], env=env, cwd=root, check=True, timeout=300)
