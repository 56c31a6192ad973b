"""QTensor products through ember.kernels.cpu.quant: real GGUF memmaps, fallback types,
errors, lazy numba. (Each format's kernels against their references: tests/kernels/quant.)"""

import subprocess
import sys

import numpy as np
import pytest

from ember.errors import DTypeError, ShapeError
from ember.kernels.cpu.quant import KERNEL_TYPES, _common
from ember.quant import QTensor, dequantize, quantize_array


def _rel_err(got, want):
    return np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)


def test_kernel_types_are_the_format_modules():
    import ember.quant
    from ember.kernels import registry

    registry.kernels("linear_q")  # loads the format modules
    assert ember.quant.KERNEL_TYPES == KERNEL_TYPES
    assert set(_common.FORMATS) == set(KERNEL_TYPES)


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q5_0", "Q5_1"])
def test_generic_fallback_types(qtype):
    rng = np.random.default_rng(4)
    n, k = 9, 64
    raw = quantize_array(rng.standard_normal((n, k)).astype(np.float32), qtype)
    q = QTensor(raw, qtype, (n, k))
    x = rng.standard_normal((2, k)).astype(np.float32)
    want = x @ dequantize(raw, qtype, (n, k)).T
    np.testing.assert_allclose(q.matmul_t(x), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(q.matmul_t(x[0]), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(q.dequantize_rows(2, 7), dequantize(raw, qtype, (n, k))[2:7])


def test_kernels_on_smollm2_memmaps(smollm2_reader):
    rng = np.random.default_rng(8)
    by_name = {t.name: t for t in smollm2_reader.tensors}
    for name in ["blk.0.ffn_down.weight", "blk.0.attn_q.weight", "blk.5.ffn_gate.weight"]:
        t = by_name[name]
        n, k = (int(s) for s in t.shape[::-1])
        assert not t.data.flags.writeable or isinstance(t.data, np.memmap)
        q = QTensor(t.data, t.tensor_type.name, (n, k))
        assert q.qtype in KERNEL_TYPES
        qk = _common.FORMATS[q.qtype]
        for m in (1, 4, 20):
            x = rng.standard_normal((m, k)).astype(np.float32)
            got = q.matmul_t(x)
            want = qk.matmul_t_reference(q.blocks3d(), x)
            assert _rel_err(got, want) < 1e-5, (name, m)
    emb = by_name["token_embd.weight"]  # Q8_0, (49152, 576): first 300 rows
    rows = np.asarray(emb.data)[:300]
    q = QTensor(rows, "Q8_0", (300, 576))
    x = rng.standard_normal((1, 576)).astype(np.float32)
    assert _rel_err(q.matmul_t(x), x @ q.dequantize().T) < 1e-5


def test_shape_errors():
    q = QTensor(quantize_array(np.zeros((4, 64), np.float32), "Q8_0"), "Q8_0", (4, 64))
    with pytest.raises(ShapeError, match=r"x.shape\[-1\] == 64"):
        q.matmul_t(np.zeros((2, 32), np.float32))
    with pytest.raises(ShapeError, match="2-d"):
        QTensor(q.data, "Q8_0", (2, 2, 64)).matmul_t(np.zeros((2, 64), np.float32))
    with pytest.raises(DTypeError):
        q.matmul_t(np.zeros(64, np.complex64))
    with pytest.raises(ShapeError, match="row range"):
        q.dequantize_rows(3, 5)
    with pytest.raises(ShapeError, match="out must be"):
        q.dequantize_rows(0, 2, out=np.empty((2, 32), np.float32))


def test_numba_is_imported_lazily():
    code = (
        "import sys, numpy as np; import ember; before = 'numba' in sys.modules\n"
        "import ember.quant as q\n"
        "t = q.QTensor.from_float(np.ones((4, 64), np.float32), 'Q8_0'); t.dequantize()\n"
        "import ember.kernels.cpu.catalog\n"
        "assert before or 'numba' not in sys.modules, 'ember.quant imported numba'\n"
        "t.matmul_t(np.ones(64, np.float32)); assert 'numba' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
