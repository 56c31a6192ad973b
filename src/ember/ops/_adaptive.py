"""Adaptive average pooling, and the NCHW helpers pooling and resampling share.

Adaptive average pooling is two small matmuls (it is separable). It lives below pool (which
re-exports it) because _resample's interpolate(mode="area") is this op too.
"""

from __future__ import annotations

import numpy as np

from ember import dtypes as _dt
from ember.autograd import Function
from ember.errors import DTypeError, ShapeError
from ember.tensor import Tensor

_LOW = _dt.HALF_FLOATS  # float16, bfloat16 (ml_dtypes not imported to ask)
_F32 = np.dtype(np.float32)


def _up(a: np.ndarray) -> np.ndarray:
    return a.astype(_F32) if a.dtype in _LOW else a


def _spatial(op: str, input: Tensor, nd: int) -> bool:
    """Check an (N, C, *sp) or (C, *sp) input with nd spatial dims; True when batched."""
    if not isinstance(input, Tensor):
        raise DTypeError(f"{op}: expected a tensor, got {type(input).__name__}")
    if input.ndim not in (nd + 1, nd + 2):
        raise ShapeError(
            f"{op}: expected a {nd + 1}-D or {nd + 2}-D input, got shape {tuple(input.shape)}"
        )
    if input._data.dtype == np.bool_:
        raise DTypeError(f"{op}: not implemented for bool tensors")
    return input.ndim == nd + 2


def _to4(a: np.ndarray, nd: int, batched: bool) -> np.ndarray:
    if not batched:
        a = a[None]
    return a[:, :, None, :] if nd == 1 else a


def _from4(a: np.ndarray, nd: int, batched: bool) -> np.ndarray:
    if nd == 1:
        a = a[:, :, 0, :]
    return a if batched else a[0]


# ------------------------------------------------------------------ adaptive average pools
def _bounds(size: int, out: int) -> tuple:
    i = np.arange(out)
    return (i * size) // out, -((-(i + 1) * size) // out)


def _adaptive_matrix(size: int, out: int, dtype) -> np.ndarray:
    """(out, size) averaging matrix: row i averages input[start_i:end_i]."""
    start, end = _bounds(size, out)
    pos = np.arange(size)
    m = (pos[None, :] >= start[:, None]) & (pos[None, :] < end[:, None])
    return (m / (end - start)[:, None]).astype(dtype)


class AdaptiveAvgPool(Function):
    """Adaptive average pooling as out = A_h @ x @ A_w^T (separable)."""

    def meta(self, x, *, out, nd, batched):
        return x.shape[:-nd] + out[2 - nd :], x.dtype

    def forward(self, x, *, out, nd, batched):
        x4 = _to4(_up(x), nd, batched)
        n, c, h, w = x4.shape
        self.nd, self.batched, self.xshape, self.out, self.shape4 = (
            nd,
            batched,
            x.shape,
            out,
            x4.shape,
        )
        self.even = out[0] and out[1] and h % out[0] == 0 and w % out[1] == 0
        if self.even:  # equal windows: a reshape and a mean
            res = x4.reshape(n, c, out[0], h // out[0], out[1], w // out[1]).mean((3, 5))
        else:
            self.ah = _adaptive_matrix(h, out[0], x4.dtype)
            self.aw = _adaptive_matrix(w, out[1], x4.dtype)
            res = np.matmul(np.matmul(self.ah, x4), self.aw.T)
        return _from4(res.astype(x.dtype, copy=False), nd, batched)

    def backward(self, g):
        g4 = _to4(_up(g), self.nd, self.batched)
        if self.even:
            n, c, h, w = self.shape4
            (oh, ow), kh, kw = self.out, h // self.out[0], w // self.out[1]
            gx = np.broadcast_to((g4 / (kh * kw))[:, :, :, None, :, None], (n, c, oh, kh, ow, kw))
            gx = gx.reshape(n, c, h, w)
        else:
            gx = np.matmul(np.matmul(self.ah.T, g4), self.aw)
        return _from4(gx, self.nd, self.batched).reshape(self.xshape)


def _out_arg(output_size, sp: tuple, nd: int, op: str) -> tuple:
    if isinstance(output_size, (int, np.integer)) or output_size is None:
        output_size = (output_size,) * nd
    output_size = tuple(output_size)
    if len(output_size) != nd:
        raise ShapeError(f"{op}: expected output_size of {nd} ints, got {output_size}")
    res = tuple(sp[i] if v is None else int(v) for i, v in enumerate(output_size))
    if any(v < 0 for v in res):
        raise ShapeError(f"{op}: output_size must be non-negative, got {res}")
    return ((1,) + res) if nd == 1 else res


def _adaptive_avg(op: str, nd: int, input: Tensor, output_size) -> Tensor:
    batched = _spatial(op, input, nd)
    if not input.is_floating_point():
        raise DTypeError(f"{op}: expected a float tensor, got {input.dtype}")
    out = _out_arg(output_size, tuple(input.shape[-nd:]), nd, op)
    return AdaptiveAvgPool.apply(input, out=out, nd=nd, batched=batched)


def adaptive_avg_pool1d(input: Tensor, output_size) -> Tensor:
    """Average pooling to a fixed output length (torch.nn.functional.adaptive_avg_pool1d)."""
    return _adaptive_avg("adaptive_avg_pool1d", 1, input, output_size)


def adaptive_avg_pool2d(input: Tensor, output_size) -> Tensor:
    """Average pooling to a fixed output size (torch.nn.functional.adaptive_avg_pool2d)."""
    return _adaptive_avg("adaptive_avg_pool2d", 2, input, output_size)
