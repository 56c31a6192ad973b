"""Helpers for nn tests: copy torch weights into ember modules, compare forward and all grads."""

from __future__ import annotations

import numpy as np
import torch

import ember
from tests.helpers import TORCH_DT, assert_close, from_torch, to_torch


def sd_to_ember(sd: dict) -> dict:
    """A torch state_dict as ember tensors (copies, bfloat16 kept)."""
    return {k: ember.from_numpy(np.array(from_torch(v), copy=True)) for k, v in sd.items()}


def sync(tmod: torch.nn.Module, emod, strict: bool = True):
    """Load tmod's weights into emod through state_dict (keys must match torch's)."""
    return emod.load_state_dict(sd_to_ember(tmod.state_dict()), strict=strict)


def _flat(out) -> list:
    if isinstance(out, (tuple, list)):
        res = []
        for o in out:
            res += _flat(o)
        return res
    return [out]


def make_pair(arrays, grad: bool) -> tuple:
    """Ember and torch inputs from numpy arrays (float arrays require grad when grad)."""
    e_in, t_in = [], []
    for a in arrays:
        if isinstance(a, np.ndarray):
            rg = grad and a.dtype.kind == "f"
            e_in.append(ember.from_numpy(a.copy()).requires_grad_(rg))
            t_in.append(to_torch(a).requires_grad_(rg))
        else:
            e_in.append(a)
            t_in.append(a)
    return e_in, t_in


def check_module(
    emod,
    tmod,
    arrays,
    dtype=ember.float64,
    atol=None,
    rtol=None,
    grad: bool = True,
    ekw: dict | None = None,
    tkw: dict | None = None,
    load: bool = True,
    seed: int = 0,
) -> tuple:
    """Copy tmod's weights into emod, run both on the same inputs, compare outputs, input grads
    and every parameter's grad (by torch's parameter names). Returns (ember out, torch out)."""
    if load:
        sync(tmod, emod)
    e_in, t_in = make_pair(arrays, grad)
    t_out = tmod(*t_in, **(tkw or {}))
    e_out = emod(*e_in, **(ekw or {}))
    fe, ft = _flat(e_out), _flat(t_out)
    assert len(fe) == len(ft), f"{len(fe)} outputs vs torch {len(ft)}"
    for i, (a, b) in enumerate(zip(fe, ft)):
        if b is None:
            assert a is None, f"output {i}: expected None"
            continue
        assert_close(a, b, dtype, f"{type(emod).__name__} output {i}", atol, rtol)
    if not grad:
        return e_out, t_out
    rng = np.random.default_rng(seed)
    lt, le = 0, 0
    for a, b in zip(fe, ft):
        if isinstance(b, torch.Tensor) and b.requires_grad:
            w = rng.standard_normal(tuple(b.shape)).astype(dtype.np)
            lt = lt + (b * to_torch(w)).sum()
            le = le + (a * ember.from_numpy(w)).sum()
    lt.backward()
    le.backward()
    for i, (a, b) in enumerate(zip(e_in, t_in)):
        if isinstance(b, torch.Tensor) and b.requires_grad:
            assert a.grad is not None, f"input {i} has no grad"
            assert_close(a.grad, b.grad, dtype, f"{type(emod).__name__} input grad {i}", atol, rtol)
    eparams = dict(emod.named_parameters())
    for name, p in tmod.named_parameters():
        ep = eparams[name]
        if p.grad is None:
            assert ep.grad is None or not np.any(ep.grad.numpy()), f"{name}: grad should be None"
            continue
        assert ep.grad is not None, f"parameter {name} has no grad"
        assert_close(ep.grad, p.grad, dtype, f"{type(emod).__name__} grad of {name}", atol, rtol)
    return e_out, t_out


def rnd(*shape, dtype=ember.float64, seed=0, low=-1.0, high=1.0) -> np.ndarray:
    """Uniform random numpy data of an ember dtype."""
    return np.random.default_rng(seed).uniform(low, high, shape).astype(dtype.np)


__all__ = ["TORCH_DT", "check_module", "make_pair", "rnd", "sd_to_ember", "sync"]
