"""Tensor: one backend array + device + autograd link.

The class holds the data and what can be said about it without computing (shape, dtype, device,
strides, conversion to Python and numpy, the autograd flags). Its op methods come from typed
mixins, one per op family (``ember/_tensor_*.py``); each is one call into the op function in
``ember.ops``. The ops import this module, never the other way: the mixins and the few methods
here that compute name the modules above them with ``ember._later.later``.
"""

from __future__ import annotations

import builtins
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from ember import dtypes as _dt
from ember._later import later
from ember._tensor_math import MathMethods
from ember._tensor_operators import OperatorMethods
from ember._tensor_reduce import ReduceMethods
from ember._tensor_shape import ShapeMethods
from ember.device import CPU, META, Device, as_device
from ember.errors import AutogradError, DeviceError, DTypeError, ShapeError, UnsupportedError

if TYPE_CHECKING:
    from typing import NamedTuple, TypeAlias

    # what ops accept where torch accepts a Python scalar, and where torch accepts a dtype
    Number: TypeAlias = int | float | bool
    DTypeLike: TypeAlias = _dt.DType | str | np.dtype | type

    class ValuesIndices(NamedTuple):
        """What max(dim), sort, topk, ... return (a torch.return_types-like namedtuple)."""

        values: Tensor
        indices: Tensor

    class MinMax(NamedTuple):
        """What aminmax returns."""

        min: Tensor
        max: Tensor


_A = later(globals(), "_A", "ember.autograd")
_U = later(globals(), "_U", "ember.ops._util")


class Size(tuple):
    """A tensor shape: a tuple of ints, as torch.Size."""

    __slots__ = ()

    def numel(self) -> int:
        """The number of elements a tensor of this shape holds."""
        n = 1
        for s in self:
            n *= s
        return n

    def __repr__(self) -> str:
        return f"ember.Size({list(self)})"


def _to_array(data: Any, dtype: Any = None) -> np.ndarray:
    """Convert Python data / numpy arrays / tensors to an array with torch's default dtypes."""
    dt = None if dtype is None else _dt.get_dtype(dtype)
    if isinstance(data, Tensor):
        arr = data._data
    elif isinstance(data, np.ndarray):
        arr = data
    else:
        if type(data).__module__.startswith("torch"):
            arr = data.detach().cpu()
            arr = arr.float().numpy() if str(arr.dtype) == "torch.bfloat16" else arr.numpy()
            if dt is None and str(data.dtype) == "torch.bfloat16":
                dt = _dt.bfloat16
        else:
            if isinstance(data, (list, tuple)) and any(isinstance(x, Tensor) for x in data):
                data = [x._data if isinstance(x, Tensor) else x for x in data]
            try:
                arr = np.asarray(data)
            except ValueError as e:
                raise ShapeError(f"cannot build a tensor from ragged data: {e}") from None
            if dt is None:
                kind = arr.dtype.kind
                if kind == "f":
                    dt = _dt.get_default_dtype()
                elif kind in "iu":
                    dt = _dt.int64
                elif kind == "O":
                    raise DTypeError("cannot build a tensor from objects of mixed or unknown type")
    if arr.dtype.kind in "USO":
        raise DTypeError(f"cannot build a tensor from {arr.dtype} data")
    if dt is not None and arr.dtype != dt.np:
        arr = arr.astype(dt.np)
    elif dt is None:
        _dt.from_numpy_dtype(arr.dtype)
    return arr


