"""Convolutions: conv1d/conv2d and conv_transpose1d/2d, plus the im2col/col2im they share.

NCHW as in torch. The general path is im2col (one strided copy per kernel offset) followed by one
BLAS matmul per sample chunk; 1x1 convolutions are a plain matmul on the input (no im2col) and
depthwise convolutions (groups == in_channels) a per-channel weighted sum over the window.
float16/bfloat16 compute in float32 and round back. 1-D ops run as 2-D ones with height 1.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ember import dtypes as _dt
from ember.autograd import Function
from ember.errors import DTypeError, ShapeError
from ember.tensor import Tensor

_LOW = _dt.HALF_FLOATS  # float16, bfloat16 (ml_dtypes not imported to ask)
_F32 = np.dtype(np.float32)
_CHUNK_BYTES = 8 << 20  # backward: im2col buffer budget per batch chunk
_BAND_BYTES = 4 << 20  # forward: im2col budget per band of output rows (measured: 2-4 MiB best)
_BAND_ABOVE = 16 << 20  # ...used only when one sample's im2col exceeds this (fewer BLAS calls)


def _up(a: np.ndarray) -> np.ndarray:
    return a.astype(_F32) if a.dtype in _LOW else a


def _tuple(v, n: int, name: str, op: str) -> tuple:
    if isinstance(v, (int, np.integer)):
        return (int(v),) * n
    v = tuple(int(i) for i in v)
    if len(v) == 1:
        v = v * n
    if len(v) != n:
        raise ShapeError(f"{op}: expected {name} to be an int or a tuple of {n} ints, got {v}")
    return v


# ------------------------------------------------------------------ im2col / col2im (numpy)
def pad_input(x: np.ndarray, k: tuple, s: tuple, d: tuple, pad: tuple, out: tuple, fill=0):
    """x zero-padded by pad = (top, left) and just enough bottom/right for `out` windows."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (dh, dw), (pt, pl), (oh, ow) = k, s, d, pad, out
    pb = max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - h - pt)
    pr = max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - w - pl)
    if not (pt or pb or pl or pr):
        return x
    xp = np.full((n, c, h + pt + pb, w + pl + pr), fill, x.dtype)
    xp[:, :, pt : pt + h, pl : pl + w] = x
    return xp


def im2col(x: np.ndarray, k: tuple, s: tuple, d: tuple, pad: tuple, out: tuple) -> np.ndarray:
    """(N, C, H, W) -> (N, C, kh, kw, OH, OW) windows; pad = (top, left), bottom/right implied."""
    xp = pad_input(x, k, s, d, pad, out)
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = k, s, d, out
    cols = np.empty(x.shape[:2] + (kh, kw, oh, ow), x.dtype)
    for i in range(kh):
        for j in range(kw):
            hi, wj = i * dh, j * dw
            cols[:, :, i, j] = xp[
                :, :, hi : hi + sh * (oh - 1) + 1 : sh, wj : wj + sw * (ow - 1) + 1 : sw
            ]
    return cols


def col2im(cols: np.ndarray, size: tuple, s: tuple, d: tuple, pad: tuple) -> np.ndarray:
    """The adjoint of im2col: scatter-add (N, C, kh, kw, OH, OW) windows into (N, C, H, W)."""
    n, c, kh, kw, oh, ow = cols.shape
    (h, w), (sh, sw), (dh, dw), (pt, pl) = size, s, d, pad
    hc = max(pt + h, (oh - 1) * sh + dh * (kh - 1) + 1)
    wc = max(pl + w, (ow - 1) * sw + dw * (kw - 1) + 1)
    xp = np.zeros((n, c, hc, wc), cols.dtype)
    for i in range(kh):
        for j in range(kw):
            hi, wj = i * dh, j * dw
            xp[:, :, hi : hi + sh * (oh - 1) + 1 : sh, wj : wj + sw * (ow - 1) + 1 : sw] += cols[
                :, :, i, j
            ]
    return xp[:, :, pt : pt + h, pl : pl + w]


