"""Elementwise ops: arithmetic, math functions, activations, comparisons, logic."""

from __future__ import annotations

import math

import numpy as np

from ember import dtypes as _dt
from ember.autograd import Function, elementwise_meta, meta_array, unbroadcast
from ember.device import META
from ember.errors import DeviceError, DTypeError
from ember.ops._util import cast, coerce, to_float
from ember.tensor import Tensor

_LOW = _dt.HALF_FLOATS  # float16, bfloat16 (ml_dtypes not imported to ask)
_F32 = np.float32
_SQRT2 = math.sqrt(2.0)
_SQRT_2_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def nondiff(f, *ts: Tensor, **kw) -> Tensor:
    """Apply an array function that has no gradient (comparisons, logic, isnan...)."""
    dev = ts[0]._device
    for t in ts:
        if t._device is not dev:
            raise DeviceError(f"expected all tensors on one device, got {dev} and {t._device}")
    if dev is META:
        shape = np.broadcast_shapes(*(t._data.shape for t in ts))
        out = np.asarray(f(*[np.ones((1,) * t._data.ndim, t._data.dtype) for t in ts], **kw))
        return Tensor._wrap(meta_array(shape, out.dtype), dev)
    out = np.asarray(f(*[t._data for t in ts], **kw))
    return Tensor._wrap(out, dev)


# ------------------------------------------------------------------ unary
class Unary(Function):
    """Base for x -> f(x); float16/bfloat16 compute in float32 like torch's opmath."""

    meta = elementwise_meta

    def forward(self, x, **kw):
        lo = x.dtype if x.dtype in _LOW else None
        if lo is not None:
            x = x.astype(_F32)
        self.kw = kw
        with np.errstate(all="ignore"):
            y = self.f(x, **kw)
        self.x, self.y, self.lo = x, y, lo
        return y.astype(lo) if lo is not None else y

    def backward(self, g):
        if self.lo is not None:
            g = g.astype(_F32)
        with np.errstate(all="ignore"):
            r = self.df(self.x, self.y, g, **self.kw)
        return r.astype(self.lo) if self.lo is not None else r


def _unary(name: str, f, df, floating: bool = True, doc: str = ""):
    cls = type(name.capitalize(), (Unary,), {"f": staticmethod(f), "df": staticmethod(df)})

    def op(input: Tensor) -> Tensor:
        return cls.apply(to_float(input) if floating else input)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc or f"{name}(x), elementwise."
    op.Function = cls
    return op


def _zero(x, y, g):
    return np.zeros_like(g)


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


def _erf(x):
    from ember.kernels.cpu.special import erf_numpy

    return erf_numpy(x)


def _gelu(x):
    from ember.kernels.cpu.special import gelu_numpy

    return gelu_numpy(x)


class _KernelUnary(Unary):
    """A Unary op with registered kernels, which also run while a graph is recorded."""

    def saved(self, x, **kw):
        self.x, self.y, self.lo, self.kw = x, None, None, kw  # df reads x only


