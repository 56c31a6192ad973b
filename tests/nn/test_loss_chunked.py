"""cross_entropy with class-index targets runs a chunk of rows at a time: many chunks vs torch,
and the memory its backward holds for a language model's (tokens, vocab) logits."""
# ruff: noqa: B023  (the lambdas in loops are called at once)

import tracemalloc

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import ember
from ember.errors import DTypeError, ShapeError
from ember.nn import functional as F
from ember.nn.functional import loss as L
from tests.helpers import assert_close
from tests.nn.common import rnd
from tests.nn.test_loss import _ints, _run
from tests.nn.test_loss import test_cross_entropy_indices as _vs_torch

F64, F32 = ember.float64, ember.float32


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Chunks of a few elements, so every test below spans many of them (and a ragged last)."""
    monkeypatch.setattr(L, "CE_CHUNK_ELEMENTS", 13)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.15])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", [(11, 5), (7, 4, 2, 3), (9,)])
def test_chunked_matches_torch(tiny_chunks, reduction, smoothing, weighted, shape):
    """test_loss's comparison with torch, over many chunks."""
    _vs_torch(reduction, smoothing, weighted, shape)


@pytest.mark.parametrize("dtype", [F32, ember.bfloat16])
def test_chunked_low_precision_and_float32(tiny_chunks, dtype):
    x = rnd(10, 6, low=-3, high=3)
    t = np.asarray(_ints((10,), 6, ignore=-100))
    xe = ember.from_numpy(x).to(dtype).requires_grad_()
    ref = torch.from_numpy(xe.detach().double().numpy()).requires_grad_()
    out = F.cross_entropy(xe, ember.tensor(t), label_smoothing=0.1)
    tout = TF.cross_entropy(ref, torch.from_numpy(t), label_smoothing=0.1)
    out.backward()
    tout.backward()
    tdt = torch.bfloat16 if dtype == ember.bfloat16 else torch.float32
    assert_close(out, tout.to(tdt), dtype, "loss")
    assert xe.grad.dtype == dtype
    assert_close(xe.grad, ref.grad.to(tdt), dtype, "grad")


def test_chunked_backward_twice_with_retain_graph(tiny_chunks):
    x = ember.from_numpy(rnd(8, 5, low=-3, high=3)).requires_grad_()
    loss = F.cross_entropy(x, ember.tensor(np.arange(8) % 5))
    loss.backward(retain_graph=True)
    first = x.grad.numpy().copy()
    loss.backward()
    np.testing.assert_array_equal(x.grad.numpy(), 2 * first)


def test_chunk_size_does_not_change_a_bit(monkeypatch):
    """One chunk or many: the same float operations per row, so the same loss and gradient."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((40, 300)) * 4).astype(np.float32)
    t = rng.integers(0, 300, 40)
    t[::5] = -100
    got = []
    for chunk in (1 << 20, 300 * 3 + 7, 1):
        monkeypatch.setattr(L, "CE_CHUNK_ELEMENTS", chunk)
        xe = ember.from_numpy(x.copy()).requires_grad_()
        loss = F.cross_entropy(xe, ember.tensor(t), label_smoothing=0.05)
        loss.backward()
        got.append((loss.detach().numpy(), xe.grad.numpy()))
    for loss, grad in got[1:]:
        np.testing.assert_array_equal(loss, got[0][0])
        np.testing.assert_array_equal(grad, got[0][1])


def test_lm_sized_logits_memory():
    """(128, 49152) float32 logits (24 MiB): forward and backward together allocate the gradient
    (one logits-sized array) and chunk temporaries, never a float32 softmax or float64 copy."""
    rng = np.random.default_rng(0)
    n, vocab = 128, 49152
    x = ember.from_numpy(rng.standard_normal((n, vocab), dtype=np.float32)).requires_grad_()
    t = ember.tensor(rng.integers(0, vocab, n))
    size = n * vocab * 4
    # the first call compiles (or loads) the kernels (numba's compiler allocates tens of MB)
    warm = ember.from_numpy(np.zeros((2, 40), np.float32)).requires_grad_()
    F.cross_entropy(warm, ember.tensor([1, 2])).backward()
    tracemalloc.start()
    try:
        loss = F.cross_entropy(x, t)
        _, fwd_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        loss.backward()
        _, bwd_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert fwd_peak < 0.5 * size, fwd_peak / size
    # the gradient itself (accumulated into x.grad as a copy) and the chunk temporaries
    assert bwd_peak < 2.0 * size + 24 * L.CE_CHUNK_ELEMENTS, bwd_peak / size
    ref = torch.from_numpy(x.detach().numpy()).requires_grad_()
    TF.cross_entropy(ref, torch.from_numpy(t.numpy())).backward()
    assert_close(x.grad, ref.grad, F32, "grad")


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("shape", [(4, 5), (5,)])
def test_all_ignored_gives_nan_loss_and_zero_grad_like_torch(smoothing, shape):
    """Nothing counted: the mean is 0/0 (nan) but ignored positions get a zero gradient, as
    torch's (a nan there would poison the optimizer step of a batch with no labelled token)."""
    t = np.full(shape[:1] if len(shape) > 1 else (), -100)
    x = rnd(*shape, low=-3, high=3)
    xe = ember.from_numpy(x).requires_grad_()
    xt = torch.from_numpy(x).requires_grad_()
    out = F.cross_entropy(xe, ember.tensor(t), label_smoothing=smoothing)
    ref = TF.cross_entropy(xt, torch.from_numpy(t), label_smoothing=smoothing)
    out.backward()
    ref.backward()
    assert np.isnan(out.item()) and np.isnan(ref.item())
    assert_close(xe.grad, xt.grad, F64, "grad")


