"""Small helpers shared by the op modules: argument normalisation and type coercion."""

from __future__ import annotations

import numpy as np

from ember import dtypes as _dt
from ember.autograd import Function, elementwise_meta, meta_array
from ember.device import META
from ember.errors import DTypeError
from ember.tensor import Tensor

_pyscalars = (bool, int, float, np.bool_, np.integer, np.floating)


def shape_arg(shape) -> tuple:
    """Accept f(2, 3), f((2, 3)), f([2, 3]) and f(ember.Size) alike."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return tuple(int(s) for s in shape)


def wrap_dim(dim: int, ndim: int) -> int:
    """Normalise a possibly negative dim; IndexError when out of range (as torch)."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(
            f"dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})"
        )
    return dim % n


def wrap_dims(dim, ndim: int) -> tuple:
    """Normalise an int, a tuple of ints or None (all dims) to a sorted tuple of axes."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, (int, np.integer)):
        return (wrap_dim(int(dim), ndim),)
    return tuple(sorted(wrap_dim(int(d), ndim) for d in dim))


class Cast(Function):
    """Change dtype; the gradient is cast back."""

    meta = elementwise_meta

    def forward(self, x, dtype):
        self.src = x.dtype
        return x.astype(dtype)

    def backward(self, g):
        return g.astype(self.src)


def cast(x: Tensor, dtype) -> Tensor:
    """Return x converted to dtype (x itself when the dtype already matches)."""
    dt = _dt.get_dtype(dtype)
    if x._data.dtype == dt.np:
        return x
    return Cast.apply(x, dtype=dt.np)


def scalar(value, dt: _dt.DType, like: Tensor) -> Tensor:
    """A 0-d tensor holding a Python scalar, on like's device."""
    if like._device is META:
        return Tensor._wrap(meta_array((), dt.np), META)
    return Tensor._wrap(np.asarray(value, dtype=dt.np), like._device)


def as_tensor_like(x, like: Tensor) -> Tensor:
    """Turn a scalar, list or array into a tensor on like's device (tensors pass through)."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, _pyscalars):
        return scalar(x, _dt.result_type(x), like)
    from ember.ops.creation import tensor

    return tensor(x, device=like._device)


def coerce(a, b, floating: bool = False):
    """Promote two operands (tensors or scalars) to one dtype, torch-style; returns two tensors."""
    ta, tb = isinstance(a, Tensor), isinstance(b, Tensor)
    if ta and tb:
        if a._data.dtype == b._data.dtype:
            dt = None
        else:
            dt = _dt.result_type(a, b)
    elif ta:
        if not isinstance(b, _pyscalars):
            b = as_tensor_like(b, a)
            return coerce(a, b, floating)
        dt = _dt.result_type(a, b)
        b = scalar(b, dt, a)
    elif tb:
        if not isinstance(a, _pyscalars):
            a = as_tensor_like(a, b)
            return coerce(a, b, floating)
        dt = _dt.result_type(a, b)
        a = scalar(a, dt, b)
    else:
        raise DTypeError(
            f"expected at least one tensor, got {type(a).__name__} and {type(b).__name__}"
        )
    if floating:
        base = dt or a.dtype
        if not base.is_floating_point:
            dt = _dt.get_default_dtype()
    if dt is not None:
        a, b = cast(a, dt), cast(b, dt)
    return a, b


def to_float(x: Tensor) -> Tensor:
    """Cast integer/bool tensors to the default float dtype (float ops such as exp need it)."""
    if x._data.dtype.kind in "biu":
        return cast(x, _dt.get_default_dtype())
    return x