neg = _unary("neg", np.negative, lambda x, y, g: -g, False, "-x, elementwise.")
abs = _unary("abs", np.abs, lambda x, y, g: g * np.sign(x), False, "|x|, elementwise.")
sign = _unary("sign", np.sign, _zero, False, "The sign of x (-1, 0, 1).")
exp = _unary("exp", np.exp, lambda x, y, g: g * y)
exp2 = _unary("exp2", np.exp2, lambda x, y, g: g * y * math.log(2.0))
log = _unary("log", np.log, lambda x, y, g: g / x)
log2 = _unary("log2", np.log2, lambda x, y, g: g / (x * math.log(2.0)))
log10 = _unary("log10", np.log10, lambda x, y, g: g / (x * math.log(10.0)))
log1p = _unary("log1p", np.log1p, lambda x, y, g: g / (1 + x))
expm1 = _unary("expm1", np.expm1, lambda x, y, g: g * (y + 1))
sqrt = _unary("sqrt", np.sqrt, lambda x, y, g: g / (2 * y))
rsqrt = _unary("rsqrt", lambda x: 1 / np.sqrt(x), lambda x, y, g: -0.5 * g * y * y * y)
reciprocal = _unary("reciprocal", lambda x: 1 / x, lambda x, y, g: -g * y * y)
square = _unary("square", np.square, lambda x, y, g: 2 * g * x, False)
sin = _unary("sin", np.sin, lambda x, y, g: g * np.cos(x))
cos = _unary("cos", np.cos, lambda x, y, g: -g * np.sin(x))
tan = _unary("tan", np.tan, lambda x, y, g: g * (1 + y * y))
asin = _unary("asin", np.arcsin, lambda x, y, g: g / np.sqrt(1 - x * x))
acos = _unary("acos", np.arccos, lambda x, y, g: -g / np.sqrt(1 - x * x))
atan = _unary("atan", np.arctan, lambda x, y, g: g / (1 + x * x))
sinh = _unary("sinh", np.sinh, lambda x, y, g: g * np.cosh(x))
cosh = _unary("cosh", np.cosh, lambda x, y, g: g * np.sinh(x))
tanh = _unary("tanh", np.tanh, lambda x, y, g: g * (1 - y * y))
sigmoid = _unary("sigmoid", _sigmoid, lambda x, y, g: g * y * (1 - y), doc="1 / (1 + exp(-x)).")
relu = _unary(
    "relu",
    lambda x: np.maximum(x, 0).astype(x.dtype, copy=False),
    lambda x, y, g: g * (x > 0),
    False,
)
silu = _unary(
    "silu", lambda x: x * _sigmoid(x), lambda x, y, g: g * (s := _sigmoid(x)) * (1 + x * (1 - s))
)


class Erf(_KernelUnary):
    """The error function; kernels: kernels.cpu.special (numba ufuncs)."""

    kernel_op = "erf"
    f = staticmethod(_erf)

    @staticmethod
    def df(x, y, g):
        return g * (2 / math.sqrt(math.pi)) * np.exp(-x * x)


def erf(input: Tensor) -> Tensor:
    """The error function."""
    return Erf.apply(to_float(input))


floor = _unary("floor", np.floor, _zero, False, "Round down.")
ceil = _unary("ceil", np.ceil, _zero, False, "Round up.")
trunc = _unary("trunc", np.trunc, _zero, False, "Round toward zero.")
frac = _unary("frac", lambda x: x - np.trunc(x), lambda x, y, g: g, False, "x - trunc(x).")
mish = _unary(
    "mish",
    lambda x: x * np.tanh(np.logaddexp(0, x)),
    lambda x, y, g: g * ((t := np.tanh(np.logaddexp(0, x))) + x * (1 - t * t) * _sigmoid(x)),
    doc="x * tanh(softplus(x)).",
)


