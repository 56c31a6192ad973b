"""kernels.cpu.cross_entropy: each row's log-sum-exp and the index-target gradient, one numba
pass per row, against their numpy references and torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember.kernels import registry
from ember.kernels.cpu import cross_entropy as ce
from ember.nn import functional as F
from tests.helpers import check_kernel, picked_kernels, run_fresh

RNG = np.random.default_rng(11)


def _z(n, c, scale=4.0):
    return (RNG.standard_normal((n, c)) * scale).astype(np.float32)


SHAPES = [(1, 1), (3, 5), (7, 37), (5, 300), (2, 1000)]  # classes not a multiple of 16


@pytest.fixture(params=["one block", "blocks of a row"])
def blocks(request, monkeypatch):
    if request.param != "one block":
        monkeypatch.setattr(ce, "ROW_BLOCK_ELEMENTS", 1)  # a task per row, on run_tiles


def test_lse_matches_reference_and_torch(blocks):
    (k,) = registry.kernels("ce_lse")
    cases = [(_z(n, c),) for n, c in SHAPES]
    big = _z(4, 50)
    big[1] += 80.0  # exp would overflow without the max
    big[2, 7] = -np.inf  # a class nobody may pick
    cases.append((big,))
    assert check_kernel(k, cases=cases, rtol=1e-6, atol=1e-6) >= len(cases)
    for (z,) in cases:
        m, logs = k.fn(z)
        want = torch.logsumexp(torch.from_numpy(z).double(), -1).numpy()
        np.testing.assert_allclose(m.astype(np.float64) + logs, want, rtol=1e-6, atol=1e-6)


def test_lse_nan_row_stays_nan():
    (k,) = registry.kernels("ce_lse")
    z = _z(3, 40)
    z[1, 33] = np.nan
    m, logs = k.fn(z)
    assert np.isnan(m[1]) and np.isnan(logs[1])
    assert np.isfinite(np.delete(m, 1)).all() and np.isfinite(np.delete(logs, 1)).all()


def _grad_case(n, c, weighted=False, in_place=False):
    z = _z(n, c)
    m, logs = ce.lse_reference(z)
    s = RNG.uniform(0.2, 2.0, n) if weighted else np.ones(n)
    gl = np.full(n, 1.0 / max(n, 1)) * RNG.uniform(0.5, 1.5, n)
    tc = RNG.integers(0, c, n)
    valid = np.ones(n, bool)
    valid[::3] = False  # ignore_index rows: zeros
    out = z if in_place else None
    return (z, m, logs, s, s.copy(), gl, tc, valid, out)


def test_grad_matches_reference_and_torch(blocks):
    (k,) = registry.kernels("ce_grad")
    cases = [_grad_case(n, c, w) for n, c in SHAPES for w in (False, True)]
    assert check_kernel(k, cases=cases, rtol=1e-6, atol=1e-7) >= len(cases)
    for n, c in SHAPES:  # the whole loss's gradient against torch's (class weights, ignored rows)
        z, tc = _z(n, c), RNG.integers(0, c, n)
        tc[::3] = -100
        w = RNG.uniform(0.2, 2.0, c).astype(np.float32)
        x = ember.from_numpy(z.copy()).requires_grad_()
        F.cross_entropy(x, ember.tensor(tc), weight=ember.from_numpy(w)).backward()
        tx = torch.from_numpy(z).double().requires_grad_()
        loss = torch.nn.functional.cross_entropy(
            tx, torch.from_numpy(tc), torch.from_numpy(w).double()
        )
        loss.backward()
        if (tc != -100).any():
            np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_grad_in_place_over_the_logits():
    (k,) = registry.kernels("ce_grad")
    args = _grad_case(6, 70, weighted=True, in_place=True)
    z = args[0]
    want = ce.grad_reference(z.copy(), *args[1:-1])
    got = k.fn(*args)
    assert got is z
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_grad_nan_row_stays_nan_ignored_rows_are_zero():
    (k,) = registry.kernels("ce_grad")
    z, m, logs, s, b, gl, tc, valid, _ = _grad_case(4, 33)
    z[1, 5] = np.nan
    z[0, 2] = np.nan  # row 0 is ignored: zeros all the same
    m, logs = ce.ce_lse(z)
    got = k.fn(z, m, logs, s, b, gl, tc, valid)
    assert np.isnan(got[1]).all() and (got[0] == 0).all() and np.isfinite(got[2:]).all()


def test_the_loss_takes_the_kernels(monkeypatch):
    """F.cross_entropy on float32 (N, C) logits without smoothing runs both kernels; smoothing
    keeps the numpy path; the losses agree with torch either way."""
    names = picked_kernels(monkeypatch)
    z, tc = _z(9, 120), RNG.integers(0, 120, 9)
    for smoothing in (0.0, 0.1):
        names.clear()
        x = ember.from_numpy(z.copy()).requires_grad_()
        loss = F.cross_entropy(x, ember.tensor(tc), label_smoothing=smoothing)
        loss.backward()
        assert names == ([] if smoothing else ["ce_lse", "ce_grad"])
        tx = torch.from_numpy(z).double().requires_grad_()
        want = torch.nn.functional.cross_entropy(
            tx, torch.from_numpy(tc), label_smoothing=smoothing
        )
        want.backward()
        np.testing.assert_allclose(loss.item(), want.item(), rtol=1e-6)
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_every_kernel_module_is_in_the_catalog():
    """A fresh process's registry (kernels.cpu.catalog) has loaded every module that registers
    kernels (this one's were missing from it once: the loss ran numpy while its tests passed)."""
    import json
    import re
    from pathlib import Path

    import ember.kernels.cpu

    code = (
        "import json, sys\n"
        "from ember.kernels import registry\n"
        "registry.table()\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('ember.kernels.cpu')),"
        " separators=(',', ':')))\n"
    )
    loaded = set(json.loads(run_fresh(code, {})[-1]))
    root = Path(ember.kernels.cpu.__file__).parent
    registering = {
        "ember.kernels.cpu." + ".".join(p.relative_to(root).with_suffix("").parts)
        for p in root.rglob("*.py")
        if re.search(r"(?<![.\w])register\(", p.read_text()) and p.name != "__init__.py"
    }
    assert registering and registering <= loaded, registering - loaded
