"""Resampling: interpolate (nearest[-exact], (bi/tri)linear, area) and pixel_(un)shuffle.

Interpolation is separable: one gather (nearest) or two-tap blend (linear) per spatial axis, with
torch's source-index rules computed in float32 (float64 for double inputs). Re-exported by pool.py.
"""

from __future__ import annotations

import math

import numpy as np

from ember import dtypes as _dt
from ember.autograd import Function
from ember.errors import DTypeError, ShapeError, UnsupportedError
from ember.ops._adaptive import adaptive_avg_pool1d, adaptive_avg_pool2d
from ember.ops.conv import _tuple
from ember.tensor import Tensor

_LOW = _dt.HALF_FLOATS  # float16, bfloat16 (ml_dtypes not imported to ask)


def _up(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if a.dtype in _LOW else a


def _axis_plan(mode: str, n_in: int, n_out: int, scale, align_corners, ctype) -> tuple:
    """Per-axis gather plan: (i0, i1, w0, w1) (i1/w-s None for nearest modes)."""
    dst = np.arange(n_out, dtype=ctype)
    if mode in ("nearest", "nearest-exact"):
        sc = ctype(1.0 / scale) if scale else ctype(n_in) / ctype(n_out)
        src = np.floor((dst + ctype(0.5)) * sc if mode == "nearest-exact" else dst * sc)
        return np.minimum(src.astype(np.int64), n_in - 1), None, None, None
    if align_corners:
        sc = ctype(n_in - 1) / ctype(n_out - 1) if n_out > 1 else ctype(0)
        src = dst * sc
    else:
        sc = ctype(1.0 / scale) if scale else ctype(n_in) / ctype(n_out)
        src = np.maximum(sc * (dst + ctype(0.5)) - ctype(0.5), ctype(0))
    i0 = np.minimum(src.astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    w1 = (src - i0).astype(ctype)
    return i0, i1, ctype(1) - w1, w1


def _wshape(w: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    shape = [1] * ndim
    shape[axis] = w.shape[0]
    return w.reshape(shape)


def _sum_sorted(vals: np.ndarray, idx: np.ndarray, n: int) -> np.ndarray:
    """Sum rows of vals (axis 0) into n rows at non-decreasing indices idx."""
    uniq, starts = np.unique(idx, return_index=True)
    res = np.zeros((n,) + vals.shape[1:], vals.dtype)
    res[uniq] = np.add.reduceat(vals, starts, axis=0)
    return res


class Interpolate(Function):
    """Separable resampling: one gather (nearest) or two-tap blend (linear) per spatial axis."""

    def meta(self, x, *, plans):
        shape = list(x.shape)
        for axis, (i0, *_) in plans:
            shape[axis] = i0.shape[0]
        return tuple(shape), x.dtype

    def forward(self, x, *, plans):
        self.plans, self.shape = plans, x.shape
        y = _up(x)
        for axis, (i0, i1, w0, w1) in plans:
            if i1 is None:
                y = np.take(y, i0, axis=axis)
            else:
                y = np.take(y, i0, axis=axis) * _wshape(w0, axis, y.ndim) + np.take(
                    y, i1, axis=axis
                ) * _wshape(w1, axis, y.ndim)
        return y.astype(x.dtype, copy=False) if plans else x.copy()  # never alias the input

    def backward(self, g):
        g = _up(g)
        sizes = list(self.shape)
        for axis, (i0, i1, w0, w1) in reversed(self.plans):
            gm = np.moveaxis(g, axis, 0)
            n = sizes[axis]
            if i1 is None:
                r = _sum_sorted(gm, i0, n)
            else:
                ws = [1] * gm.ndim
                ws[0] = -1
                r = _sum_sorted(gm * w0.reshape(ws), i0, n) + _sum_sorted(
                    gm * w1.reshape(ws), i1, n
                )
            g = np.moveaxis(r, 0, axis)
        return g


_LINEAR = {"linear": 1, "bilinear": 2, "trilinear": 3}


def interpolate(
    input: Tensor,
    size=None,
    scale_factor=None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
) -> Tensor:
    """Resize the spatial dims (F.interpolate): nearest, nearest-exact, (bi/tri)linear, area."""
    nd = input.ndim - 2
    if nd < 1 or nd > 3:
        raise ShapeError(
            f"interpolate: expected a 3-D, 4-D or 5-D input, got shape {tuple(input.shape)}"
        )
    if antialias:
        raise UnsupportedError("interpolate: antialias=True is not supported")
    if mode in _LINEAR and _LINEAR[mode] != nd:
        raise ShapeError(
            f"interpolate: mode {mode!r} needs a {_LINEAR[mode] + 2}-D input, got {input.ndim}-D"
        )
    if mode not in _LINEAR and mode not in ("nearest", "nearest-exact", "area"):
        raise UnsupportedError(f"interpolate: mode {mode!r} is not supported")
    if align_corners is not None and mode not in _LINEAR:
        raise ValueError(
            "align_corners can only be set with the modes linear | bilinear | trilinear"
        )
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: give exactly one of size and scale_factor")
    sp = tuple(input.shape[2:])
    if size is not None:
        out = _tuple(size, nd, "size", "interpolate")
        scales = (None,) * nd
    else:
        sf = tuple(
            float(v)
            for v in (
                scale_factor if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * nd
            )
        )
        if len(sf) != nd:
            raise ShapeError(f"interpolate: expected {nd} scale factors, got {sf}")
        out = tuple(int(math.floor(sp[i] * sf[i])) for i in range(nd))
        scales = (None,) * nd if recompute_scale_factor else sf
    if any(v < 1 for v in out):
        raise ShapeError(
            f"interpolate: output size {out} must be positive (input {tuple(input.shape)})"
        )
    if mode == "area":
        if nd == 3:
            raise UnsupportedError("interpolate: mode 'area' supports 1-D and 2-D inputs")
        return (adaptive_avg_pool1d if nd == 1 else adaptive_avg_pool2d)(input, out)
    if mode in _LINEAR and not input.is_floating_point():
        raise DTypeError(f"interpolate: mode {mode!r} expects a float tensor, got {input.dtype}")
    if input._data.dtype == np.bool_:
        raise DTypeError("interpolate: not implemented for bool tensors")
    ctype = np.float64 if input._data.dtype == np.float64 else np.float32
    plans = tuple(
        (2 + i, _axis_plan(mode, sp[i], out[i], scales[i], bool(align_corners), ctype))
        for i in range(nd)
        if not (sp[i] == out[i] and mode in ("nearest", "nearest-exact"))
    )
    return Interpolate.apply(input, plans=plans)


def upsample(
    input: Tensor, size=None, scale_factor=None, mode: str = "nearest", align_corners=None
) -> Tensor:
    """Alias of interpolate (torch.nn.functional.upsample)."""
    return interpolate(input, size, scale_factor, mode, align_corners)


# ------------------------------------------------------------------ pixel shuffle
def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
    """(N, C*r*r, H, W) -> (N, C, H*r, W*r)."""
    r = int(upscale_factor)
    *lead, c, h, w = input.shape
    if c % (r * r):
        raise ShapeError(
            f"pixel_shuffle: channels {c} are not divisible by upscale_factor**2 = {r * r}"
        )
    x = input.reshape(*lead, c // (r * r), r, r, h, w)
    k = len(lead)
    x = x.permute(*range(k), k, k + 3, k + 1, k + 4, k + 2)
    return x.reshape(*lead, c // (r * r), h * r, w * r)


def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:
    """(N, C, H*r, W*r) -> (N, C*r*r, H, W)."""
    r = int(downscale_factor)
    *lead, c, h, w = input.shape
    if h % r or w % r:
        raise ShapeError(
            f"pixel_unshuffle: spatial size {(h, w)} is not divisible by downscale_factor {r}"
        )
    x = input.reshape(*lead, c, h // r, r, w // r, r)
    k = len(lead)
    x = x.permute(*range(k), k, k + 2, k + 4, k + 1, k + 3)
    return x.reshape(*lead, c * r * r, h // r, w // r)
