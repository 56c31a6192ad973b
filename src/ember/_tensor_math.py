"""Tensor methods for elementwise math and comparisons, with their in-place forms.

Each method is one call into the op function of the same name in ember.ops.elementwise, whose
docstring holds the details; an in-place form writes the result into self (ops._util.assign).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember._later import later

if TYPE_CHECKING:
    from ember.tensor import Number, Tensor

_E = later(globals(), "_E", "ember.ops.elementwise")
_U = later(globals(), "_U", "ember.ops._util")


class MathMethods:
    """Elementwise math as Tensor methods (mixed into ember.Tensor)."""

    __slots__ = ()

    def neg(self) -> Tensor:
        """-x, elementwise."""
        return _E.neg(self)

    def abs(self) -> Tensor:
        """|x|, elementwise."""
        return _E.abs(self)

    def sign(self) -> Tensor:
        """The sign of x (-1, 0, 1)."""
        return _E.sign(self)

    def exp(self) -> Tensor:
        """exp(x), elementwise."""
        return _E.exp(self)

    def exp2(self) -> Tensor:
        """exp2(x), elementwise."""
        return _E.exp2(self)

    def log(self) -> Tensor:
        """log(x), elementwise."""
        return _E.log(self)

    def log2(self) -> Tensor:
        """log2(x), elementwise."""
        return _E.log2(self)

    def log10(self) -> Tensor:
        """log10(x), elementwise."""
        return _E.log10(self)

    def log1p(self) -> Tensor:
        """log1p(x), elementwise."""
        return _E.log1p(self)

    def expm1(self) -> Tensor:
        """expm1(x), elementwise."""
        return _E.expm1(self)

    def sqrt(self) -> Tensor:
        """sqrt(x), elementwise."""
        return _E.sqrt(self)

    def rsqrt(self) -> Tensor:
        """rsqrt(x), elementwise."""
        return _E.rsqrt(self)

    def reciprocal(self) -> Tensor:
        """reciprocal(x), elementwise."""
        return _E.reciprocal(self)

    def square(self) -> Tensor:
        """square(x), elementwise."""
        return _E.square(self)

    def sin(self) -> Tensor:
        """sin(x), elementwise."""
        return _E.sin(self)

    def cos(self) -> Tensor:
        """cos(x), elementwise."""
        return _E.cos(self)

    def tan(self) -> Tensor:
        """tan(x), elementwise."""
        return _E.tan(self)

    def asin(self) -> Tensor:
        """asin(x), elementwise."""
        return _E.asin(self)

    def acos(self) -> Tensor:
        """acos(x), elementwise."""
        return _E.acos(self)

    def atan(self) -> Tensor:
        """atan(x), elementwise."""
        return _E.atan(self)

    def sinh(self) -> Tensor:
        """sinh(x), elementwise."""
        return _E.sinh(self)

    def cosh(self) -> Tensor:
        """cosh(x), elementwise."""
        return _E.cosh(self)

    def tanh(self) -> Tensor:
        """tanh(x), elementwise."""
        return _E.tanh(self)

    def sigmoid(self) -> Tensor:
        """1 / (1 + exp(-x))."""
        return _E.sigmoid(self)

    def relu(self) -> Tensor:
        """relu(x), elementwise."""
        return _E.relu(self)

    def silu(self) -> Tensor:
        """silu(x), elementwise."""
        return _E.silu(self)

    def erf(self) -> Tensor:
        """The error function."""
        return _E.erf(self)

    def floor(self) -> Tensor:
        """Round down."""
        return _E.floor(self)

    def ceil(self) -> Tensor:
        """Round up."""
        return _E.ceil(self)

    def trunc(self) -> Tensor:
        """Round toward zero."""
        return _E.trunc(self)

    def frac(self) -> Tensor:
        """x - trunc(x)."""
        return _E.frac(self)

    def mish(self) -> Tensor:
        """x * tanh(softplus(x))."""
        return _E.mish(self)

    def gelu(self, approximate: str = "none") -> Tensor:
        """Gaussian error linear unit; approximate='tanh' for the tanh form."""
        return _E.gelu(self, approximate)

    def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
        """Smooth ReLU: log(1 + exp(beta x)) / beta."""
        return _E.softplus(self, beta, threshold)

    def leaky_relu(self, negative_slope: float = 0.01) -> Tensor:
        """Leaky ReLU."""
        return _E.leaky_relu(self, negative_slope)

    def elu(self, alpha: float = 1.0) -> Tensor:
        """Exponential linear unit."""
        return _E.elu(self, alpha)

    def hardswish(self) -> Tensor:
        """Hard swish (MobileNetV3)."""
        return _E.hardswish(self)

    def hardsigmoid(self) -> Tensor:
        """Hard sigmoid."""
        return _E.hardsigmoid(self)

    def clamp(
        self, min: Tensor | Number | None = None, max: Tensor | Number | None = None
    ) -> Tensor:
        """Clip values into [min, max]; bounds may be numbers or tensors."""
        return _E.clamp(self, min, max)

    def relu6(self) -> Tensor:
        """min(max(x, 0), 6)."""
        return _E.relu6(self)

    def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
        """clamp(x, min_val, max_val)."""
        return _E.hardtanh(self, min_val, max_val)

    def round(self, decimals: int = 0) -> Tensor:
        """Round half to even (as torch)."""
        return _E.round(self, decimals)

    def add(self, other: Tensor | Number, *, alpha: Number = 1) -> Tensor:
        """input + alpha * other, with broadcasting and type promotion."""
        return _E.add(self, other, alpha=alpha)

    def sub(self, other: Tensor | Number, *, alpha: Number = 1) -> Tensor:
        """input - alpha * other."""
        return _E.sub(self, other, alpha=alpha)

    def subtract(self, other: Tensor | Number, *, alpha: Number = 1) -> Tensor:
        """Alias of sub()."""
        return _E.sub(self, other, alpha=alpha)

    def mul(self, other: Tensor | Number) -> Tensor:
        """input * other."""
        return _E.mul(self, other)

    def multiply(self, other: Tensor | Number) -> Tensor:
        """Alias of mul()."""
        return _E.mul(self, other)

    def div(self, other: Tensor | Number, *, rounding_mode: str | None = None) -> Tensor:
        """input / other; rounding_mode None (true division), 'trunc' or 'floor'."""
        return _E.div(self, other, rounding_mode=rounding_mode)

    def divide(self, other: Tensor | Number, *, rounding_mode: str | None = None) -> Tensor:
        """Alias of div()."""
        return _E.div(self, other, rounding_mode=rounding_mode)

    def true_divide(self, other: Tensor | Number, *, rounding_mode: str | None = None) -> Tensor:
        """Alias of div()."""
        return _E.div(self, other, rounding_mode=rounding_mode)

    def floor_divide(self, other: Tensor | Number) -> Tensor:
        """input // other, rounding toward negative infinity (as torch and Python)."""
        return _E.floor_divide(self, other)

    def remainder(self, other: Tensor | Number) -> Tensor:
        """Python-style modulus: the result has the sign of the divisor."""
        return _E.remainder(self, other)

    def fmod(self, other: Tensor | Number) -> Tensor:
        """C-style modulus: the result has the sign of the dividend."""
        return _E.fmod(self, other)

    def pow(self, exponent: Tensor | Number) -> Tensor:
        """input ** exponent."""
        return _E.pow(self, exponent)

    def float_power(self, exponent: Tensor | Number) -> Tensor:
        """input ** exponent in float64."""
        return _E.float_power(self, exponent)

    def maximum(self, other: Tensor) -> Tensor:
        """Elementwise maximum."""
        return _E.maximum(self, other)

    def minimum(self, other: Tensor) -> Tensor:
        """Elementwise minimum."""
        return _E.minimum(self, other)

    def fmax(self, other: Tensor) -> Tensor:
        """Alias of maximum()."""
        return _E.maximum(self, other)

    def fmin(self, other: Tensor) -> Tensor:
        """Alias of minimum()."""
        return _E.minimum(self, other)

    def lerp(self, end: Tensor, weight: Tensor | Number) -> Tensor:
        """input + weight * (end - input)."""
        return _E.lerp(self, end, weight)

    def addcmul(self, tensor1: Tensor, tensor2: Tensor, *, value: Tensor | Number = 1) -> Tensor:
        """input + value * tensor1 * tensor2."""
        return _E.addcmul(self, tensor1, tensor2, value=value)

    def addcdiv(self, tensor1: Tensor, tensor2: Tensor, *, value: Tensor | Number = 1) -> Tensor:
        """input + value * tensor1 / tensor2."""
        return _E.addcdiv(self, tensor1, tensor2, value=value)

    def eq(self, other: Tensor | Number) -> Tensor:
        """Elementwise eq comparison (bool result)."""
        return _E.eq(self, other)

    def ne(self, other: Tensor | Number) -> Tensor:
        """Elementwise ne comparison (bool result)."""
        return _E.ne(self, other)

    def lt(self, other: Tensor | Number) -> Tensor:
        """Elementwise lt comparison (bool result)."""
        return _E.lt(self, other)

    def le(self, other: Tensor | Number) -> Tensor:
        """Elementwise le comparison (bool result)."""
        return _E.le(self, other)

    def gt(self, other: Tensor | Number) -> Tensor:
        """Elementwise gt comparison (bool result)."""
        return _E.gt(self, other)

    def ge(self, other: Tensor | Number) -> Tensor:
        """Elementwise ge comparison (bool result)."""
        return _E.ge(self, other)

    def greater(self, other: Tensor | Number) -> Tensor:
        """Alias of gt()."""
        return _E.gt(self, other)

    def greater_equal(self, other: Tensor | Number) -> Tensor:
        """Alias of ge()."""
        return _E.ge(self, other)

    def less(self, other: Tensor | Number) -> Tensor:
        """Alias of lt()."""
        return _E.lt(self, other)

    def less_equal(self, other: Tensor | Number) -> Tensor:
        """Alias of le()."""
        return _E.le(self, other)

    def not_equal(self, other: Tensor | Number) -> Tensor:
        """Alias of ne()."""
        return _E.ne(self, other)

    def logical_and(self, other: Tensor | Number) -> Tensor:
        """Elementwise logical_and (bool result)."""
        return _E.logical_and(self, other)

    def logical_or(self, other: Tensor | Number) -> Tensor:
        """Elementwise logical_or (bool result)."""
        return _E.logical_or(self, other)

    def logical_xor(self, other: Tensor | Number) -> Tensor:
        """Elementwise logical_xor (bool result)."""
        return _E.logical_xor(self, other)

    def bitwise_and(self, other: Tensor | Number) -> Tensor:
        """Elementwise bitwise_and of integer or bool tensors."""
        return _E.bitwise_and(self, other)

    def bitwise_or(self, other: Tensor | Number) -> Tensor:
        """Elementwise bitwise_or of integer or bool tensors."""
        return _E.bitwise_or(self, other)

    def bitwise_xor(self, other: Tensor | Number) -> Tensor:
        """Elementwise bitwise_xor of integer or bool tensors."""
        return _E.bitwise_xor(self, other)

    def logical_not(self) -> Tensor:
        """Elementwise not (bool result)."""
        return _E.logical_not(self)

    def bitwise_not(self) -> Tensor:
        """Bitwise inversion of integer tensors, logical not of bool tensors."""
        return _E.bitwise_not(self)

    def isnan(self) -> Tensor:
        """Elementwise NaN test."""
        return _E.isnan(self)

    def isinf(self) -> Tensor:
        """Elementwise infinity test."""
        return _E.isinf(self)

    def isfinite(self) -> Tensor:
        """Elementwise finiteness test."""
        return _E.isfinite(self)

    def isclose(
        self, other: Tensor, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False
    ) -> Tensor:
        """Elementwise |a - b| <= atol + rtol * |b|."""
        return _E.isclose(self, other, rtol, atol, equal_nan)

    def nan_to_num(
        self, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None
    ) -> Tensor:
        """Replace NaN and infinities by finite numbers (no gradient)."""
        return _E.nan_to_num(self, nan, posinf, neginf)

    def allclose(
        self, other: Tensor, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False
    ) -> bool:
        """Whether every element is close (see isclose)."""
        return _E.allclose(self, other, rtol, atol, equal_nan)

    def equal(self, other: Tensor) -> bool:
        """Whether both tensors have the same shape and elements."""
        return _E.equal(self, other)

    def atan2(self, other: Tensor) -> Tensor:
        """Elementwise atan2(input, other)."""
        return _E.atan2(self, other)

    def arctan2(self, other: Tensor) -> Tensor:
        """Alias of atan2()."""
        return _E.atan2(self, other)

    def where(self, condition: Tensor, other: Tensor | Number) -> Tensor:
        """Elements of self where condition holds, else of other."""
        return _E.where(condition, self, other)

    def clamp_min(self, min: Tensor | Number) -> Tensor:
        """Clamp from below."""
        return _E.clamp(self, min=min)

    def clamp_max(self, max: Tensor | Number) -> Tensor:
        """Clamp from above."""
        return _E.clamp(self, max=max)

    def clip(
        self, min: Tensor | Number | None = None, max: Tensor | Number | None = None
    ) -> Tensor:
        """Alias of clamp()."""
        return _E.clamp(self, min, max)

    def absolute(self) -> Tensor:
        """Alias of abs()."""
        return _E.abs(self)

    def negative(self) -> Tensor:
        """Alias of neg()."""
        return _E.neg(self)

    def add_(self, other: Tensor | Number, *, alpha: Number = 1) -> Tensor:
        """In-place add()."""
        return _U.assign(self, _E.add(self, other, alpha=alpha))

    def sub_(self, other: Tensor | Number, *, alpha: Number = 1) -> Tensor:
        """In-place sub()."""
        return _U.assign(self, _E.sub(self, other, alpha=alpha))

    def mul_(self, other: Tensor | Number) -> Tensor:
        """In-place mul()."""
        return _U.assign(self, _E.mul(self, other))

    def div_(self, other: Tensor | Number, *, rounding_mode: str | None = None) -> Tensor:
        """In-place div()."""
        return _U.assign(self, _E.div(self, other, rounding_mode=rounding_mode))

    def pow_(self, exponent: Tensor | Number) -> Tensor:
        """In-place pow()."""
        return _U.assign(self, _E.pow(self, exponent))

    def neg_(self) -> Tensor:
        """In-place neg()."""
        return _U.assign(self, _E.neg(self))

    def abs_(self) -> Tensor:
        """In-place abs()."""
        return _U.assign(self, _E.abs(self))

    def exp_(self) -> Tensor:
        """In-place exp()."""
        return _U.assign(self, _E.exp(self))

    def log_(self) -> Tensor:
        """In-place log()."""
        return _U.assign(self, _E.log(self))

    def sqrt_(self) -> Tensor:
        """In-place sqrt()."""
        return _U.assign(self, _E.sqrt(self))

    def rsqrt_(self) -> Tensor:
        """In-place rsqrt()."""
        return _U.assign(self, _E.rsqrt(self))

    def sigmoid_(self) -> Tensor:
        """In-place sigmoid()."""
        return _U.assign(self, _E.sigmoid(self))

    def tanh_(self) -> Tensor:
        """In-place tanh()."""
        return _U.assign(self, _E.tanh(self))

    def relu_(self) -> Tensor:
        """In-place relu()."""
        return _U.assign(self, _E.relu(self))

    def clamp_(
        self, min: Tensor | Number | None = None, max: Tensor | Number | None = None
    ) -> Tensor:
        """In-place clamp()."""
        return _U.assign(self, _E.clamp(self, min, max))

    def clamp_min_(self, min: Tensor | Number) -> Tensor:
        """In-place clamp_min()."""
        return _U.assign(self, _E.clamp(self, min=min))

    def clamp_max_(self, max: Tensor | Number) -> Tensor:
        """In-place clamp_max()."""
        return _U.assign(self, _E.clamp(self, max=max))

    def clip_(
        self, min: Tensor | Number | None = None, max: Tensor | Number | None = None
    ) -> Tensor:
        """In-place clip()."""
        return _U.assign(self, _E.clamp(self, min, max))

    def floor_(self) -> Tensor:
        """In-place floor()."""
        return _U.assign(self, _E.floor(self))

    def ceil_(self) -> Tensor:
        """In-place ceil()."""
        return _U.assign(self, _E.ceil(self))

    def round_(self, decimals: int = 0) -> Tensor:
        """In-place round()."""
        return _U.assign(self, _E.round(self, decimals))

    def trunc_(self) -> Tensor:
        """In-place trunc()."""
        return _U.assign(self, _E.trunc(self))

    def sign_(self) -> Tensor:
        """In-place sign()."""
        return _U.assign(self, _E.sign(self))

    def reciprocal_(self) -> Tensor:
        """In-place reciprocal()."""
        return _U.assign(self, _E.reciprocal(self))

    def square_(self) -> Tensor:
        """In-place square()."""
        return _U.assign(self, _E.square(self))

    def sin_(self) -> Tensor:
        """In-place sin()."""
        return _U.assign(self, _E.sin(self))

    def cos_(self) -> Tensor:
        """In-place cos()."""
        return _U.assign(self, _E.cos(self))

    def addcmul_(self, tensor1: Tensor, tensor2: Tensor, *, value: Tensor | Number = 1) -> Tensor:
        """In-place addcmul()."""
        return _U.assign(self, _E.addcmul(self, tensor1, tensor2, value=value))

    def addcdiv_(self, tensor1: Tensor, tensor2: Tensor, *, value: Tensor | Number = 1) -> Tensor:
        """In-place addcdiv()."""
        return _U.assign(self, _E.addcdiv(self, tensor1, tensor2, value=value))

    def lerp_(self, end: Tensor, weight: Tensor | Number) -> Tensor:
        """In-place lerp()."""
        return _U.assign(self, _E.lerp(self, end, weight))

    def fmod_(self, other: Tensor | Number) -> Tensor:
        """In-place fmod()."""
        return _U.assign(self, _E.fmod(self, other))

    def remainder_(self, other: Tensor | Number) -> Tensor:
        """In-place remainder()."""
        return _U.assign(self, _E.remainder(self, other))

    def maximum_(self, other: Tensor) -> Tensor:
        """In-place maximum()."""
        return _U.assign(self, _E.maximum(self, other))

    def minimum_(self, other: Tensor) -> Tensor:
        """In-place minimum()."""
        return _U.assign(self, _E.minimum(self, other))

    def silu_(self) -> Tensor:
        """In-place silu()."""
        return _U.assign(self, _E.silu(self))

    def gelu_(self, approximate: str = "none") -> Tensor:
        """In-place gelu()."""
        return _U.assign(self, _E.gelu(self, approximate))

    def erf_(self) -> Tensor:
        """In-place erf()."""
        return _U.assign(self, _E.erf(self))

    def log1p_(self) -> Tensor:
        """In-place log1p()."""
        return _U.assign(self, _E.log1p(self))

    def expm1_(self) -> Tensor:
        """In-place expm1()."""
        return _U.assign(self, _E.expm1(self))

    def floor_divide_(self, other: Tensor | Number) -> Tensor:
        """In-place floor_divide()."""
        return _U.assign(self, _E.floor_divide(self, other))

    def hardtanh_(self, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
        """In-place hardtanh()."""
        return _U.assign(self, _E.hardtanh(self, min_val, max_val))

    def leaky_relu_(self, negative_slope: float = 0.01) -> Tensor:
        """In-place leaky_relu()."""
        return _U.assign(self, _E.leaky_relu(self, negative_slope))

    def elu_(self, alpha: float = 1.0) -> Tensor:
        """In-place elu()."""
        return _U.assign(self, _E.elu(self, alpha))

    def logical_not_(self) -> Tensor:
        """In-place logical_not()."""
        return _U.assign(self, _E.logical_not(self))

    def logical_and_(self, other: Tensor | Number) -> Tensor:
        """In-place logical_and()."""
        return _U.assign(self, _E.logical_and(self, other))

    def logical_or_(self, other: Tensor | Number) -> Tensor:
        """In-place logical_or()."""
        return _U.assign(self, _E.logical_or(self, other))

    def bitwise_and_(self, other: Tensor | Number) -> Tensor:
        """In-place bitwise_and()."""
        return _U.assign(self, _E.bitwise_and(self, other))

    def bitwise_or_(self, other: Tensor | Number) -> Tensor:
        """In-place bitwise_or()."""
        return _U.assign(self, _E.bitwise_or(self, other))

    def atan2_(self, other: Tensor) -> Tensor:
        """In-place atan2()."""
        return _U.assign(self, _E.atan2(self, other))

    def nan_to_num_(
        self, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None
    ) -> Tensor:
        """In-place nan_to_num()."""
        return _U.assign(self, _E.nan_to_num(self, nan, posinf, neginf))

    def exp2_(self) -> Tensor:
        """In-place exp2()."""
        return _U.assign(self, _E.exp2(self))

    def mish_(self) -> Tensor:
        """In-place mish()."""
        return _U.assign(self, _E.mish(self))

    def hardswish_(self) -> Tensor:
        """In-place hardswish()."""
        return _U.assign(self, _E.hardswish(self))