# ------------------------------------------------------------------ linear_cross_entropy


@pytest.fixture
def tiny_blocks(monkeypatch):
    """Blocks of a few rows, so the tests below span many (and a ragged last one)."""
    monkeypatch.setattr(L, "LINEAR_CE_BLOCK_ELEMENTS", 3 * 17 + 5)
    monkeypatch.setattr(L, "CE_CHUNK_ELEMENTS", 20)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("lead", [(13,), (2, 7)])
def test_linear_cross_entropy_matches_torch(tiny_blocks, reduction, smoothing, with_bias, lead):
    rng = np.random.default_rng(0)
    H, C = 8, 17
    h = rng.standard_normal(lead + (H,))
    w = rng.standard_normal((C, H)) * 0.5
    b = rng.standard_normal(C)
    t = rng.integers(0, C, lead)
    t.reshape(-1)[::4] = -100
    kw = dict(reduction=reduction, label_smoothing=smoothing)
    floats = [h, w] + ([b] if with_bias else [])
    _run(
        lambda x, ww, *bb: F.linear_cross_entropy(
            x, ww, ember.tensor(t), bias=bb[0] if bb else None, **kw
        ),
        lambda x, ww, *bb: TF.cross_entropy(
            TF.linear(x, ww, bb[0] if bb else None).reshape(-1, C),
            torch.from_numpy(t).reshape(-1),
            **kw,
        ).reshape(t.shape if reduction == "none" else ()),
        floats,
        [],
    )


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
def test_linear_cross_entropy_quantized_weight(tiny_blocks, qtype):
    """A QTensor head: its kernels run (as in cross_entropy(linear(h, q))), the input's
    gradient matches torch on the dequantized W, and the quantized weight is left as it was."""
    from ember.quant import QTensor

    rng = np.random.default_rng(1)
    N, H, C = 11, 64, 23
    q = QTensor.from_float(rng.standard_normal((C, H)).astype(np.float32) * 0.2, qtype)
    blocks = q.data.copy()
    h = rng.standard_normal((N, H)).astype(np.float32)
    t = rng.integers(0, C, N)
    t[3] = -100
    he = ember.from_numpy(h.copy()).requires_grad_()
    out = F.linear_cross_entropy(he, q, ember.tensor(t), label_smoothing=0.05)
    out.backward()
    hc = ember.from_numpy(h.copy()).requires_grad_()
    comp = F.cross_entropy(F.linear(hc, q), ember.tensor(t), label_smoothing=0.05)
    comp.backward()
    np.testing.assert_allclose(out.item(), comp.item(), rtol=1e-6)
    np.testing.assert_allclose(he.grad.numpy(), hc.grad.numpy(), rtol=1e-5, atol=1e-7)
    # torch on the dequantized W (the products quantize x to int8: EMBER_QUANT_DOT)
    ht = torch.from_numpy(h.copy()).requires_grad_()
    ref = TF.cross_entropy(
        TF.linear(ht, torch.from_numpy(q.dequantize())), torch.from_numpy(t), label_smoothing=0.05
    )
    ref.backward()
    tol = 5e-3
    assert_close(out, ref, F32, "loss", atol=tol, rtol=tol)
    assert_close(he.grad, ht.grad, F32, "grad", atol=tol, rtol=tol)
    np.testing.assert_array_equal(q.data, blocks)


