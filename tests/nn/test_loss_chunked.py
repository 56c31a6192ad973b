"""cross_entropy with class-index targets runs a chunk of rows at a time: many chunks vs torch,
and the memory its backward holds for a language model's (tokens, vocab) logits."""
# ruff: noqa: B023  (the lambdas in loops are called at once)

import tracemalloc

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import ember
from ember.nn import functional as F
from ember.nn.functional import loss as L
from tests.helpers import assert_close
from tests.nn.common import rnd
from tests.nn.test_loss import _ints, _run

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
    C = shape[1] if len(shape) > 1 else shape[0]
    tshape = shape[:1] + shape[2:] if len(shape) > 1 else ()
    t = np.asarray(_ints(tshape, C, ignore=-100 if tshape else None))
    w = rnd(C, seed=3, low=0.2, high=2.0)
    wp = (ember.from_numpy(w), torch.from_numpy(w)) if weighted else (None, None)
    kw = dict(reduction=reduction, label_smoothing=smoothing)
    _run(
        lambda x, tt, ww: F.cross_entropy(x, tt, weight=ww, **kw),
        lambda x, tt, ww: TF.cross_entropy(x, tt, weight=ww, **kw),
        [rnd(*shape, low=-3, high=3)],
        [(ember.tensor(t), torch.from_numpy(t)), wp],
    )


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
