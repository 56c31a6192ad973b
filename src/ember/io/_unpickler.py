"""A restricted unpickler that rebuilds PyTorch tensors as numpy arrays and nothing else.

Only the globals torch.save emits for tensors (rebuild functions, storage classes, dtypes,
OrderedDict, torch.Size) and a few inert builtins resolve; each resolves to our own
implementation, never to torch. Any other global is refused with FormatError naming it.

We subclass the pure-Python `pickle._Unpickler`: it reads every length-prefixed item through
`read(n)`, which is bounded by the bytes actually present, while the C unpickler allocates the
length a file claims before reading it.

Work is bounded by the file, never by what it claims: tuples nested past MAX_NESTING are refused
as they are built (hashing them would overflow the C stack), hashing dict keys and set elements
is charged to a budget proportional to the pickle's size, the finished object is walked once
(iteratively, sizes memoised) to refuse cycles, deep nesting, and shared containers that expand
past that budget ("billion laughs"), and the bytes all rebuilt tensors view are bounded by a
multiple of the file's size (stride-0 views of a tiny storage).
"""

from __future__ import annotations

import codecs
import collections
import contextvars
import itertools
import pickle
from typing import Any

import numpy as np

from ember.errors import FormatError
from ember.io._common import MAX_ARRAY_BYTES, MAX_ELEMENTS, np_dtype

# Bounds on what a pickle may make us build or walk (see _Budget and _measure).
MAX_NESTING = 100  # containers inside containers; torch checkpoints nest fewer than 10 deep
MIN_OBJECT_LIMIT = 1_000_000
OBJECTS_PER_BYTE = 16  # the object limit grows with the pickle: a real one spends >= 1 byte each
TENSOR_BYTES_PER_FILE_BYTE = 4  # views may overlap (tied weights, expand) but not without bound
MIN_TENSOR_BYTE_LIMIT = 2**20

# Storage classes and torch dtypes by numpy code; "ml_dtypes.X" names a type numpy lacks, and
# ml_dtypes is imported only when a checkpoint names one (see _common.np_dtype).
STORAGE_DTYPES: dict[str, str] = {
    "DoubleStorage": "<f8",
    "FloatStorage": "<f4",
    "HalfStorage": "<f2",
    "BFloat16Storage": "ml_dtypes.bfloat16",
    "LongStorage": "<i8",
    "IntStorage": "<i4",
    "ShortStorage": "<i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "?",
    "ComplexFloatStorage": "<c8",
    "ComplexDoubleStorage": "<c16",
    "UntypedStorage": "u1",
}

TORCH_DTYPES: dict[str, str] = {
    "float64": "<f8",
    "float32": "<f4",
    "float16": "<f2",
    "bfloat16": "ml_dtypes.bfloat16",
    "int64": "<i8",
    "int32": "<i4",
    "int16": "<i2",
    "int8": "i1",
    "uint8": "u1",
    "uint16": "<u2",
    "uint32": "<u4",
    "uint64": "<u8",
    "bool": "?",
    "complex64": "<c8",
    "complex128": "<c16",
    "float8_e4m3fn": "ml_dtypes.float8_e4m3fn",
    "float8_e5m2": "ml_dtypes.float8_e5m2",
}


_ATOMS = (type(None), bool, int, float, complex, str, bytes, bytearray)


def show(x: Any, limit: int = 80, depth: int = 1) -> str:
    """A short description of a value read from a file: never walks or prints it whole."""
    t = type(x)
    if t is int and x.bit_length() > 256:
        r = f"<int of {x.bit_length()} bits>"
    elif t in (str, bytes, bytearray):
        r = repr(x[: limit + 1])
    elif t in _ATOMS or isinstance(x, (np.dtype, StorageType, _Marker)):
        r = repr(x)
    elif t in (tuple, list) and depth > 0 and len(x) <= 8:
        inner = ", ".join(show(e, limit, depth - 1) for e in x)
        r = f"({inner}{',' if len(x) == 1 else ''})" if t is tuple else f"[{inner}]"
    else:
        try:
            n = f" of {len(x)} items" if t in (tuple, list, dict, set, frozenset) else ""
        except Exception:  # a dict subclass we built; cannot really fail, but never let it raise
            n = ""
        r = f"<{t.__name__}{n}>"
    return r if len(r) <= limit else r[: limit - 3] + "..."


