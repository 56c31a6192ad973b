"""Dropout: zero elements (or whole channels) with probability p, scale the rest by 1/(1-p)."""

from __future__ import annotations

import numpy as np

from ember.autograd import Function
from ember.errors import ShapeError
from ember.tensor import Tensor


class _Dropout(Function):
    """x * mask / (1 - p); mask drawn from ember's global generator (broadcast over mask_shape)."""

    def meta(self, x, p, mask_shape):
        return x.shape, x.dtype

    def forward(self, x, p, mask_shape):
        from ember.ops.random import default_generator

        if p >= 1.0:
            self.m = np.zeros(mask_shape, x.dtype)
        else:
            keep = default_generator.rng.random(mask_shape) >= p
            self.m = (keep * (1.0 / (1.0 - p))).astype(x.dtype)
        return x * self.m

    def backward(self, g):
        return g * self.m


def _check_p(p: float) -> None:
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero each element with probability p in training (identity otherwise)."""
    _check_p(p)
    if not training or p == 0.0:
        return input
    out = _Dropout.apply(input, p=p, mask_shape=tuple(input.shape))
    return input._assign(out) if inplace else out


def _feature_dropout(
    input: Tensor, p: float, training: bool, inplace: bool, nd: int, name: str
) -> Tensor:
    _check_p(p)
    if input.ndim not in (nd + 1, nd + 2):
        raise ShapeError(
            f"{name}: expected {nd + 1}-D or {nd + 2}-D input, got shape {tuple(input.shape)}"
        )
    if not training or p == 0.0:
        return input
    shape = tuple(input.shape)
    mask_shape = shape[: input.ndim - nd] + (1,) * nd
    out = _Dropout.apply(input, p=p, mask_shape=mask_shape)
    return input._assign(out) if inplace else out


def dropout1d(
    input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> Tensor:
    """Zero whole channels of (N, C, L) / (C, L) inputs with probability p."""
    return _feature_dropout(input, p, training, inplace, 1, "dropout1d")


def dropout2d(
    input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> Tensor:
    """Zero whole channels of (N, C, H, W) / (C, H, W) inputs with probability p."""
    return _feature_dropout(input, p, training, inplace, 2, "dropout2d")


def dropout3d(
    input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> Tensor:
    """Zero whole channels of (N, C, D, H, W) / (C, D, H, W) inputs with probability p."""
    return _feature_dropout(input, p, training, inplace, 3, "dropout3d")


def alpha_dropout(
    input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False
) -> Tensor:
    """Dropout that keeps SELU's self-normalising mean and variance."""
    _check_p(p)
    if not training or p == 0.0:
        return input
    from ember.ops.random import default_generator

    alpha_p = -1.7580993408473766
    keep = default_generator.rng.random(tuple(input.shape)) >= p
    a = ((1 - p) * (1 + p * alpha_p**2)) ** -0.5
    b = -a * alpha_p * p
    k = Tensor._wrap(keep.astype(input._data.dtype), input.device)
    out = (input * k + alpha_p * (1 - k)) * a + b
    return input._assign(out) if inplace else out


__all__ = ["dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout"]
