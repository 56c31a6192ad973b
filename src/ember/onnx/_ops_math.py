"""ONNX arithmetic, comparison, logic, activation, softmax, reduction and product operators."""

from __future__ import annotations

import math
from functools import reduce as _fold

import numpy as np

import ember
from ember import dtypes as _dt
from ember.errors import DTypeError
from ember.nn import functional as F
from ember.onnx._proto import np_dtype
from ember.onnx._registry import Attrs, axis_of, const, ints, npdt, op, scalar
from ember.tensor import Tensor


def _is_int(x: Tensor) -> bool:
    return npdt(x).kind in "iub"


# ---- binary arithmetic -------------------------------------------------------------------


@op("Add")
def _add(a: Attrs, x, y):
    return ember.add(x, y)


@op("Sub")
def _sub(a: Attrs, x, y):
    return ember.sub(x, y)


@op("Mul")
def _mul(a: Attrs, x, y):
    return ember.mul(x, y)


@op("Div")
def _div(a: Attrs, x, y):
    if _is_int(x):
        return ember.div(x, y, rounding_mode="trunc")
    return ember.div(x, y)


@op("Pow")
def _pow(a: Attrs, x, y):
    if y.dtype != x.dtype:
        y = y.to(x.dtype)
    if _is_int(x):
        return ember.pow(x.to(ember.float64), y.to(ember.float64)).to(x.dtype)
    return ember.pow(x, y)


@op("Mod")
def _mod(a: Attrs, x, y):
    if a.get("fmod", 0):
        return ember.fmod(x, y)
    return ember.remainder(x, y)


def _variadic(fn):
    def run(a: Attrs, *xs):
        return _fold(fn, [x for x in xs if x is not None])

    return run


op("Max")(_variadic(ember.maximum))
op("Min")(_variadic(ember.minimum))
op("Sum")(_variadic(ember.add))


@op("Mean")
def _mean(a: Attrs, *xs):
    return ember.div(_fold(ember.add, xs), len(xs))


@op("BitShift")
def _bitshift(a: Attrs, x, y):
    p = ember.pow(ember.full_like(y, 2).to(ember.float64), y.to(ember.float64)).to(x.dtype)
    if a.get("direction") == "LEFT":
        return ember.mul(x, p)
    return ember.div(x, p, rounding_mode="floor")


# ---- comparison and logic ----------------------------------------------------------------

for _name, _fn in {
    "Equal": ember.eq, "Greater": ember.gt, "GreaterOrEqual": ember.ge, "Less": ember.lt,
    "LessOrEqual": ember.le, "And": ember.logical_and, "Or": ember.logical_or,
    "Xor": ember.logical_xor, "BitwiseAnd": ember.bitwise_and, "BitwiseOr": ember.bitwise_or,
    "BitwiseXor": ember.bitwise_xor,
}.items():  # fmt: skip
    op(_name)(lambda a, x, y, _f=_fn: _f(x, y))


@op("Not")
def _not(a: Attrs, x):
    return ember.logical_not(x)


@op("BitwiseNot")
def _bnot(a: Attrs, x):
    return ember.bitwise_not(x)


@op("Where")
def _where(a: Attrs, c, x, y):
    return ember.where(c, x, y)


@op("IsNaN")
def _isnan(a: Attrs, x):
    return ember.isnan(x)


@op("IsInf")
def _isinf(a: Attrs, x):
    inf = ember.isinf(x)
    if not a.get("detect_positive", 1):
        inf = ember.logical_and(inf, x < 0)
    if not a.get("detect_negative", 1):
        inf = ember.logical_and(inf, x > 0)
    return inf


# ---- unary math --------------------------------------------------------------------------

for _name, _fn in {
    "Abs": ember.abs, "Neg": ember.neg, "Exp": ember.exp, "Log": ember.log, "Sqrt": ember.sqrt,
    "Sin": ember.sin, "Cos": ember.cos, "Tan": ember.tan, "Asin": ember.asin, "Acos": ember.acos,
    "Atan": ember.atan, "Sinh": ember.sinh, "Cosh": ember.cosh, "Tanh": ember.tanh,
    "Erf": ember.erf, "Ceil": ember.ceil, "Floor": ember.floor, "Sign": ember.sign,
    "Round": ember.round, "Reciprocal": ember.reciprocal,
    "Relu": F.relu, "Softsign": F.softsign, "Mish": F.mish, "HardSwish": F.hardswish,
}.items():  # fmt: skip
    op(_name)(lambda a, x, _f=_fn: _f(x))