class _Budget:
    """What one pickle may cost us: objects built and walked, hashing work, tensor bytes.

    Tuples and frozensets (the hashable containers) get their expanded size and depth recorded
    when built: hashing one walks it whole, so each dict key or set element is charged that
    size, and a tuple nested too deeply is refused before anything hashes it (CPython's tuple
    hash recurses in C and would overflow the stack).
    """

    def __init__(self, where: str, pickle_bytes: int, data_bytes: int) -> None:
        self.where = where
        self.max_objects = max(MIN_OBJECT_LIMIT, OBJECTS_PER_BYTE * pickle_bytes)
        self.work = 0
        self.data_bytes = data_bytes
        self.max_tensor_bytes = max(MIN_TENSOR_BYTE_LIMIT, TENSOR_BYTES_PER_FILE_BYTE * data_bytes)
        self.tensor_bytes = 0
        self.shapes: dict[int, tuple[Any, int, int]] = {}  # id -> (tuple, size, depth)

    def too_many(self, what: str) -> FormatError:
        return FormatError(
            f"{self.where}: {what} more than {self.max_objects} objects (the limit for a pickle "
            f"of this size: {OBJECTS_PER_BYTE} per byte, at least {MIN_OBJECT_LIMIT})"
        )

    def too_deep(self) -> FormatError:
        return FormatError(
            f"{self.where}: containers nested more than {MAX_NESTING} deep (the limit)"
        )

    def size_depth(self, x: Any) -> tuple[int, int]:
        """(expanded size, nesting depth) of a value as hashing or walking it sees it."""
        t = type(x)
        if t is tuple or t is frozenset:
            rec = self.shapes.get(id(x))
            if rec is not None and rec[0] is x:
                return rec[1], rec[2]
            return 1 + len(x), 1  # only flat ones are built without being recorded
        if t is int:
            return 1 + x.bit_length() // 64, 0
        return 1, 0

    def record(self, x: Any) -> Any:
        """Note a new tuple or frozenset's size and depth; refuse it if either is past a limit."""
        size, depth = 1, 0
        for item in x:
            s, d = self.size_depth(item)
            size += s
            depth = max(depth, d)
        if depth + 1 > MAX_NESTING:
            raise self.too_deep()
        if size > self.max_objects:
            raise self.too_many(f"a {type(x).__name__} expands to")
        self.shapes[id(x)] = (x, size, depth + 1)
        return x

    def charge_hash(self, keys: Any) -> None:
        """Charge the work of hashing `keys` (dict keys or set elements)."""
        for k in keys:
            self.work += self.size_depth(k)[0]
        if self.work > self.max_objects:
            raise self.too_many("hashing its dict keys and set elements walks")

    def charge_tensor(self, numel: int, itemsize: int) -> None:
        """Count a rebuilt tensor's logical bytes against the file's size."""
        self.tensor_bytes += numel * itemsize
        if self.tensor_bytes > self.max_tensor_bytes:
            raise FormatError(
                f"{self.where}: its tensors view {self.tensor_bytes} bytes or more in all, past "
                f"the limit of {self.max_tensor_bytes} ({TENSOR_BYTES_PER_FILE_BYTE} x the "
                f"{self.data_bytes}-byte file; overlapping or stride-0 views)"
            )


_BUDGET: contextvars.ContextVar[_Budget] = contextvars.ContextVar("ember_unpickle_budget")


def _budget() -> _Budget:
    """The budget of the pickle being loaded (a generous one outside restricted_load)."""
    b = _BUDGET.get(None)
    return b if b is not None else _Budget("<pickle>", 0, MAX_ARRAY_BYTES)


class StorageType:
    """Stands for a torch storage class (torch.FloatStorage, ...); only its dtype matters."""

    __slots__ = ("name", "code")

    def __init__(self, name: str, code: str) -> None:
        self.name, self.code = name, code

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype of the storage's items."""
        return np_dtype(self.code)

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
        raise FormatError(f"tensor {what} must be a tuple of non-negative ints, found {show(x)}")
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
        raise FormatError(
            f"bad tensor layout: offset {show(offset)}, size {show(size)}, stride {show(stride)}"
        )
    numel = nonzero = 1
    for s in size:
        numel *= s
        nonzero *= s or 1
    if nonzero >= MAX_ELEMENTS or nonzero * dt.itemsize > MAX_ARRAY_BYTES:
        raise FormatError(
            f"tensor size {list(size)} of {dt} is too large for any array "
            f"(limit: {MAX_ARRAY_BYTES} bytes, zero dimensions counted as 1)"
        )
    _budget().charge_tensor(numel, dt.itemsize)
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
        raise FormatError(f"_rebuild_tensor_v3 needs a torch dtype, found {show(dtype)}")
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
        raise FormatError(f"refusing tensor subclass rebuild {show(func)} for {show(new_type)}")
    return func(*args)