# ------------------------------------------------------------------ geometry
class Geom(NamedTuple):
    """Static convolution parameters, normalised to 2-D."""

    stride: tuple
    dilation: tuple
    pad: tuple  # (top, bottom, left, right)
    groups: int
    nd: int  # 1 or 2 spatial dims as the user sees them
    batched: bool
    out_pad: tuple = (0, 0)


def _out_size(size: int, k: int, s: int, d: int, p0: int, p1: int) -> int:
    return (size + p0 + p1 - d * (k - 1) - 1) // s + 1


def _to4(a: np.ndarray, g: Geom) -> np.ndarray:
    if not g.batched:
        a = a[None]
    return a[:, :, None, :] if g.nd == 1 else a


def _from4(a: np.ndarray, g: Geom) -> np.ndarray:
    if g.nd == 1:
        a = a[:, :, 0, :]
    return a if g.batched else a[0]


def _w4(w: np.ndarray, g: Geom) -> np.ndarray:
    return w[:, :, None, :] if g.nd == 1 else w


def _chunks(n: int, per_sample: int, budget: int | None = None):
    step = max(1, (budget or _CHUNK_BYTES) // max(per_sample, 1))
    for a in range(0, n, step):
        yield a, min(n, a + step)


# ------------------------------------------------------------------ convolution
class Conv(Function):
    """N-D (1 or 2) cross-correlation with stride, padding, dilation and groups."""

    # kernels.cpu.conv: the packed GEMM for a gemm.PackedWeight and for conv1d, depthwise NCHW;
    # saved(): they also run while a graph is recorded
    kernel_op = "conv2d"

    def saved(self, x, w, b=None, *, geom):
        self.geom, self.xshape, self.wshape = geom, x.shape, w.shape
        lo = x.dtype if x.dtype in _LOW else None
        self.x4, self.w4, self.lo = _to4(_up(x), geom), _w4(_up(w), geom), lo

    def forward(self, x, w, b=None, *, geom):
        self.saved(x, w, b, geom=geom)
        x4, w4, lo = self.x4, self.w4, self.lo
        out = _conv_fwd(x4, w4, geom)
        if b is not None:
            out += _up(b)[:, None, None]
        out = _from4(out, geom)
        return out.astype(lo) if lo is not None else out

    def meta(self, x, w, b=None, *, geom):
        n, _, h, wd = _to4(x, geom).shape
        _, _, kh, kw = _w4(w, geom).shape
        (sh, sw), (dh, dw), (pt, pb, pl, pr) = geom.stride, geom.dilation, geom.pad
        oh, ow = _out_size(h, kh, sh, dh, pt, pb), _out_size(wd, kw, sw, dw, pl, pr)
        shape = (n, w.shape[0], oh, ow) if geom.nd == 2 else (n, w.shape[0], ow)
        return (shape if geom.batched else shape[1:]), x.dtype

    def backward(self, g):
        geom, x4, w4 = self.geom, self.x4, self.w4
        g4 = _to4(_up(g), geom)
        need = self.needs_input_grad
        gx, gw = _conv_bwd(x4, w4, g4, geom, need[0], need[1])
        gb = g4.sum((0, 2, 3)) if len(need) > 2 and need[2] else None
        if gx is not None:
            gx = _from4(gx, geom).reshape(self.xshape)
        if gw is not None:
            gw = gw.reshape(self.wshape)
        return gx, gw, gb


def _geom_sizes(x4, w4, geom: Geom):
    n, c, h, w = x4.shape
    o, cg, kh, kw = w4.shape
    (sh, sw), (dh, dw), (pt, pb, pl, pr) = geom.stride, geom.dilation, geom.pad
    oh, ow = _out_size(h, kh, sh, dh, pt, pb), _out_size(w, kw, sw, dw, pl, pr)
    return n, c, h, w, o, cg, kh, kw, oh, ow


def _is_depthwise(c: int, cg: int, groups: int) -> bool:
    return groups > 1 and groups == c and cg == 1


def _conv_fwd(x4: np.ndarray, w4: np.ndarray, geom: Geom) -> np.ndarray:
    n, c, h, w, o, cg, kh, kw, oh, ow = _geom_sizes(x4, w4, geom)
    g, (pt, pb, pl, pr) = geom.groups, geom.pad
    k, s, d, pad = (kh, kw), geom.stride, geom.dilation, (pt, pl)
    if _is_depthwise(c, cg, g):  # a per-channel weighted sum (kernel: kernels.cpu.conv)
        from ember.kernels.cpu.conv import depthwise_conv2d_reference

        return depthwise_conv2d_reference(x4, w4, s, d, pad, (oh, ow))
    out = np.empty((n, o, oh, ow), np.result_type(x4, w4))
    wm = w4.reshape(g, o // g, cg * kh * kw)
    out3 = out.reshape(n, g, o // g, oh * ow)
    if kh == kw == 1 and not (pt or pb or pl or pr):
        xs = x4[:, :, :: s[0], :: s[1]][:, :, :oh, :ow]
        np.matmul(wm, xs.reshape(n, g, cg, oh * ow), out=out3)
        return out
    row = c * kh * kw * ow * x4.itemsize  # im2col bytes per output row of one sample
    if oh * row <= max(_BAND_ABOVE, _BAND_BYTES):  # whole samples per chunk
        for a, e in _chunks(n, oh * row, _CHUNK_BYTES):
            cols = im2col(x4[a:e], k, s, d, pad, (oh, ow))
            np.matmul(wm, cols.reshape(e - a, g, cg * kh * kw, oh * ow), out=out3[a:e])
        return out
    # large images: bands of output rows so the im2col buffer stays in cache
    xp = pad_input(x4, k, s, d, pad, (oh, ow))
    nb = max(1, _BAND_BYTES // row)
    for a in range(n):
        for r0 in range(0, oh, nb):
            r1 = min(oh, r0 + nb)
            rows = xp[a : a + 1, :, r0 * s[0] : (r1 - 1) * s[0] + d[0] * (kh - 1) + 1]
            cols = im2col(rows, k, s, d, (0, 0), (r1 - r0, ow))
            band = np.matmul(wm, cols.reshape(g, cg * kh * kw, (r1 - r0) * ow))
            out[a, :, r0:r1] = band.reshape(o, r1 - r0, ow)
    return out


def _conv_bwd(x4, w4, g4, geom: Geom, need_x: bool, need_w: bool):
    n, c, h, w, o, cg, kh, kw, oh, ow = _geom_sizes(x4, w4, geom)
    g, (pt, pb, pl, pr) = geom.groups, geom.pad
    k, s, d, pad = (kh, kw), geom.stride, geom.dilation, (pt, pl)
    if _is_depthwise(c, cg, g):
        return _depthwise_bwd(x4, w4, g4, k, s, d, pad, need_x, need_w)
    og, kk = o // g, cg * kh * kw
    wm = w4.reshape(g, og, kk)
    gx = np.empty(x4.shape, g4.dtype) if need_x else None
    gw = np.zeros((g, og, kk), g4.dtype) if need_w else None
    one = kh == kw == 1 and not (pt or pb or pl or pr)
    per = c * kh * kw * oh * ow * x4.itemsize
    for a, e in _chunks(n, per):
        gc = g4[a:e].reshape(e - a, g, og, oh * ow)
        if need_w:
            if one:
                cols = x4[a:e, :, :: s[0], :: s[1]][:, :, :oh, :ow].reshape(e - a, g, cg, oh * ow)
            else:
                cols = im2col(x4[a:e], k, s, d, pad, (oh, ow)).reshape(e - a, g, kk, oh * ow)
            gw += np.matmul(gc, cols.swapaxes(-1, -2)).sum(0)
        if need_x:
            gcols = np.matmul(wm.swapaxes(-1, -2), gc).reshape(e - a, c, kh, kw, oh, ow)
            if one and s == (1, 1):
                gx[a:e] = gcols.reshape(e - a, c, h, w)
            else:
                gx[a:e] = col2im(gcols, (h, w), s, d, pad)
    return gx, gw


def _depthwise_bwd(x4, w4, g4, k, s, d, pad, need_x, need_w):
    from ember.kernels.cpu import conv as dw

    gx = dw.depthwise_grad_input(g4, w4, x4.shape, s, d, pad) if need_x else None
    gw = dw.depthwise_grad_weight(g4, x4, w4.shape, s, d, pad) if need_w else None
    return gx, gw


# ------------------------------------------------------------------ transposed convolution
class ConvTranspose(Function):
    """The adjoint of Conv with respect to its input (a 'deconvolution')."""

    def forward(self, x, w, b=None, *, geom):
        self.geom, self.xshape, self.wshape = geom, x.shape, w.shape
        lo = x.dtype if x.dtype in _LOW else None
        x4, w4 = _to4(_up(x), geom), _w4(_up(w), geom)
        self.x4, self.w4 = x4, w4
        n, cin, h, wd = x4.shape
        _, cog, kh, kw = w4.shape
        g = geom.groups
        oh, ow = _tr_out(h, wd, kh, kw, geom)
        wm = w4.reshape(g, cin // g, cog * kh * kw).swapaxes(-1, -2)
        cols = np.matmul(wm, x4.reshape(n, g, cin // g, h * wd))
        cols = cols.reshape(n, g * cog, kh, kw, h, wd)
        out = col2im(cols, (oh, ow), geom.stride, geom.dilation, (geom.pad[0], geom.pad[2]))
        out = np.ascontiguousarray(out)
        if b is not None:
            out += _up(b)[:, None, None]
        out = _from4(out, geom)
        return out.astype(lo) if lo is not None else out

    def meta(self, x, w, b=None, *, geom):
        n, _, h, wd = _to4(x, geom).shape
        _, cog, kh, kw = _w4(w, geom).shape
        oh, ow = _tr_out(h, wd, kh, kw, geom)
        shape = (n, cog * geom.groups, oh, ow) if geom.nd == 2 else (n, cog * geom.groups, ow)
        return (shape if geom.batched else shape[1:]), x.dtype

    def backward(self, g):
        geom, x4, w4 = self.geom, self.x4, self.w4
        g4 = _to4(_up(g), geom)
        n, cin, h, wd = x4.shape
        _, cog, kh, kw = w4.shape
        grp, kk = geom.groups, cog * kh * kw
        pad = (geom.pad[0], geom.pad[2])
        cols = im2col(g4, (kh, kw), geom.stride, geom.dilation, pad, (h, wd))
        cols = cols.reshape(n, grp, kk, h * wd)
        need = self.needs_input_grad
        gx = gw = gb = None
        if need[0]:
            wm = w4.reshape(grp, cin // grp, kk)
            gx = _from4(np.matmul(wm, cols).reshape(x4.shape), geom).reshape(self.xshape)
        if need[1]:
            xs = x4.reshape(n, grp, cin // grp, h * wd)
            gw = np.matmul(xs, cols.swapaxes(-1, -2)).sum(0).reshape(self.wshape)
        if len(need) > 2 and need[2]:
            gb = g4.sum((0, 2, 3))
        return gx, gw, gb


def _tr_out(h: int, w: int, kh: int, kw: int, geom: Geom) -> tuple:
    (sh, sw), (dh, dw), (pt, pb, pl, pr), (oph, opw) = (
        geom.stride,
        geom.dilation,
        geom.pad,
        geom.out_pad,
    )
    return (
        (h - 1) * sh - pt - pb + dh * (kh - 1) + oph + 1,
        (w - 1) * sw - pl - pr + dw * (kw - 1) + opw + 1,
    )


# ------------------------------------------------------------------ public API
def _check(op: str, input: Tensor, weight: Tensor, bias, nd: int) -> bool:
    if not isinstance(input, Tensor) or not isinstance(weight, Tensor):
        raise DTypeError(
            f"{op}: expected tensors, got {type(input).__name__} and {type(weight).__name__}"
        )
    if input.ndim not in (nd + 1, nd + 2):
        raise ShapeError(
            f"{op}: expected a {nd + 1}-D (unbatched) or {nd + 2}-D (batched) input, "
            f"got shape {tuple(input.shape)}"
        )
    if weight.ndim != nd + 2:
        raise ShapeError(f"{op}: expected a {nd + 2}-D weight, got shape {tuple(weight.shape)}")
    for t in (weight, bias) if bias is not None else (weight,):
        if t._data.dtype != input._data.dtype:
            raise DTypeError(
                f"{op}: input ({input.dtype}) and {'bias' if t is bias else 'weight'} "
                f"({t.dtype}) must have the same dtype"
            )
    if input._data.dtype == np.bool_:
        raise DTypeError(f"{op}: not implemented for bool tensors")
    return input.ndim == nd + 2


def _padding(padding, k: tuple, d: tuple, s: tuple, nd: int, op: str) -> tuple:
    """Normalise int / tuple / 'same' / 'valid' to (top, bottom, left, right) in 2-D."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding != "same":
            raise ValueError(
                f"{op}: padding must be an int, a tuple, 'same' or 'valid', got {padding!r}"
            )
        if any(v != 1 for v in s):
            raise ValueError(f"{op}: padding='same' is not supported for strided convolutions")
        tot = [d[i] * (k[i] - 1) for i in range(2)]
        return (tot[0] // 2, tot[0] - tot[0] // 2, tot[1] // 2, tot[1] - tot[1] // 2)
    p = _tuple(padding, nd, "padding", op)
    if any(v < 0 for v in p):
        raise ShapeError(f"{op}: negative padding {p}")
    p = (0,) + p if nd == 1 else p
    return (p[0], p[0], p[1], p[1])


def _conv(op: str, nd: int, input, weight, bias, stride, padding, dilation, groups) -> Tensor:
    batched = _check(op, input, weight, bias, nd)
    s = _tuple(stride, nd, "stride", op)
    d = _tuple(dilation, nd, "dilation", op)
    if any(v < 1 for v in s + d) or groups < 1:
        raise ShapeError(
            f"{op}: stride, dilation and groups must be positive, got {s}, {d}, {groups}"
        )
    if nd == 1:
        s, d = (1,) + s, (1,) + d
    ws = tuple(weight.shape)
    k = (1,) + ws[2:] if nd == 1 else ws[2:]
    pad = _padding(padding, k, d, s, nd, op)
    xs = tuple(input.shape) if batched else (1,) + tuple(input.shape)
    c = xs[1]
    if ws[1] * groups != c or ws[0] % groups:
        raise ShapeError(
            f"{op}: given groups={groups}, weight of size {list(ws)} expects input {list(xs)} "
            f"to have {ws[1] * groups} channels (and out_channels divisible by groups), got {c}"
        )
    sp = ((1,) + xs[2:]) if nd == 1 else xs[2:]
    padded = tuple(sp[j] + pad[2 * j] + pad[2 * j + 1] for j in range(2))
    dk = tuple(d[j] * (k[j] - 1) + 1 for j in range(2))
    for i in range(2):
        if padded[i] < dk[i]:
            raise ShapeError(
                f"{op}: padded input size {padded[2 - nd :]} is smaller than the (dilated) "
                f"kernel {dk[2 - nd :]} (input {tuple(input.shape)}, weight {ws})"
            )
    if bias is not None and tuple(bias.shape) != (ws[0],):
        raise ShapeError(
            f"{op}: bias of shape {tuple(bias.shape)} does not fit {ws[0]} output channels"
        )
    geom = Geom(s, d, pad, int(groups), nd, batched)
    args = (input, weight) if bias is None else (input, weight, bias)
    return Conv.apply(*args, geom=geom)


def conv1d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
) -> Tensor:
    """1-D cross-correlation over (N, C, L) (torch.nn.functional.conv1d)."""
    return _conv("conv1d", 1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
) -> Tensor:
    """2-D cross-correlation over (N, C, H, W) (torch.nn.functional.conv2d)."""
    return _conv("conv2d", 2, input, weight, bias, stride, padding, dilation, groups)


def _conv_t(
    op: str, nd: int, input, weight, bias, stride, padding, output_padding, groups, dilation
) -> Tensor:
    batched = _check(op, input, weight, bias, nd)
    s = _tuple(stride, nd, "stride", op)
    d = _tuple(dilation, nd, "dilation", op)
    p = _tuple(padding, nd, "padding", op)
    op_ = _tuple(output_padding, nd, "output_padding", op)
    if any(v < 1 for v in s + d) or groups < 1 or any(v < 0 for v in p + op_):
        raise ShapeError(
            f"{op}: bad stride {s}, dilation {d}, padding {p}, output_padding {op_} "
            f"or groups {groups}"
        )
    for i in range(nd):
        if op_[i] >= s[i] and op_[i] >= d[i]:
            raise ShapeError(
                f"{op}: output padding must be smaller than either stride or dilation, "
                f"got output_padding={op_}, stride={s}, dilation={d}"
            )
    if nd == 1:
        s, d, p, op_ = (1,) + s, (1,) + d, (0,) + p, (0,) + op_
    ws = tuple(weight.shape)
    xs = tuple(input.shape) if batched else (1,) + tuple(input.shape)
    if ws[0] != xs[1] or xs[1] % groups:
        raise ShapeError(
            f"{op}: given groups={groups}, weight of size {list(ws)} expects input {list(xs)} "
            f"to have {ws[0]} channels (divisible by groups)"
        )
    if bias is not None and tuple(bias.shape) != (ws[1] * groups,):
        raise ShapeError(
            f"{op}: bias of shape {tuple(bias.shape)} does not fit {ws[1] * groups} output channels"
        )
    geom = Geom(s, d, (p[0], p[0], p[1], p[1]), int(groups), nd, batched, op_)
    k = ((1,) + ws[2:]) if nd == 1 else ws[2:]
    sp = ((1,) + xs[2:]) if nd == 1 else xs[2:]
    oh, ow = _tr_out(sp[0], sp[1], k[0], k[1], geom)
    if oh < 1 or ow < 1:
        raise ShapeError(
            f"{op}: the output size {(oh, ow)[2 - nd :]} is too small (input {xs}, weight {ws})"
        )
    args = (input, weight) if bias is None else (input, weight, bias)
    return ConvTranspose.apply(*args, geom=geom)


def conv_transpose1d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride=1,
    padding=0,
    output_padding=0,
    groups: int = 1,
    dilation=1,
) -> Tensor:
    """1-D transposed convolution (F.conv_transpose1d); weight (Cin, Cout/groups, k)."""
    return _conv_t(
        "conv_transpose1d",
        1,
        input,
        weight,
        bias,
        stride,
        padding,
        output_padding,
        groups,
        dilation,
    )


def conv_transpose2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride=1,
    padding=0,
    output_padding=0,
    groups: int = 1,
    dilation=1,
) -> Tensor:
    """2-D transposed convolution (F.conv_transpose2d); weight (Cin, Cout/groups, kh, kw)."""
    return _conv_t(
        "conv_transpose2d",
        2,
        input,
        weight,
        bias,
        stride,
        padding,
        output_padding,
        groups,
        dilation,
    )


__all__ = ["conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d"]
