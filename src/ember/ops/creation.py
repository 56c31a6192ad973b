"""Tensor factories: tensor, zeros, ones, full, arange, linspace, eye and the *_like forms."""

from __future__ import annotations

import numpy as np

from ember import dtypes as _dt
from ember.autograd import meta_array
from ember.device import META, as_device
from ember.errors import DeviceError, DTypeError, ShapeError
from ember.memory import allocate
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


def from_dlpack(ext_tensor: object) -> Tensor:
    """A tensor sharing memory with any object that speaks DLPack (torch, pyarrow, jax, numpy).

    The exporter must hold CPU memory of a dtype ember has. A pyarrow ChunkedArray (a Table's
    column) of one chunk is read as that chunk; Polars columns export through
    ``series.to_arrow()`` (or use ``from_numpy(series.to_numpy())``). Zero-copy both ways.
    """
    if isinstance(ext_tensor, Tensor):
        return ext_tensor
    chunks = getattr(ext_tensor, "chunks", None)  # a pyarrow ChunkedArray (a Table's column)
    if not hasattr(ext_tensor, "__dlpack__") and isinstance(chunks, list):
        if len(chunks) != 1:
            raise DTypeError(
                f"from_dlpack: a chunked array of {len(chunks)} chunks is not one buffer; "
                "call combine_chunks() first (that copies)"
            )
        ext_tensor = chunks[0]
    if not hasattr(ext_tensor, "__dlpack__"):
        raise DTypeError(
            f"from_dlpack expects an object with __dlpack__ (a torch tensor, a pyarrow array, "
            f"a numpy array, ...), got {type(ext_tensor).__name__} (a Polars Series: pass "
            "series.to_arrow())"
        )
    if hasattr(ext_tensor, "__dlpack_device__"):
        kind, _ = ext_tensor.__dlpack_device__()
        if int(kind) not in (1, 3):  # kDLCPU, kDLCUDAHost: memory the CPU can read
            raise DeviceError(
                f"from_dlpack: the data lives on DLPack device type {int(kind)}; ember reads CPU "
                "memory only (move it to the CPU first)"
            )
    try:
        arr = np.from_dlpack(ext_tensor)
    except (BufferError, TypeError, RuntimeError) as e:
        raise DTypeError(f"from_dlpack: {type(ext_tensor).__name__} could not be read ({e})") from e
    _dt.from_numpy_dtype(arr.dtype)
    return Tensor._wrap(arr)


def _make(shape, dtype, device, requires_grad, fill, op: str = "empty") -> Tensor:
    shape = shape_arg(shape, op)
    if any(s < 0 for s in shape):
        raise ShapeError(f"{op}: negative dimension in shape {shape}")
    dt = _dt.get_dtype(dtype) if dtype is not None else _dt.get_default_dtype()
    dev = as_device(device)
    npd = dt.np
    if dev is META:
        arr = allocate(lambda: meta_array(shape, npd), op, shape, npd)
    elif fill is None:
        arr = allocate(lambda: np.empty(shape, npd), op, shape, npd)
    elif fill == 0:
        arr = allocate(lambda: np.zeros(shape, npd), op, shape, npd)
    else:
        arr = allocate(lambda: np.full(shape, fill, npd), op, shape, npd)
    t = Tensor._wrap(arr, dev)
    if requires_grad:
        t.requires_grad_(True)
    return t


def zeros(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor of zeros."""
    return _make(size, dtype, device, requires_grad, 0, "zeros")


def ones(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor of ones."""
    return _make(size, dtype, device, requires_grad, 1, "ones")


def empty(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """An uninitialised tensor."""
    return _make(size, dtype, device, requires_grad, None)


def full(size, fill_value, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor filled with fill_value (dtype inferred from it as torch does)."""
    if dtype is None:
        dtype = _dt.result_type(fill_value)
    return _make(
        (tuple(size),) if isinstance(size, (tuple, list)) else (size,),
        dtype,
        device,
        requires_grad,
        fill_value,
        "full",
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
