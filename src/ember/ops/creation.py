"""Tensor factories: tensor, zeros, ones, full, arange, linspace, eye and the *_like forms."""

from __future__ import annotations

import numpy as np

from ember import dtypes as _dt
from ember.autograd import meta_array
from ember.device import META, as_device
from ember.errors import DTypeError, ShapeError
from ember.ops._util import shape_arg
from ember.tensor import Tensor, _to_array


def tensor(data, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A new tensor copying data (Python numbers, nested lists, numpy arrays)."""
    arr = _to_array(data, dtype)
    if isinstance(data, (np.ndarray, Tensor)) and (
        arr is data or (isinstance(data, Tensor) and arr is data._data)
    ):
        arr = arr.copy()
    return Tensor(arr, device=device, requires_grad=requires_grad)


def as_tensor(data, dtype=None, device=None) -> Tensor:
    """A tensor sharing memory with data when dtype and device allow it."""
    if isinstance(data, Tensor) and dtype is None and device is None:
        return data
    return Tensor(_to_array(data, dtype), device=device)


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor sharing memory with a numpy array (zero-copy)."""
    if not isinstance(array, np.ndarray):
        raise DTypeError(f"from_numpy expects a numpy.ndarray, got {type(array).__name__}")
    _dt.from_numpy_dtype(array.dtype)
    return Tensor._wrap(array)


def _make(shape, dtype, device, requires_grad, fill) -> Tensor:
    shape = shape_arg(shape)
    if any(s < 0 for s in shape):
        raise ShapeError(f"negative dimension in shape {shape}")
    dt = _dt.get_dtype(dtype) if dtype is not None else _dt.get_default_dtype()
    dev = as_device(device)
    if dev is META:
        arr = meta_array(shape, dt.np)
    elif fill is None:
        arr = np.empty(shape, dt.np)
    elif fill == 0:
        arr = np.zeros(shape, dt.np)
    else:
        arr = np.full(shape, fill, dt.np)
    t = Tensor._wrap(arr, dev)
    if requires_grad:
        t.requires_grad_(True)
    return t


def zeros(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor of zeros."""
    return _make(size, dtype, device, requires_grad, 0)


def ones(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor of ones."""
    return _make(size, dtype, device, requires_grad, 1)


def empty(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """An uninitialised tensor."""
    return _make(size, dtype, device, requires_grad, None)


def full(size, fill_value, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor filled with fill_value (dtype inferred from it as torch does)."""
    if dtype is None:
        dtype = _dt.result_type(fill_value)
    return _make(
        (tuple(size),) if not isinstance(size, int) else (size,),
        dtype,
        device,
        requires_grad,
        fill_value,
    )


def _like(x: Tensor, dtype, device):
    return (x.dtype if dtype is None else dtype), (x.device if device is None else device)


def zeros_like(input: Tensor, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Zeros with input's shape, dtype and device."""
    dt, dev = _like(input, dtype, device)
    return _make(input.shape, dt, dev, requires_grad, 0)


def ones_like(input: Tensor, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Ones with input's shape, dtype and device."""
    dt, dev = _like(input, dtype, device)
    return _make(input.shape, dt, dev, requires_grad, 1)


def empty_like(input: Tensor, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Uninitialised with input's shape, dtype and device."""
    dt, dev = _like(input, dtype, device)
    return _make(input.shape, dt, dev, requires_grad, None)


def full_like(
    input: Tensor, fill_value, dtype=None, device=None, requires_grad: bool = False
) -> Tensor:
    """fill_value with input's shape, dtype and device."""
    dt, dev = _like(input, dtype, device)
    return _make(input.shape, dt, dev, requires_grad, fill_value)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Values from start to end (exclusive) by step; int64 unless an argument is a float."""
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ShapeError("arange: step must be nonzero")
    if dtype is None:
        dtype = _dt.result_type(start, end, step)
    dt = _dt.get_dtype(dtype)
    n = max(0, int(np.ceil((end - start) / step)))
    arr = (
        start + step * np.arange(n, dtype=np.float64 if dt.is_floating_point else np.int64)
    ).astype(dt.np)
    return _finish(arr, device, requires_grad)


def linspace(
    start, end, steps: int, dtype=None, device=None, requires_grad: bool = False
) -> Tensor:
    """steps evenly spaced values from start to end inclusive."""
    dt = _dt.get_dtype(dtype) if dtype is not None else _dt.get_default_dtype()
    arr = np.linspace(start, end, int(steps), dtype=np.float64).astype(dt.np)
    return _finish(arr, device, requires_grad)


def logspace(start, end, steps: int, base: float = 10.0, dtype=None, device=None) -> Tensor:
    """steps values spaced evenly on a log scale."""
    dt = _dt.get_dtype(dtype) if dtype is not None else _dt.get_default_dtype()
    return _finish(np.logspace(start, end, int(steps), base=base).astype(dt.np), device, False)


def eye(
    n: int, m: int | None = None, dtype=None, device=None, requires_grad: bool = False
) -> Tensor:
    """The identity matrix (n x m)."""
    dt = _dt.get_dtype(dtype) if dtype is not None else _dt.get_default_dtype()
    return _finish(np.eye(n, m, dtype=dt.np), device, requires_grad)


def _finish(arr, device, requires_grad) -> Tensor:
    dev = as_device(device)
    if dev is META:
        arr = meta_array(arr.shape, arr.dtype)
    t = Tensor._wrap(arr, dev)
    return t.requires_grad_(True) if requires_grad else t


def scalar_tensor(value, dtype=None, device=None) -> Tensor:
    """A 0-d tensor."""
    return tensor(
        value, dtype=dtype if dtype is not None else _dt.get_default_dtype(), device=device
    )