@op("Sigmoid")
def _sigmoid(a: Attrs, x):
    d = x._data
    if d.dtype != np.float32:
        return ember.sigmoid(x)
    # float32 (the graph runs without gradients): four in-place numpy passes on numpy's vector
    # exp, 14 us for PP-OCRv4 rec's (1, 480, 1, 40) SE gates against ember.sigmoid's 37
    y = np.array(d, copy=True, order="K")  # its layout kept (a conv's channels-last result)
    np.negative(y, out=y)
    with np.errstate(over="ignore"):  # exp(-x) = inf: 1 / inf = 0, the limit
        np.exp(y, out=y)
    y += np.float32(1)
    np.reciprocal(y, out=y)
    return Tensor._wrap(y)


@op("Asinh")
def _asinh(a: Attrs, x):
    return ember.log(x + ember.sqrt(x * x + 1.0))


@op("Acosh")
def _acosh(a: Attrs, x):
    return ember.log(x + ember.sqrt(x * x - 1.0))


@op("Atanh")
def _atanh(a: Attrs, x):
    return 0.5 * ember.log((1.0 + x) / (1.0 - x))


@op("Softplus")
def _softplus(a: Attrs, x):
    return F.softplus(x)


# ---- activations with parameters ---------------------------------------------------------


@op("LeakyRelu")
def _leaky(a: Attrs, x):
    return F.leaky_relu(x, a.get("alpha", 0.01))


@op("PRelu")
def _prelu(a: Attrs, x, slope):
    return ember.where(x < 0, x * slope, x)


@op("Elu")
def _elu(a: Attrs, x):
    return F.elu(x, a.get("alpha", 1.0))


@op("Celu")
def _celu(a: Attrs, x):
    al = a.get("alpha", 1.0)
    return ember.clamp(x, min=0) + ember.clamp(al * (ember.exp(x / al) - 1.0), max=0)


@op("Selu")
def _selu(a: Attrs, x):
    al, g = a.get("alpha", 1.67326319217681884765625), a.get("gamma", 1.05070102214813232421875)
    return g * ember.where(x > 0, x, al * (ember.exp(x) - 1.0))


@op("HardSigmoid")
def _hsig(a: Attrs, x):
    return ember.clamp(x * a.get("alpha", 0.2) + a.get("beta", 0.5), 0.0, 1.0)


@op("ThresholdedRelu")
def _trelu(a: Attrs, x):
    return ember.where(x > a.get("alpha", 1.0), x, ember.zeros_like(x))


@op("Shrink")
def _shrink(a: Attrs, x):
    lam, bias = a.get("lambd", 0.5), a.get("bias", 0.0)
    zero = ember.zeros_like(x)
    return ember.where(x < -lam, x + bias, ember.where(x > lam, x - bias, zero)).to(x.dtype)


@op("Gelu")
def _gelu(a: Attrs, x):
    return F.gelu(x, approximate=a.get("approximate", "none"))


@op("Swish")
def _swish(a: Attrs, x):
    return x * ember.sigmoid(x * a.get("alpha", 1.0))


@op("Clip")
def _clip(a: Attrs, x, lo=None, hi=None):
    if a.opset < 11:
        lo_v, hi_v = a.get("min", None), a.get("max", None)
    else:
        lo_v, hi_v = scalar(lo), scalar(hi)
    if lo_v is None and hi_v is None:
        return x
    out = x
    if lo_v is not None:
        out = ember.maximum(out, const(lo_v, npdt(x)))
    if hi_v is not None:
        out = ember.minimum(out, const(hi_v, npdt(x)))
    return out


# ---- dtype -------------------------------------------------------------------------------


def _ember_dtype(code: int, where: str):
    return _dt.from_numpy_dtype(np_dtype(code, where))