class Tensor(OperatorMethods, MathMethods, ShapeMethods, ReduceMethods):
    """An n-dimensional array with a dtype, a device and (optionally) a gradient."""

    __slots__ = (
        "_data",
        "_device",
        "requires_grad",
        "grad",
        "_ctx",
        "_retain",
        "_hooks",
        "__weakref__",
    )
    __array_ufunc__ = None  # numpy defers to our reflected operators

    _data: np.ndarray
    _device: Device
    requires_grad: builtins.bool
    grad: Tensor | None
    _ctx: Any
    _retain: builtins.bool
    _hooks: tuple

    def __init__(
        self,
        data: Any,
        dtype: DTypeLike | None = None,
        device: Device | str | None = None,
        requires_grad: builtins.bool = False,
    ) -> None:
        dev = as_device(device)
        arr = _to_array(data, dtype)
        if dev is META:  # a data-free array: a 0-d zero broadcast with zero strides
            arr = np.broadcast_to(np.zeros((), arr.dtype), arr.shape)
        self._init(arr, dev, requires_grad)

    def _init(self, arr: np.ndarray, device: Device, requires_grad: builtins.bool) -> None:
        """Set every field of a new leaf tensor (``_wrap`` inlines this: it is per-op)."""
        self._data = arr
        self._device = device
        self.grad = None
        self._ctx = None
        self._retain = False
        self._hooks = ()
        self.requires_grad = False
        if requires_grad:
            self.requires_grad_(True)

    @staticmethod
    def _wrap(arr: Any, device: Device = CPU, ctx: Any = None) -> Tensor:
        """Wrap a backend array without copying (internal fast path)."""
        t = object.__new__(Tensor)
        t._data = arr if type(arr) is np.ndarray else np.asarray(arr)
        t._device = device
        t.requires_grad = ctx is not None
        t.grad = None
        t._ctx = ctx
        t._retain = False
        t._hooks = ()
        if ctx is not None:
            ctx._out_ref = weakref.ref(t)
        return t

    # ---------------------------------------------------------------- properties
    @property
    def shape(self) -> Size:
        """The shape as an ember.Size."""
        return Size(self._data.shape)

    @overload
    def size(self, dim: None = None) -> Size: ...
    @overload
    def size(self, dim: builtins.int) -> builtins.int: ...
    def size(self, dim: builtins.int | None = None) -> Size | builtins.int:
        """The shape, or the length of one dimension."""
        if dim is None:
            return Size(self._data.shape)
        return self._data.shape[_wrap_dim(dim, self._data.ndim)]

    @property
    def dtype(self) -> _dt.DType:
        """The element type."""
        return _dt.from_numpy_dtype(self._data.dtype)

    @property
    def device(self) -> Device:
        """The device the data lives on."""
        return self._device

    @property
    def ndim(self) -> builtins.int:
        """The number of dimensions."""
        return self._data.ndim

    def dim(self) -> builtins.int:
        """The number of dimensions."""
        return self._data.ndim

    def numel(self) -> builtins.int:
        """The number of elements."""
        return self._data.size

    def nelement(self) -> builtins.int:
        """The number of elements."""
        return self._data.size

    def element_size(self) -> builtins.int:
        """Bytes per element."""
        return self._data.itemsize

    @property
    def nbytes(self) -> builtins.int:
        """Bytes the elements take (as if contiguous)."""
        return self._data.nbytes

    @property
    def is_leaf(self) -> builtins.bool:
        """True for tensors not produced by a recorded op."""
        return self._ctx is None

    @property
    def grad_fn(self) -> Any:
        """The Function that produced this tensor, or None for leaves."""
        return self._ctx

    @property
    def data(self) -> Tensor:
        """The same data, detached from the graph."""
        return Tensor._wrap(self._data, self._device)

    @data.setter
    def data(self, value: Tensor | np.ndarray) -> None:
        self._data = value._data if isinstance(value, Tensor) else np.asarray(value)

    @property
    def is_meta(self) -> builtins.bool:
        """Whether this tensor lives on the meta device (no data)."""
        return self._device is META

    @property
    def is_cuda(self) -> builtins.bool:
        """Always False: ember has no CUDA backend installed."""
        return False

    def is_floating_point(self) -> builtins.bool:
        """Whether the dtype is a float type."""
        return self._data.dtype.kind == "f" or self._data.dtype.name == "bfloat16"

    def stride(self, dim: builtins.int | None = None) -> Any:
        """Strides in elements, as torch reports them."""
        if self._device is META:
            st, acc = [], 1
            for s in reversed(self._data.shape):
                st.append(acc)
                acc *= max(s, 1)
            st = tuple(reversed(st))
        else:
            st = tuple(s // self._data.itemsize for s in self._data.strides)
        return st if dim is None else st[_wrap_dim(dim, self._data.ndim)]

    def is_contiguous(self, memory_format: object = None) -> builtins.bool:
        """Whether elements are laid out densely in row-major order."""
        if self._device is META:
            return True
        return bool(self._data.flags.c_contiguous)

    def data_ptr(self) -> builtins.int:
        """The address of the first element."""
        return self._data.__array_interface__["data"][0]

    def untyped_storage_nbytes(self) -> builtins.int:
        """Bytes of the underlying buffer."""
        base = self._data
        while isinstance(base.base, np.ndarray):
            base = base.base
        return base.nbytes

    # ---------------------------------------------------------------- conversion
    def numpy(self, *, force: builtins.bool = False) -> np.ndarray:
        """The data as a numpy array, sharing memory (zero-copy)."""
        if self._device is META:
            raise DeviceError("a meta tensor has no data; move it to 'cpu' with real values first")
        if self.requires_grad and not force:
            raise AutogradError(
                "can't call numpy() on a tensor that requires grad; use .detach().numpy()"
            )
        return self._data

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[builtins.int, builtins.int] | None = None,
        dl_device: Any = None,
        copy: builtins.bool | None = None,
    ) -> Any:
        """The data as a DLPack capsule, zero-copy (torch.from_dlpack, np.from_dlpack, ...)."""
        if self._device is META:
            raise DeviceError("__dlpack__: a meta tensor has no data to export")
        if self.requires_grad:
            raise AutogradError(
                "can't export a tensor that requires grad through DLPack; use tensor.detach()"
            )
        if self._data.dtype.kind == "V":  # ml_dtypes types; BufferError is DLPack's refusal
            raise BufferError(
                f"__dlpack__: numpy cannot export {self.dtype} through DLPack; cast to float32"
            )
        kw: dict[str, Any] = {}
        if max_version is not None:
            kw["max_version"] = max_version
        if dl_device is not None:
            kw["dl_device"] = dl_device
        if copy is not None:
            kw["copy"] = copy
        return self._data.__dlpack__(stream=stream, **kw)

    def __dlpack_device__(self) -> tuple[builtins.int, builtins.int]:
        """(device type, device id) in DLPack's codes: (1, 0) for the CPU."""
        if self._device is META:
            raise DeviceError("__dlpack_device__: a meta tensor has no data to export")
        return self._data.__dlpack_device__()

    def __array__(self, dtype: Any = None, copy: builtins.bool | None = None) -> np.ndarray:
        if self._device is META:
            raise DeviceError("a meta tensor has no data")
        a = self._data
        if dtype is not None and a.dtype != dtype:
            return a.astype(dtype)
        return a.copy() if copy else a

    def item(self) -> Any:
        """The single value as a Python number."""
        if self._device is META:
            raise DeviceError("item() on a meta tensor: it has no data")
        if self._data.size != 1:
            raise ShapeError(
                f"item(): a tensor with {self._data.size} elements cannot be converted to a scalar"
            )
        v = (
            self._data.reshape(()).item()
            if self._data.dtype.name != "bfloat16"
            else float(self._data.reshape(()))
        )
        return v

    def tolist(self) -> Any:
        """The data as (nested) Python lists."""
        if self._device is META:
            raise DeviceError("tolist() on a meta tensor: it has no data")
        a = self._data
        if a.dtype.kind not in "biuf":
            a = a.astype(np.float32)
        return a.tolist()

    def __float__(self) -> builtins.float:
        return float(self.item())

    def __int__(self) -> builtins.int:
        return int(self.item())

    def __index__(self) -> builtins.int:
        if self._data.dtype.kind not in "iu" or self._data.size != 1:
            raise DTypeError("only integer tensors of a single element can be used as an index")
        return int(self.item())

    def __bool__(self) -> builtins.bool:
        if self._data.size != 1:
            raise ShapeError(
                f"boolean value of a tensor with {self._data.size} elements is ambiguous"
            )
        return bool(self.item())

    def __len__(self) -> builtins.int:
        if self._data.ndim == 0:
            raise ShapeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self) -> Iterator[Tensor]:
        if self._data.ndim == 0:
            raise ShapeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self._data.shape[0]))

    def __hash__(self) -> builtins.int:
        return id(self)

    def __repr__(self) -> str:
        extra = ""
        if self._device is META:
            body = f"..., size={tuple(self._data.shape)}"
            extra = ", device='meta'"
        else:
            a = self._data
            if a.dtype.name == "bfloat16":
                a = a.astype(np.float32)
            body = np.array2string(a, separator=", ", precision=4, threshold=1000, prefix="tensor(")
        dt = self.dtype
        if dt not in (_dt.float32, _dt.int64, _dt.bool_):
            extra += f", dtype={dt!r}"
        if self._ctx is not None:
            extra += f", grad_fn=<{type(self._ctx).__name__}Backward>"
        elif self.requires_grad:
            extra += ", requires_grad=True"
        return f"tensor({body}{extra})"

    # ---------------------------------------------------------------- dtype / device
    def to(self, *args: Any, **kwargs: Any) -> Tensor:
        """Move and/or cast: to(dtype), to(device), to(device, dtype), to(other_tensor)."""
        dtype = kwargs.pop("dtype", None)
        device = kwargs.pop("device", None)
        kwargs.pop("non_blocking", None)
        copy = kwargs.pop("copy", False)
        for a in args:
            if isinstance(a, Tensor):
                dtype, device = a.dtype, a.device
            elif isinstance(a, (_dt.DType, np.dtype)) or type(a).__module__.startswith("torch"):
                dtype = a
            elif isinstance(a, Device) or (isinstance(a, str) and a.split(":")[0] in _DEVICE_NAMES):
                device = a
            elif a is not None:
                dtype = a
        out = self
        if device is not None:
            dev = as_device(device)
            if dev is not self._device:
                out = _U.to_device(out, dev)
        if dtype is not None:
            out = _U.cast(out, _dt.get_dtype(dtype))
        if copy and out is self:
            out = self.clone()
        return out

    def type(self, dtype: DTypeLike | None = None) -> Any:
        """The dtype name, or a cast to dtype."""
        if dtype is None:
            return f"ember.{self.dtype.name}"
        return self.to(dtype)

    def float(self) -> Tensor:
        """Cast to float32."""
        return self.to(_dt.float32)

    def double(self) -> Tensor:
        """Cast to float64."""
        return self.to(_dt.float64)

    def half(self) -> Tensor:
        """Cast to float16."""
        return self.to(_dt.float16)

    def bfloat16(self) -> Tensor:
        """Cast to bfloat16."""
        return self.to(_dt.bfloat16)

    def long(self) -> Tensor:
        """Cast to int64."""
        return self.to(_dt.int64)

    def int(self) -> Tensor:
        """Cast to int32."""
        return self.to(_dt.int32)

    def short(self) -> Tensor:
        """Cast to int16."""
        return self.to(_dt.int16)

    def char(self) -> Tensor:
        """Cast to int8."""
        return self.to(_dt.int8)

    def byte(self) -> Tensor:
        """Cast to uint8."""
        return self.to(_dt.uint8)

    def bool(self) -> Tensor:
        """Cast to bool."""
        return self.to(_dt.bool_)

    def cpu(self) -> Tensor:
        """This tensor on the CPU."""
        return self.to("cpu")

    def cuda(self, device: Any = None) -> Tensor:
        """Raises DeviceError: no CUDA backend is installed."""
        return self.to("cuda")

    # ---------------------------------------------------------------- autograd
    def requires_grad_(self, requires_grad: builtins.bool = True) -> Tensor:
        """Set whether autograd records ops on this leaf."""
        if not self.is_leaf and not requires_grad:
            raise AutogradError("you can only change requires_grad flags of leaf variables")
        if requires_grad and not (self.is_floating_point()):
            raise DTypeError(f"only floating point tensors can require gradients, got {self.dtype}")
        self.requires_grad = bool(requires_grad)
        return self

    def detach(self) -> Tensor:
        """The same data, cut from the graph (shares memory)."""
        return Tensor._wrap(self._data, self._device)

    def detach_(self) -> Tensor:
        """Cut this tensor from the graph in place."""
        self._ctx = None
        self.requires_grad = False
        return self

    def retain_grad(self) -> None:
        """Keep .grad for this non-leaf tensor after backward."""
        if not self.requires_grad:
            raise AutogradError("can't retain_grad on a tensor that doesn't require grad")
        self._retain = True

    @property
    def retains_grad(self) -> builtins.bool:
        """Whether backward stores .grad on this non-leaf."""
        return self._retain

    def register_hook(self, hook: Any) -> None:
        """Call hook(grad) when this tensor's gradient is computed; a returned tensor replaces it."""
        if not self.requires_grad:
            raise AutogradError("cannot register a hook on a tensor that doesn't require gradient")
        self._hooks = (*self._hooks, hook)

    def backward(
        self,
        gradient: Tensor | None = None,
        retain_graph: builtins.bool | None = None,
        create_graph: builtins.bool = False,
    ) -> None:
        """Compute gradients of this tensor with respect to graph leaves."""
        if self._device is META:
            raise UnsupportedError(
                "backward() on the meta device: meta tensors have shapes but no data, so there "
                "are no gradients to compute; run the graph on 'cpu' to train"
            )
        _A.backward([self], None if gradient is None else [gradient], retain_graph)

    # ---------------------------------------------------------------- in-place machinery
    def _assign(self, out: Tensor) -> Tensor:
        """Make ``out`` the new value of self in place (the core of every op_; ops._util.assign)."""
        return _U.assign(self, out)


_DEVICE_NAMES = ("cpu", "meta", "cuda")


def _wrap_dim(dim: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(
            f"dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})"
        )
    return dim % n
