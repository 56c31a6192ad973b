"""Gradient clipping and parameter/vector conversion (torch.nn.utils)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ember.errors import EmberError, ShapeError
from ember.tensor import Tensor


def _grads(parameters) -> list:
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def get_total_norm(
    tensors: Iterable[Tensor], norm_type: float = 2.0, error_if_nonfinite: bool = False
) -> Tensor:
    """The norm of all tensors together (as if concatenated)."""
    tensors = list(tensors)
    arrays = [np.asarray(t._data, np.float64) for t in tensors]
    norm_type = float(norm_type)
    if not arrays:
        total = 0.0
    elif math.isinf(norm_type):
        total = max(float(np.abs(a).max()) if a.size else 0.0 for a in arrays)
    else:
        total = sum(float((np.abs(a) ** norm_type).sum()) for a in arrays) ** (1.0 / norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise EmberError(
            f"The total norm of order {norm_type} for gradients from `parameters` is "
            "non-finite, so it cannot be "
            "clipped. To disable this error and scale the gradients by the non-finite "
            "norm anyway, set "
            "`error_if_nonfinite=False`"
        )
    dt = tensors[0]._data.dtype if tensors else np.float32
    return Tensor._wrap(np.asarray(total, dt))


def clip_grad_norm_(
    parameters,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach=None,
) -> Tensor:
    """Scale gradients in place so their joint norm is <= max_norm; returns the norm before."""
    grads = _grads(parameters)
    total = get_total_norm(grads, norm_type, error_if_nonfinite)
    if not grads:
        return total
    coef = float(max_norm) / (float(total._data) + 1e-6)
    if coef < 1.0:
        for g in grads:
            g._data = (g._data * coef).astype(g._data.dtype, copy=False)
    return total


def clip_grad_value_(parameters, clip_value: float, foreach=None) -> None:
    """Clamp every gradient element into [-clip_value, clip_value] in place."""
    for g in _grads(parameters):
        np.clip(g._data, -clip_value, clip_value, out=g._data)


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """All parameters flattened and concatenated into one vector (a copy)."""
    from ember.ops.movement import cat

    return cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Copy consecutive slices of vec into the parameters (in place)."""
    if vec.ndim != 1:
        raise ShapeError(f"expected a 1-D vector, got shape {tuple(vec.shape)}")
    off = 0
    for p in parameters:
        n = p.numel()
        p._data[...] = vec._data[off : off + n].reshape(p._data.shape)
        off += n


__all__ = [
    "clip_grad_norm_",
    "clip_grad_value_",
    "get_total_norm",
    "parameters_to_vector",
    "vector_to_parameters",
]
