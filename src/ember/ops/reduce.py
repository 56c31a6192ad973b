"""Reductions: sum, mean, prod, var/std, logsumexp, norm, all/any (+ order stats, softmax, scans).

Every reduction takes ``dim`` as an int, a tuple or None (all dims; an empty tuple too) and
``keepdim``, as torch. float16/bfloat16 accumulate in float32 and round back (torch's opmath).
Meta tensors get their shape from ``_Reduce.meta`` without touching data.
"""

from __future__ import annotations

import builtins as _b
import math

import numpy as np

from ember import dtypes as _dt
from ember.errors import UnsupportedError
from ember.ops._reduce_base import (
    _I64,
    _LOW,
    _acc,
    _count,
    _dims,
    _expand_back,
    _float_only,
    _int_to_long,
    _isfloat,
    _keep,
    _nodiff,
    _nonempty,
    _out,
    _Reduce,
    _run,
    _shape,
    _up,
)
from ember.ops._util import cast
from ember.tensor import Tensor


# ------------------------------------------------------------------ sum / mean / prod
class Sum(_Reduce):
    """Sum over axes."""

    def forward(self, x, axes, keepdim, dtype=None):
        self.shape, self.axes, self.keepdim = x.shape, axes, keepdim
        return _run(np.add, x, axes, keepdim, x.dtype if dtype is None else dtype)

    def backward(self, g):
        return _expand_back(g, self.shape, self.axes, self.keepdim)


