"""The gated_act op's kernel (kernels.cpu.glu: swiglu / geglu) against its reference, torch, and
the op's closed-form backward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember.kernels import registry
from ember.kernels.cpu import glu
from ember.nn import functional as F
from tests.helpers import check_kernel, gradcheck

ACTS = ["silu", "gelu_tanh", "gelu"]


def _cases(act):
    rng = np.random.default_rng(0)
    cases = []
    for shape in [(0, 4), (1, 1), (3, 7, 40), (2, 33), (70, 300)]:  # 70 x 300: silu's numpy path
        gu = (rng.standard_normal(shape[:-1] + (2 * shape[-1],)) * 30).astype(np.float32)
        g, u = gu[..., : shape[-1]], gu[..., shape[-1] :]  # views of one fused projection
        cases.append(((g, u), {"act": act}))
    g = np.array([[-100.0, -88.5, 0.0, np.nan, np.inf, -np.inf, 50.0]], np.float32)
    cases.append(((g, np.ones_like(g)), {"act": act}))  # exp overflow, NaN and infinities
    return cases


@pytest.mark.parametrize("act", ACTS)
def test_gated_act_kernel(act):
    (k,) = registry.kernels("gated_act")
    check_kernel(k, cases=_cases(act), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("small", [True, False])
def test_silu_kernel_both_paths(small, monkeypatch):
    monkeypatch.setattr(glu, "NUMPY_MIN", 1 << 40 if small else 0)
    monkeypatch.setattr(glu, "LOOP_ROWS", glu.LOOP_ROWS if small else 0)
    (k,) = registry.kernels("gated_act")
    check_kernel(k, cases=_cases("silu")[:4], rtol=2e-5, atol=2e-5)


def test_silu_rows_of_a_decode_batch_are_those_alone():
    """Up to LOOP_ROWS rows, however large, each row is bitwise what it gives as one row."""
    (k,) = registry.kernels("gated_act")
    rng = np.random.default_rng(3)
    g, u = rng.standard_normal((2, glu.LOOP_ROWS, glu.NUMPY_MIN), dtype=np.float32)
    together = k.fn(g, u, act="silu")
    for i in range(len(g)):
        np.testing.assert_array_equal(together[i], k.fn(g[i : i + 1], u[i : i + 1], act="silu")[0])


@pytest.mark.parametrize("act", ACTS)
def test_op_matches_torch(act):
    rng = np.random.default_rng(1)
    g = (rng.standard_normal((4, 9, 24)) * 4).astype(np.float32)
    u = rng.standard_normal((4, 9, 24)).astype(np.float32)
    tg, tu = torch.from_numpy(g), torch.from_numpy(u)
    if act == "silu":
        want, got = (
            torch.nn.functional.silu(tg) * tu,
            F.swiglu(ember.from_numpy(g), ember.from_numpy(u)),
        )
    else:
        approx = "tanh" if act == "gelu_tanh" else "none"
        want = torch.nn.functional.gelu(tg, approximate=approx) * tu
        got = F.geglu(ember.from_numpy(g), ember.from_numpy(u), approximate=approx)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    (k,) = registry.kernels("gated_act")
    np.testing.assert_allclose(k.reference(g, u, act=act), want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act", ["silu", "tanh", "none"])
def test_gradients(act):
    fn = F.swiglu if act == "silu" else (lambda g, u: F.geglu(g, u, approximate=act))
    gradcheck(fn, [(3, 5), (3, 5)])


def test_kernel_runs_in_training_with_the_same_gradient(monkeypatch):
    calls = []
    (k,) = registry.kernels("gated_act")
    fn = k.fn
    monkeypatch.setattr(k, "fn", lambda *a, **kw: calls.append(1) or fn(*a, **kw))
    rng = np.random.default_rng(2)
    ga, ua = (rng.standard_normal((2, 6)).astype(np.float32) for _ in range(2))
    g, u = ember.from_numpy(ga).requires_grad_(), ember.from_numpy(ua).requires_grad_()
    F.swiglu(g, u).sum().backward()
    assert calls == [1]
    tg, tu = torch.from_numpy(ga).requires_grad_(), torch.from_numpy(ua).requires_grad_()
    (torch.nn.functional.silu(tg) * tu).sum().backward()
    np.testing.assert_allclose(g.grad.numpy(), tg.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(u.grad.numpy(), tu.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_errors():
    with pytest.raises(ember.errors.ShapeError, match="differ"):
        F.swiglu(ember.zeros(2, 3), ember.zeros(2, 4))
    with pytest.raises(ValueError, match="approximate"):
        F.geglu(ember.zeros(2), ember.zeros(2), approximate="fast")


def _grad_cases():
    rng = np.random.default_rng(3)
    cases = []
    for shape in [(0, 4), (1, 1), (3, 7, 40), (2, 33), (70, 300)]:
        gu = (rng.standard_normal(shape[:-1] + (2 * shape[-1],)) * 30).astype(np.float32)
        g, u = gu[..., : shape[-1]], gu[..., shape[-1] :]  # views of one fused projection
        gr = rng.standard_normal(shape).astype(np.float32)
        cases.append(((gr, g, u), {"act": "silu"}))
    g = np.array([[-100.0, -88.5, 0.0, np.nan, np.inf, 50.0, 3.0]], np.float32)
    cases.append(((np.ones_like(g), g, np.ones_like(g)), {"act": "silu"}))  # overflow, NaN, inf
    return cases


@pytest.mark.parametrize("block", [1, 1 << 16])
def test_silu_grad_kernel(block, monkeypatch):
    """SwiGLU's backward in one pass (blocks of rows on run_tiles, ragged last one) against its
    numpy reference; the reference against torch's autograd."""
    monkeypatch.setattr(glu, "GRAD_BLOCK_ELEMENTS", block)
    (k,) = registry.kernels("gated_act_grad")
    check_kernel(k, cases=_grad_cases(), rtol=2e-5, atol=2e-5)
    for (gr, g, u), _ in _grad_cases()[:-1]:
        tg, tu = (
            torch.from_numpy(np.ascontiguousarray(a)).double().requires_grad_() for a in (g, u)
        )
        (torch.nn.functional.silu(tg) * tu).backward(torch.from_numpy(gr).double())
        dg, du = glu.gated_act_grad_reference(gr, g, u, act="silu")
        scale = 1 + np.abs(tg.grad.numpy()).max() if g.size else 1.0
        np.testing.assert_allclose(dg, tg.grad.numpy(), rtol=1e-5, atol=1e-5 * scale)
        np.testing.assert_allclose(du, tu.grad.numpy(), rtol=1e-5, atol=1e-5 * scale)


def test_training_takes_the_grad_kernel(monkeypatch):
    """float32 SwiGLU trains through gated_act_grad; geglu keeps the op's closed form."""
    (k,) = registry.kernels("gated_act_grad")
    calls = []
    fn = k.fn
    monkeypatch.setattr(k, "fn", lambda *a, **kw: calls.append(kw["act"]) or fn(*a, **kw))
    rng = np.random.default_rng(4)
    ga, ua = (rng.standard_normal((3, 70)).astype(np.float32) for _ in range(2))
    for f in (F.swiglu, F.geglu):
        g, u = ember.from_numpy(ga).requires_grad_(), ember.from_numpy(ua).requires_grad_()
        f(g, u).sum().backward()
        g64, u64 = (ember.from_numpy(a.astype(np.float64)).requires_grad_() for a in (ga, ua))
        f(g64, u64).sum().backward()  # float64: the op's own backward
        np.testing.assert_allclose(g.grad.numpy(), g64.grad.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(u.grad.numpy(), u64.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert calls == ["silu"]
