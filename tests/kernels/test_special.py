"""The erf and gelu ufunc kernels (kernels/cpu/special.py) against the ops' numpy forwards."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember.kernels import registry
from ember.kernels.cpu import special
from tests.helpers import check_kernel


def _cases(dtype, **kw):
    rng = np.random.default_rng(0)
    cases = []
    for shape in [(1,), (3, 7), (2, 5, 33), (0, 8), ()]:
        cases.append(((np.array(rng.uniform(-6, 6, shape), dtype),), kw))
    cases.append(((np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 30.0, -30.0], dtype),), kw))
    return cases


def _kernel(op):
    (k,) = [k for k in registry.kernels(op) if k.fn in (special.erf, special.gelu)]
    return k


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_erf_and_gelu_kernels(dtype):
    tol = {"rtol": 1e-6, "atol": 1e-7} if dtype == np.float32 else {"rtol": 1e-15, "atol": 1e-15}
    with np.errstate(invalid="ignore"):  # gelu(-inf) = -inf * 0 in the numpy forms
        check_kernel(_kernel("erf"), cases=_cases(dtype), **tol)
        check_kernel(_kernel("gelu"), cases=_cases(dtype, approximate="none"), **tol)


def test_numpy_forwards_match_torch():
    x = np.random.default_rng(1).uniform(-5, 5, 301)
    for dt, tol in ((np.float32, 2e-6), (np.float64, 1e-14)):
        a, t = x.astype(dt), torch.from_numpy(x.astype(dt))
        np.testing.assert_allclose(special.erf_numpy(a), torch.erf(t).numpy(), atol=tol)
        want = torch.nn.functional.gelu(t).numpy()
        np.testing.assert_allclose(special.gelu_numpy(a), want, atol=tol)


def test_erf_kernel_runs_in_training_and_the_gradient_is_the_ops(monkeypatch):
    k = _kernel("erf")
    calls = []
    fn = k.fn
    monkeypatch.setattr(k, "fn", lambda *a, **kw: calls.append(1) or fn(*a, **kw))
    a = np.random.default_rng(2).uniform(-3, 3, (4, 9))
    x = ember.from_numpy(a.copy()).requires_grad_()
    y = ember.erf(x)
    y.sum().backward()
    assert len(calls) == (1 if k.applies([a], {}) else 0)
    t = torch.from_numpy(a).requires_grad_()
    torch.erf(t).sum().backward()
    np.testing.assert_allclose(y.detach().numpy(), torch.erf(t).detach().numpy(), atol=1e-15)
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), atol=1e-14)
