"""A restricted unpickler that rebuilds PyTorch tensors as numpy arrays and nothing else.

Only the globals torch.save emits for tensors (rebuild functions, storage classes, dtypes,
OrderedDict, torch.Size) and a few inert builtins resolve; each resolves to our own
implementation, never to torch. Any other global is refused with FormatError naming it.

We subclass the pure-Python `pickle._Unpickler`: it reads every length-prefixed item through
`read(n)`, which is bounded by the bytes actually present, while the C unpickler allocates the
length a file claims before reading it.
"""

from __future__ import annotations

import codecs
import collections
import pickle
from typing import Any

import ml_dtypes
import numpy as np

from ember.errors import FormatError
from ember.io._common import MAX_ELEMENTS

STORAGE_DTYPES: dict[str, np.dtype] = {
    "DoubleStorage": np.dtype("<f8"),
    "FloatStorage": np.dtype("<f4"),
    "HalfStorage": np.dtype("<f2"),
    "BFloat16Storage": np.dtype(ml_dtypes.bfloat16),
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"),
    "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"),
    "BoolStorage": np.dtype("?"),
    "ComplexFloatStorage": np.dtype("<c8"),
    "ComplexDoubleStorage": np.dtype("<c16"),
    "UntypedStorage": np.dtype("u1"),
}

TORCH_DTYPES: dict[str, np.dtype] = {
    "float64": np.dtype("<f8"),
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "int64": np.dtype("<i8"),
    "int32": np.dtype("<i4"),
    "int16": np.dtype("<i2"),
    "int8": np.dtype("i1"),
    "uint8": np.dtype("u1"),
    "uint16": np.dtype("<u2"),
    "uint32": np.dtype("<u4"),
    "uint64": np.dtype("<u8"),
    "bool": np.dtype("?"),
    "complex64": np.dtype("<c8"),
    "complex128": np.dtype("<c16"),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}


class StorageType:
    """Stands for a torch storage class (torch.FloatStorage, ...); only its dtype matters."""

    __slots__ = ("name", "dtype")

    def __init__(self, name: str, dtype: np.dtype) -> None:
        self.name, self.dtype = name, dtype

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class Storage:
    """A flat typed buffer (a view into the file, or a copy) that tensors are rebuilt from.

    A storage without an array stands in for one whose bytes are not located yet (the first
    pass over a legacy file): tensors on it are checked, not built.
    """

    __slots__ = ("array", "dtype", "numel")

    def __init__(self, array: np.ndarray | None, dtype: np.dtype, numel: int) -> None:
        self.array, self.dtype, self.numel = array, dtype, numel

    @classmethod
    def of(cls, array: np.ndarray) -> Storage:
        """A storage over a flat array."""
        return cls(array, array.dtype, array.size)


class _Marker:
    """A global that is allowed as a value but must never be called (torch.Tensor, ...)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_TENSOR = _Marker("torch.Tensor")
_PARAMETER = _Marker("torch.nn.Parameter")


def _ints(x: Any, what: str) -> tuple[int, ...]:
    if not isinstance(x, tuple) or not all(type(v) is int and v >= 0 for v in x):
        raise FormatError(f"tensor {what} must be a tuple of non-negative ints, found {x!r}")
    return x


def rebuild(
    storage: Any, offset: Any, size: Any, stride: Any, dtype: np.dtype | None = None
) -> np.ndarray:
    """The numpy view torch's _rebuild_tensor* would build; every index checked in bounds."""
    if not isinstance(storage, Storage):
        raise FormatError(
            f"tensor storage must come from a persistent id, found {type(storage).__name__}"
        )
    base, dt, n_items = storage.array, storage.dtype, storage.numel
    if dtype is not None and dtype != dt:  # untyped (byte) storage + dtype
        nbytes = n_items * dt.itemsize
        if nbytes % dtype.itemsize:
            raise FormatError(f"storage of {nbytes} bytes does not hold whole {dtype} items")
        dt, n_items = dtype, nbytes // dtype.itemsize
        base = None if base is None else base.view(dtype)
    size, stride = _ints(size, "size"), _ints(stride, "stride")
    if type(offset) is not int or offset < 0 or len(size) != len(stride) or len(size) > 64:
        raise FormatError(f"bad tensor layout: offset {offset!r}, size {size}, stride {stride}")
    numel = nonzero = 1
    for s in size:
        numel *= s
        nonzero *= s or 1
    if nonzero >= MAX_ELEMENTS:
        raise FormatError(f"tensor size {list(size)} is too large")
    if numel:
        last = offset + sum((s - 1) * st for s, st in zip(size, stride))
        if last >= n_items:
            raise FormatError(
                f"tensor (offset {offset}, size {list(size)}, stride {list(stride)}) reaches "
                f"element {last} of a storage holding {n_items}"
            )
    if base is None:
        return np.empty(0, dt)  # checked only; the real pass builds it
    if numel == 0:
        out = np.empty(size, dt)
        out.flags.writeable = base.flags.writeable
        return out
    item = dt.itemsize
    # as_strided goes through __array_interface__, which cannot name ml_dtypes types: stride a
    # same-sized void view, then view it back.
    out = np.lib.stride_tricks.as_strided(
        base[offset:].view(f"V{item}"),
        shape=size,
        strides=tuple(st * item for st in stride),
        writeable=base.flags.writeable,
    )
    return out.view(dt)


def _rebuild_tensor(storage, storage_offset, size, stride):
    return rebuild(storage, storage_offset, size, stride)


