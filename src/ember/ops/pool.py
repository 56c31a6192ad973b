"""Pooling: max/avg pools, adaptive pools, unfold/fold; re-exports interpolate and pixel_shuffle.

NCHW as in torch; 1-D ops run as 2-D ones with height 1. Window ops loop over the kernel offsets
(one strided numpy pass each); adaptive average pooling is two small matmuls (it is separable).
"""

from __future__ import annotations

import numpy as np

from ember import autograd
from ember import dtypes as _dt
from ember.autograd import Function
from ember.errors import ShapeError
from ember.ops._adaptive import (  # noqa: F401  (re-exported)
    AdaptiveAvgPool,
    _bounds,
    _from4,
    _out_arg,
    _spatial,
    _to4,
    _up,
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
)
from ember.ops._resample import interpolate, pixel_shuffle, pixel_unshuffle, upsample
from ember.ops.conv import _out_size, _tuple, col2im, im2col
from ember.tensor import Tensor


def _pool_out(size: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    num = size + 2 * p - d * (k - 1) - 1
    out = (-(-num // s) if ceil else num // s) + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_args(op, nd, input, kernel_size, stride, padding, dilation, ceil_mode):
    batched = _spatial(op, input, nd)
    k = _tuple(kernel_size, nd, "kernel_size", op)
    s = k if stride is None or stride == () or stride == [] else _tuple(stride, nd, "stride", op)
    p = _tuple(padding, nd, "padding", op)
    d = _tuple(dilation, nd, "dilation", op)
    if any(v < 1 for v in k + s + d) or any(v < 0 for v in p):
        raise ShapeError(f"{op}: bad kernel_size {k}, stride {s}, padding {p} or dilation {d}")
    for i in range(nd):
        if p[i] > ((k[i] - 1) * d[i] + 1) / 2:
            raise ShapeError(
                f"{op}: pad should be at most half of effective kernel size, "
                f"got pad={p[i]}, kernel_size={k[i]} and dilation={d[i]}"
            )
    if nd == 1:
        k, s, p, d = (1,) + k, (1,) + s, (0,) + p, (1,) + d
    sp = tuple(input.shape[-2:]) if nd == 2 else (1, input.shape[-1])
    out = tuple(_pool_out(sp[i], k[i], s[i], p[i], d[i], ceil_mode) for i in range(2))
    if out[0] < 1 or out[1] < 1:
        raise ShapeError(
            f"{op}: output size {out[2 - nd :]} is too small for input {tuple(input.shape)}"
        )
    return batched, k, s, p, d, out


def _padded(x: np.ndarray, k, s, p, d, out, fill) -> np.ndarray:
    """x padded by p on top/left and enough on bottom/right for every window (value fill)."""
    n, c, h, w = x.shape
    pb = max(0, (out[0] - 1) * s[0] + d[0] * (k[0] - 1) + 1 - h - p[0])
    pr = max(0, (out[1] - 1) * s[1] + d[1] * (k[1] - 1) + 1 - w - p[1])
    if not (p[0] or p[1] or pb or pr):
        return x
    xp = np.full((n, c, h + p[0] + pb, w + p[1] + pr), fill, x.dtype)
    xp[:, :, p[0] : p[0] + h, p[1] : p[1] + w] = x
    return xp


def _tap(xp: np.ndarray, i: int, j: int, s, d, out) -> np.ndarray:
    hi, wj = i * d[0], j * d[1]
    return xp[
        :, :, hi : hi + s[0] * (out[0] - 1) + 1 : s[0], wj : wj + s[1] * (out[1] - 1) + 1 : s[1]
    ]


def _scatter_flat(g: np.ndarray, idx: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum g into a zero (N, C, H, W) array at per-plane flat indices idx (same shape as g)."""
    n, c, h, w = shape
    plane = (np.arange(n * c, dtype=np.int64) * (h * w)).reshape(n, c, *([1] * (idx.ndim - 2)))
    flat = (idx + plane).ravel()
    out = np.bincount(flat, weights=g.ravel().astype(np.float64), minlength=n * c * h * w)
    return out.reshape(shape).astype(g.dtype)


# ------------------------------------------------------------------ max pool
class MaxPool(Function):
    """Max over windows; the gradient goes to the (first) arg-max of each window."""

    kernel_op = "max_pool2d"  # kernels.cpu.conv: channels-last input, rows in parallel

    def meta(self, x, *, k, s, p, d, out, nd, batched, track):
        return x.shape[:-nd] + out[2 - nd :], x.dtype

    def forward(self, x, *, k, s, p, d, out, nd, batched, track):
        x4 = _to4(x, nd, batched)
        lo = x4.dtype if x4.dtype.name == "bfloat16" else None
        xw = _up(x4) if lo is not None else x4
        fill = -np.inf if xw.dtype.kind == "f" else np.iinfo(xw.dtype).min
        xp = _padded(xw, k, s, p, d, out, fill)
        w = x4.shape[3]
        best, idx = None, None
        for i in range(k[0]):
            for j in range(k[1]):
                v = _tap(xp, i, j, s, d, out)
                if best is None:
                    best = v.copy()
                    if track:
                        idx = np.broadcast_to(self._flat(i, j, s, p, d, out, w), best.shape).copy()
                    continue
                if not track:
                    np.maximum(best, v, out=best)
                    continue
                upd = v > best
                if xw.dtype.kind == "f":
                    upd |= np.isnan(v)
                np.copyto(best, v, where=upd)
                np.copyto(idx, self._flat(i, j, s, p, d, out, w), where=upd)
        self.idx, self.shape4, self.nd, self.batched, self.xshape = (
            idx,
            x4.shape,
            nd,
            batched,
            x.shape,
        )
        res = _from4(best if lo is None else best.astype(lo), nd, batched)
        return res

    @staticmethod
    def _flat(i, j, s, p, d, out, w) -> np.ndarray:
        hh = np.arange(out[0]) * s[0] + i * d[0] - p[0]
        ww = np.arange(out[1]) * s[1] + j * d[1] - p[1]
        return (hh[:, None] * w + ww[None, :]).astype(np.int64)

    def backward(self, g):
        g4 = _to4(_up(g), self.nd, self.batched)
        gx = _scatter_flat(g4, self.idx, self.shape4)
        return _from4(gx, self.nd, self.batched).reshape(self.xshape)


def _max_pool(op, nd, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    batched, k, s, p, d, out = _pool_args(
        op, nd, input, kernel_size, stride, padding, dilation, ceil_mode
    )
    track = bool(return_indices) or (autograd.is_grad_enabled() and input.requires_grad)
    res = MaxPool.apply(input, k=k, s=s, p=p, d=d, out=out, nd=nd, batched=batched, track=track)
    if not return_indices:
        return res
    ctx = res._ctx
    if input.is_meta:
        from ember.ops.creation import empty

        return res, empty(tuple(res.shape), dtype=_dt.int64, device="meta")
    if ctx is None:  # no graph recorded: recompute the indices through a throwaway node
        ctx = MaxPool()
        ctx.forward(input._data, k=k, s=s, p=p, d=d, out=out, nd=nd, batched=batched, track=True)
    idx = _from4(ctx.idx, nd, batched)
    return res, Tensor._wrap(np.ascontiguousarray(idx))


def max_pool1d(
    input: Tensor,
    kernel_size,
    stride=None,
    padding=0,
    dilation=1,
    ceil_mode: bool = False,
    return_indices: bool = False,
):
    """1-D max pooling over (N, C, L) (torch.nn.functional.max_pool1d)."""
    return _max_pool(
        "max_pool1d", 1, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices
    )


def max_pool2d(
    input: Tensor,
    kernel_size,
    stride=None,
    padding=0,
    dilation=1,
    ceil_mode: bool = False,
    return_indices: bool = False,
):
    """2-D max pooling over (N, C, H, W) (torch.nn.functional.max_pool2d)."""
    return _max_pool(
        "max_pool2d", 2, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices
    )


# ------------------------------------------------------------------ average pool
def _divisor(size: int, k: int, s: int, p: int, out: int, include_pad: bool) -> np.ndarray:
    start = np.arange(out) * s - p
    end = np.minimum(start + k, size + p)
    pool = end - start
    if include_pad:
        return pool
    return np.minimum(end, size) - np.maximum(start, 0)


class AvgPool(Function):
    """Mean over windows (torch's count_include_pad / divisor_override rules)."""

    def meta(self, x, *, k, s, p, out, nd, batched, include_pad, override):
        return x.shape[:-nd] + out[2 - nd :], x.dtype

    def forward(self, x, *, k, s, p, out, nd, batched, include_pad, override):
        x4 = _to4(x, nd, batched)
        n, c, h, w = x4.shape
        xw = x4.astype(np.int64) if x4.dtype.kind in "biu" else _up(x4)
        xp = _padded(xw, k, s, p, (1, 1), out, 0)
        acc = None
        for i in range(k[0]):
            for j in range(k[1]):
                v = _tap(xp, i, j, s, (1, 1), out)
                acc = v.copy() if acc is None else acc.__iadd__(v)
        if override:
            div = np.full(out, override, np.int64)
        else:
            dh = _divisor(h, k[0], s[0], p[0], out[0], include_pad)
            dw = _divisor(w, k[1], s[1], p[1], out[1], include_pad)
            div = dh[:, None] * dw[None, :]
        self.div, self.k, self.s, self.p, self.out = div, k, s, p, out
        self.shape4, self.nd, self.batched, self.xshape = x4.shape, nd, batched, x.shape
        if acc.dtype.kind == "f":
            res = (acc / div.astype(acc.dtype)).astype(x.dtype)
        else:
            res = (np.sign(acc) * (np.abs(acc) // div)).astype(x.dtype)
        return _from4(res, nd, batched)

    def backward(self, g):
        g4 = _to4(_up(g), self.nd, self.batched)
        gd = g4 / self.div.astype(g4.dtype)
        n, c, h, w = self.shape4
        cols = np.broadcast_to(gd[:, :, None, None], (n, c, *self.k, *self.out))
        gx = col2im(cols, (h, w), self.s, (1, 1), self.p)
        return _from4(gx, self.nd, self.batched).reshape(self.xshape)


def _avg_pool(
    op, nd, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    batched, k, s, p, _, out = _pool_args(op, nd, input, kernel_size, stride, padding, 1, ceil_mode)
    if divisor_override is not None and divisor_override == 0:
        raise ValueError(f"{op}: divisor must be not zero")
    return AvgPool.apply(
        input,
        k=k,
        s=s,
        p=p,
        out=out,
        nd=nd,
        batched=batched,
        include_pad=bool(count_include_pad),
        override=divisor_override,
    )


def avg_pool1d(
    input: Tensor,
    kernel_size,
    stride=None,
    padding=0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> Tensor:
    """1-D average pooling over (N, C, L) (torch.nn.functional.avg_pool1d)."""
    return _avg_pool(
        "avg_pool1d", 1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None
    )


def avg_pool2d(
    input: Tensor,
    kernel_size,
    stride=None,
    padding=0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override=None,
) -> Tensor:
    """2-D average pooling over (N, C, H, W) (torch.nn.functional.avg_pool2d)."""
    return _avg_pool(
        "avg_pool2d",
        2,
        input,
        kernel_size,
        stride,
        padding,
        ceil_mode,
        count_include_pad,
        divisor_override,
    )


# ------------------------------------------------------------------ adaptive pools
class AdaptiveMaxPool(Function):
    """Adaptive max pooling: one vectorised max per output cell."""

    def meta(self, x, *, out, nd, batched):
        return x.shape[:-nd] + out[2 - nd :], x.dtype

    def forward(self, x, *, out, nd, batched):
        x4 = _to4(x, nd, batched)
        n, c, h, w = x4.shape
        (hs, he), (ws, we) = _bounds(h, out[0]), _bounds(w, out[1])
        res = np.empty((n, c, *out), x.dtype)
        idx = np.empty((n, c, *out), np.int64)
        for a in range(out[0]):
            for b in range(out[1]):
                win = x4[:, :, hs[a] : he[a], ws[b] : we[b]]
                flat = win.reshape(n, c, -1)
                am = np.argmax(flat, -1) if flat.size else np.zeros((n, c), np.int64)
                res[:, :, a, b] = (
                    np.take_along_axis(flat, am[..., None], -1)[..., 0] if flat.size else 0
                )
                ww = we[b] - ws[b]
                idx[:, :, a, b] = (hs[a] + am // ww) * w + ws[b] + am % ww
        self.idx, self.shape4, self.nd, self.batched, self.xshape = (
            idx,
            x4.shape,
            nd,
            batched,
            x.shape,
        )
        return _from4(res, nd, batched)

    def backward(self, g):
        g4 = _to4(_up(g), self.nd, self.batched)
        gx = _scatter_flat(g4, self.idx, self.shape4)
        return _from4(gx, self.nd, self.batched).reshape(self.xshape)


def _adaptive_max(op, nd, input, output_size, return_indices):
    batched = _spatial(op, input, nd)
    out = _out_arg(output_size, tuple(input.shape[-nd:]), nd, op)
    res = AdaptiveMaxPool.apply(input, out=out, nd=nd, batched=batched)
    if not return_indices:
        return res
    if input.is_meta:
        from ember.ops.creation import empty

        return res, empty(tuple(res.shape), dtype=_dt.int64, device="meta")
    ctx = res._ctx
    if ctx is None:
        ctx = AdaptiveMaxPool()
        ctx.forward(input._data, out=out, nd=nd, batched=batched)
    return res, Tensor._wrap(np.ascontiguousarray(_from4(ctx.idx, nd, batched)))


def adaptive_max_pool1d(input: Tensor, output_size, return_indices: bool = False):
    """Max pooling to a fixed output length (torch.nn.functional.adaptive_max_pool1d)."""
    return _adaptive_max("adaptive_max_pool1d", 1, input, output_size, return_indices)


def adaptive_max_pool2d(input: Tensor, output_size, return_indices: bool = False):
    """Max pooling to a fixed output size (torch.nn.functional.adaptive_max_pool2d)."""
    return _adaptive_max("adaptive_max_pool2d", 2, input, output_size, return_indices)


# ------------------------------------------------------------------ unfold / fold
class Unfold(Function):
    """torch.nn.functional.unfold: (N, C, H, W) -> (N, C*kh*kw, L) sliding blocks."""

    def meta(self, x, *, k, s, d, p, out):
        return (x.shape[0], x.shape[1] * k[0] * k[1], out[0] * out[1]), x.dtype

    def forward(self, x, *, k, s, d, p, out):
        self.shape, self.k, self.s, self.d, self.p, self.out = x.shape, k, s, d, p, out
        n, c = x.shape[:2]
        return im2col(x, k, s, d, p, out).reshape(n, c * k[0] * k[1], out[0] * out[1])

    def backward(self, g):
        n, c, h, w = self.shape
        cols = _up(g).reshape(n, c, *self.k, *self.out)
        return col2im(cols, (h, w), self.s, self.d, self.p)


class Fold(Function):
    """torch.nn.functional.fold: the adjoint of unfold (sums overlapping blocks)."""

    def meta(self, x, *, size, k, s, d, p, out):
        return (x.shape[0], x.shape[1] // (k[0] * k[1])) + tuple(size), x.dtype

    def forward(self, x, *, size, k, s, d, p, out):
        self.k, self.s, self.d, self.p, self.out = k, s, d, p, out
        n, ckk, _ = x.shape
        cols = _up(x).reshape(n, ckk // (k[0] * k[1]), *k, *out)
        return np.ascontiguousarray(col2im(cols, size, s, d, p)).astype(x.dtype, copy=False)

    def backward(self, g):
        n, c = g.shape[:2]
        return im2col(g, self.k, self.s, self.d, self.p, self.out).reshape(
            n, c * self.k[0] * self.k[1], -1
        )


def _fold_args(kernel_size, dilation, padding, stride, op: str) -> tuple:
    names = (
        ("kernel_size", kernel_size),
        ("stride", stride),
        ("dilation", dilation),
        ("padding", padding),
    )
    return tuple(_tuple(v, 2, n, op) for n, v in names)


def _fold_out(size: tuple, k: tuple, s: tuple, d: tuple, p: tuple) -> tuple:
    return tuple(_out_size(size[i], k[i], s[i], d[i], p[i], p[i]) for i in range(2))


def unfold(input: Tensor, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """Extract sliding blocks: (N, C, H, W) -> (N, C*kh*kw, L) (torch.nn.functional.unfold)."""
    k, s, d, p = _fold_args(kernel_size, dilation, padding, stride, "unfold")
    batched = _spatial("unfold", input, 2)
    x = input if batched else input.unsqueeze(0)
    out = _fold_out(tuple(x.shape[2:]), k, s, d, p)
    if out[0] < 1 or out[1] < 1:
        raise ShapeError(
            f"unfold: input of shape {tuple(input.shape)} is too small for kernel {k} "
            f"(padding {p}, dilation {d})"
        )
    r = Unfold.apply(x, k=k, s=s, d=d, p=p, out=out)
    return r if batched else r.squeeze(0)


def fold(input: Tensor, output_size, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """Combine sliding blocks (N, C*kh*kw, L) into (N, C, H, W), summing overlaps (F.fold)."""
    k, s, d, p = _fold_args(kernel_size, dilation, padding, stride, "fold")
    size = _tuple(output_size, 2, "output_size", "fold")
    if input.ndim not in (2, 3):
        raise ShapeError(f"fold: expected a 2-D or 3-D input, got shape {tuple(input.shape)}")
    batched = input.ndim == 3
    x = input if batched else input.unsqueeze(0)
    out = _fold_out(size, k, s, d, p)
    _, ckk, blocks = x.shape
    if ckk % (k[0] * k[1]) or out[0] * out[1] != blocks:
        raise ShapeError(
            f"fold: input of shape {tuple(input.shape)} does not fit output_size {size} "
            f"with kernel {k} "
            f"({out[0] * out[1]} blocks of C*{k[0] * k[1]} expected)"
        )
    r = Fold.apply(x, size=size, k=k, s=s, d=d, p=p, out=out)
    return r if batched else r.squeeze(0)


__all__ = [
    "max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d",
    "adaptive_avg_pool2d", "adaptive_max_pool1d", "adaptive_max_pool2d", "interpolate", "upsample",
    "pixel_shuffle", "pixel_unshuffle", "unfold", "fold",
]  # fmt: skip
