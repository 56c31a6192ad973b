"""QTensor: no-copy storage, shapes, dequantize, x @ W.T over leading dimensions."""

import numpy as np
import pytest

from ember.errors import FormatError, ShapeError
from ember.quant import QTensor, dequantize, quantize_array


def test_wraps_memmap_without_copy(smollm2_reader):
    t = next(t for t in smollm2_reader.tensors if t.name == "blk.0.attn_k.weight")
    shape = tuple(int(s) for s in t.shape[::-1])
    q = QTensor(t.data, t.tensor_type.name, shape)
    assert np.shares_memory(q.data, t.data)
    assert q.shape == (192, 576) and q.qtype == "Q4_1" and q.dtype == np.float32
    assert q.nbytes == 192 * 576 // 32 * 20
    np.testing.assert_array_equal(q.dequantize(), dequantize(t.data, "Q4_1", shape))
    x = np.random.default_rng(0).standard_normal((2, 3, 576)).astype(np.float32)
    want = x @ q.dequantize().T
    np.testing.assert_allclose(q.matmul_t(x), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    r = repr(q)
    assert "(192, 576)" in r and "Q4_1" in r and "float32" in r


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K", "Q5_1", "F16"])
def test_from_float_and_matmul_t(qtype):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((7, 512)).astype(np.float32)
    q = QTensor.from_float(w, qtype)
    assert q.shape == (7, 512)
    np.testing.assert_array_equal(q.data, quantize_array(w, qtype).reshape(-1))
    wd = q.dequantize()
    for x in [rng.standard_normal(512), rng.standard_normal((1, 512)),
              rng.standard_normal((3, 4, 512)).astype(np.float32)]:  # fmt: skip
        got = q.matmul_t(x)
        want = np.asarray(x, np.float32) @ wd.T
        assert got.shape == x.shape[:-1] + (7,) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    np.testing.assert_array_equal(np.asarray(q), wd)


def test_errors():
    raw = quantize_array(np.zeros((2, 64), np.float32), "Q4_0")
    with pytest.raises(FormatError, match="takes 72 bytes"):
        QTensor(raw[:, :-1].copy(), "Q4_0", (2, 64))
    q = QTensor(raw, "Q4_0", (2, 64))
    with pytest.raises(ShapeError, match=r"x.shape\[-1\] == 64"):
        q.matmul_t(np.zeros((3, 32), np.float32))
    with pytest.raises(ShapeError, match="2-d weight"):
        QTensor(raw, "Q4_0", (2, 1, 64)).matmul_t(np.zeros(64, np.float32))
