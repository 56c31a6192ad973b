"""Dropout, Dropout1d, Dropout2d, Dropout3d, AlphaDropout."""

from __future__ import annotations

from ember.nn import functional as F
from ember.nn.module import Module
from ember.tensor import Tensor


class _DropoutNd(Module):
    """p and inplace."""

    _fn = None

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        """Drop in training mode; identity in eval mode."""
        return type(self)._fn(input, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        """p and inplace."""
        return f"p={self.p}, inplace={self.inplace}"


class Dropout(_DropoutNd):
    """Zero each element with probability p during training, scaling the rest by 1/(1-p)."""

    _fn = staticmethod(F.dropout)


class Dropout1d(_DropoutNd):
    """Zero whole channels of (N, C, L) inputs."""

    _fn = staticmethod(F.dropout1d)


class Dropout2d(_DropoutNd):
    """Zero whole channels of (N, C, H, W) inputs."""

    _fn = staticmethod(F.dropout2d)


class Dropout3d(_DropoutNd):
    """Zero whole channels of (N, C, D, H, W) inputs."""

    _fn = staticmethod(F.dropout3d)


class AlphaDropout(_DropoutNd):
    """Dropout that keeps SELU's mean and variance."""

    _fn = staticmethod(F.alpha_dropout)