class Gelu(_KernelUnary):
    """GELU, exact (erf) or with the tanh approximation; kernels: kernels.cpu.activation, special."""

    kernel_op = "gelu"

    @staticmethod
    def f(x, approximate):
        if approximate == "tanh":
            return 0.5 * x * (1 + np.tanh(_SQRT_2_PI * (x + 0.044715 * x**3)))
        return _gelu(x)

    @staticmethod
    def df(x, y, g, approximate):
        if approximate == "tanh":
            inner = _SQRT_2_PI * (x + 0.044715 * x**3)
            t = np.tanh(inner)
            return g * (
                0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_PI * (1 + 3 * 0.044715 * x * x)
            )
        return g * (0.5 * (1 + _erf(x / _SQRT2)) + x * _INV_SQRT_2PI * np.exp(-0.5 * x * x))


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    """Gaussian error linear unit; approximate='tanh' for the tanh form."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return Gelu.apply(to_float(input), approximate=approximate)


class Softplus(Unary):
    """log(1 + exp(beta x)) / beta, linear above threshold."""

    @staticmethod
    def f(x, beta, threshold):
        bx = beta * x
        return np.where(bx > threshold, x, np.logaddexp(0, bx) / beta).astype(x.dtype, copy=False)

    @staticmethod
    def df(x, y, g, beta, threshold):
        bx = beta * x
        return g * np.where(bx > threshold, 1.0, _sigmoid(bx)).astype(x.dtype, copy=False)


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """Smooth ReLU: log(1 + exp(beta x)) / beta."""
    return Softplus.apply(to_float(input), beta=beta, threshold=threshold)


class LeakyRelu(Unary):
    """x for x > 0, slope * x otherwise."""

    @staticmethod
    def f(x, slope):
        return np.where(x > 0, x, x * slope).astype(x.dtype, copy=False)

    @staticmethod
    def df(x, y, g, slope):
        return np.where(x > 0, g, g * slope).astype(g.dtype, copy=False)


def leaky_relu(input: Tensor, negative_slope: float = 0.01) -> Tensor:
    """Leaky ReLU."""
    return LeakyRelu.apply(input, slope=negative_slope)


class Elu(Unary):
    """x for x > 0, alpha (exp(x) - 1) otherwise."""

    @staticmethod
    def f(x, alpha):
        return np.where(x > 0, x, alpha * np.expm1(x)).astype(x.dtype, copy=False)

    @staticmethod
    def df(x, y, g, alpha):
        return np.where(x > 0, g, g * (y + alpha)).astype(g.dtype, copy=False)


def elu(input: Tensor, alpha: float = 1.0) -> Tensor:
    """Exponential linear unit."""
    return Elu.apply(to_float(input), alpha=alpha)


class Hardswish(Unary):
    """x * relu6(x + 3) / 6."""

    @staticmethod
    def f(x):
        return x * np.clip(x + 3, 0, 6) / 6

    @staticmethod
    def df(x, y, g):
        return g * np.where(x < -3, 0.0, np.where(x > 3, 1.0, (2 * x + 3) / 6)).astype(
            g.dtype, copy=False
        )


def hardswish(input: Tensor) -> Tensor:
    """Hard swish (MobileNetV3)."""
    return Hardswish.apply(to_float(input))


class Hardsigmoid(Unary):
    """relu6(x + 3) / 6."""

    @staticmethod
    def f(x):
        return np.clip(x + 3, 0, 6) / 6

    @staticmethod
    def df(x, y, g):
        return g * ((x > -3) & (x < 3)) / 6


def hardsigmoid(input: Tensor) -> Tensor:
    """Hard sigmoid."""
    return Hardsigmoid.apply(to_float(input))


class Clamp(Unary):
    """Clip to [lo, hi]; the gradient passes where lo <= x <= hi."""

    @staticmethod
    def f(x, lo, hi):
        return np.clip(x, lo, hi).astype(x.dtype, copy=False)

    @staticmethod
    def df(x, y, g, lo, hi):
        m = np.ones(x.shape, bool)
        if lo is not None:
            m &= x >= lo
        if hi is not None:
            m &= x <= hi
        return g * m


def clamp(input: Tensor, min=None, max=None) -> Tensor:
    """Clip values into [min, max]; bounds may be numbers or tensors."""
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        out = input
        if min is not None:
            out = maximum(out, min if isinstance(min, Tensor) else _full_like(out, min))
        if max is not None:
            out = minimum(out, max if isinstance(max, Tensor) else _full_like(out, max))
        return out
    x = input
    if (isinstance(min, float) or isinstance(max, float)) and not x.is_floating_point():
        x = to_float(x)
    return Clamp.apply(x, lo=min, hi=max)


def _full_like(x: Tensor, v) -> Tensor:
    from ember.ops._util import scalar

    return scalar(v, x.dtype, x)


def relu6(input: Tensor) -> Tensor:
    """min(max(x, 0), 6)."""
    return clamp(input, 0, 6)


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """clamp(x, min_val, max_val)."""
    return clamp(input, min_val, max_val)


class Round(Unary):
    """Round half to even, optionally to a number of decimals; zero gradient."""

    @staticmethod
    def f(x, decimals):
        return np.round(x, decimals)

    df = staticmethod(lambda x, y, g, decimals: np.zeros_like(g))


def round(input: Tensor, decimals: int = 0) -> Tensor:
    """Round half to even (as torch)."""
    return Round.apply(input, decimals=decimals)


# ------------------------------------------------------------------ binary
class Add(Function):
    """a + alpha * b."""

    meta = elementwise_meta

    def forward(self, a, b, alpha=1):
        self.sa, self.sb, self.alpha = a.shape, b.shape, alpha
        return a + b if alpha == 1 else a + alpha * b

    def backward(self, g):
        gb = g if self.alpha == 1 else g * self.alpha
        return unbroadcast(g, self.sa), unbroadcast(gb, self.sb)


class Sub(Function):
    """a - alpha * b."""

    meta = elementwise_meta

    def forward(self, a, b, alpha=1):
        self.sa, self.sb, self.alpha = a.shape, b.shape, alpha
        return a - b if alpha == 1 else a - alpha * b

    def backward(self, g):
        return unbroadcast(g, self.sa), unbroadcast(
            -g if self.alpha == 1 else -self.alpha * g, self.sb
        )


class Mul(Function):
    """a * b."""

    meta = elementwise_meta

    def forward(self, a, b):
        self.a, self.b = a, b
        return a * b

    def backward(self, g):
        a, b = self.a, self.b
        ga = unbroadcast(g * b, a.shape) if self.needs_input_grad[0] else None
        gb = unbroadcast(g * a, b.shape) if self.needs_input_grad[1] else None
        return ga, gb


class Div(Function):
    """a / b (true division)."""

    meta = elementwise_meta

    def forward(self, a, b):
        self.a, self.b = a, b
        with np.errstate(divide="ignore", invalid="ignore"):
            return a / b

    def backward(self, g):
        a, b = self.a, self.b
        with np.errstate(divide="ignore", invalid="ignore"):
            ga = unbroadcast(g / b, a.shape) if self.needs_input_grad[0] else None
            gb = unbroadcast(-g * a / (b * b), b.shape) if self.needs_input_grad[1] else None
        return ga, gb


class Pow(Function):
    """a ** b."""

    meta = elementwise_meta

    def forward(self, a, b):
        with np.errstate(all="ignore"):
            y = np.power(a, b)
        self.a, self.b, self.y = a, b, y
        return y

    def backward(self, g):
        a, b, y = self.a, self.b, self.y
        ga = gb = None
        with np.errstate(all="ignore"):
            if self.needs_input_grad[0]:
                ga = unbroadcast(
                    np.where(b == 0, 0, g * b * np.power(a, b - 1)).astype(g.dtype), a.shape
                )
            if self.needs_input_grad[1]:
                gb = unbroadcast(np.where(a == 0, 0, g * y * np.log(a)).astype(g.dtype), b.shape)
        return ga, gb


class Maximum(Function):
    """Elementwise max; ties split the gradient equally (as torch)."""

    meta = elementwise_meta

    take = staticmethod(np.maximum)

    def forward(self, a, b):
        self.a, self.b = a, b
        return self.take(a, b)

    def backward(self, g):
        a, b = self.a, self.b
        win = (a > b) if self.take is np.maximum else (a < b)
        tie = (a == b) * 0.5
        wa = win + tie
        wb = (1 - win) - tie
        return unbroadcast((g * wa).astype(g.dtype), a.shape), unbroadcast(
            (g * wb).astype(g.dtype), b.shape
        )


class Minimum(Maximum):
    """Elementwise min."""

    take = staticmethod(np.minimum)


class Atan2(Function):
    """atan2(a, b)."""

    meta = elementwise_meta

    def forward(self, a, b):
        self.a, self.b = a, b
        return np.arctan2(a, b)

    def backward(self, g):
        a, b = self.a, self.b
        d = a * a + b * b
        return unbroadcast(g * b / d, a.shape), unbroadcast(-g * a / d, b.shape)


class Where(Function):
    """cond ? a : b."""

    meta = elementwise_meta

    def forward(self, c, a, b):
        self.c, self.sa, self.sb = c, a.shape, b.shape
        return np.where(c, a, b)

    def backward(self, g):
        z = np.zeros((), g.dtype)
        return (
            None,
            unbroadcast(np.where(self.c, g, z), self.sa),
            unbroadcast(np.where(self.c, z, g), self.sb),
        )


class Remainder(Function):
    """Python-style modulus (sign of the divisor); gradient 1 for a, -floor(a/b) for b."""

    meta = elementwise_meta

    def forward(self, a, b, fn):
        self.a, self.b, self.fn = a, b, fn
        with np.errstate(all="ignore"):
            return fn(a, b)

    def backward(self, g):
        a, b = self.a, self.b
        q = np.floor(a / b) if self.fn is np.mod else np.trunc(a / b)
        return unbroadcast(g, a.shape), unbroadcast(-g * q, b.shape)


def add(input, other, *, alpha=1) -> Tensor:
    """input + alpha * other, with broadcasting and type promotion."""
    a, b = coerce(input, other)
    return Add.apply(a, b, alpha=alpha)


def sub(input, other, *, alpha=1) -> Tensor:
    """input - alpha * other."""
    a, b = coerce(input, other)
    if a._data.dtype == np.bool_:
        raise DTypeError("subtraction of bool tensors is not supported; use logical_xor or ~")
    return Sub.apply(a, b, alpha=alpha)


subtract = sub


def mul(input, other) -> Tensor:
    """input * other."""
    a, b = coerce(input, other)
    return Mul.apply(a, b)


multiply = mul


def _int_div_check(b: Tensor) -> None:
    if b._device is not META and b._data.dtype.kind in "iub" and (b._data == 0).any():
        raise ZeroDivisionError("integer division by zero")


def div(input, other, *, rounding_mode: str | None = None) -> Tensor:
    """input / other; rounding_mode None (true division), 'trunc' or 'floor'."""
    if rounding_mode is None:
        a, b = coerce(input, other, floating=True)
        return Div.apply(a, b)
    a, b = coerce(input, other)
    if rounding_mode == "floor":
        return floor_divide(a, b)
    if rounding_mode != "trunc":
        raise ValueError(
            f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}"
        )
    if a.is_floating_point():
        return trunc(Div.apply(a, b))
    _int_div_check(b)

    def tdiv(x, y):
        q = x // y
        return q + ((q < 0) & (q * y != x))

    return nondiff(tdiv, a, b)


divide = true_divide = div


def floor_divide(input, other) -> Tensor:
    """input // other, rounding toward negative infinity (as torch and Python)."""
    a, b = coerce(input, other)
    if a.is_floating_point():
        return floor(Div.apply(a, b))
    _int_div_check(b)
    return nondiff(np.floor_divide, a, b)


