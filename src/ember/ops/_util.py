"""Small helpers shared by the op modules: argument normalisation, type coercion, casts and
device moves, and the in-place writes every ``op_`` method ends in."""

from __future__ import annotations

import operator
import weakref

import numpy as np

from ember import autograd
from ember import dtypes as _dt
from ember.autograd import Function, elementwise_meta, meta_array
from ember.device import CPU, META, Device
from ember.errors import AutogradError, DTypeError, EmberError, ShapeError
from ember.tensor import Tensor, _to_array

_pyscalars = (bool, int, float, np.bool_, np.integer, np.floating)
_LOW = _dt.HALF_FLOATS  # float16, bfloat16 (ml_dtypes not imported to ask)


def acc_dtype(dt: np.dtype) -> np.dtype:
    """The dtype gradients accumulate in (float32 for float16/bfloat16, like torch's opmath)."""
    return np.dtype(np.float32) if dt in _LOW else dt


class IndexOutOfRangeError(EmberError, IndexError):
    """An index value outside what the op accepts (IndexError, as torch raises for it)."""


class SizeTypeError(ShapeError, TypeError):
    """A size that is not an integer, e.g. empty(2.9) (TypeError, as torch raises for it)."""


class ValueRangeError(EmberError, ValueError):
    """A value outside the range an op is defined on, e.g. a BCE target outside [0, 1]."""


def shape_arg(shape, op: str = "size") -> tuple:
    """Accept f(2, 3), f((2, 3)), f([2, 3]) and f(ember.Size) alike; only integers are sizes."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    out = []
    for i, s in enumerate(shape):
        try:
            out.append(operator.index(s))  # int, numpy integer, 0-d integer tensor; not 2.9
        except TypeError:
            raise SizeTypeError(
                f"{op}: a size must be a tuple of ints, but found element of type "
                f"{type(s).__name__} ({s!r}) at position {i}"
            ) from None
    return tuple(out)


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
    arr = _to_array(x)
    return Tensor(arr.copy() if arr is x else arr, device=like._device)


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


def to_device(x: Tensor, device: Device) -> Tensor:
    """x on another device: cpu -> meta keeps shape and dtype; meta -> cpu gives zeros."""
    shape, dtype = x._data.shape, x._data.dtype
    if device is META:
        return Tensor._wrap(meta_array(shape, dtype), META)
    return Tensor._wrap(np.zeros(shape, dtype), CPU)


# ------------------------------------------------------------------ in-place writes
def assign(self: Tensor, out: Tensor) -> Tensor:
    """Make ``out`` the new value of self in place (the core of every op_ method).

    Values are written into self's array (views see them); with grad, self is rebound to out's
    graph node instead, so history stays intact.
    """
    if out._ctx is not None:
        if self._ctx is None and self.requires_grad:
            raise AutogradError(
                "a leaf tensor that requires grad is used in an in-place operation; "
                "wrap it in ember.no_grad() or use the out-of-place op"
            )
        # out's node recorded self's old node as its edge, so rebinding keeps history intact
        self._data = out._data.astype(self._data.dtype, copy=False)
        self._ctx = out._ctx
        self._ctx._out_ref = weakref.ref(self)
        self.requires_grad = True
        return self
    if self.requires_grad and self._ctx is None and autograd.is_grad_enabled():
        raise AutogradError("a leaf tensor that requires grad is used in an in-place operation")
    if self._device is META:
        np.broadcast_shapes(out._data.shape, self._data.shape)
        return self
    src = out._data
    if src.dtype != self._data.dtype:
        if _dt.from_numpy_dtype(src.dtype).category > self.dtype.category:
            raise DTypeError(
                f"result type {out.dtype} can't be cast to the desired output type {self.dtype}"
            )
    if np.broadcast_shapes(src.shape, self._data.shape) != self._data.shape:
        raise ShapeError(
            f"in-place op: output with shape {self._data.shape} doesn't match the broadcast shape {src.shape}"
        )
    if not self._data.flags.writeable:
        raise AutogradError(
            "in-place write into a read-only tensor (an expand()ed view or a memory-mapped "
            "weight); clone() it first"
        )
    np.copyto(self._data, src, casting="unsafe")
    return self


def assign_view(self: Tensor, out: Tensor) -> Tensor:
    """Make the view ``out`` the new self (t_, transpose_, squeeze_, ...): self takes its array."""
    if self.requires_grad and self._ctx is None and autograd.is_grad_enabled():
        raise AutogradError("a leaf tensor that requires grad is used in an in-place operation")
    self._data = out._data
    if out._ctx is not None:
        self._ctx = out._ctx
        self._ctx._out_ref = weakref.ref(self)
    return self


def fill_(self: Tensor, value) -> Tensor:
    """Fill with a value in place."""
    if self.requires_grad and self._ctx is None and autograd.is_grad_enabled():
        raise AutogradError("a leaf tensor that requires grad is used in an in-place operation")
    if self._device is not META:
        self._data[...] = value._data if isinstance(value, Tensor) else value
    return self


def zero_(self: Tensor) -> Tensor:
    """Fill with zeros in place."""
    return fill_(self, 0)


class _Identity(Function):
    def forward(self, x):
        return x

    def backward(self, g):
        return g


def copy_(self: Tensor, src, non_blocking: bool = False) -> Tensor:
    """Copy src's values (broadcast and cast to self) into self."""
    if not isinstance(src, Tensor):
        src = Tensor(np.array(_to_array(src)))
    src = cast(src, self.dtype)
    if src._device is not self._device:
        src = to_device(src, self._device)
    return assign(self, _Identity.apply(src) if src.requires_grad else src)
