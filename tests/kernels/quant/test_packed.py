"""kernels.cpu.quant.packed: many rows times a quantized weight on the packed GEMM's
microkernels (the prefill's x @ W.T and QLoRA's g @ W), against the formats' references."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.kernels import registry
from ember.kernels.cpu.quant import KERNEL_TYPES, _common, packed, transposed
from tests.kernels.quant.test_quant_kernels import _kernels, _tol, _weight

FORMATS = list(KERNEL_TYPES)
pytestmark = pytest.mark.skipif(not packed.available(), reason="no packed GEMM microkernels")


@pytest.fixture(params=[1, 2, 3])
def threads(request):
    prev = ember.get_num_threads()
    ember.set_num_threads(request.param)
    yield request.param
    ember.set_num_threads(prev)


@pytest.fixture(params=["one tile", "tiles"])
def tiles(request, monkeypatch):
    """The whole weight decoded at once, or tiles of a few hundred weights (ragged last one)."""
    if request.param == "tiles":
        monkeypatch.setattr(packed, "TILE_WEIGHTS", 40 * 512)  # 32-row tiles, 16 at the end
        monkeypatch.setattr(packed, "PACK_ROWS", 32)


def _x(rng, m, k):
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[m // 2] *= 100  # rows of very different scale
    return x


@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("m,n", [(32, 37), (70, 80), (131, 5), (33, 64)])
def test_forward_matches_reference(qtype, m, n, threads, tiles):
    """x @ W.T: panels of W's rows as columns, the last one partial (37, 5 rows), tasks split by
    rows of x or, for a few rows, by panels."""
    qk = _kernels(qtype)
    rng = np.random.default_rng(m + n)
    k = 512
    w3 = _weight(rng, qtype, n, k).blocks3d()
    x = _x(rng, m, k)
    want = qk.matmul_t_reference(w3, x)
    got = packed.matmul_t(qk, w3, x)
    assert got.shape == (m, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, **_tol(want))
    np.testing.assert_allclose(qk._prefill(w3, x), want, **_tol(want))  # the prefill's way


@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("m,n,k", [(32, 37, 512), (70, 80, 256), (131, 600, 32), (40, 1, 544)])
def test_transposed_matches_reference(qtype, m, n, k, threads, tiles):
    """g @ W: panels of W's columns (the last one partial where K is no multiple of NR), tiles of
    W's rows summed into the result."""
    qk = _kernels(qtype)
    k = max(k, qk.block_size) // qk.block_size * qk.block_size
    rng = np.random.default_rng(m + n + k)
    q = _weight(rng, qtype, n, k)
    g = _x(rng, m, n)
    want = transposed.matmul_qt_reference(g, qweight=q)
    w3 = q.blocks3d()
    got = packed.matmul_qt(qk, g, k, lambda r0, r1: w3[r0:r1])
    assert got.shape == (m, k) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, **_tol(want))
    np.testing.assert_allclose(transposed.matmul_qt_tiled(g, qweight=q), want, **_tol(want))


@pytest.mark.parametrize("m", [3, 40])
def test_transposed_reads_the_panels_of_a_weight_held_only_as_panels(m, monkeypatch):
    """A weight whose GGUF bytes exist only as the panel kernels' copy (a stacked q/k/v): g @ W
    unpacks the panels a tile at a time (tiles of 16-row multiples, the last one partial) and
    never makes the whole GGUF copy that ``data`` would keep."""
    from ember.kernels.cpu.quant import _panels
    from ember.quant.qtensor import QTensor

    rng = np.random.default_rng(m)
    n, k = 83, 256
    q = _weight(rng, "Q4_1", n, k)
    g = _x(rng, m, n)
    want = transposed.matmul_qt_reference(g, qweight=q)
    only = QTensor.packed_only("Q4_1", (n, k), _panels.pack(q.blocks3d(), "Q4_1"))
    monkeypatch.setattr(transposed, "TILE_ELEMENTS", 20 * k)  # several tiles: 16 rows each
    monkeypatch.setattr(packed, "TILE_WEIGHTS", 20 * k)
    got = transposed.matmul_qt_tiled(g, qweight=only)
    np.testing.assert_allclose(got, want, **_tol(want))
    assert only._data is None  # no GGUF-order copy was kept


def test_nan_rows_stay_in_their_rows():
    qk = _kernels("Q4_1")
    rng = np.random.default_rng(3)
    w3 = _weight(rng, "Q4_1", 70, 256).blocks3d()
    x = _x(rng, 40, 256)
    x[7, 3] = np.nan
    got = packed.matmul_t(qk, w3, x)
    assert np.isnan(got[7]).all() and np.isfinite(np.delete(got, 7, 0)).all()


def test_the_ops_take_the_packed_gemm(monkeypatch):
    """A training step's products (512 rows) run here, forward and backward; fewer than
    MIN_ROWS rows keep the BLAS tiles. (Every format's forward runs the panel kernels by
    default: EMBER_QUANT_REPACK=0 gives this one back to the float kernels.)"""
    from ember import config

    monkeypatch.setattr(config, "QUANT_REPACK", False)
    calls = []
    for name in ("matmul_t", "matmul_qt"):
        real = getattr(packed, name)
        monkeypatch.setattr(packed, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
    rng = np.random.default_rng(5)
    q = _weight(rng, "Q4_K", 48, 256)
    for m, want in ((64, ["matmul_t", "matmul_qt"]), (packed.MIN_ROWS - 1, [])):
        calls.clear()
        x = ember.from_numpy(_x(rng, m, 256)).requires_grad_()
        ember.nn.functional.linear(x, q).sum().backward()
        assert calls == want
        g = np.ones((m, 48), np.float32)
        np.testing.assert_allclose(
            x.grad.numpy(), transposed.matmul_qt_reference(g, qweight=q), rtol=1e-5, atol=1e-4
        )
    assert registry.pick("linear_q_t", "cpu", (g,), {"qweight": q}).name == "linear_q_t_tiled"
    assert _common.INT_ROWS  # (the Q4_0/Q4_1 integer kernels take up to INT_ROWS rows first)