def remainder(input, other) -> Tensor:
    """Python-style modulus: the result has the sign of the divisor."""
    a, b = coerce(input, other)
    if not a.is_floating_point():
        _int_div_check(b)
        return nondiff(np.mod, a, b)
    return Remainder.apply(a, b, fn=np.mod)


def fmod(input, other) -> Tensor:
    """C-style modulus: the result has the sign of the dividend."""
    a, b = coerce(input, other)
    if not a.is_floating_point():
        _int_div_check(b)
        return nondiff(np.fmod, a, b)
    return Remainder.apply(a, b, fn=np.fmod)


def pow(input, exponent) -> Tensor:
    """input ** exponent."""
    a, b = coerce(input, exponent)
    if not a.is_floating_point() and b._device is not META and (b._data < 0).any():
        raise ValueError("integers to negative integer powers are not allowed")
    if a.dtype is _dt.bool_:
        a, b = cast(a, _dt.int64), cast(b, _dt.int64)
    return Pow.apply(a, b)


def float_power(input, exponent) -> Tensor:
    """input ** exponent in float64."""
    a, b = coerce(input, exponent)
    return Pow.apply(cast(a, _dt.float64), cast(b, _dt.float64))


def maximum(input: Tensor, other: Tensor) -> Tensor:
    """Elementwise maximum."""
    a, b = coerce(input, other)
    return Maximum.apply(a, b)