def test_linear_cross_entropy_same_as_the_composition():
    """One block or many: the loss and the input's gradient of cross_entropy(linear(...))."""
    rng = np.random.default_rng(2)
    h = rng.standard_normal((40, 16)).astype(np.float32)
    w = rng.standard_normal((300, 16)).astype(np.float32) * 0.3
    t = rng.integers(0, 300, 40)
    he = ember.from_numpy(h.copy()).requires_grad_()
    ref = F.cross_entropy(F.linear(he, ember.from_numpy(w)), ember.tensor(t))
    ref.backward()
    he2 = ember.from_numpy(h.copy()).requires_grad_()
    out = F.linear_cross_entropy(he2, ember.from_numpy(w), ember.tensor(t))
    out.backward()
    np.testing.assert_allclose(out.item(), ref.item(), rtol=1e-6)
    np.testing.assert_allclose(he2.grad.numpy(), he.grad.numpy(), rtol=1e-5, atol=1e-8)


def test_linear_cross_entropy_bf16_runs_the_composition():
    rng = np.random.default_rng(3)
    h = ember.from_numpy(rng.standard_normal((6, 8)).astype(np.float32)).to(ember.bfloat16)
    w = ember.from_numpy(rng.standard_normal((5, 8)).astype(np.float32)).to(ember.bfloat16)
    t = ember.tensor(rng.integers(0, 5, 6))
    h.requires_grad_()
    out = F.linear_cross_entropy(h, w, t)
    ref = F.cross_entropy(F.linear(h.detach(), w), t)
    assert out.dtype == ember.bfloat16
    assert out.item() == ref.item()
    out.backward()
    assert h.grad.shape == h.shape


def test_linear_cross_entropy_errors():
    h = ember.zeros(4, 8)
    with pytest.raises(ShapeError, match="linear_cross_entropy"):
        F.linear_cross_entropy(h, ember.zeros(5, 7), ember.zeros(4, dtype=ember.int64))
    with pytest.raises(ShapeError, match="linear_cross_entropy"):
        F.linear_cross_entropy(h, ember.zeros(5, 8), ember.zeros(3, dtype=ember.int64))
    with pytest.raises(DTypeError, match="class indices"):
        F.linear_cross_entropy(h, ember.zeros(5, 8), ember.zeros(4))
    with pytest.raises(ValueError, match="label_smoothing"):
        F.linear_cross_entropy(
            h, ember.zeros(5, 8), ember.zeros(4, dtype=ember.int64), label_smoothing=2.0
        )


def test_linear_cross_entropy_never_holds_the_logits():
    """(128, 576) hidden states, a 49152-row Q8_0 head: forward + backward allocate about one
    block, far under the 24 MiB float32 logits the composition holds (and their gradient)."""
    from ember.quant import QTensor

    rng = np.random.default_rng(0)
    n, hid, vocab = 128, 576, 49152
    q = QTensor.from_float(rng.standard_normal((vocab, hid), dtype=np.float32) * 0.05, "Q8_0")
    h = ember.from_numpy(rng.standard_normal((n, hid), dtype=np.float32)).requires_grad_()
    t = ember.tensor(rng.integers(0, vocab, n))
    logits_bytes = n * vocab * 4
    # once before measuring: the first call compiles (or loads) the kernels it takes, and the
    # threads' reused work buffers grow to their size (numba's compiler allocates ~50 MB)
    F.linear_cross_entropy(h, q, t).backward()
    h.grad = None
    tracemalloc.start()
    try:
        loss = F.linear_cross_entropy(h, q, t)
        loss.backward()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 0.6 * logits_bytes, peak / logits_bytes
    ref = torch.from_numpy(h.detach().numpy()).requires_grad_()
    TF.cross_entropy(
        TF.linear(ref, torch.from_numpy(q.dequantize())), torch.from_numpy(t.numpy())
    ).backward()
    assert_close(h.grad, ref.grad, F32, "grad", atol=1e-6, rtol=1e-4)