def _torch_size(dims=()):
    if not isinstance(dims, (tuple, list)):
        raise FormatError(f"torch.Size needs a tuple of ints, found {show(dims)}")
    return _budget().record(_ints(tuple(dims), "torch.Size"))


# The hashing containers a pickle may build: each charges its elements' hashing to the budget.
def _set(items=()):
    items = list(_iterable(items, "set"))
    _budget().charge_hash(items)
    return set(items)


def _frozenset(items=()):
    items = list(_iterable(items, "frozenset"))
    b = _budget()
    b.charge_hash(items)
    return b.record(frozenset(items))


def _ordered_dict(items=()):
    pairs = (
        list(items.items()) if isinstance(items, dict) else list(_iterable(items, "OrderedDict"))
    )
    for p in pairs:
        if not (type(p) in (tuple, list) and len(p) == 2):
            raise FormatError(f"OrderedDict needs (key, value) pairs, found {show(p)}")
    _budget().charge_hash(p[0] for p in pairs)
    return collections.OrderedDict(pairs)


def _iterable(items: Any, what: str) -> Any:
    if type(items) not in (tuple, list, set, frozenset, dict, collections.OrderedDict):
        raise FormatError(f"{what} needs a list or tuple, found {show(items)}")
    return items


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
    ("collections", "OrderedDict"): _ordered_dict,
    ("builtins", "set"): _set,
    ("builtins", "frozenset"): _frozenset,
    ("__builtin__", "set"): _set,
    ("__builtin__", "frozenset"): _frozenset,
    ("_codecs", "encode"): _encode,
    ("codecs", "encode"): _encode,
}
for _name, _code in STORAGE_DTYPES.items():
    ALLOWED[("torch", _name)] = StorageType(_name, _code)
ALLOWED[("torch.storage", "UntypedStorage")] = ALLOWED[("torch", "UntypedStorage")]


class RestrictedUnpickler(pickle._Unpickler):
    """Unpickler whose globals are limited to ALLOWED and whose storages come from a callback."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: Any, persistent_load: Any, where: str, budget: _Budget) -> None:
        super().__init__(file, encoding="utf-8")
        self._load_storage = persistent_load
        self._where = where
        self._budget = budget

    def find_class(self, module: str, name: str) -> Any:
        """Resolve only allow-listed globals, to ember's own implementations."""
        try:
            if module == "torch" and name in TORCH_DTYPES:
                return np_dtype(TORCH_DTYPES[name])
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
            raise FormatError(f"{self._where}: unsupported persistent id {show(pid, 200)}")
        if not isinstance(pid[1], StorageType) or not isinstance(pid[2], str):
            raise FormatError(f"{self._where}: bad storage reference {show(pid, 200)}")
        if type(pid[4]) is not int or pid[4] < 0:
            raise FormatError(f"{self._where}: bad storage size {show(pid[4], 50)}")
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
            raise FormatError(
                f"{self._where}: refusing attribute {show(key, 50)} on an OrderedDict"
            )
        inst.__dict__[key] = value


RestrictedUnpickler.dispatch[pickle.BUILD[0]] = _load_build


# Opcodes that build tuples and frozensets record their size and depth; opcodes that hash dict
# keys or set elements charge for it. torch.save sets items only on dicts and adds them to sets.
def _recording(load: Any) -> Any:
    def load_and_record(self: RestrictedUnpickler) -> None:
        load(self)
        self._budget.record(self.stack[-1])

    return load_and_record


for _op in (pickle.TUPLE, pickle.TUPLE1, pickle.TUPLE2, pickle.TUPLE3):
    RestrictedUnpickler.dispatch[_op[0]] = _recording(pickle._Unpickler.dispatch[_op[0]])


def _target(self: RestrictedUnpickler, types: tuple[type, ...], op: str) -> Any:
    obj = self.stack[-1]
    if type(obj) not in types:
        raise FormatError(f"{self._where}: {op} on a {type(obj).__name__} is refused")
    return obj


def _load_setitem(self: RestrictedUnpickler) -> None:
    value = self.stack.pop()
    key = self.stack.pop()
    self._budget.charge_hash((key,))
    _target(self, (dict, collections.OrderedDict), "SETITEM")[key] = value