def minimum(input: Tensor, other: Tensor) -> Tensor:
    """Elementwise minimum."""
    a, b = coerce(input, other)
    return Minimum.apply(a, b)


fmax, fmin = maximum, minimum


def atan2(input: Tensor, other: Tensor) -> Tensor:
    """Elementwise atan2(input, other)."""
    a, b = coerce(input, other, floating=True)
    return Atan2.apply(a, b)


arctan2 = atan2


def where(condition: Tensor, input=None, other=None) -> Tensor:
    """Pick input where condition holds, else other; where(cond) alone gives nonzero indices."""
    if input is None and other is None:
        from ember.ops.index import nonzero

        return nonzero(condition, as_tuple=True)
    a, b = coerce(input, other)
    c = condition if isinstance(condition, Tensor) else Tensor(np.asarray(condition, bool))
    if c._data.dtype != np.bool_:
        c = cast(c, _dt.bool_)
    return Where.apply(c, a, b)


def lerp(input: Tensor, end: Tensor, weight) -> Tensor:
    """input + weight * (end - input)."""
    return add(input, mul(sub(end, input), weight))


def addcmul(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    """input + value * tensor1 * tensor2."""
    return add(input, mul(tensor1, tensor2), alpha=value)


def addcdiv(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    """input + value * tensor1 / tensor2."""
    return add(input, div(tensor1, tensor2), alpha=value)


# ------------------------------------------------------------------ comparisons and logic
def _cmp(f, name):
    def op(input, other) -> Tensor:
        a, b = coerce(input, other)
        return nondiff(f, a, b)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Elementwise {name} comparison (bool result)."
    return op


eq = _cmp(np.equal, "eq")
ne = _cmp(np.not_equal, "ne")
lt = _cmp(np.less, "lt")
le = _cmp(np.less_equal, "le")
gt = _cmp(np.greater, "gt")
ge = _cmp(np.greater_equal, "ge")
greater, greater_equal, less, less_equal, not_equal = gt, ge, lt, le, ne


def _logic(f, name):
    def op(input, other) -> Tensor:
        a, b = coerce(input, other)
        return nondiff(lambda x, y: f(x.astype(bool), y.astype(bool)), a, b)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Elementwise {name} (bool result)."
    return op


logical_and = _logic(np.logical_and, "logical_and")
logical_or = _logic(np.logical_or, "logical_or")
logical_xor = _logic(np.logical_xor, "logical_xor")


def _bitwise(f, name):
    def op(input, other) -> Tensor:
        a, b = coerce(input, other)
        if a.is_floating_point():
            raise DTypeError(f"{name} is only defined for integer and bool tensors, got {a.dtype}")
        return nondiff(f, a, b)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Elementwise {name} of integer or bool tensors."
    return op


bitwise_and = _bitwise(np.bitwise_and, "bitwise_and")
bitwise_or = _bitwise(np.bitwise_or, "bitwise_or")
bitwise_xor = _bitwise(np.bitwise_xor, "bitwise_xor")


def logical_not(input: Tensor) -> Tensor:
    """Elementwise not (bool result)."""
    return nondiff(lambda x: np.logical_not(x.astype(bool)), input)


def bitwise_not(input: Tensor) -> Tensor:
    """Bitwise inversion of integer tensors, logical not of bool tensors."""
    if input.is_floating_point():
        raise DTypeError(
            f"bitwise_not is only defined for integer and bool tensors, got {input.dtype}"
        )
    return nondiff(np.invert, input)


def isnan(input: Tensor) -> Tensor:
    """Elementwise NaN test."""
    return nondiff(
        lambda x: (
            np.isnan(x) if x.dtype.kind == "f" or x.dtype in _LOW else np.zeros(x.shape, bool)
        ),
        input,
    )


def isinf(input: Tensor) -> Tensor:
    """Elementwise infinity test."""
    return nondiff(
        lambda x: (
            np.isinf(x) if x.dtype.kind == "f" or x.dtype in _LOW else np.zeros(x.shape, bool)
        ),
        input,
    )


def isfinite(input: Tensor) -> Tensor:
    """Elementwise finiteness test."""
    return nondiff(
        lambda x: (
            np.isfinite(x) if x.dtype.kind == "f" or x.dtype in _LOW else np.ones(x.shape, bool)
        ),
        input,
    )


def isclose(
    input: Tensor, other: Tensor, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False
) -> Tensor:
    """Elementwise |a - b| <= atol + rtol * |b|."""
    a, b = coerce(input, other)
    return nondiff(lambda x, y: np.isclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan), a, b)


def allclose(
    input: Tensor, other: Tensor, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False
) -> bool:
    """Whether every element is close (see isclose)."""
    return bool(isclose(input, other, rtol, atol, equal_nan)._data.all())


def equal(input: Tensor, other: Tensor) -> bool:
    """Whether both tensors have the same shape and elements."""
    return input.shape == other.shape and bool((input._data == other._data).all())


def nan_to_num(input: Tensor, nan: float = 0.0, posinf=None, neginf=None) -> Tensor:
    """Replace NaN and infinities by finite numbers (no gradient)."""
    return nondiff(lambda x: np.nan_to_num(x, nan=nan, posinf=posinf, neginf=neginf), input)


__all__ = [
    n
    for n, v in list(globals().items())
    if callable(v)
    and not n.startswith("_")
    and getattr(v, "__module__", "") == __name__
    and not isinstance(v, type)
    and n not in ("nondiff",)
]
