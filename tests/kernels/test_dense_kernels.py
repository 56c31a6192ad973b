"""Token-major linear / conv1d / layer norm / gelu kernels against torch and their references."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ember.kernels.cpu import dense as D

RNG = np.random.default_rng(3)


def _f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _close(out, ref, tol=1e-5):
    np.testing.assert_allclose(out, ref, rtol=0, atol=tol * max(np.abs(ref).max(), 1e-30))


@pytest.mark.parametrize("m,k,o", [(1, 5, 3), (37, 40, 100), (130, 384, 33)])
@pytest.mark.parametrize("bias,res", [(True, False), (False, True), (True, True)])
def test_linear_matches_torch(m, k, o, bias, res):
    x, w = _f32(m, k), _f32(o, k)
    b = _f32(o) if bias else None
    r = _f32(m, o) if res else None
    out = D.linear(x, D.pack(w), b, residual=r)
    ref = torch.nn.functional.linear(torch.from_numpy(x), torch.from_numpy(w))
    ref = (
        ref + (0 if b is None else torch.from_numpy(b)) + (0 if r is None else torch.from_numpy(r))
    )
    _close(out, ref.numpy())


@pytest.mark.parametrize("outs", [(64, 64, 32), (40, 33, 7)])
def test_stacked_weights_are_one_linear(outs):
    """q, k, v side by side: panel-aligned (packed in place) or not (stacked first)."""
    x = _f32(21, 48)
    ws = [_f32(o, 48) for o in outs]
    bias = _f32(sum(outs))
    shape = D.packed_shape(sum(outs), 48)
    out = np.full((21, sum(outs)), np.nan, np.float32)
    w = D.pack(*ws, out=None if shape is None else np.empty(shape, np.float32))
    assert D.linear(x, w, bias, out=out) is out
    _close(out, x @ np.concatenate(ws).T + bias)


@pytest.mark.parametrize(
    "b,c,n,o,k,stride,pad",
    [
        (1, 8, 30, 20, 3, 1, 1),
        (2, 13, 31, 40, 3, 2, 1),
        (3, 5, 9, 7, 5, 1, 0),
        (1, 33, 17, 70, 1, 2, 0),
    ],
)
def test_conv1d_channels_last_matches_torch(b, c, n, o, k, stride, pad):
    x, w, bias = _f32(b, c, n), _f32(o, c, k), _f32(o)
    out = D.conv1d(np.ascontiguousarray(x.transpose(0, 2, 1)), D.pack(w), bias, stride, pad)
    ref = torch.nn.functional.conv1d(
        torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(bias), stride, pad
    )
    _close(out, ref.numpy().transpose(0, 2, 1))


@pytest.mark.parametrize("n,f", [(1, 7), (45, 384), (3, 1000)])
def test_layer_norm_matches_torch(n, f):
    x, w, b = _f32(n, f, scale=3.0) + 5.0, _f32(f), _f32(f)
    ref = torch.nn.functional.layer_norm(
        torch.from_numpy(x), (f,), torch.from_numpy(w), torch.from_numpy(b), 1e-5
    ).numpy()
    _close(D.layer_norm(x, w, b, 1e-5), ref)
    _close(D.layer_norm_reference(x, w, b, 1e-5), ref)
    plain = torch.nn.functional.layer_norm(torch.from_numpy(x), (f,), eps=1e-5).numpy()
    _close(D.layer_norm(x, None, None, 1e-5), plain)


@pytest.mark.parametrize("with_add", [False, True])
def test_gelu_in_place_matches_torch(with_add):
    x = _f32(6, 50, scale=3.0)
    add = _f32(3, 50) if with_add else None
    ref = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
    if with_add:
        ref = ref + np.tile(add, (2, 1))
    y = x.copy()
    assert D.gelu_(y, add) is y
    _close(y, ref, 2e-6)
    _close(D.gelu_reference(x, add), ref, 2e-6)


def test_gelu_keeps_nan_and_saturates():
    x = np.array([[np.nan, -np.inf, np.inf, -30.0, 30.0, 0.0, -1e-30]], np.float32)
    y = D.gelu_(x.copy())
    with np.errstate(invalid="ignore"):
        ref = D.gelu_reference(x)  # gelu(inf) = inf (torch says nan), gelu(-inf) = nan
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    np.testing.assert_array_equal(y[:, 2], ref[:, 2])
    torch_ref = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(y[:, 3:], torch_ref[:, 3:], atol=1e-30)


def test_avx2_row_kernels_in_a_fresh_process():
    """8-wide vecmath rows and NR = 16 panels (an AVX2-only CPU), forced by EMBER_SGEMM_ISA."""
    code = (
        "from tests.kernels import test_dense_kernels as t\n"
        "from ember.kernels.cpu import vecmath\n"
        "assert vecmath.symbols()['width'] == 8\n"
        "t.test_linear_matches_torch(37, 40, 100, True, True)\n"
        "t.test_stacked_weights_are_one_linear((40, 33, 7))\n"
        "t.test_gelu_in_place_matches_torch(True)\n"
        "t.test_gelu_keeps_nan_and_saturates()\n"
    )
    env = {**os.environ, "EMBER_SGEMM_ISA": "avx2"}
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], env=env, cwd=root, check=True, timeout=300)


def test_without_numba_the_references_run_in_a_fresh_process():
    code = (
        "from tests.kernels import test_dense_kernels as t\n"
        "from ember.kernels.cpu import dense as D\n"
        "assert D.pack(t._f32(4, 3)).panels is None\n"
        "t.test_linear_matches_torch(37, 40, 100, True, True)\n"
        "t.test_conv1d_channels_last_matches_torch(2, 13, 31, 40, 3, 2, 1)\n"
        "t.test_layer_norm_matches_torch(45, 384)\n"
        "t.test_gelu_in_place_matches_torch(True)\n"
        "t.test_stacked_weights_are_one_linear((40, 33, 7))\n"
    )
    env = {**os.environ, "EMBER_NO_NUMBA": "1"}
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], env=env, cwd=root, check=True, timeout=300)


def test_workspace_reuses_by_name_and_shape():
    from ember.kernels.cpu.workspace import Workspace

    ws = Workspace(max_buffers=3)
    a = ws("a", (4, 5))
    assert ws("a", (4, 5)) is a and ws("a", (4, 5), np.float64) is not a
    assert ws("a", (5, 4)).shape == (5, 4)
    ws("b", (1,))
    ws("c", (1,))
    ws("d", (2,))  # a fourth name: the workspace starts over
    assert ws.nbytes() == 8
