"""Reductions: sum, mean, prod, max/min, var/std, logsumexp, softmax, cumsum, all/any, norm."""

from __future__ import annotations

import numpy as np

from ember import dtypes as _dt
from ember.autograd import Function
from ember.ops._util import cast, wrap_dims
from ember.tensor import Tensor


def _expand_back(g: np.ndarray, shape: tuple, axes: tuple, keepdim: bool) -> np.ndarray:
    """Broadcast a reduced gradient back to the input shape."""
    if not keepdim:
        g = np.expand_dims(g, axes)
    return np.broadcast_to(g, shape)


class Sum(Function):
    """Sum over axes."""

    def forward(self, x, axes, keepdim):
        self.shape, self.axes, self.keepdim = x.shape, axes, keepdim
        return np.sum(x, axis=axes, keepdims=keepdim)

    def backward(self, g):
        return _expand_back(g, self.shape, self.axes, self.keepdim)


def sum(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """Sum of elements over dim (an int, a tuple, or None for all); ints and bools sum as int64."""
    x = input
    if dtype is not None:
        x = cast(x, dtype)
    elif x._data.dtype.kind in "biu":
        x = cast(x, _dt.int64)
    axes = wrap_dims(dim, x._data.ndim)
    if x._data.ndim == 0:
        axes = ()
    return Sum.apply(x, axes=axes, keepdim=keepdim)


__all__ = ["sum"]
METHODS = {"sum": sum}