@op("Cast")
def _cast(a: Attrs, x):
    to = _ember_dtype(a.get("to"), a.where())
    if x.dtype == to:
        return x
    if to == ember.bool_:
        return x != 0
    return x.to(to)


@op("CastLike")
def _cast_like(a: Attrs, x, like):
    if x.dtype == like.dtype:
        return x
    return x != 0 if like.dtype == ember.bool_ else x.to(like.dtype)


@op("Identity")
def _identity(a: Attrs, x):
    return x


# ---- softmax family ----------------------------------------------------------------------


def _softmax_like(a: Attrs, x, fn):
    r = x.ndim
    if a.opset < 13:
        ax = axis_of(a.get("axis", 1), r, a.where())
        shape = tuple(x.shape)
        lead = math.prod(shape[:ax])
        y = fn(x.reshape(lead, -1) if x.numel() else x.reshape(lead, math.prod(shape[ax:])), 1)
        return y.reshape(shape)
    return fn(x, axis_of(a.get("axis", -1), r, a.where()))


@op("Softmax")
def _softmax(a: Attrs, x):
    ax = a.get("axis", -1 if a.opset >= 13 else 1)
    if x.dtype == ember.float32 and x.ndim and ax in (-1, x.ndim - 1) and x.numel():
        from ember.kernels.cpu import softmax as S

        if S.available() and not (ember.is_grad_enabled() and x.requires_grad):
            return Tensor._wrap(S.softmax_last(x._data))  # the last axis: ~4x numpy's passes
    return _softmax_like(a, x, lambda t, d: F.softmax(t, dim=d))


@op("LogSoftmax")
def _log_softmax(a: Attrs, x):
    return _softmax_like(a, x, lambda t, d: F.log_softmax(t, dim=d))


def _hardmax_dim(t: Tensor, d: int) -> Tensor:
    idx = ember.argmax(t, dim=d, keepdim=True)
    return ember.zeros_like(t).scatter(d, idx, value=1.0) if t.numel() else t


@op("Hardmax")
def _hardmax(a: Attrs, x):
    return _softmax_like(a, x, _hardmax_dim)


# ---- reductions --------------------------------------------------------------------------

_IDENTITY = {"sum": 0.0, "mean": math.nan, "prod": 1.0, "max": -math.inf, "min": math.inf,
             "l1": 0.0, "l2": 0.0, "logsum": -math.inf, "logsumexp": -math.inf,
             "sumsquare": 0.0}  # fmt: skip


def _reduce_fn(kind: str, x: Tensor, dims: tuple, keep: bool) -> Tensor:
    if kind == "sum":
        return ember.sum(x, dim=dims, keepdim=keep)
    if kind == "mean":
        return ember.mean(x, dim=dims, keepdim=keep)
    if kind == "prod":
        out = x
        for d in sorted(dims, reverse=True):
            out = ember.prod(out, dim=d, keepdim=keep)
        return out
    if kind == "max":
        return ember.amax(x, dim=dims, keepdim=keep)
    if kind == "min":
        return ember.amin(x, dim=dims, keepdim=keep)
    if kind == "l1":
        return ember.sum(ember.abs(x), dim=dims, keepdim=keep)
    if kind == "l2":
        return ember.sqrt(ember.sum(x * x, dim=dims, keepdim=keep))
    if kind == "sumsquare":
        return ember.sum(x * x, dim=dims, keepdim=keep)
    if kind == "logsum":
        return ember.log(ember.sum(x, dim=dims, keepdim=keep))
    return ember.logsumexp(x, dim=dims, keepdim=keep)


