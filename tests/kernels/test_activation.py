"""The gelu kernel (kernels/cpu/activation.py) against its reference and torch, and the op."""

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
from ember.kernels.cpu import activation as A
from tests.helpers import check_kernel


def _cases():
    rng = np.random.default_rng(0)
    cases = []
    for shape in [(1,), (3, 7), (2, 5, 64), (4097,), (0, 8), (3, 1536), ()]:
        x = np.array(rng.standard_normal(shape) * 4, np.float32)
        cases.append(((x,), {"approximate": "none"}))
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 30.0, -30.0], np.float32)
    cases.append(((x,), {"approximate": "none"}))
    return cases


def _kernel():
    return registry.kernels("gelu")[0]  # tried first; kernels.cpu.special's ufunc after it


def test_gelu_kernel(monkeypatch):
    check_kernel(_kernel(), cases=_cases(), rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(A, "GELU_PARALLEL", 1)  # the multi-threaded variant
    monkeypatch.setattr(A, "CHUNK", 64)
    check_kernel(_kernel(), cases=_cases(), rtol=1e-5, atol=1e-6)


def test_gelu_reference_matches_torch():
    x = np.random.default_rng(1).standard_normal(300).astype(np.float32) * 5
    want = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(_kernel().reference(x, approximate="none"), want, 1e-6, 1e-6)


@pytest.mark.parametrize("grad", [False, True])
def test_gelu_op_picks_kernel_with_or_without_graph(grad, monkeypatch):
    calls = []
    k = _kernel()
    fn = k.fn
    monkeypatch.setattr(k, "fn", lambda *a, **kw: calls.append(1) or fn(*a, **kw))
    x = ember.randn(2, 3, 16, requires_grad=grad)
    y = ember.nn.functional.gelu(x)
    assert len(calls) == (1 if k.applies([x.detach().numpy()], {"approximate": "none"}) else 0)
    tx = torch.from_numpy(x.detach().numpy()).requires_grad_(grad)
    want = torch.nn.functional.gelu(tx)
    np.testing.assert_allclose(y.detach().numpy(), want.detach().numpy(), 1e-6, 1e-6)
    if grad:  # the kernel ran in training too (Gelu.saved): the gradient is the op's
        y.sum().backward()
        want.sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), 1e-5, 1e-6)
    n = len(calls)
    ember.nn.functional.gelu(x, approximate="tanh")  # the reference path
    assert len(calls) == n


@pytest.mark.parametrize("env", [{"EMBER_SGEMM_ISA": "avx2"}, {"EMBER_NO_NUMBA": "1"}])
def test_in_a_fresh_process(env):
    """8-wide vecmath rows (an AVX2-only CPU); without numba the op's reference."""
    code = (
        "import pytest\n"
        "from ember.kernels.cpu import vecmath\n"
        "from tests.kernels import test_activation as t\n"
        "if 'EMBER_SGEMM_ISA' in __import__('os').environ:\n"
        "    assert vecmath.symbols()['width'] == 8\n"
        "    t.test_gelu_kernel(pytest.MonkeyPatch())\n"
        "else:\n"
        "    assert not t._kernel().applies([t._cases()[1][0][0]], {'approximate': 'none'})\n"
        "t.test_gelu_op_picks_kernel_with_or_without_graph(True, pytest.MonkeyPatch())\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, **env}
    subprocess.run([sys.executable, "-c", code], env=env, cwd=root, check=True, timeout=300)
