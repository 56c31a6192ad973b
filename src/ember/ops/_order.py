"""Order statistics: max/min (values and indices), amax/amin, argmax/argmin, median, mode.

Re-exported by ember.ops.reduce; the helpers they share with it live in _reduce_base. Selection by index (max(dim),
median(dim), mode) sends the gradient to the chosen element; amax/amin and the full max(),
min(), median() split it evenly among ties, as torch does.
"""

from __future__ import annotations

import numpy as np

from ember.autograd import Function, meta_array
from ember.device import META
from ember.errors import DTypeError
from ember.ops._reduce_base import (
    _I64,
    _acc,
    _dims,
    _isfloat,
    _keep,
    _nodiff,
    _nonempty,
    _out,
    _Reduce,
    _rt,
    _shape,
    _up,
)
from ember.ops._util import wrap_dim
from ember.tensor import Tensor


class OrderStat(_Reduce):
    """An order statistic (amax, max(), median()); ties share the gradient evenly, as torch."""

    def forward(self, x, axes, keepdim, fn):
        self.x, self.axes, self.keepdim = x, axes, keepdim
        self.y = _out(fn(x, axes, keepdim), x.dtype)
        return self.y

    def backward(self, g):
        x, axes = self.x, self.axes
        yk = _keep(self.y, axes, self.keepdim)
        mask = x == yk
        if _isfloat(x.dtype):
            mask |= np.isnan(x) & np.isnan(yk)
        cnt = np.sum(mask, axis=axes, keepdims=True)
        with np.errstate(all="ignore"):
            share = _keep(_up(g), axes, self.keepdim) / cnt.astype(_acc(g.dtype))
        return mask * share


class PickAlong(Function):
    """Values at given indices along one axis; the gradient goes to those indices only."""

    def forward(self, x, idx, axis, keepdim, ufunc=None):
        self.shape, self.idx, self.axis, self.keepdim = x.shape, idx, axis, keepdim
        if x.ndim == 0:
            return x.copy()
        if ufunc is not None:  # max/min: the reduction is cheaper than a gather
            return ufunc.reduce(x, axis=axis, keepdims=keepdim)
        v = np.take_along_axis(x, idx, axis)
        return v if keepdim else np.squeeze(v, axis)

    def meta(self, x, idx, axis, keepdim, ufunc=None):
        return _shape(x.shape, (axis,) if x.ndim else (), keepdim), x.dtype

    def backward(self, g):
        if not self.shape:
            return g
        out = np.zeros(self.shape, g.dtype)
        np.put_along_axis(out, self.idx, _keep(g, (self.axis,), self.keepdim), self.axis)
        return out


def _by_index(x: Tensor, dim: int, keepdim: bool, name: str, find, ufunc=None) -> tuple:
    """(values, indices) where find(array, axis) -> int64 indices with the axis kept."""
    nd = x.ndim
    d = wrap_dim(dim, nd)
    if nd:
        _nonempty(x, (d,), name)
    kshape = _shape(x._data.shape, (d,) if nd else (), True)
    if x._device is META:
        idx = meta_array(kshape, _I64)
    elif nd == 0:
        idx = np.zeros((), _I64)
    else:
        idx = find(x._data, d).astype(_I64, copy=False)
    values = PickAlong.apply(x, idx=idx, axis=d, keepdim=keepdim, ufunc=ufunc)
    ind = idx if keepdim or not nd else np.squeeze(idx, d)
    return _rt(name)(values, Tensor._wrap(ind, x._device))


def _amax(x, axes, keepdim):
    return np.maximum.reduce(x, axis=axes, keepdims=keepdim)


def _amin(x, axes, keepdim):
    return np.minimum.reduce(x, axis=axes, keepdims=keepdim)


def _extreme(input: Tensor, dim, keepdim, name: str, fn, ufunc):
    if isinstance(dim, Tensor):
        from ember.ops.elementwise import maximum, minimum

        return (maximum if name == "max" else minimum)(input, dim)
    if dim is None:
        _nonempty(input, None, name)
        return OrderStat.apply(input, axes=tuple(range(input.ndim)), keepdim=False, fn=fn)
    if name == "max":
        find = lambda a, ax: a.argmax(axis=ax, keepdims=True)  # noqa: E731
    else:
        find = lambda a, ax: a.argmin(axis=ax, keepdims=True)  # noqa: E731
    return _by_index(input, dim, keepdim, name, find, ufunc)


def max(input: Tensor, dim=None, keepdim: bool = False):
    """The largest element (0-d); with dim, (values, indices); with a tensor, maximum()."""
    return _extreme(input, dim, keepdim, "max", _amax, np.maximum)


def min(input: Tensor, dim=None, keepdim: bool = False):
    """The smallest element (0-d); with dim, (values, indices); with a tensor, minimum()."""
    return _extreme(input, dim, keepdim, "min", _amin, np.minimum)


def amax(input: Tensor, dim=(), keepdim: bool = False) -> Tensor:
    """Largest values over dim (all by default); ties share the gradient evenly."""
    axes = _dims(dim, input.ndim, "amax")
    _nonempty(input, axes, "amax")
    return OrderStat.apply(input, axes=axes, keepdim=keepdim, fn=_amax)


