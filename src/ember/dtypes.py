"""The dtype table and torch's type-promotion rules.

bfloat16 and the float8 types come from ``ml_dtypes``, which takes longer to import than the rest
of ember together; it is imported the first time one of those dtypes' numpy type is needed
(``DType.np``), or a numpy dtype from it is looked up, not at ``import ember``.
"""

from __future__ import annotations

import sys

import numpy as np

from ember.errors import DTypeError

BOOL, INT, FLOAT = 0, 1, 2


class DType:
    """A tensor element type; compares equal to itself and hashes by name."""

    __slots__ = ("name", "np", "itemsize", "category", "is_signed", "_ml_name")

    def __init__(
        self, name: str, np_dtype: np.dtype | str, category: int, is_signed: bool, itemsize: int = 0
    ) -> None:
        self.name = name
        if isinstance(np_dtype, str):  # an ml_dtypes type, named: resolved on first use of .np
            self._ml_name = np_dtype
            self.itemsize = itemsize
        else:
            self._ml_name = None
            self.np = np.dtype(np_dtype)
            self.itemsize = self.np.itemsize
        self.category = category
        self.is_signed = is_signed

    def __getattr__(self, attr: str):
        # Called only for a slot not yet set: ``np`` of an ml_dtypes type before its first use.
        if attr == "np" and object.__getattribute__(self, "_ml_name") is not None:
            _load_ml_dtypes()
            return object.__getattribute__(self, "np")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")

    @property
    def is_floating_point(self) -> bool:
        """True for float16, bfloat16, float32 and float64."""
        return self.category == FLOAT

    def __repr__(self) -> str:
        return f"ember.{self.name}"

    def __reduce__(self):
        return (get_dtype, (self.name,))


bool_ = DType("bool", np.bool_, BOOL, False)
uint8 = DType("uint8", np.uint8, INT, False)
int8 = DType("int8", np.int8, INT, True)
int16 = DType("int16", np.int16, INT, True)
int32 = DType("int32", np.int32, INT, True)
int64 = DType("int64", np.int64, INT, True)
float16 = DType("float16", np.float16, FLOAT, True)
bfloat16 = DType("bfloat16", "bfloat16", FLOAT, True, itemsize=2)
float32 = DType("float32", np.float32, FLOAT, True)
float64 = DType("float64", np.float64, FLOAT, True)
# float8 types exist for storage (safetensors); compute upcasts them.
float8_e4m3fn = DType("float8_e4m3fn", "float8_e4m3fn", FLOAT, True, itemsize=1)
float8_e5m2 = DType("float8_e5m2", "float8_e5m2", FLOAT, True, itemsize=1)
_ML = (bfloat16, float8_e4m3fn, float8_e5m2)

ALL = (bool_, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64)
_BY_NAME = {d.name: d for d in ALL + (float8_e4m3fn, float8_e5m2)}
_BY_NAME.update(
    {
        "half": float16,
        "float": float32,
        "double": float64,
        "long": int64,
        "int": int32,
        "short": int16,
        "bool_": bool_,
        "bf16": bfloat16,
        "f16": float16,
        "f32": float32,
        "f64": float64,
    }
)
_BY_NP = {d.np: d for d in ALL if d not in _ML}  # the ml_dtypes types join on first use


def _load_ml_dtypes() -> None:
    """Import ml_dtypes and give bfloat16 and the float8 types their numpy dtypes."""
    import ml_dtypes

    for d in _ML:
        if d._ml_name is not None:
            d.np = np.dtype(getattr(ml_dtypes, d._ml_name))
            _BY_NP[d.np] = d
            d._ml_name = None


def is_half_float(d: np.dtype) -> bool:
    """Whether a numpy dtype is float16 or bfloat16 (without importing ml_dtypes to ask)."""
    return d == _np_float16 or getattr(d, "name", None) == "bfloat16"


class _HalfFloats:
    """``d in HALF_FLOATS``: float16 or bfloat16, the types computed in float32 (torch's opmath)."""

    __slots__ = ()

    def __contains__(self, d: object) -> bool:
        return is_half_float(d)

    def __repr__(self) -> str:
        return "HALF_FLOATS(float16, bfloat16)"


