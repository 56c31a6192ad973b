"""What every reduction shares: accumulation dtypes, dim handling, result shapes, the _Reduce
base class (shape-only meta) and torch.return_types-like (values, indices) tuples.

Below reduce, _order (max, median, ...) and _scan (softmax, cumsum, ...), which all use it.
"""

from __future__ import annotations

import builtins as _b
from collections import namedtuple

import numpy as np

from ember import dtypes as _dt
from ember.autograd import Function, meta_array
from ember.device import META
from ember.errors import DTypeError, ShapeError
from ember.ops._util import cast, wrap_dim
from ember.tensor import Tensor

_LOW = _dt.HALF_FLOATS  # float16, bfloat16 (ml_dtypes not imported to ask)
_F32 = np.dtype(np.float32)
_I64 = np.dtype(np.int64)


# ------------------------------------------------------------------ helpers
def _isfloat(d: np.dtype) -> bool:
    return d.kind == "f" or d.name == "bfloat16"


def _acc(d: np.dtype) -> np.dtype:
    """The accumulation dtype: float32 for float16/bfloat16, else d."""
    return _F32 if d in _LOW else d


def _up(a: np.ndarray) -> np.ndarray:
    return a.astype(_F32) if a.dtype in _LOW else a


def _out(r, d: np.dtype) -> np.ndarray:
    r = np.asarray(r)
    return r if r.dtype == d else r.astype(d)


def _run(ufunc, x: np.ndarray, axes: tuple, keepdim: bool, dtype: np.dtype):
    """ufunc.reduce over axes, accumulating in float32 for float16/bfloat16, rounded to dtype.

    ufunc.reduce directly: np.sum's Python wrapper costs more than the sum of a small tensor.
    """
    if x.dtype == dtype and dtype not in _LOW:
        return ufunc.reduce(x, axis=axes, keepdims=keepdim)
    acc = _acc(dtype)
    if not np.can_cast(x.dtype, acc, "same_kind"):
        x = x.astype(acc)
    return _out(ufunc.reduce(x, axis=axes, dtype=acc, keepdims=keepdim), dtype)


def _dims(dim, ndim: int, name: str) -> tuple:
    """dim (None, int, tuple/list; an empty tuple means all) -> sorted axes; () for 0-d input."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, (int, np.integer)) and not isinstance(dim, bool):
        axes = (wrap_dim(int(dim), ndim),)
    elif isinstance(dim, (tuple, list)):
        if not dim:
            return tuple(range(ndim))
        if not _b.all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in dim):
            raise TypeError(f"{name}(): dim must be an int or a tuple of ints, got {dim!r}")
        axes = tuple(wrap_dim(int(d), ndim) for d in dim)
        if len(set(axes)) != len(axes):
            raise ShapeError(f"{name}(): dim {dim!r} names dimension(s) more than once")
    else:
        raise TypeError(f"{name}(): dim must be an int, a tuple of ints or None, got {dim!r}")
    return tuple(sorted(axes)) if ndim else ()


def _shape(shape: tuple, axes: tuple, keepdim: bool) -> tuple:
    if keepdim:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def _count(shape: tuple, axes: tuple) -> int:
    n = 1
    for a in axes:
        n *= shape[a]
    return n


def _keep(g: np.ndarray, axes: tuple, keepdim: bool) -> np.ndarray:
    """A reduced array with the reduced axes present (size 1)."""
    return g if keepdim or not axes else np.expand_dims(g, axes)


def _expand_back(g: np.ndarray, shape: tuple, axes: tuple, keepdim: bool) -> np.ndarray:
    """Broadcast a reduced gradient back to the input shape."""
    return np.broadcast_to(_keep(g, axes, keepdim), shape)


def _nonempty(x: Tensor, axes: tuple | None, name: str) -> None:
    """Raise for reductions that have no identity (max, argmax, ...) over a zero-size extent."""
    shape = x._data.shape
    if axes is None:
        if x._data.size == 0:
            raise ShapeError(
                f"{name}(): cannot reduce an empty tensor of shape {list(shape)}: {name} has no "
                "identity value; pass dim= to reduce a non-empty dimension"
            )
        return
    for a in axes:
        if shape[a] == 0:
            raise ShapeError(
                f"{name}(): expected reduction dim {a} to have non-zero size, got shape "
                f"{list(shape)} ({name} of nothing is undefined: it has no identity value)"
            )


def _nodiff(x: Tensor, f, shape: tuple, dtype) -> Tensor:
    """A result with no gradient; on meta only the shape and dtype are produced."""
    if x._device is META:
        return Tensor._wrap(meta_array(shape, np.dtype(dtype)), META)
    return Tensor._wrap(_out(f(x._data), np.dtype(dtype)), x._device)


def _float_only(x: Tensor, name: str, dtype=None) -> Tensor:
    """Cast to dtype if given; otherwise refuse integer/bool input, as torch does."""
    if dtype is not None:
        return cast(x, dtype)
    if not _isfloat(x._data.dtype):
        raise DTypeError(
            f"{name}(): expected a floating point input, got {x.dtype}; pass dtype= or cast first"
        )
    return x


def _int_to_long(x: Tensor, dtype) -> tuple:
    """(input, output numpy dtype) for sum-like ops: ints and bools give int64 unless dtype."""
    if dtype is not None:
        dt = _dt.get_dtype(dtype)
        return (x if dt.is_floating_point else x.detach()), dt.np
    if not _isfloat(x._data.dtype):
        return x.detach(), _I64
    return x, x._data.dtype


_RT: dict = {}


def _rt(name: str, fields=("values", "indices")):
    """A torch.return_types-like namedtuple class (values, indices)."""
    if name not in _RT:
        _RT[name] = namedtuple(name, fields)
    return _RT[name]


class _Reduce(Function):
    """Base of reductions over ``axes``: shape-only meta."""

    def meta(self, x, axes, keepdim, dtype=None, **kw):
        return _shape(x.shape, axes, keepdim), dtype if dtype is not None else x.dtype