def _reduce(kind: str, input_since: int):
    def run(a: Attrs, x, axes_t=None):
        keep = bool(a.get("keepdims", 1))
        axes = ints(axes_t) if a.opset >= input_since else list(a.get("axes", []))
        r = x.ndim
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                return x
            axes = list(range(r))
        dims = tuple(sorted({axis_of(v, r, a.where()) for v in axes}))
        if any(x.shape[d] == 0 for d in dims) or (r == 0):
            shape = [1 if d in dims else n for d, n in enumerate(x.shape)]
            if not keep:
                shape = [n for d, n in enumerate(x.shape) if d not in dims]
            if r == 0:
                return _reduce_fn(kind, x.reshape(1), (0,), False).reshape(())
            fill = _IDENTITY[kind]
            if npdt(x).kind in "iu" and not math.isfinite(fill):
                info = np.iinfo(npdt(x))
                fill = info.min if fill < 0 else info.max
            return ember.full(tuple(shape), fill, dtype=x.dtype)
        out = _reduce_fn(kind, x, dims, keep)
        return out.to(x.dtype) if out.dtype != x.dtype else out

    return run


for _name, _kind in {
    "ReduceMax": "max", "ReduceMin": "min", "ReduceMean": "mean", "ReduceProd": "prod",
    "ReduceL1": "l1", "ReduceL2": "l2", "ReduceLogSum": "logsum", "ReduceLogSumExp": "logsumexp",
    "ReduceSumSquare": "sumsquare",
}.items():  # fmt: skip
    op(_name)(_reduce(_kind, 18))
op("ReduceSum")(_reduce("sum", 13))


def _arg(which):
    def run(a: Attrs, x):
        ax = axis_of(a.get("axis", 0), x.ndim, a.where())
        keep = bool(a.get("keepdims", 1))
        if a.get("select_last_index", 0):
            n = x.shape[ax]
            i = which(ember.flip(x, [ax]), dim=ax, keepdim=keep)
            return (n - 1) - i
        return which(x, dim=ax, keepdim=keep)

    return run


op("ArgMax")(_arg(ember.argmax))
op("ArgMin")(_arg(ember.argmin))


def _cum(fn):
    def run(a: Attrs, x, axis):
        ax = axis_of(int(scalar(axis)), x.ndim, a.where())
        rev, excl = a.get("reverse", 0), a.get("exclusive", 0)
        t = ember.flip(x, [ax]) if rev else x
        y = fn(t, ax)
        if excl:
            n = t.shape[ax]
            y = y.narrow(ax, 0, max(n - 1, 0))
            pad = [0, 0] * (x.ndim - 1 - ax) + [1, 0]
            fill = 0 if fn is ember.cumsum else 1
            y = ember.pad(y, pad, value=fill)
        y = ember.flip(y, [ax]) if rev else y
        return y.to(x.dtype) if y.dtype != x.dtype else y

    return run


op("CumSum")(_cum(ember.cumsum))
op("CumProd")(_cum(ember.cumprod))


# ---- products ----------------------------------------------------------------------------


@op("MatMul")
def _matmul(a: Attrs, x, y):
    if x.ndim >= 2 and y.ndim == 2 and x.dtype == y.dtype == ember.float32:
        return F.linear(x, y.mT)
    return ember.matmul(x, y)


@op("Gemm")
def _gemm(a: Attrs, x, w, c=None):
    if a.get("transA", 0):
        x = x.mT
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
    wt = w if a.get("transB", 0) else w.mT
    if alpha == 1.0 and (c is None or (beta == 1.0 and c.ndim <= 1)) and x.dtype == ember.float32:
        bias = None if c is None else (c if c.ndim == 1 else c.reshape(-1))
        if bias is not None and bias.shape[0] != wt.shape[0]:
            return F.linear(x, wt) + c
        return F.linear(x, wt, bias)
    y = ember.matmul(x, wt.mT)
    if alpha != 1.0:
        y = y * alpha
    if c is not None and beta != 0.0:
        y = y + (c * beta if beta != 1.0 else c)
    return y.to(x.dtype) if y.dtype != x.dtype else y


@op("Einsum")
def _einsum(a: Attrs, *xs):
    eq = a.get("equation", "").replace(" ", "")
    return ember.einsum(eq, *xs)


@op("Det")
def _det(a: Attrs, x):
    return ember.det(x)


def check_float(a: Attrs, x: Tensor) -> None:
    """Raise DTypeError unless x is a float tensor."""
    if not x.dtype.is_floating_point:
        raise DTypeError(f"ONNX {a.where()}: expected a float tensor, got {x.dtype}")