def _rebuild_tensor_v2(
    storage, storage_offset, size, stride, requires_grad=False, hooks=None, metadata=None
):
    return rebuild(storage, storage_offset, size, stride)


def _rebuild_tensor_v3(
    storage, storage_offset, size, stride, requires_grad, hooks, dtype, metadata=None
):
    if not isinstance(dtype, np.dtype):
        raise FormatError(f"_rebuild_tensor_v3 needs a torch dtype, found {dtype!r}")
    return rebuild(storage, storage_offset, size, stride, dtype)


def _rebuild_parameter(data, requires_grad, hooks, state=None):
    if not isinstance(data, np.ndarray):
        raise FormatError(f"a Parameter must wrap a tensor, found {type(data).__name__}")
    return data


def _rebuild_from_type_v2(func, new_type, args, state):
    if (
        func not in _REBUILDERS
        or new_type not in (_TENSOR, _PARAMETER)
        or not isinstance(args, tuple)
    ):
        raise FormatError(f"refusing tensor subclass rebuild {func!r} for {new_type!r}")
    return func(*args)


def _torch_size(dims=()):
    return tuple(_ints(tuple(dims), "torch.Size"))


def _encode(text, encoding="utf-8"):
    # Python 3 pickles bytes under protocol 2 as codecs.encode(str, 'latin1').
    if not isinstance(text, str) or encoding != "latin1":
        raise FormatError("codecs.encode is only allowed to rebuild bytes from latin1 text")
    return codecs.encode(text, "latin1")


_REBUILDERS = (_rebuild_tensor, _rebuild_tensor_v2, _rebuild_tensor_v3)

ALLOWED: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch", "Tensor"): _TENSOR,
    ("torch._tensor", "Tensor"): _TENSOR,
    ("torch.nn.parameter", "Parameter"): _PARAMETER,
    ("torch", "Size"): _torch_size,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("__builtin__", "set"): set,
    ("__builtin__", "frozenset"): frozenset,
    ("_codecs", "encode"): _encode,
    ("codecs", "encode"): _encode,
}
for _name, _dt in STORAGE_DTYPES.items():
    ALLOWED[("torch", _name)] = StorageType(_name, _dt)
ALLOWED[("torch.storage", "UntypedStorage")] = ALLOWED[("torch", "UntypedStorage")]
for _name, _dt in TORCH_DTYPES.items():
    ALLOWED[("torch", _name)] = _dt


class RestrictedUnpickler(pickle._Unpickler):
    """Unpickler whose globals are limited to ALLOWED and whose storages come from a callback."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: Any, persistent_load: Any, where: str) -> None:
        super().__init__(file, encoding="utf-8")
        self._load_storage = persistent_load
        self._where = where

    def find_class(self, module: str, name: str) -> Any:
        """Resolve only allow-listed globals, to ember's own implementations."""
        try:
            return ALLOWED[(module, name)]
        except (KeyError, TypeError):
            shown = f"{module}.{name}"
            if not (module and name and shown.isprintable()):
                shown = repr(shown)
            raise FormatError(
                f"{self._where}: refusing to load global {shown[:200]} "
                "(only tensor-rebuilding globals are allowed)"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        """Resolve ('storage', type, key, location, numel[, view]) ids through the callback."""
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage"):
            raise FormatError(f"{self._where}: unsupported persistent id {pid!r:.200}")
        if not isinstance(pid[1], StorageType) or not isinstance(pid[2], str):
            raise FormatError(f"{self._where}: bad storage reference {pid!r:.200}")
        if type(pid[4]) is not int or pid[4] < 0:
            raise FormatError(f"{self._where}: bad storage size {pid[4]!r:.50}")
        return self._load_storage(pid)


def _load_build(self: RestrictedUnpickler) -> None:
    # BUILD calls __setstate__ or sets attributes; numpy dtypes have a __setstate__ that would
    # mutate the process-wide singletons. torch.save only emits BUILD to give a state dict its
    # `_metadata` attribute, so that is all we accept.
    state = self.stack.pop()
    inst = self.stack[-1]
    if type(inst) is not collections.OrderedDict or not isinstance(state, dict):
        raise FormatError(
            f"{self._where}: refusing to set state on a {type(inst).__name__} "
            "(only OrderedDict attributes are allowed)"
        )
    for key, value in state.items():
        if not isinstance(key, str) or key.startswith("__"):
            raise FormatError(f"{self._where}: refusing attribute {key!r:.50} on an OrderedDict")
        inst.__dict__[key] = value


RestrictedUnpickler.dispatch[pickle.BUILD[0]] = _load_build


def restricted_load(file: Any, persistent_load: Any, where: str) -> Any:
    """Unpickle one object; any failure of a hostile or broken pickle becomes FormatError."""
    try:
        return RestrictedUnpickler(file, persistent_load, where).load()
    except FormatError:
        raise
    except Exception as e:  # a corrupt pickle fails in many ways; all mean the same
        if isinstance(e, KeyError) and e.args and isinstance(e.args[0], int):
            why = f"unknown opcode {e.args[0]:#04x}"
        elif isinstance(e, EOFError):
            why = "the data ends before the pickle's STOP opcode"
        elif isinstance(e, RecursionError):
            why = "nested too deeply"
        elif isinstance(e, MemoryError):
            why = "it claims more memory than is available"
        else:
            why = f"{type(e).__name__}: {e}"[:300]
        try:
            at = f" (near byte {file.tell()})"
        except Exception:
            at = ""
        raise FormatError(f"{where}: corrupt pickle, {why}{at}") from None