def _load_setitems(self: RestrictedUnpickler) -> None:
    items = self.pop_mark()
    d = _target(self, (dict, collections.OrderedDict), "SETITEMS")
    if len(items) % 2:
        raise FormatError(f"{self._where}: SETITEMS with a key but no value")
    self._budget.charge_hash(items[0::2])
    for i in range(0, len(items), 2):
        d[items[i]] = items[i + 1]


def _load_additems(self: RestrictedUnpickler) -> None:
    items = self.pop_mark()
    target = _target(self, (set,), "ADDITEMS")
    self._budget.charge_hash(items)
    target.update(items)


def _load_frozenset(self: RestrictedUnpickler) -> None:
    items = self.pop_mark()
    self._budget.charge_hash(items)
    self.append(self._budget.record(frozenset(items)))


RestrictedUnpickler.dispatch[pickle.SETITEM[0]] = _load_setitem
RestrictedUnpickler.dispatch[pickle.SETITEMS[0]] = _load_setitems
RestrictedUnpickler.dispatch[pickle.ADDITEMS[0]] = _load_additems
RestrictedUnpickler.dispatch[pickle.FROZENSET[0]] = _load_frozenset

_CONTAINERS = (list, tuple, dict, collections.OrderedDict, set, frozenset)


def _children(x: Any) -> Any:
    if isinstance(x, dict):
        extra = getattr(x, "__dict__", None) or {}  # an OrderedDict's _metadata (see BUILD)
        return itertools.chain(itertools.chain.from_iterable(x.items()), extra.values())
    return iter(x)


def _measure(root: Any, budget: _Budget) -> int:
    """Walk the result once: its expanded size (a container counted once per reference, as any
    consumer walking it would see it), refusing cycles, nesting past MAX_NESTING and a size
    past the budget. Iterative, and each container's size is remembered, so the walk itself
    costs only the pickle's own objects."""
    if type(root) not in _CONTAINERS:
        return 1
    done: dict[int, int] = {}
    on_path = {id(root)}
    stack = [[root, _children(root), 1]]
    while stack:
        frame = stack[-1]
        for child in frame[1]:
            if type(child) not in _CONTAINERS:
                frame[2] += 1
                continue
            cid = id(child)
            if cid in done:
                frame[2] += done[cid]
                if frame[2] > budget.max_objects:
                    raise budget.too_many("its containers, counted per reference, hold")
                continue
            if cid in on_path:
                raise FormatError(
                    f"{budget.where}: a {type(child).__name__} contains itself (a cycle; "
                    "checkpoints are trees)"
                )
            if len(stack) >= MAX_NESTING:
                raise budget.too_deep()
            on_path.add(cid)
            stack.append([child, _children(child), 1])
            break
        else:
            stack.pop()
            on_path.discard(id(frame[0]))
            done[id(frame[0])] = frame[2]
            if stack:
                stack[-1][2] += frame[2]
                if stack[-1][2] > budget.max_objects:
                    raise budget.too_many("its containers, counted per reference, hold")
    return done[id(root)]


def restricted_load(
    file: Any,
    persistent_load: Any,
    where: str,
    *,
    pickle_bytes: int | None = None,
    data_bytes: int | None = None,
) -> Any:
    """Unpickle one object; any failure of a hostile or broken pickle becomes FormatError.

    `pickle_bytes` (default: the file's length) scales the object limit; `data_bytes` (default:
    the same) is the size of the file the tensors' storages lie in, which bounds their bytes.
    """
    if pickle_bytes is None:
        pickle_bytes = _length(file)
    budget = _Budget(where, pickle_bytes, pickle_bytes if data_bytes is None else data_bytes)
    token = _BUDGET.set(budget)
    try:
        obj = RestrictedUnpickler(file, persistent_load, where, budget).load()
        _measure(obj, budget)
        return obj
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
            why = f"{type(e).__name__}: {str(e)[:300]}"
        try:
            at = f" (near byte {file.tell()})"
        except Exception:
            at = ""
        raise FormatError(f"{where}: corrupt pickle, {why}{at}") from None
    finally:
        _BUDGET.reset(token)


def _length(file: Any) -> int:
    """Bytes in a BytesIO or mmap (what a pickle read from it can span)."""
    try:
        return len(file.getbuffer())
    except AttributeError:
        try:
            return len(file)
        except TypeError:
            return 0
