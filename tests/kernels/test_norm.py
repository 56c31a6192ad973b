"""Normalisation kernels against their numpy references, and the op picking them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember.kernels import registry
from tests.helpers import check_kernel


def _rms_cases():
    rng = np.random.default_rng(0)
    cases = []
    for shape in [(1, 1), (3, 7), (2, 5, 64), (1, 576), (0, 8), (4, 3, 2, 33)]:
        x = rng.standard_normal(shape).astype(np.float32)
        w = rng.standard_normal(shape[-1]).astype(np.float32)
        cases.append(((x, w), {"n": 1, "eps": 1e-5}))
        cases.append(((x,), {"n": 1, "eps": 1e-6}))
    x = rng.standard_normal((3, 9)).astype(np.float32)
    x[1, 2], x[2, 0] = np.nan, np.inf  # a hostile row stays NaN; the others are untouched
    cases.append(((x, np.ones(9, np.float32)), {"n": 1, "eps": 1e-5}))
    return cases


def test_rms_norm_kernel():
    (k,) = registry.kernels("rms_norm")
    check_kernel(k, cases=_rms_cases(), rtol=2e-6, atol=2e-6)


def test_rms_norm_reference_matches_torch():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 48)).astype(np.float32)
    w = rng.standard_normal(48).astype(np.float32)
    (k,) = registry.kernels("rms_norm")
    want = torch.nn.functional.rms_norm(torch.from_numpy(x), (48,), torch.from_numpy(w), 1e-5)
    np.testing.assert_allclose(k.reference(x, w, n=1, eps=1e-5), want.numpy(), 2e-6, 2e-6)


@pytest.mark.parametrize("grad", [False, True])
def test_rms_norm_op_picks_kernel_only_without_graph(grad, monkeypatch):
    calls = []
    (k,) = registry.kernels("rms_norm")
    fn = k.fn
    monkeypatch.setattr(k, "fn", lambda *a, **kw: calls.append(1) or fn(*a, **kw))
    x = ember.randn(2, 3, 16, requires_grad=grad)
    w = ember.randn(16)
    y = ember.nn.functional.rms_norm(x, (16,), w, 1e-6)
    assert len(calls) == (0 if grad else 1)
    ref = k.reference(x.detach().numpy(), w.numpy(), n=1, eps=1e-6)
    np.testing.assert_allclose(y.detach().numpy(), ref, 2e-6, 2e-6)
