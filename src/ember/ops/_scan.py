"""Ops along one dim that keep the shape: softmax, log_softmax, cumsum, cumprod.

Re-exported by ember.ops.reduce; the helpers they share with it live in _reduce_base. Softmax is on the hot path of
attention, so it works in place on one output buffer: subtract the max, exp, scale.
"""

from __future__ import annotations

import numpy as np

from ember import dtypes as _dt
from ember.autograd import Function
from ember.errors import DTypeError
from ember.ops._reduce_base import _F32, _LOW, _isfloat
from ember.ops._util import cast, wrap_dim
from ember.tensor import Tensor


class _AlongDim(Function):
    """Base: the output has the input's shape (and the given dtype); meta needs no data."""

    def meta(self, x, axis, dtype=None, **kw):
        return x.shape, dtype if dtype is not None else x.dtype


# ------------------------------------------------------------------ softmax
class Softmax(_AlongDim):
    """softmax or log_softmax along one axis; float16/bfloat16 compute in float32."""

    def forward(self, x, axis, log):
        self.log, self.axis = log, axis
        lo = x.dtype if x.dtype in _LOW else None
        if x.ndim == 0:
            return self.forward(x.reshape(1), 0, log).reshape(())
        if x.size == 0:
            self.y = np.empty(x.shape, _F32 if lo else x.dtype)
            return self.y.astype(lo) if lo else self.y
        m = np.maximum.reduce(x, axis=axis, keepdims=True)
        if lo is not None:
            y = x.astype(_F32)
            m = m.astype(_F32)
            y -= m
        else:
            y = np.subtract(x, m)
        if log:
            e = np.exp(y)
            s = np.add.reduce(e, axis=axis, keepdims=True)
            del e
            np.log(s, out=s)
            y -= s
        else:
            np.exp(y, out=y)
            s = np.add.reduce(y, axis=axis, keepdims=True)
            np.reciprocal(s, out=s)
            y *= s
        self.y = y
        return y.astype(lo) if lo is not None else y

    def backward(self, g):
        y = self.y
        shape = g.shape
        if g.ndim == 0:
            g = g.reshape(1)
        if g.dtype != y.dtype:
            g = g.astype(y.dtype)
        ax = self.axis
        if self.log:  # g - exp(y) * sum(g)
            t = np.exp(y)
            t *= np.sum(g, axis=ax, keepdims=True)
            np.subtract(g, t, out=t)
        else:  # y * (g - sum(g * y))
            t = np.multiply(g, y)
            s = np.sum(t, axis=ax, keepdims=True)
            np.subtract(g, s, out=t)
            t *= y
        return t.reshape(shape)


def _softmax(input: Tensor, dim, dtype, log: bool, name: str) -> Tensor:
    if dim is None:
        raise TypeError(f"{name}(): dim is required (the dimension to normalise over)")
    x = input
    if dtype is not None:
        x = cast(x, dtype)
    elif not _isfloat(x._data.dtype):
        raise DTypeError(f"{name}(): expected a floating point input, got {x.dtype}; pass dtype=")
    return Softmax.apply(x, axis=wrap_dim(dim, x.ndim), log=log)


def softmax(input: Tensor, dim: int, dtype=None) -> Tensor:
    """exp(x) / sum(exp(x)) along dim, computed stably (the max is subtracted first)."""
    return _softmax(input, dim, dtype, False, "softmax")


def log_softmax(input: Tensor, dim: int, dtype=None) -> Tensor:
    """x - logsumexp(x) along dim, computed stably."""
    return _softmax(input, dim, dtype, True, "log_softmax")


# ------------------------------------------------------------------ cumsum / cumprod
def _rev_cumsum(a: np.ndarray, axis: int) -> np.ndarray:
    return np.flip(np.cumsum(np.flip(a, axis), axis=axis), axis)


class CumSum(_AlongDim):
    """Running sum along one axis; the gradient is the reversed running sum."""

    def forward(self, x, axis, dtype):
        self.axis = axis
        if x.ndim == 0:
            return x.astype(dtype)
        acc = _F32 if dtype in _LOW else dtype
        if not np.can_cast(x.dtype, acc, "same_kind"):
            x = x.astype(acc)
        return np.cumsum(x, axis=axis, dtype=acc).astype(dtype, copy=False)

    def backward(self, g):
        return g if g.ndim == 0 else _rev_cumsum(g, self.axis)


class CumProd(_AlongDim):
    """Running product along one axis; the gradient is exact with zeros."""

    def forward(self, x, axis, dtype):
        self.axis = axis
        if x.ndim == 0:
            self.x = x
            return x.astype(dtype)
        acc = _F32 if dtype in _LOW else dtype
        if not np.can_cast(x.dtype, acc, "same_kind"):
            x = x.astype(acc)
        self.x = x
        self.y = np.cumprod(x, axis=axis, dtype=acc)
        return self.y.astype(dtype, copy=False)

    def backward(self, g):
        if g.ndim == 0:
            return g
        ax, x, y = self.axis, self.x, self.y
        if x.dtype in _LOW:
            x = x.astype(_F32)
        g = g.astype(y.dtype, copy=False)
        zero = x == 0
        with np.errstate(all="ignore"):
            a = _rev_cumsum(g * y, ax) / x
            if not zero.any():
                return a
            # before the first zero: sum_j g_j y_j / x_i; at it: the running product without it;
            # after it: 0 (every product through it holds that zero).
            n = x.shape[ax]
            first = np.where(
                zero.any(axis=ax, keepdims=True), np.argmax(zero, axis=ax, keepdims=True), n
            )
            pos = np.arange(n).reshape([-1 if i == ax else 1 for i in range(x.ndim)])
            x2 = np.where(pos == first, 1, x).astype(x.dtype)
            b = _rev_cumsum(g * np.cumprod(x2, axis=ax), ax)
        return np.where(pos < first, a, np.where(pos == first, b, 0)).astype(y.dtype)


def _scan(cls, input: Tensor, dim, dtype, name: str) -> Tensor:
    x = input
    if dtype is not None:
        dt = _dt.get_dtype(dtype)
        x = cast(x, dt) if dt.is_floating_point else x.detach()
        odt = dt.np
    elif _isfloat(x._data.dtype):
        odt = x._data.dtype
    else:
        x, odt = x.detach(), np.dtype(np.int64)
    return cls.apply(x, axis=wrap_dim(dim, x.ndim), dtype=odt)


def cumsum(input: Tensor, dim: int, *, dtype=None) -> Tensor:
    """Running sum along dim; ints and bools accumulate as int64."""
    return _scan(CumSum, input, dim, dtype, "cumsum")


def cumprod(input: Tensor, dim: int, *, dtype=None) -> Tensor:
    """Running product along dim; ints and bools accumulate as int64."""
    return _scan(CumProd, input, dim, dtype, "cumprod")
