"""ONNX convolution, pooling and normalization operators."""

from __future__ import annotations

import math

import numpy as np

import ember
from ember.errors import ShapeError
from ember.nn import functional as F
from ember.onnx._registry import Attrs, axis_of, const, npdt, op, unsupported
from ember.tensor import Tensor


def _geometry(a: Attrs, sp: list[int], k: list[int], transposed: bool = False):
    nd = len(sp)
    s = list(a.get("strides", [1] * nd))
    d = list(a.get("dilations", [1] * nd))
    auto = a.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER") and not transposed:
        lo, hi = [], []
        for n, kk, ss, dd in zip(sp, k, s, d):
            out = -(-n // ss)
            total = max((out - 1) * ss + (kk - 1) * dd + 1 - n, 0)
            small = total // 2
            lo.append(small if auto == "SAME_UPPER" else total - small)
            hi.append(total - lo[-1])
    elif auto == "VALID":
        lo, hi = [0] * nd, [0] * nd
    else:
        p = list(a.get("pads", [0] * (2 * nd)))
        if len(p) != 2 * nd:
            raise ShapeError(f"ONNX {a.where()}: pads {p} for {nd} spatial dims")
        lo, hi = p[:nd], p[nd:]
    if len(s) != nd or len(d) != nd or any(v <= 0 for v in s + d):
        raise ShapeError(f"ONNX {a.where()}: strides {s} / dilations {d} for {nd} spatial dims")
    return s, d, lo, hi


def _pad_sp(x: Tensor, lo, hi, value=0.0) -> Tensor:
    if not any(lo) and not any(hi):
        return x
    flat = []
    for p, q in zip(reversed(lo), reversed(hi)):
        flat += [p, q]
    return ember.pad(x, flat, value=value)


@op("Conv")
def _conv(a: Attrs, x, w, b=None):
    nd = x.ndim - 2
    k = list(a.get("kernel_shape", w.shape[2:]))
    g = a.get("group", 1)
    s, d, lo, hi = _geometry(a, list(x.shape[2:]), k)
    if nd not in (1, 2, 3):
        unsupported(a, f"{nd}-D convolution")
    sym = lo == hi
    if not sym:
        x = _pad_sp(x, lo, hi)
        lo = [0] * nd
    if nd == 1:
        return F.conv1d(x, w, b, stride=s[0], padding=lo[0], dilation=d[0], groups=g)
    if nd == 2:
        return F.conv2d(x, w, b, stride=tuple(s), padding=tuple(lo), dilation=tuple(d), groups=g)
    return _conv3d(x, w, b, s, d, lo, g)


def _conv3d(x, w, b, s, d, lo, g):
    """3-D convolution as a sum over the kernel's depth of 2-D convolutions."""
    x = _pad_sp(x, [lo[0], 0, 0], [lo[0], 0, 0])
    n, c, depth, h, wd = x.shape
    kd = w.shape[2]
    do = (depth - (kd - 1) * d[0] - 1) // s[0] + 1
    if do <= 0:
        raise ShapeError(f"Conv: kernel depth {kd} larger than padded input depth {depth}")
    out = None
    for i in range(kd):
        start = i * d[0]
        xs = x[:, :, start : start + s[0] * (do - 1) + 1 : s[0]]
        xs = xs.permute(0, 2, 1, 3, 4).reshape(n * do, c, h, wd)
        y = F.conv2d(xs, w[:, :, i].contiguous(), None, stride=tuple(s[1:]), padding=tuple(lo[1:]),
                     dilation=tuple(d[1:]), groups=g)  # fmt: skip
        out = y if out is None else out + y
    m, ho, wo = out.shape[1:]
    out = out.reshape(n, do, m, ho, wo).permute(0, 2, 1, 3, 4)
    if b is not None:
        out = out + b.reshape(1, -1, 1, 1, 1)
    return out.contiguous()


@op("ConvTranspose")
def _conv_t(a: Attrs, x, w, b=None):
    nd = x.ndim - 2
    if nd not in (1, 2):
        unsupported(a, f"{nd}-D transposed convolution")
    sp = list(x.shape[2:])
    k = list(a.get("kernel_shape", w.shape[2:]))
    g = a.get("group", 1)
    s = list(a.get("strides", [1] * nd))
    d = list(a.get("dilations", [1] * nd))
    opad = list(a.get("output_padding", [0] * nd))
    full = [ss * (n - 1) + (kk - 1) * dd + 1 for n, kk, ss, dd in zip(sp, k, s, d)]
    auto = a.get("auto_pad", "NOTSET")
    if "output_shape" in a:
        outs = list(a.get("output_shape"))[-nd:]
        total = [f + o - t for f, o, t in zip(full, opad, outs)]
        lo = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
        hi = [t - l_ for t, l_ in zip(total, lo)]
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        total = [f + o - n * ss for f, o, n, ss in zip(full, opad, sp, s)]
        lo = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
        hi = [t - l_ for t, l_ in zip(total, lo)]
    else:
        p = list(a.get("pads", [0] * (2 * nd)))
        lo, hi = p[:nd], p[nd:]
    fn = F.conv_transpose1d if nd == 1 else F.conv_transpose2d
    one = (lambda v: v[0]) if nd == 1 else tuple
    y = fn(x, w, None, stride=one(s), padding=0, output_padding=0, groups=g, dilation=one(d))
    # output padding adds rows past the last input's reach; pads crop (negative: grow)
    y = _pad_sp(y, [-v for v in lo], [o - v for o, v in zip(opad, hi)])
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * nd)
    return y