def sum(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """Sum of elements over dim (an int, a tuple, or None for all); ints and bools sum as int64."""
    x, odt = _int_to_long(input, dtype)
    return Sum.apply(x, axes=_dims(dim, x.ndim, "sum"), keepdim=keepdim, dtype=odt)


class Mean(_Reduce):
    """Mean over axes."""

    def forward(self, x, axes, keepdim, dtype):
        self.shape, self.axes, self.keepdim = x.shape, axes, keepdim
        self.n = _count(x.shape, axes)
        if self.n == 0:
            return np.full(_shape(x.shape, axes, keepdim), np.nan, dtype)
        acc = _acc(dtype)
        s = np.add.reduce(x, axis=axes, dtype=acc, keepdims=keepdim)
        return _out(s / acc.type(self.n), dtype)

    def backward(self, g):
        with np.errstate(all="ignore"):
            return _expand_back(
                g / np.asarray(self.n, g.dtype), self.shape, self.axes, self.keepdim
            )


def mean(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """Mean over dim; float input only (integer input needs dtype=), as torch."""
    x = _float_only(input, "mean", dtype)
    return Mean.apply(x, axes=_dims(dim, x.ndim, "mean"), keepdim=keepdim, dtype=x._data.dtype)


class NanSum(_Reduce):
    """Sum treating NaN as zero; no gradient flows to NaN entries."""

    def forward(self, x, axes, keepdim, dtype, mean=False):
        x = _up(x)  # numpy's nan* functions skip NaN only in its own float types
        self.x, self.axes, self.keepdim, self.mean = x, axes, keepdim, mean
        acc = _acc(dtype)
        if not _isfloat(x.dtype):
            return _out(np.sum(x, axis=axes, dtype=acc, keepdims=keepdim), dtype)
        with np.errstate(all="ignore"):
            s = np.nansum(x, axis=axes, dtype=acc, keepdims=keepdim)
            if mean:
                self.n = np.sum(~np.isnan(x), axis=axes, keepdims=keepdim)
                s = s / self.n.astype(s.dtype)
        return _out(s, dtype)

    def backward(self, g):
        x = self.x
        g = _up(g)
        with np.errstate(all="ignore"):
            if self.mean:
                g = g / self.n.astype(g.dtype)
        return _expand_back(g, x.shape, self.axes, self.keepdim) * ~np.isnan(x)


def nansum(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """Sum over dim treating NaN as zero."""
    x, odt = _int_to_long(input, dtype)
    return NanSum.apply(x, axes=_dims(dim, x.ndim, "nansum"), keepdim=keepdim, dtype=odt)


def nanmean(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """Mean over dim of the non-NaN elements (NaN where there are none)."""
    x = _float_only(input, "nanmean", dtype)
    axes = _dims(dim, x.ndim, "nanmean")
    return NanSum.apply(x, axes=axes, keepdim=keepdim, dtype=x._data.dtype, mean=True)


class Prod(_Reduce):
    """Product over axes; the gradient is exact with zeros (products of all the others)."""

    def forward(self, x, axes, keepdim, dtype):
        self.x, self.axes, self.keepdim = x, axes, keepdim
        return _run(np.multiply, x, axes, keepdim, dtype)

    def backward(self, g):
        x, axes = _up(self.x), self.axes
        if x.size == 0:
            return np.zeros(x.shape, _acc(g.dtype))
        rest = [i for i in range(x.ndim) if i not in axes]
        perm = rest + list(axes)
        xt = np.transpose(x, perm).reshape([x.shape[i] for i in rest] + [_count(x.shape, axes)])
        one = np.ones(xt.shape[:-1] + (1,), xt.dtype)
        left = np.concatenate([one, np.cumprod(xt[..., :-1], axis=-1)], axis=-1)
        right = np.concatenate([np.cumprod(xt[..., :0:-1], axis=-1)[..., ::-1], one], axis=-1)
        gk = _keep(_up(g), axes, self.keepdim)
        gt = np.transpose(
            np.broadcast_to(gk, [1 if i in axes else n for i, n in enumerate(x.shape)]), perm
        )
        d = (left * right).reshape([x.shape[i] for i in perm]) * gt
        return np.transpose(d, np.argsort(perm))


def prod(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """Product over dim (None for all); ints and bools multiply as int64."""
    x, odt = _int_to_long(input, dtype)
    return Prod.apply(x, axes=_dims(dim, x.ndim, "prod"), keepdim=keepdim, dtype=odt)


# ------------------------------------------------------------------ var / std
class Var(_Reduce):
    """Variance (or standard deviation) over axes with a correction (Bessel's is 1)."""

    def forward(self, x, axes, keepdim, correction, sqrt):
        xf = _up(x)
        self.x, self.axes, self.keepdim, self.sqrt = xf, axes, keepdim, sqrt
        n = _count(x.shape, axes)
        self.dof = _b.max(n - correction, 0)
        with np.errstate(all="ignore"):
            if n:
                self.m = np.add.reduce(xf, axis=axes, keepdims=True) / xf.dtype.type(n)
            else:  # numpy warns on the mean of nothing; torch gives NaN quietly
                self.m = np.full(_shape(xf.shape, axes, True), np.nan, xf.dtype)
            d = np.asarray(xf - self.m)
            np.multiply(d, d, out=d)
            v = np.add.reduce(d, axis=axes, keepdims=keepdim) / xf.dtype.type(self.dof)
            if sqrt:
                v = np.sqrt(v)
        self.y = np.asarray(v)
        return _out(v, x.dtype)

    def backward(self, g):
        g = _keep(_up(g), self.axes, self.keepdim)
        with np.errstate(all="ignore"):
            if self.sqrt:
                y = _keep(self.y, self.axes, self.keepdim)
                g = np.where(y == 0, 0, g / (2 * y)).astype(g.dtype)
            return (2 / np.asarray(self.dof, g.dtype)) * g * (self.x - self.m)


def _var_args(dim, unbiased, correction, name) -> tuple:
    if isinstance(dim, bool):  # var(x, True): the old unbiased flag
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        raise ValueError(f"{name}(): pass either unbiased or correction, not both")
    c = correction if correction is not None else (1 if unbiased is None else int(bool(unbiased)))
    return dim, c


def _var(input, dim, unbiased, keepdim, correction, sqrt, name) -> Tensor:
    dim, c = _var_args(dim, unbiased, correction, name)
    x = _float_only(input, name)
    return Var.apply(x, axes=_dims(dim, x.ndim, name), keepdim=keepdim, correction=c, sqrt=sqrt)


def var(
    input: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None
) -> Tensor:
    """Variance over dim with correction (default 1) or the older unbiased flag."""
    return _var(input, dim, unbiased, keepdim, correction, False, "var")


def std(
    input: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None
) -> Tensor:
    """Standard deviation over dim with correction (default 1) or the older unbiased flag."""
    return _var(input, dim, unbiased, keepdim, correction, True, "std")


def var_mean(input: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
    """(var, mean) over dim."""
    v = _var(input, dim, unbiased, keepdim, correction, False, "var_mean")
    return v, mean(input, _var_args(dim, unbiased, correction, "var_mean")[0], keepdim)


def std_mean(input: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
    """(std, mean) over dim."""
    s = _var(input, dim, unbiased, keepdim, correction, True, "std_mean")
    return s, mean(input, _var_args(dim, unbiased, correction, "std_mean")[0], keepdim)


# ------------------------------------------------------------------ logsumexp / norm
class LogSumExp(_Reduce):
    """log(sum(exp(x))) computed stably around the maximum."""

    def forward(self, x, axes, keepdim):
        xf = _up(x)
        self.x, self.axes, self.keepdim = xf, axes, keepdim
        if _b.any(x.shape[a] == 0 for a in axes):
            self.out = np.full(_shape(x.shape, axes, True), -np.inf, xf.dtype)
        else:
            m = np.asarray(np.maximum.reduce(xf, axis=axes, keepdims=True))
            m[np.isinf(m)] = 0
            with np.errstate(all="ignore"):
                e = np.exp(xf - m)
                self.out = np.log(np.add.reduce(e, axis=axes, keepdims=True)) + m
        r = self.out if keepdim else np.squeeze(self.out, axes)
        return _out(r, x.dtype)

    def backward(self, g):
        with np.errstate(all="ignore"):
            return _keep(_up(g), self.axes, self.keepdim) * np.exp(self.x - self.out)


def logsumexp(input: Tensor, dim, keepdim: bool = False) -> Tensor:
    """log(sum(exp(input), dim)), stable for large values; integer input gives float."""
    x = input if _isfloat(input._data.dtype) else cast(input, _dt.get_default_dtype())
    return LogSumExp.apply(x, axes=_dims(dim, x.ndim, "logsumexp"), keepdim=keepdim)


class Norm(_Reduce):
    """Vector p-norm over axes; gradients at zero are 0 as in torch."""

    def forward(self, x, axes, keepdim, p):
        xf = _up(x)
        self.x, self.axes, self.keepdim, self.p = xf, axes, keepdim, p
        with np.errstate(all="ignore"):
            a = np.abs(xf)
            if p == 2:
                y = np.sqrt(np.sum(a * a, axis=axes, keepdims=keepdim))
            elif p == math.inf:
                y = np.max(a, axis=axes, keepdims=keepdim)
            elif p == -math.inf:
                y = np.min(a, axis=axes, keepdims=keepdim)
            elif p == 0:
                y = np.sum(a != 0, axis=axes, keepdims=keepdim, dtype=xf.dtype)
            elif p == 1:
                y = np.sum(a, axis=axes, keepdims=keepdim)
            else:
                y = np.sum(a**p, axis=axes, keepdims=keepdim) ** (1.0 / p)
        self.y = np.asarray(y, xf.dtype)
        return _out(y, x.dtype)

    def backward(self, g):
        x, p, axes = self.x, self.p, self.axes
        g = _keep(_up(g), axes, self.keepdim)
        y = _keep(self.y, axes, self.keepdim)
        with np.errstate(all="ignore"):
            if p == 0:
                return np.zeros(x.shape, g.dtype)
            if p == 1:
                return np.sign(x) * g
            if p in (math.inf, -math.inf):
                mask = np.abs(x) == y
                return np.sign(x) * mask * (g / np.sum(mask, axis=axes, keepdims=True))
            if p == 2:
                return x * np.where(y == 0, 0, g / y).astype(g.dtype)
            a = np.abs(x)
            if p < 1:
                s = np.where(x == 0, 0, np.sign(x) * a ** (p - 1))
                return s * g * y ** (1 - p)
            s = np.sign(x) * a ** (p - 1) if p < 2 else x * a ** (p - 2)
            return s * np.where(y == 0, 0, g / y ** (p - 1))


def norm(input: Tensor, p="fro", dim=None, keepdim: bool = False, dtype=None) -> Tensor:
    """Vector p-norm over dim (all by default): p = 'fro' (2), any number, inf or -inf."""
    if p == "nuc":
        raise UnsupportedError("norm(p='nuc') (nuclear norm) is not supported")
    if p is None or p == "fro":
        p = 2
    if isinstance(p, str) or not isinstance(p, (int, float, np.number)):
        raise ValueError(f"norm(): p must be a number, 'fro' or 'nuc', got {p!r}")
    x = _float_only(input, "norm", dtype)
    axes = _dims(dim, x.ndim, "norm")
    if p in (math.inf, -math.inf):
        _nonempty(x, axes if dim is not None else None, "norm(p=inf)")
    return Norm.apply(x, axes=axes, keepdim=keepdim, p=float(p))


# ------------------------------------------------------------------ all / any / count_nonzero
def _logical(input: Tensor, dim, keepdim: bool, name: str, f) -> Tensor:
    x = input
    axes = _dims(dim, x.ndim, name)
    odt = np.uint8 if x._data.dtype == np.uint8 else np.bool_

    def run(a):
        if a.dtype in _LOW:
            a = a != 0
        return f(a, axis=axes, keepdims=keepdim)

    return _nodiff(x, run, _shape(x.shape, axes, keepdim), odt)


def all(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Whether every element over dim is nonzero (bool; uint8 for uint8 input, as torch)."""
    return _logical(input, dim, keepdim, "all", np.all)


def any(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Whether any element over dim is nonzero (bool; uint8 for uint8 input, as torch)."""
    return _logical(input, dim, keepdim, "any", np.any)


def count_nonzero(input: Tensor, dim=None) -> Tensor:
    """The number of nonzero elements over dim (int64)."""
    axes = _dims(dim, input.ndim, "count_nonzero")
    return _nodiff(
        input,
        lambda a: np.sum(a != 0, axis=axes, dtype=_I64),
        _shape(input.shape, axes, False),
        _I64,
    )


# --------------------------------------------- order statistics, softmax, scans (own modules)
from ember.ops._order import (  # noqa: E402
    amax,
    amin,
    aminmax,
    argmax,
    argmin,
    max,
    median,
    min,
    mode,
    nanmedian,
)
from ember.ops._scan import cumprod, cumsum, log_softmax, softmax  # noqa: E402

__all__ = [
    "sum", "mean", "nansum", "nanmean", "prod", "max", "min", "amax", "amin", "aminmax", "argmax",
    "argmin", "median", "nanmedian", "mode", "var", "std", "var_mean", "std_mean", "logsumexp",
    "norm", "all", "any", "count_nonzero", "softmax", "log_softmax", "cumsum", "cumprod",
]  # fmt: skip
