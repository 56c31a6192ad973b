"""The layer_norm kernel (kernels/cpu/norm.py) against its reference and torch, and the op."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import ember
from ember.kernels import registry
from ember.kernels.cpu import norm as N
from tests.helpers import check_kernel


def _kw(x, has_w=True, has_b=True, eps=1e-5):
    return {"view": None, "axes": (x.ndim - 1,), "eps": eps, "pshape": (1,) * (x.ndim - 1)
            + x.shape[-1:], "has_w": has_w, "has_b": has_b}  # fmt: skip


def _cases():
    rng = np.random.default_rng(0)
    cases = []
    for shape in [(1, 1), (3, 7), (2, 5, 64), (1, 384), (0, 8), (4, 3, 2, 33), (300, 97)]:
        x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
        w, b = (rng.standard_normal(shape[-1]).astype(np.float32) for _ in range(2))
        cases.append(((x, w, b), _kw(x, eps=1e-12)))
        cases.append(((x, w), _kw(x, has_b=False)))
        cases.append(((x,), _kw(x, False, False)))
    x = rng.standard_normal((3, 9)).astype(np.float32)
    x[1, 2], x[2, 0] = np.nan, np.inf  # hostile rows stay NaN, the others are untouched
    cases.append(((x, np.ones(9, np.float32), np.zeros(9, np.float32)), _kw(x)))
    return cases


def _kernel():
    (k,) = registry.kernels("layer_norm")
    return k


def test_layer_norm_kernel(monkeypatch):
    check_kernel(_kernel(), cases=_cases(), rtol=2e-5, atol=2e-5)
    monkeypatch.setattr(N, "LAYER_NORM_PARALLEL", 1)  # the multi-threaded variant
    check_kernel(_kernel(), cases=_cases(), rtol=2e-5, atol=2e-5)


def test_layer_norm_reference_matches_torch():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 48)).astype(np.float32)
    w, b = (rng.standard_normal(48).astype(np.float32) for _ in range(2))
    want = torch.nn.functional.layer_norm(*(torch.from_numpy(a) for a in (x,)), (48,),
                                          torch.from_numpy(w), torch.from_numpy(b), 1e-5)  # fmt: skip
    got = _kernel().reference(x, w, b, **_kw(x))
    np.testing.assert_allclose(got, want.numpy(), 2e-6, 2e-6)


@pytest.mark.parametrize("grad", [False, True])
def test_layer_norm_op_picks_kernel_only_without_graph(grad, monkeypatch):
    calls = []
    k = _kernel()
    fn = k.fn
    monkeypatch.setattr(k, "fn", lambda *a, **kw: calls.append(1) or fn(*a, **kw))
    x = ember.randn(2, 3, 16, requires_grad=grad)
    w, b = ember.randn(16), ember.randn(16)
    y = ember.nn.functional.layer_norm(x, (16,), w, b, 1e-6)
    assert len(calls) == (0 if grad else 1)
    ref = k.reference(x.detach().numpy(), w.numpy(), b.numpy(), **_kw(x.detach().numpy(), eps=1e-6))
    np.testing.assert_allclose(y.detach().numpy(), ref, 2e-6, 2e-6)
    ember.nn.functional.layer_norm(x, (3, 16))  # over two dims: the reference path
    assert len(calls) == (0 if grad else 1)


def test_without_numba_the_op_runs_its_reference_in_a_fresh_process():
    code = (
        "import pytest\n"
        "from tests.kernels import test_layer_norm as t\n"
        "assert not t._kernel().applies([t._cases()[2][0][0]], t._cases()[2][1])\n"
        "t.test_layer_norm_op_picks_kernel_only_without_graph(True, pytest.MonkeyPatch())\n"
        "t.test_layer_norm_reference_matches_torch()\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "EMBER_NO_NUMBA": "1"}
    subprocess.run([sys.executable, "-c", code], env=env, cwd=root, check=True, timeout=300)