# ---- pooling -----------------------------------------------------------------------------


def _pool_plan(a: Attrs, x: Tensor, k: list[int]):
    sp = list(x.shape[2:])
    s, d, lo, hi = _geometry(a, sp, k)
    ceil = bool(a.get("ceil_mode", 0))
    outs = []
    for n, kk, ss, dd, p, q in zip(sp, k, s, d, lo, hi):
        span = n + p + q - ((kk - 1) * dd + 1)
        if span < 0:
            raise ShapeError(f"ONNX {a.where()}: kernel {k} larger than padded input {sp}")
        o = (-(-span // ss) if ceil else span // ss) + 1
        if ceil and (o - 1) * ss >= n + p:  # a window starting in the end padding is dropped
            o -= 1
        outs.append(o)
    return s, d, lo, hi, outs


def _windows(xp: Tensor, k, s, d, outs):
    """Each kernel tap's strided view of the padded input, with its offsets."""
    for taps in np.ndindex(*k):
        idx = [slice(None), slice(None)]
        for t, ss, dd, o in zip(taps, s, d, outs):
            start = t * dd
            idx.append(slice(start, start + ss * (o - 1) + 1, ss))
        yield taps, xp[tuple(idx)]


def _extra_hi(xsp, k, s, d, lo, hi, outs):
    return [max((o - 1) * ss + (kk - 1) * dd + 1 - (n + p + q), 0) + q
            for n, kk, ss, dd, p, q, o in zip(xsp, k, s, d, lo, hi, outs)]  # fmt: skip


def _generic_pool(a: Attrs, x: Tensor, kind: str, p_norm: float = 2.0):
    k = list(a.get("kernel_shape"))
    s, d, lo, hi, outs = _pool_plan(a, x, k)
    xsp = list(x.shape[2:])
    hi2 = _extra_hi(xsp, k, s, d, lo, hi, outs)
    if kind == "max":
        xp = _pad_sp(x, lo, hi2, -math.inf if npdt(x).kind == "f" else np.iinfo(npdt(x)).min)
        best = None
        arg = None
        for taps, v in _windows(xp, k, s, d, outs):
            if best is None:
                best = v
                if a.n_out > 1:
                    arg = _tap_index(x, taps, s, d, lo, outs, a)
                continue
            if a.n_out > 1:
                take = v > best
                arg = ember.where(take, _tap_index(x, taps, s, d, lo, outs, a), arg)
            best = ember.maximum(best, v)
        return (best.contiguous(), arg) if a.n_out > 1 else best.contiguous()
    xp = _pad_sp(x, lo, hi2, 0.0)
    if kind == "lp":
        xp = ember.abs(xp) ** p_norm
    total = None
    for _, v in _windows(xp, k, s, d, outs):
        total = v if total is None else total + v
    if kind == "lp":
        return (total ** (1.0 / p_norm)).contiguous()
    inside = _pad_sp(ember.ones((1, 1) + tuple(xsp), dtype=x.dtype), lo, hi2, 0.0)
    if a.get("count_include_pad", 0):
        inside = _pad_sp(ember.ones((1, 1) + tuple(xsp), dtype=x.dtype), [0] * len(k),
                         [h2 - q for h2, q in zip(hi2, hi)], 0.0)  # fmt: skip
        inside = _pad_sp(inside, lo, hi, 1.0)
    count = None
    for _, v in _windows(inside, k, s, d, outs):
        count = v if count is None else count + v
    return (total / count).contiguous()


def _tap_index(x, taps, s, d, lo, outs, a: Attrs) -> Tensor:
    """Flat indices (ONNX's MaxPool Indices) of one kernel tap over every output position."""
    n, c = x.shape[:2]
    sp = list(x.shape[2:])
    coords = np.meshgrid(*[np.arange(o) * ss + t * dd - p
                           for o, ss, t, dd, p in zip(outs, s, taps, d, lo)], indexing="ij")  # fmt: skip
    if a.get("storage_order", 0):
        strides = [int(math.prod(sp[:i])) for i in range(len(sp))]
    else:
        strides = [math.prod(sp[i + 1 :]) for i in range(len(sp))]
    lin = sum(cc * st for cc, st in zip(coords, strides))
    plane = math.prod(sp)
    base = (np.arange(n * c) * plane).reshape(n, c, *([1] * len(sp)))
    return const(base + lin[None, None], np.int64)


@op("MaxPool")
def _max_pool(a: Attrs, x):
    k = list(a.get("kernel_shape"))
    nd = len(k)
    s, d, lo, hi = _geometry(a, list(x.shape[2:]), k)
    if nd == 2 and lo == hi and a.n_out == 1 and npdt(x) == np.float32:
        ceil = bool(a.get("ceil_mode", 0))
        if all(p <= kk // 2 for p, kk in zip(lo, k)):
            return F.max_pool2d(x, tuple(k), tuple(s), tuple(lo), tuple(d), ceil_mode=ceil)
    return _generic_pool(a, x, "max")


@op("AveragePool")
def _avg_pool(a: Attrs, x):
    k = list(a.get("kernel_shape"))
    s, d, lo, hi = _geometry(a, list(x.shape[2:]), k)
    if len(k) == 2 and s == k and d == [1, 1] and not any(lo + hi):
        y = _tiled_avg_pool(x, k, bool(a.get("ceil_mode", 0)))
        if y is not None:
            return y
    if len(k) == 2 and lo == hi and d == [1, 1] and all(p <= kk // 2 for p, kk in zip(lo, k)):
        return F.avg_pool2d(x, tuple(k), tuple(s), tuple(lo), ceil_mode=bool(a.get("ceil_mode", 0)),
                            count_include_pad=bool(a.get("count_include_pad", 0)))  # fmt: skip
    return _generic_pool(a, x, "avg")


def _tiled_avg_pool(x: Tensor, k: list[int], ceil: bool) -> Tensor | None:
    """A 2-D average pool whose windows tile the map (stride = kernel, no pads) on float32 x.

    The windows' k[0] * k[1] strided slices are added in place of the pool op's window copy
    (PP-OCRv4's recognizer: a 3 x 2 pool of its channels-last (1, 480, 3, 80) map, 124 -> 44 us
    a call in the model against ``F.avg_pool2d``; ad-hoc per-node timing). A channels-last x (a fused conv's result) gives a
    channels-last result. None when x is not float32 4-D, needs gradients, or ceil mode adds a
    partial window.
    """
    d = x._data
    if d.dtype != np.float32 or d.ndim != 4 or (ember.is_grad_enabled() and x.requires_grad):
        return None
    n, c, h, w = d.shape
    kh, kw = k
    oh, ow = (h - kh) // kh + 1, (w - kw) // kw + 1
    if oh <= 0 or ow <= 0 or d.size == 0 or (ceil and ((h - kh) % kh or (w - kw) % kw)):
        return None
    nhwc = d.transpose(0, 2, 3, 1)
    t = nhwc if nhwc.flags.c_contiguous else d  # window axes in either layout
    sp = (1, 2) if t is nhwc else (2, 3)
    t = t[tuple(slice(0, oh * kh) if i == sp[0] else slice(0, ow * kw) if i == sp[1]
                else slice(None) for i in range(4))]  # fmt: skip
    acc = None
    for i in range(kh):
        for j in range(kw):
            win = t[tuple(slice(i, None, kh) if a == sp[0] else slice(j, None, kw) if a == sp[1]
                          else slice(None) for a in range(4))]  # fmt: skip
            acc = win.copy() if acc is None else np.add(acc, win, out=acc)
    acc /= np.float32(kh * kw)
    return Tensor._wrap(acc.transpose(0, 3, 1, 2) if sp == (1, 2) else acc)


@op("LpPool")
def _lp_pool(a: Attrs, x):
    return _generic_pool(a, x, "lp", float(a.get("p", 2)))


@op("GlobalAveragePool")
def _gap(a: Attrs, x):
    d = x._data
    if d.dtype == np.float32 and d.ndim == 4 and d.transpose(0, 2, 3, 1).flags.c_contiguous:
        from ember.kernels.cpu import conv  # a fused conv's channels-last result: rows of C

        n, c, h, w = d.shape
        return Tensor._wrap(conv.channel_mean(d.transpose(0, 2, 3, 1).reshape(n, h * w, c))
                            .reshape(n, c, 1, 1))  # fmt: skip
    return ember.mean(x, dim=tuple(range(2, x.ndim)), keepdim=True)


@op("GlobalMaxPool")
def _gmp(a: Attrs, x):
    return ember.amax(x, dim=tuple(range(2, x.ndim)), keepdim=True)


@op("GlobalLpPool")
def _glp(a: Attrs, x):
    p = float(a.get("p", 2))
    return ember.sum(ember.abs(x) ** p, dim=tuple(range(2, x.ndim)), keepdim=True) ** (1.0 / p)


@op("MaxUnpool")
def _max_unpool(a: Attrs, x, idx, out_shape=None):
    k = list(a.get("kernel_shape"))
    nd = len(k)
    s = list(a.get("strides", [1] * nd))
    p = list(a.get("pads", [0] * (2 * nd)))
    if out_shape is not None:
        shape = [int(v) for v in np.asarray(out_shape.numpy()).reshape(-1)]
    else:
        sp = [(n - 1) * ss + kk - p[i] - p[i + nd] for i, (n, ss, kk) in
              enumerate(zip(x.shape[2:], s, k))]  # fmt: skip
        shape = list(x.shape[:2]) + sp
    flat = ember.zeros(math.prod(shape), dtype=x.dtype)
    flat = ember.index_put(flat, (idx.reshape(-1).to(ember.int64),), x.reshape(-1))
    return flat.reshape(tuple(shape))


# ---- normalization -----------------------------------------------------------------------


def _bshape(t: Tensor, r: int) -> Tensor:
    return t.reshape((1, -1) + (1,) * (r - 2))


@op("BatchNormalization")
def _batch_norm(a: Attrs, x, scale, bias, mean, var):
    eps = a.get("epsilon", 1e-5)
    r = x.ndim
    training = a.get("training_mode", 0) or (
        a.opset < 9 and not a.get("is_test", 1) and a.n_out > 1
    )
    if training:
        dims = (0,) + tuple(range(2, r))
        bm = ember.mean(x, dim=dims)
        bv = ember.var(x, dim=dims, correction=0)
        mom = a.get("momentum", 0.9)
        y = (x - _bshape(bm, r)) / ember.sqrt(_bshape(bv, r) + eps) * _bshape(scale, r)
        y = y + _bshape(bias, r)
        return y, mean * mom + bm * (1 - mom), var * mom + bv * (1 - mom)
    if r == 4 and x.dtype == ember.float32:
        return F.batch_norm(x, mean, var, scale, bias, eps=eps)
    inv = scale / ember.sqrt(var + eps)
    return x * _bshape(inv, r) + _bshape(bias - mean * inv, r)


@op("InstanceNormalization")
def _instance_norm(a: Attrs, x, scale, bias):
    eps = a.get("epsilon", 1e-5)
    r = x.ndim
    dims = tuple(range(2, r))
    m = ember.mean(x, dim=dims, keepdim=True)
    v = ember.mean((x - m) ** 2, dim=dims, keepdim=True)
    return (x - m) / ember.sqrt(v + eps) * _bshape(scale, r) + _bshape(bias, r)


@op("LayerNormalization")
def _layer_norm(a: Attrs, x, scale, bias=None):
    r = x.ndim
    ax = axis_of(a.get("axis", -1), r, a.where())
    eps = a.get("epsilon", 1e-5)
    dims = tuple(range(ax, r))
    if a.n_out == 1 and ax == r - 1 and x.dtype == ember.float32 and scale.shape == x.shape[-1:]:
        return F.layer_norm(x, tuple(x.shape[ax:]), scale, bias, eps=eps)
    xf = x.to(ember.float32) if x.dtype != ember.float64 else x
    m = ember.mean(xf, dim=dims, keepdim=True)
    v = ember.mean((xf - m) ** 2, dim=dims, keepdim=True)
    inv = ember.rsqrt(v + eps)
    y = ((xf - m) * inv).to(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return (y, m, inv) if a.n_out > 1 else y


@op("RMSNormalization")
def _rms_norm(a: Attrs, x, scale):
    r = x.ndim
    ax = axis_of(a.get("axis", -1), r, a.where())
    eps = a.get("epsilon", 1e-5)
    xf = x.to(ember.float32) if x.dtype != ember.float64 else x
    ms = ember.mean(xf * xf, dim=tuple(range(ax, r)), keepdim=True)
    return (xf * ember.rsqrt(ms + eps)).to(x.dtype) * scale


@op("GroupNormalization")
def _group_norm(a: Attrs, x, scale, bias):
    g = a.get("num_groups")
    eps = a.get("epsilon", 1e-5)
    n, c = x.shape[:2]
    r = x.ndim
    xg = x.reshape(n, g, -1)
    m = ember.mean(xg, dim=2, keepdim=True)
    v = ember.mean((xg - m) ** 2, dim=2, keepdim=True)
    y = ((xg - m) / ember.sqrt(v + eps)).reshape(tuple(x.shape))
    if a.opset < 21 and scale.shape[0] == g and g != c:  # opset 18: one scale per group
        scale = scale.repeat_interleave(c // g)
        bias = bias.repeat_interleave(c // g)
    return y * _bshape(scale, r) + _bshape(bias, r)


@op("LpNormalization")
def _lp_norm(a: Attrs, x):
    ax = axis_of(a.get("axis", -1), x.ndim, a.where())
    p = a.get("p", 2)
    if p == 1:
        nrm = ember.sum(ember.abs(x), dim=ax, keepdim=True)
    else:
        nrm = ember.sqrt(ember.sum(x * x, dim=ax, keepdim=True))
    return ember.where(nrm == 0, ember.zeros_like(x), x / nrm)


@op("LRN")
def _lrn(a: Attrs, x):
    size = a.get("size")
    alpha, beta, bias = a.get("alpha", 1e-4), a.get("beta", 0.75), a.get("bias", 1.0)
    sq = x * x
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    flat = [0, 0] * (x.ndim - 2) + [lo, hi]
    sp = ember.pad(sq, flat)
    total = None
    for i in range(size):
        v = sp.narrow(1, i, c)
        total = v if total is None else total + v
    return x / (bias + alpha / size * total) ** beta


@op("MeanVarianceNormalization")
def _mvn(a: Attrs, x):
    dims = tuple(axis_of(v, x.ndim, a.where()) for v in a.get("axes", [0, 2, 3]))
    m = ember.mean(x, dim=dims, keepdim=True)
    v = ember.mean((x - m) ** 2, dim=dims, keepdim=True)
    return (x - m) / (ember.sqrt(v) + 1e-9)