HALF_FLOATS = _HalfFloats()
_np_float16 = np.dtype(np.float16)


def _by_np(d: np.dtype) -> DType:
    try:
        return _BY_NP[d]
    except KeyError:
        if "ml_dtypes" not in sys.modules or all(t._ml_name is None for t in _ML):
            raise
    _load_ml_dtypes()  # d may be one of its types: numpy had to import it to make d
    return _BY_NP[d]


float = float32  # noqa: A001  torch aliases
double = float64
half = float16
long = int64
int = int32  # noqa: A001
short = int16
bool = bool_  # noqa: A001

_default_float = float32


def get_dtype(spec) -> DType:
    """Turn a DType, a name ('float32', 'bf16'), a numpy dtype or a torch dtype into a DType."""
    if isinstance(spec, DType):
        return spec
    if isinstance(spec, str):
        d = _BY_NAME.get(spec.removeprefix("torch.").removeprefix("ember."))
        if d is None:
            raise DTypeError(f"unknown dtype {spec!r}; expected one of {sorted(_BY_NAME)}")
        return d
    if spec is _pyfloat:
        return _default_float
    if spec is _pyint:
        return int64
    if spec is _pybool:
        return bool_
    mod = type(spec).__module__
    if mod.startswith("torch"):
        return get_dtype(str(spec))
    try:
        return _by_np(np.dtype(spec))
    except (TypeError, KeyError):
        raise DTypeError(f"unsupported dtype {spec!r}") from None


_pyfloat, _pyint, _pybool = type(1.0), type(1), type(True)  # noqa: UP003 (names shadowed above)


def from_numpy_dtype(d: np.dtype) -> DType:
    """The DType of a numpy dtype; DTypeError for types ember has no twin of."""
    try:
        return _by_np(d)
    except KeyError:
        raise DTypeError(f"numpy dtype {d} has no ember equivalent") from None


def set_default_dtype(d) -> None:
    """Set the dtype that Python floats and float factories produce (float32 by default)."""
    global _default_float
    d = get_dtype(d)
    if not d.is_floating_point:
        raise DTypeError(f"default dtype must be floating point, got {d}")
    _default_float = d


def get_default_dtype() -> DType:
    """The dtype Python floats become (float32 unless changed)."""
    return _default_float


def promote_types(a: DType, b: DType) -> DType:
    """torch.promote_types: the smallest dtype both a and b convert to safely."""
    if a is b:
        return a
    if a.category != b.category:
        return a if a.category > b.category else b
    if a.category == FLOAT:
        if a.itemsize == b.itemsize:  # float16 with bfloat16
            return float32
        return a if a.itemsize > b.itemsize else b
    return _BY_NP[np.promote_types(a.np, b.np)]


def scalar_category(x) -> int:
    """The category (bool, int, float) of a Python or numpy scalar."""
    if isinstance(x, (_pybool, np.bool_)):
        return BOOL
    if isinstance(x, (_pyint, np.integer)):
        return INT
    if isinstance(x, (_pyfloat, np.floating)):
        return FLOAT
    raise DTypeError(f"expected a tensor or a Python number, got {type(x).__name__}")


def default_for_category(cat: int) -> DType:
    """The dtype a Python scalar of this category becomes."""
    return (bool_, int64, _default_float)[cat]


def result_type(*operands) -> DType:
    """torch.result_type: dimensioned tensors > 0-d tensors > Python scalars, by category."""
    dim = zero = None
    scat = -1
    for x in operands:
        d = getattr(x, "dtype", None)
        if isinstance(d, DType):
            if x.ndim:
                dim = d if dim is None else promote_types(dim, d)
            else:
                zero = d if zero is None else promote_types(zero, d)
        else:
            scat = max(scat, scalar_category(x))
    res = dim
    if zero is not None and (res is None or zero.category > res.category):
        res = zero
    if res is None:
        return default_for_category(scat)
    if scat > res.category:
        res = default_for_category(scat)
    return res


def float_type_of(d: DType) -> DType:
    """The dtype a float-valued op returns for input dtype d (ints and bool -> default float)."""
    return d if d.category == FLOAT else _default_float