def amin(input: Tensor, dim=(), keepdim: bool = False) -> Tensor:
    """Smallest values over dim (all by default); ties share the gradient evenly."""
    axes = _dims(dim, input.ndim, "amin")
    _nonempty(input, axes, "amin")
    return OrderStat.apply(input, axes=axes, keepdim=keepdim, fn=_amin)


def aminmax(input: Tensor, *, dim=None, keepdim: bool = False):
    """(min, max) over one dim or all."""
    if dim is not None and not isinstance(dim, (int, np.integer)):
        raise TypeError(f"aminmax(): dim must be an int, got {dim!r}")
    rt = _rt("aminmax", ("min", "max"))
    return rt(amin(input, dim, keepdim), amax(input, dim, keepdim))


def _arg(input: Tensor, dim, keepdim: bool, name: str, f) -> Tensor:
    if input._data.dtype == np.bool_:
        raise DTypeError(f"{name}(): bool input is not supported; cast it first")
    x = input
    if dim is None:
        _nonempty(x, None, name)
        shape = (1,) * x.ndim if keepdim else ()
        return _nodiff(x, lambda a: np.reshape(f(a), shape), shape, _I64)
    d = wrap_dim(dim, x.ndim)
    if not x.ndim:
        return _nodiff(x, lambda a: 0, (), _I64)
    _nonempty(x, (d,), name)
    return _nodiff(
        x, lambda a: f(a, axis=d, keepdims=keepdim), _shape(x.shape, (d,), keepdim), _I64
    )


def argmax(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Index of the largest value (over the flattened tensor when dim is None); int64."""
    return _arg(input, dim, keepdim, "argmax", np.argmax)


def argmin(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Index of the smallest value (over the flattened tensor when dim is None); int64."""
    return _arg(input, dim, keepdim, "argmin", np.argmin)


def _nan_first(a: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
    """Replace idx by the first NaN's index in slices that hold a NaN (torch's median)."""
    if not _isfloat(a.dtype):
        return idx
    nan = np.isnan(a)
    return np.where(
        nan.any(axis=axis, keepdims=True), np.argmax(nan, axis=axis, keepdims=True), idx
    )


def _median_idx(a: np.ndarray, axis: int, ignore_nan: bool) -> np.ndarray:
    a = _up(a)
    n = a.shape[axis]
    if not ignore_nan:
        k = (n - 1) // 2
        part = np.argpartition(a, k, axis=axis)
        idx = np.take(part, [k], axis=axis)
        return _nan_first(a, idx, axis)
    order = np.argsort(a, axis=axis, kind="stable")  # NaNs sort last
    c = np.sum(~np.isnan(a), axis=axis, keepdims=True)
    idx = np.take_along_axis(order, np.maximum((c - 1) // 2, 0), axis)
    return np.where(c == 0, np.argmax(np.isnan(a), axis=axis, keepdims=True), idx)


def _median_all(ignore_nan: bool):
    def f(x, axes, keepdim):
        a = _up(x).reshape(-1)
        if ignore_nan and _isfloat(a.dtype):
            a = a[~np.isnan(a)]
        if a.size == 0 or (_isfloat(a.dtype) and np.isnan(a).any()):
            return np.asarray(np.nan)
        k = (a.size - 1) // 2
        return np.partition(a, k)[k]

    return f


def median(input: Tensor, dim=None, keepdim: bool = False):
    """The lower median (0-d, NaN if empty); with dim, (values, indices)."""
    if dim is None:
        return OrderStat.apply(
            input, axes=tuple(range(input.ndim)), keepdim=False, fn=_median_all(False)
        )
    return _by_index(input, dim, keepdim, "median", lambda a, ax: _median_idx(a, ax, False))


def nanmedian(input: Tensor, dim=None, keepdim: bool = False):
    """median() ignoring NaN values."""
    if dim is None:
        return OrderStat.apply(
            input, axes=tuple(range(input.ndim)), keepdim=False, fn=_median_all(True)
        )
    return _by_index(input, dim, keepdim, "nanmedian", lambda a, ax: _median_idx(a, ax, True))


def _mode_idx(a: np.ndarray, axis: int) -> np.ndarray:
    a = np.moveaxis(_up(a), axis, -1)
    n = a.shape[-1]
    order = np.argsort(a, axis=-1, kind="stable")
    s = np.take_along_axis(a, order, -1)
    start = np.ones(s.shape, bool)
    start[..., 1:] = s[..., 1:] != s[..., :-1]
    pos = np.arange(n)
    run = pos - np.maximum.accumulate(np.where(start, pos, 0), axis=-1)
    end = np.argmax(run, axis=-1)[..., None]  # end of the first (smallest) longest run
    return np.moveaxis(np.take_along_axis(order, end, -1), -1, axis)


def mode(input: Tensor, dim: int = -1, keepdim: bool = False):
    """The most frequent value along dim (the smallest on ties) and its last index."""
    return _by_index(input, dim, keepdim, "mode", _mode_idx)
