"""All tensor ops, one module per family; also binds them to Tensor as methods and operators."""

from __future__ import annotations

import numpy as np

from ember import dtypes as _dt
from ember.autograd import Function, meta_array
from ember.device import CPU, META
from ember.ops import (
    conv,
    creation,
    elementwise,
    index,
    linalg,
    movement,
    pool,
    random,
    reduce,
    rope,
)
from ember.ops._util import cast
from ember.ops.conv import *  # noqa: F403
from ember.ops.creation import *  # noqa: F403
from ember.ops.elementwise import *  # noqa: F403
from ember.ops.index import *  # noqa: F403
from ember.ops.linalg import *  # noqa: F403
from ember.ops.movement import *  # noqa: F403
from ember.ops.pool import *  # noqa: F403
from ember.ops.random import *  # noqa: F403
from ember.ops.reduce import *  # noqa: F403
from ember.ops.rope import *  # noqa: F403
from ember.tensor import Tensor

_E = elementwise


def to_device(x: Tensor, device) -> Tensor:
    """x on another device: cpu -> meta keeps shape and dtype; meta -> cpu gives zeros."""
    shape, dtype = x._data.shape, x._data.dtype
    if device is META:
        return Tensor._wrap(meta_array(shape, dtype), META)
    return Tensor._wrap(np.zeros(shape, dtype), CPU)


# ------------------------------------------------------------------ in-place methods
def zero_(self: Tensor) -> Tensor:
    """Fill with zeros in place."""
    return fill_(self, 0)


def fill_(self: Tensor, value) -> Tensor:
    """Fill with a value in place."""
    from ember import autograd

    if self.requires_grad and self._ctx is None and autograd.is_grad_enabled():
        from ember.errors import AutogradError

        raise AutogradError("a leaf tensor that requires grad is used in an in-place operation")
    if self._device is not META:
        self._data[...] = value._data if isinstance(value, Tensor) else value
    return self


class _Identity(Function):
    def forward(self, x):
        return x

    def backward(self, g):
        return g


def copy_(self: Tensor, src: Tensor, non_blocking: bool = False) -> Tensor:
    """Copy src's values (broadcast and cast to self) into self."""
    if not isinstance(src, Tensor):
        src = creation.tensor(src)
    src = cast(src, self.dtype)
    if src._device is not self._device:
        src = to_device(src, self._device)
    return self._assign(_Identity.apply(src) if src.requires_grad else src)


_INPLACE = [
    "add", "sub", "mul", "div", "pow", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "sigmoid",
    "tanh", "relu", "clamp", "clamp_min", "clamp_max", "clip", "floor", "ceil", "round", "trunc",
    "sign", "reciprocal", "square", "sin", "cos", "addcmul", "addcdiv", "lerp", "fmod",
    "remainder", "maximum", "minimum", "masked_fill", "scatter", "scatter_add", "index_fill",
    "index_add", "index_copy", "masked_scatter", "tril", "triu", "silu", "gelu", "erf", "log1p",
    "expm1", "floor_divide", "t", "transpose", "squeeze", "unsqueeze", "hardtanh", "leaky_relu",
    "elu", "logical_not", "logical_and", "logical_or", "bitwise_and", "bitwise_or", "atan2",
    "nan_to_num", "exp2", "mish", "hardswish",
]  # fmt: skip


def _bind() -> None:
    for mod in (elementwise, movement, reduce, index, linalg, conv, pool, random):
        for name, fn in mod.METHODS.items():
            setattr(Tensor, name, fn)
    T = Tensor
    for name in _INPLACE:
        fn = getattr(T, name, None)
        if fn is not None and not hasattr(T, name + "_"):
            setattr(T, name + "_", movement.inplace(fn))
    T.zero_, T.fill_, T.copy_ = zero_, fill_, copy_
    T.__add__ = lambda a, b: _E.add(a, b)
    T.__radd__ = lambda a, b: _E.add(b, a)
    T.__sub__ = lambda a, b: _E.sub(a, b)
    T.__rsub__ = lambda a, b: _E.sub(b, a)
    T.__mul__ = lambda a, b: _E.mul(a, b)
    T.__rmul__ = lambda a, b: _E.mul(b, a)
    T.__truediv__ = lambda a, b: _E.div(a, b)
    T.__rtruediv__ = lambda a, b: _E.div(b, a)
    T.__floordiv__ = lambda a, b: _E.floor_divide(a, b)
    T.__rfloordiv__ = lambda a, b: _E.floor_divide(b, a)
    T.__mod__ = lambda a, b: _E.remainder(a, b)
    T.__rmod__ = lambda a, b: _E.remainder(b, a)
    T.__pow__ = lambda a, b: _E.pow(a, b)
    T.__rpow__ = lambda a, b: _E.pow(b, a)
    T.__neg__ = _E.neg
    T.__pos__ = lambda a: a
    T.__abs__ = _E.abs
    T.__invert__ = lambda a: _E.logical_not(a) if a.dtype is _dt.bool_ else _E.bitwise_not(a)
    T.__and__ = lambda a, b: _E.bitwise_and(a, b)
    T.__rand__ = lambda a, b: _E.bitwise_and(b, a)
    T.__or__ = lambda a, b: _E.bitwise_or(a, b)
    T.__ror__ = lambda a, b: _E.bitwise_or(b, a)
    T.__xor__ = lambda a, b: _E.bitwise_xor(a, b)
    T.__rxor__ = lambda a, b: _E.bitwise_xor(b, a)
    T.__eq__ = lambda a, b: _E.eq(a, b)
    T.__ne__ = lambda a, b: _E.ne(a, b)
    T.__lt__ = lambda a, b: _E.lt(a, b)
    T.__le__ = lambda a, b: _E.le(a, b)
    T.__gt__ = lambda a, b: _E.gt(a, b)
    T.__ge__ = lambda a, b: _E.ge(a, b)
    T.__iadd__ = lambda a, b: a.add_(b)
    T.__isub__ = lambda a, b: a.sub_(b)
    T.__imul__ = lambda a, b: a.mul_(b)
    T.__itruediv__ = lambda a, b: a.div_(b)
    if hasattr(linalg, "matmul"):
        T.__matmul__ = lambda a, b: linalg.matmul(a, b)
        T.__rmatmul__ = lambda a, b: linalg.matmul(b, a)
    if hasattr(index, "getitem"):
        T.__getitem__ = index.getitem
        T.__setitem__ = index.setitem
    T.T = property(
        lambda a: movement.permute(a, tuple(range(a.ndim - 1, -1, -1))), doc="All dims reversed."
    )
    T.mT = property(lambda a: movement.transpose(a, -2, -1), doc="The last two dims swapped.")
    T.H = T.mT


_bind()
