"""Numba kernels against the pure-numpy reference (dequantize + BLAS), and the fallbacks."""

import subprocess
import sys

import numpy as np
import pytest

from ember.errors import ShapeError
from ember.quant import dequantize, kernels, quantize_array

KERNEL_TYPES = list(kernels.KERNEL_TYPES)


def _weights(rng, n, k):
    w = rng.standard_normal((n, k)).astype(np.float32)
    w[0] *= 30  # rows of very different scale
    return w


def _rel_err(got, want):
    return np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)


@pytest.fixture(scope="module")
def numba_mod():
    mod = kernels.numba_kernels()
    assert mod is not None, "numba is a required dependency"
    return mod


@pytest.mark.parametrize("qtype", KERNEL_TYPES)
@pytest.mark.parametrize(("n", "schedule"), [(1, "serial"), (3, "static"), (37, "dynamic"),
                                             (37, "serial"), (38, "static")])  # fmt: skip
def test_matvec_kernel_matches_reference(numba_mod, qtype, n, schedule, monkeypatch):
    if schedule != "serial":  # force the threaded paths on these small weights
        monkeypatch.setattr(kernels, "SERIAL_MAX_BYTES", 0)
        monkeypatch.setattr(kernels, "DYNAMIC_MIN_BYTES", 0 if schedule == "dynamic" else 1 << 40)
    rng = np.random.default_rng(n)
    k = 512
    raw = quantize_array(_weights(rng, n, k), qtype)
    x = rng.standard_normal(k).astype(np.float32)
    got = kernels.matvec(raw, qtype, (n, k), x)
    want = kernels.matmul_t_ref(raw, qtype, (n, k), x[None])[0]
    exact = dequantize(raw, qtype, (n, k)).astype(np.float64) @ x.astype(np.float64)
    assert got.shape == (n,) and got.dtype == np.float32
    assert _rel_err(got, want) < 1e-5
    assert _rel_err(got, exact) < 1e-5  # float32 accumulation, K = 512


@pytest.mark.parametrize("qtype", KERNEL_TYPES)
@pytest.mark.parametrize("m", [3, 13])  # per-row matvec (M <= SMALL_M), tiled BLAS above
def test_matmul_prefill_tiles_match_reference(numba_mod, qtype, m, monkeypatch):
    monkeypatch.setattr(kernels, "TILE_ELEMENTS", 3 * 256)  # 3 rows per tile: ragged last tile
    rng = np.random.default_rng(2)
    n, k = 11, 256
    raw = quantize_array(_weights(rng, n, k), qtype)
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = kernels.matmul_t(raw, qtype, (n, k), x)
    want = x @ dequantize(raw, qtype, (n, k)).T
    assert got.shape == (m, n)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    rows = kernels.dequantize_rows(raw, qtype, (n, k), 4, 9)
    np.testing.assert_array_equal(rows, dequantize(raw, qtype, (n, k))[4:9])


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q5_0", "Q5_1"])
def test_generic_fallback_types(qtype):
    rng = np.random.default_rng(4)
    n, k = 9, 64
    raw = quantize_array(_weights(rng, n, k), qtype)
    x = rng.standard_normal((2, k)).astype(np.float32)
    want = x @ dequantize(raw, qtype, (n, k)).T
    np.testing.assert_allclose(kernels.matmul_t(raw, qtype, (n, k), x), want, rtol=1e-5)
    np.testing.assert_allclose(kernels.matvec(raw, qtype, (n, k), x[0]), want[0], rtol=1e-5)


def test_reference_path_without_numba(monkeypatch):
    monkeypatch.setattr(kernels, "_numba_kernels", False)  # as when numba is not importable
    rng = np.random.default_rng(6)
    raw = quantize_array(_weights(rng, 5, 64), "Q4_0")
    x = rng.standard_normal(64).astype(np.float32)
    want = dequantize(raw, "Q4_0", (5, 64)) @ x
    np.testing.assert_allclose(kernels.matvec(raw, "Q4_0", (5, 64), x), want, rtol=1e-5)


def test_kernels_on_smollm2_memmaps(numba_mod, smollm2_reader):
    rng = np.random.default_rng(8)
    by_name = {t.name: t for t in smollm2_reader.tensors}
    for name in ["blk.0.ffn_down.weight", "blk.0.attn_q.weight", "blk.5.ffn_gate.weight"]:
        t = by_name[name]
        n, k = (int(s) for s in t.shape[::-1])
        assert not t.data.flags.writeable or isinstance(t.data, np.memmap)
        x = rng.standard_normal(k).astype(np.float32)
        got = kernels.matvec(t.data, t.tensor_type.name, (n, k), x)
        want = kernels.matmul_t_ref(t.data, t.tensor_type.name, (n, k), x[None])[0]
        assert _rel_err(got, want) < 1e-5, name
    emb = by_name["token_embd.weight"]  # Q8_0, (49152, 576): first 300 rows
    rows = np.asarray(emb.data)[:300]
    x = rng.standard_normal((1, 576)).astype(np.float32)
    got = kernels.matmul_t(rows, "Q8_0", (300, 576), x)
    want = kernels.matmul_t_ref(rows, "Q8_0", (300, 576), x)
    assert _rel_err(got, want) < 1e-5


def test_shape_errors():
    raw = quantize_array(np.zeros((4, 64), np.float32), "Q8_0")
    with pytest.raises(ShapeError, match=r"x must be \(M, 64\)"):
        kernels.matmul_t(raw, "Q8_0", (4, 64), np.zeros((2, 32), np.float32))
    with pytest.raises(ShapeError, match="must be 2-d"):
        kernels.matmul_t(raw, "Q8_0", (2, 2, 64), np.zeros((2, 64), np.float32))
    with pytest.raises(ShapeError, match="row range"):
        kernels.dequantize_rows(raw, "Q8_0", (4, 64), 3, 5)
    with pytest.raises(ShapeError, match="out must be"):
        kernels.dequantize_rows(raw, "Q8_0", (4, 64), 0, 2, out=np.empty((2, 32), np.float32))


def test_numba_is_imported_lazily():
    code = (
        "import sys, numpy as np; import ember; before = 'numba' in sys.modules\n"
        "import ember.quant as q\n"
        "t = q.QTensor.from_float(np.ones((4, 64), np.float32), 'Q8_0'); t.dequantize()\n"
        "assert before or 'numba' not in sys.modules, 'ember.quant imported numba'\n"
        "t.matmul_t(np.ones(64, np.float32)); assert 'numba' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
