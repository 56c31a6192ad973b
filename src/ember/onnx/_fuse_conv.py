"""Convolutions of an imported graph as ``fused_conv2d`` calls on packed, channels-last weights.

A ``Conv`` (1-D or 2-D, no dilation, dense or depthwise) by a constant weight becomes one node
that calls ember.inference.ops' ``fused_conv2d``, as ``optimize_for_inference`` makes a
module tree's convolutions ``FusedConv2d``. The chain that follows the conv's output, while each
value in it has that one reader and is no graph output, is folded in:

- ``BatchNormalization`` (inference), and ``Mul``/``Div``/``Add``/``Sub`` by a constant that is
  one value per output channel (or a scalar): into the weight and bias (float64 maths);
- then an ``Add`` of another computed value: the residual of the GEMM's epilogue;
- then ``Relu``, ``Clip(0, 6)``, ``Clip(0, inf)``, ``HardSwish`` or SiLU (``x * Sigmoid(x)``,
  spelled out or not: the activation patterns are made single nodes first): its activation;
- then ``Mul``/``Div``/``Add``/``Sub`` by a scalar constant: the op's scale and shift.

The dense weight is a ``PackedWeight`` (the GEMM's panels, packed here once); the result is
channels-last, which the next fused conv, max pool or global pool reads in place, so a network's
activations stay NHWC from conv to conv and ops that care about layout (a reshape, a concat) make
the one copy they need. A residual whose run-time shape is not the conv's output shape (one that
broadcasts) is added after the conv instead, as the original ``Add`` would.

A ``ConvTranspose`` whose kernel equals its stride (no padding, group 1: an upsampling head)
computes one product over channels (the packed GEMM on a (C, kh*kw*O) weight, ReLU/ReLU6 in its
epilogue) and a parallel copy that interleaves the taps, or, with fewer than 16 output columns,
one direct loop (conv.conv_transpose); the chain after it (affine, BatchNormalization,
activation) folds in the same way. PP-OCRv4 det's two (2x2, 24 -> 24 channels at 160x160 and
24 -> 1 at 320x320, batch 1) took 3.0 and 2.3 ms as F.linear, a depth-to-space copy and a
separate ReLU; 1.8 and 0.43 ms this way (onnxruntime: 1.7 + 1.2 for its BatchNorm and ReLU, 0.43).
"""

from __future__ import annotations

import numpy as np

import ember
from ember import autograd as A
from ember import config
from ember.device import CPU
from ember.inference.ops import FusedConv, fused_conv2d
from ember.kernels.cpu import conv as K
from ember.kernels.cpu import gemm as G
from ember.kernels.cpu import have_numba
from ember.nn import functional as F
from ember.onnx._ops_conv import _geometry
from ember.onnx._optimize import Rewriter, fused_node
from ember.tensor import Tensor
from ember.threads import get_num_threads

_F32 = np.dtype(np.float32)
_TAP0 = np.zeros(1, np.int64)


def per_channel(c: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """A constant that broadcasts as one value per channel (dim 1 of rank-`rank` data) or a
    scalar, as a float64 (channels,) array; None for any other shape."""
    if c.ndim > rank or c.dtype.kind != "f":
        return None
    shape = (1,) * (rank - c.ndim) + tuple(c.shape)
    if any(s != 1 for i, s in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    v = c.astype(np.float64).reshape(-1)
    return np.broadcast_to(v, (channels,)).copy()


def _other(nd, name: str) -> str | None:
    """The input of a two-input node that is not name (None when both are, or it has not two)."""
    if len(nd.inputs) != 2 or nd.inputs.count(name) != 1:
        return None
    return nd.inputs[1] if nd.inputs[0] == name else nd.inputs[0]


def _bn(rw: Rewriter, m, channels: int):
    """(scale, shift) of an inference BatchNormalization with constant parameters, or None."""
    if len(m.inputs) != 5 or m.attrs.get("training_mode", 0) or any(m.outputs[1:]):
        return None
    if m.attrs.opset < 9 and not m.attrs.get("spatial", 1):
        return None
    vals = [rw.const(n) for n in m.inputs[1:]]
    if any(v is None or v.shape != (channels,) or v.dtype.kind != "f" for v in vals):
        return None
    gamma, beta, mean, var = (v.astype(np.float64) for v in vals)
    s = gamma / np.sqrt(var + m.attrs.get("epsilon", 1e-5))
    return s, beta - mean * s


def _act(rw: Rewriter, m) -> str | None:
    """The fused activation of a Relu ("relu") or a Clip to [0, 6] ("relu6") or [0, inf), or None."""
    if m.op == "Relu":
        return "relu"
    if m.op != "Clip":
        return None
    if m.attrs.opset < 11:
        lo, hi = m.attrs.get("min", None), m.attrs.get("max", None)
    else:
        bounds = []
        for n in (m.inputs[1:] + ["", ""])[:2]:
            if not n:
                bounds.append(None)
                continue
            v = rw.const(n)
            if v is None or v.size != 1:
                return None
            bounds.append(float(v.reshape(-1)[0]))
        lo, hi = bounds
    if lo == 0.0 and hi == 6.0:
        return "relu6"
    if lo == 0.0 and (hi is None or hi == float("inf")):
        return "relu"
    return None


_ACT_OPS = {"HardSwish": "hardswish", "Silu": "silu"}  # single-node activations (onnx, or fused)
_SEEN_MAX = 64  # input shapes a fused conv node remembers (more: checked every call)
_ACT_FNS = {"relu": F.relu, "relu6": F.relu6, "hardswish": F.hardswish, "silu": F.silu}


class _ConvRun:
    """The fused node's function: act(conv'(x) + b' [+ residual]) * post_scale + post_shift."""

    def __init__(self, conv_at, w: Tensor, b: Tensor, groups: int, act: str | None, nd: int,
                 post: tuple[float, float] = (1.0, 0.0)) -> None:  # fmt: skip
        self.conv_at, self.w, self.b = conv_at, w, b
        self.groups, self.act, self.one_d = groups, act, nd == 1
        self.scale, self.shift = post
        self.k = list(w.shape[2:]) if nd == 2 else [w.shape[3]]
        # (input shape, dtype, residual's) -> (kept, fused_conv2d's keywords); kept: None (not
        # tried yet) or (thread count, its conv.KeptConv or None where it has none)
        self._seen: dict = {}
        # what conv.KeptConv repeats: the packed GEMM's pooled call with ReLU/ReLU6 or nothing
        # after it (hard swish, SiLU and the scale/shift run after the GEMM, 1-D convs reshape)
        self.keeps = (nd == 2 and groups == 1 and act in (None, "relu", "relu6")
                      and post == (1.0, 0.0) and G.packed_panels(w._data) is not None)  # fmt: skip
        self.donate = False  # the residual dies here: the GEMM may write over it (donate())

    def __call__(self, at, x: Tensor, res: Tensor | None = None) -> Tensor:
        # the common case, a float32 input of a shape seen before (and a residual of the
        # output's shape): its KeptConv (conv.KeptConv: the pooled GEMM's job rerun, ~1 us of
        # Python against ~6 through the op), else FusedConv.apply with the keywords
        # fused_conv2d checked and built then (~3 us a call of geometry and checks)
        d = x._data  # (the arrays' shapes: Tensor.shape makes an ember.Size, ~0.1 us each)
        key = (d.shape, d.dtype, None if res is None else (res._data.shape, res._data.dtype))
        hit = self._seen.get(key)
        if hit is None:
            y, kw = self._run(x, res)
            if kw is not None and x._data.dtype == _F32 and len(self._seen) < _SEEN_MAX:
                self._seen[key] = (None, kw)
            return y
        kept, kw = hit
        threads = get_num_threads()
        if kept is not None and kept[0] == threads:
            if kept[1] is not None and _plain(x, res):
                return Tensor._wrap(kept[1](d, None if res is None else res._data))
        elif self.keeps and _plain(x, res):  # the second call (at this thread count): keep it
            y, k = K.keep_conv(lambda: self._seen_call(x, res, kw))
            self._seen[key] = ((threads, k), kw)
            return y
        return self._seen_call(x, res, kw)

    def _seen_call(self, x: Tensor, res: Tensor | None, kw: dict) -> Tensor:
        """The op on an input of a shape seen before (kw: its fused_conv2d keywords)."""
        if self.one_d:
            x = x.unsqueeze(2)
            res = None if res is None else res.unsqueeze(2) if res.ndim == 3 else res
            y = FusedConv.apply(x, self.w, self.b, **kw) if res is None else (
                FusedConv.apply(x, self.w, self.b, res, **kw))  # fmt: skip
            return y.squeeze(2)
        if res is None:
            return FusedConv.apply(x, self.w, self.b, **kw)
        if self.donate and not ember.is_grad_enabled():  # autograd may keep the residual
            y = K.fused_conv2d_over_residual(x._data, self.w._data, self.b._data,
                                             res._data, **kw)  # fmt: skip
            if y is not None:
                return Tensor._wrap(y)
        return FusedConv.apply(x, self.w, self.b, res, **kw)

    def _run(self, x: Tensor, res: Tensor | None) -> tuple[Tensor, dict | None]:
        """The node's result, and fused_conv2d's keywords when it ran as one call."""
        s, _, lo, hi = _geometry(self.conv_at, list(x.shape[2:]), self.k)
        if self.one_d:
            x, stride, pads = x.unsqueeze(2), (1, s[0]), (0, 0, lo[0], hi[0])
        else:
            stride, pads = tuple(s), (lo[0], hi[0], lo[1], hi[1])
        w, b, g, act, sc, sh = self.w, self.b, self.groups, self.act, self.scale, self.shift
        if res is not None:
            r = res.unsqueeze(2) if self.one_d and res.ndim == 3 else res
            if tuple(r.shape) != self._out_shape(x, stride, pads) or r.dtype != x.dtype:
                y = fused_conv2d(x, w, b, None, stride, pads, g, None)
                y = (y.squeeze(2) if self.one_d else y) + res  # broadcasts, as the Add did
                y = y if act is None else _ACT_FNS[act](y)
                return (y if sc == 1.0 and sh == 0.0 else y * sc + sh), None
            res = r
        y = fused_conv2d(x, w, b, res, stride, pads, g, act, sc, sh)
        kw = dict(stride=tuple(int(v) for v in stride), pads=tuple(int(v) for v in pads),
                  groups=int(g), act=act)  # fmt: skip
        if sc != 1.0 or sh != 0.0:
            kw.update(scale=float(sc), shift=float(sh))
        return (y.squeeze(2) if self.one_d else y), kw

    def _out_shape(self, x: Tensor, stride, pads) -> tuple:
        n, _, h, wd = x.shape
        o, _, kh, kw = self.w.shape
        (sh, sw), (pt, pb, pl, pr) = stride, pads
        return (n, o, (h + pt + pb - kh) // sh + 1, (wd + pl + pr - kw) // sw + 1)


def _plain(x: Tensor, res: Tensor | None) -> bool:
    """Whether a call may take its node's KeptConv: what FusedConv.apply would run is the kernel
    it kept (on the CPU, kernels on, the pool on), with nothing to record (no gradient, no
    autograd tape)."""
    return (
        x._device is CPU and (res is None or res._device is CPU) and not A._grad_enabled
        and not A._tapes and G.USE_POOL and config.KERNELS != "reference"
    )  # fmt: skip


def _post(rw: Rewriter, m, out: str, post: tuple[float, float]) -> tuple[float, float] | None:
    """(scale, shift) after m, a Mul/Div/Add/Sub of out by a scalar constant; else None."""
    other = _other(m, out) if m.op in ("Mul", "Div", "Add", "Sub") else None
    c = None if other is None else rw.const(other)
    if c is None or c.size != 1 or c.dtype.kind != "f" or c.ndim > 4:
        return None
    v, (s, t) = float(c.reshape(-1)[0]), post
    if m.op == "Mul":
        return s * v, t * v
    if m.op == "Add":
        return s, t + v
    if m.inputs[0] != out or (m.op == "Div" and v == 0.0):
        return None
    return (s / v, t / v) if m.op == "Div" else (s, t - v)


def _weight(w4: np.ndarray, pack: bool, depthwise: bool = False) -> Tensor:
    t = Tensor._wrap(w4)
    if pack:  # set directly: wrapping would make it a plain array
        t._data = G.PackedWeight(w4)
    elif depthwise:  # its "panels": the (kh, kw, C) layout conv's depthwise kernel reads
        t._data = G.PackedWeight(w4, np.ascontiguousarray(w4[:, 0].transpose(1, 2, 0)))
    return t


def _chain(rw: Rewriter, i: int, o: int, rank: int, shift: np.ndarray, residual: bool):
    """What follows node i's output that its fused node takes (see the module docstring):
    (nodes, output, residual, activation, (scale, shift) after it, per-channel scale, shift)."""
    scale = np.ones(o)
    nd = rw.nodes[i]
    idxs, out, res, act, post = [i], nd.outputs[0], None, None, None
    while True:
        j = rw.sole_user(out)
        m = rw.node(j)
        if m is None or not m.outputs or not m.outputs[0]:
            break
        if act is not None or post is not None:  # after the activation: a scalar scale/shift
            nxt = _post(rw, m, out, post or (1.0, 0.0))
            if nxt is None:
                break
            post = nxt
            idxs.append(j)
            out = m.outputs[0]
            continue
        a = None
        if m.inputs and m.inputs[0] == out:
            a = _ACT_OPS.get(m.op) if len(m.inputs) == 1 else None
            a = a or _act(rw, m)
        if a is not None:
            act = a
        elif res is None and m.op == "BatchNormalization" and m.inputs[0] == out:
            sb = _bn(rw, m, o)
            if sb is None:
                break
            scale, shift = scale * sb[0], shift * sb[0] + sb[1]
        elif m.op in ("Mul", "Div", "Add", "Sub") and res is None:
            other = _other(m, out)
            if other is None:
                break
            c = rw.const(other)
            v = None if c is None else per_channel(c, o, rank)
            if c is not None and v is None:
                break
            if v is None:  # a computed value: the residual (Add only)
                if m.op != "Add" or not residual:
                    break
                res = other
            elif m.op == "Mul":
                scale, shift = scale * v, shift * v
            elif m.op == "Div" and m.inputs[0] == out and np.all(v != 0):
                scale, shift = scale / v, shift / v
            elif m.op == "Add":
                shift = shift + v
            elif m.op == "Sub" and m.inputs[0] == out:
                shift = shift - v
            else:
                break
        else:
            break
        idxs.append(j)
        out = m.outputs[0]
    return idxs, out, res, act, post, scale, shift


def _fuse_one(rw: Rewriter, i: int) -> None:
    nd = rw.nodes[i]
    if len(nd.inputs) < 2 or not nd.outputs[0]:
        return
    w = rw.const(nd.inputs[1])
    b = rw.const(nd.inputs[2]) if len(nd.inputs) > 2 and nd.inputs[2] else None
    if w is None or w.dtype != _F32 or w.ndim not in (3, 4):
        return
    if len(nd.inputs) > 2 and nd.inputs[2] and (b is None or b.shape != w.shape[:1]):
        return
    at = nd.attrs
    sp = w.ndim - 2
    if list(at.get("kernel_shape", w.shape[2:])) != list(w.shape[2:]):
        return
    if any(d != 1 for d in at.get("dilations", [1] * sp)):
        return
    o, cg = w.shape[:2]
    g = at.get("group", 1)
    depthwise = g > 1 and cg == 1 and o == g
    if g != 1 and not depthwise:
        return
    if not (have_numba() if depthwise else G.microkernels_available()):
        return
    rank = w.ndim
    shift0 = np.zeros(o) if b is None else b.astype(np.float64)
    idxs, out, res, act, post, scale, shift = _chain(rw, i, o, rank, shift0, residual=True)
    if np.all(scale == 1.0):
        wf = w
    else:
        wf = (w.astype(np.float64) * scale.reshape(-1, *([1] * (rank - 1)))).astype(_F32)
    w4 = wf if sp == 2 else wf[:, :, None, :]
    wt = _weight(np.ascontiguousarray(w4), pack=not depthwise, depthwise=depthwise)
    bt = Tensor._wrap(shift.astype(_F32))
    run = _ConvRun(at, wt, bt, g, act, sp, post or (1.0, 0.0))
    inputs = [nd.inputs[0]] + ([res] if res is not None else [])
    rw.replace(idxs, fused_node("FusedConv", inputs, [out], run, nd))


# transposed convs with fewer output columns (kh*kw*O) than this run on conv.conv_transpose's
# direct loop: the GEMM's 32-column panel would be mostly padding (PP-OCRv4 det's last one, 4
# columns at 320x320 -> 640x640: GEMM + depth-to-space 2.3 ms, the loop ~0.5)
CT_DIRECT_BELOW = 16


class _ConvTransposeRun:
    """A stride-k, kernel-k transposed conv: one product over channels, then depth-to-space.

    Output pixel (i*kh + a, j*kw + b) of channel o is sum_c x[c, i, j] w[c, o, a, b]: no two
    input pixels reach the same output pixel, so the op is x (pixels, C) @ W (C, kh*kw*O) on the
    packed GEMM (ReLU/ReLU6 in its epilogue) and a parallel copy that interleaves the taps into
    the channels-last result; narrow outputs take conv.conv_transpose's direct loop instead.
    """

    def __init__(self, wm: np.ndarray, bias: np.ndarray, k: tuple, o: int, act, post,
                 replay) -> None:  # fmt: skip
        (kh, kw), self.c = k, wm.shape[1]
        self.k, self.o, self.act, self.replay, self.bias = k, o, act, replay, bias
        self.scale, self.shift = post
        self.direct = kh * kw * o < CT_DIRECT_BELOW
        if self.direct:  # (kh, kw*O, C): each output column's weights contiguous
            self.w = np.ascontiguousarray(wm.reshape(kh, kw * o, self.c))
        else:
            self.w = G.PackedWeight(np.ascontiguousarray(wm)).panels
        self._rows: dict = {}

    def __call__(self, at, x: Tensor) -> Tensor:
        if x.ndim != 4 or x.dtype != ember.float32 or x.shape[1] != self.c:
            return self.replay(x)
        n, c, h, wd = x.shape
        (kh, kw), o = self.k, self.o
        a = K.nhwc(x._data)
        out = np.empty((n, h * kh, wd * kw, o), _F32)
        sigmoid = self.act == "sigmoid"  # (never with a scale and shift: _fuse_transpose)
        code = 0 if sigmoid else K.ACTS[self.act]
        fused = code if code <= 2 else 0  # hard swish, SiLU: after, with the scale and shift
        if self.direct:
            K.conv_transpose(a, self.w, self.bias, out, fused)
        else:
            m = n * h * wd
            rows = self._rows.get(m)
            if rows is None:
                self._rows = {m: np.arange(m, dtype=np.int64) * c}  # the last batch size only
                rows = self._rows[m]
            y = np.empty((m, kh * kw * o), _F32)
            span = (0, max(m - 1, 0) * c)
            G.gemm(a.reshape(-1), rows, _TAP0, c, self.w, self.bias, None, fused, y, span)
            from ember.kernels.cpu import nhwc

            nhwc.depth_to_space(
                y.reshape(n * h, wd, kh, kw * o), out.reshape(n * h, kh, wd, kw * o)
            )
        K._post(out, code, self.scale, self.shift)
        if sigmoid:  # in place, on numpy's vector exp (ember.sigmoid: 0.6 ms at 640x640, this 0.23)
            np.negative(out, out=out)
            with np.errstate(over="ignore"):  # exp(-x) = inf: 1 / inf = 0, as the op's
                np.exp(out, out=out)
            out += 1
            np.reciprocal(out, out=out)
        return Tensor._wrap(K.channels_last(out))


def _fuse_transpose(rw: Rewriter, i: int) -> None:
    """ConvTranspose with kernel == stride, no padding, group 1, by a constant weight."""
    nd = rw.nodes[i]
    if len(nd.inputs) < 2 or not nd.outputs[0] or not G.microkernels_available():
        return
    w = rw.const(nd.inputs[1])
    b = rw.const(nd.inputs[2]) if len(nd.inputs) > 2 and nd.inputs[2] else None
    if w is None or w.dtype != _F32 or w.ndim != 4 or 0 in w.shape:
        return
    c, o, kh, kw = w.shape
    if len(nd.inputs) > 2 and nd.inputs[2] and (b is None or b.shape != (o,)):
        return
    at = nd.attrs
    if at.get("group", 1) != 1 or "output_shape" in at:
        return
    if list(at.get("kernel_shape", [kh, kw])) != [kh, kw] or list(at.get("strides", [1, 1])) != [
        kh,
        kw,
    ]:
        return
    if list(at.get("dilations", [1, 1])) != [1, 1]:
        return
    if any(at.get("pads", [0] * 4)) or any(at.get("output_padding", [0, 0])):
        return
    if at.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return
    shift0 = np.zeros(o) if b is None else b.astype(np.float64)
    idxs, out, _, act, post, scale, shift = _chain(rw, i, o, 4, shift0, residual=False)
    j = rw.sole_user(out)
    sig = rw.node(j)
    if act is None and post is None and sig is not None and sig.op == "Sigmoid" and sig.outputs[0]:
        idxs, out, act = [*idxs, j], sig.outputs[0], "sigmoid"  # the detector's probability map
    wf = w.astype(np.float64) * scale.reshape(1, -1, 1, 1)
    wm = np.ascontiguousarray(wf.transpose(2, 3, 1, 0).reshape(kh * kw * o, c).astype(_F32))
    bias = np.tile(shift, kh * kw).astype(_F32)
    from ember.onnx._fuse_dense import Replay

    order = sorted(idxs)
    replay = Replay([rw.nodes[k] for k in order], [nd.inputs[0]], out, rw.consts)
    run = _ConvTransposeRun(wm, bias, (kh, kw), o, act, post or (1.0, 0.0), replay)
    rw.replace(idxs, fused_node("FusedConvTranspose", [nd.inputs[0]], [out], run, nd))


# channels-last pools of at most this many floats are one numpy float64 sum on the calling
# thread (ResNet-50 b1's 7x7x2048: 62-65 us in the pass against 80-83 through K.channel_mean,
# whose one task went to the pool; ad-hoc timing of the node's call)
SMALL_POOL = 1 << 18


class _PoolFlatten:
    """GlobalAveragePool then Flatten(axis=1): (N, C, ...) -> (N, C), one node.

    A classifier's tail (ResNet-50's, MobileNetV2's) is GlobalAveragePool -> Flatten -> Gemm.
    In a whole pass a node's Python runs cold (the convs' weights have streamed through the
    caches): the Flatten, 2.5 us alone, took ~28 us in ResNet-50 b1's pass and the pool ~85
    against 12 alone (ad-hoc timings of each node's call, medians of 20 passes). As one node:
    ResNet-50 116 -> 62 us, MobileNetV2 82 -> 49. A channels-last input (the last fused conv's
    result) is summed in place; any other goes through the two ops.
    """

    __slots__ = ("gap", "flat", "gap_at", "flat_at")

    def __init__(self, gap, flat) -> None:
        self.gap, self.flat = gap.fn, flat.fn
        self.gap_at, self.flat_at = gap.attrs, flat.attrs

    def __call__(self, at, x):
        d = x._data
        if d.dtype == _F32 and d.ndim == 4 and d.transpose(0, 2, 3, 1).flags.c_contiguous:
            n, c, h, w = d.shape
            x3 = d.transpose(0, 2, 3, 1).reshape(n, h * w, c)
            if x3.size <= SMALL_POOL and h * w:
                return Tensor._wrap((x3.sum(axis=1, dtype=np.float64) / (h * w)).astype(_F32))
            return Tensor._wrap(K.channel_mean(x3))
        return self.flat(self.flat_at, self.gap(self.gap_at, x))


def _fuse_pool_flatten(rw: Rewriter, i: int) -> None:
    nd = rw.nodes[i]
    j = rw.sole_user(nd.outputs[0]) if nd.outputs and nd.outputs[0] else None
    fl = rw.node(j)
    if fl is None or fl.op != "Flatten" or fl.attrs.get("axis", 1) != 1 or not fl.outputs[0]:
        return
    if fl.inputs[0] != nd.outputs[0]:
        return
    run = _PoolFlatten(nd, fl)
    rw.replace(
        [i, j], fused_node("GlobalAveragePoolFlatten", [nd.inputs[0]], [fl.outputs[0]], run, nd)
    )


class _ConvMaxPool:
    """A fused conv then the ``MaxPool`` that alone reads its result (ResNet's stem), one node.

    Where kernels.cpu.stem applies (64 output channels, a contiguous NCHW float32 image, a
    3x3 stride-2 pool, a ReLU or ReLU6 between; AVX-512), the node is one call of its
    kernel from a shape's second call on: a direct conv read from the image, each conv row
    pooled while it is in cache (the conv's 3.2 MB output never made). ResNet-50 b1's stem in
    the pass, one process alternating the two paths pass by pass (medians of 30-40 passes,
    ad hoc, several runs): 1 thread 1.07-1.15 -> 0.98-1.04 ms, 2 threads 0.62-0.69 -> 0.50-0.58
    (the conv on the GEMM over a padded NHWC copy, then the pool over its result; onnxruntime's
    profile: conv 0.94 / 0.49 + pool 0.07 / 0.04).

    Otherwise the pool runs kernels.cpu.conv's NHWC max pool straight on the conv's
    channels-last result, its output geometry worked out once per input shape. Two nodes cost
    two rounds of the graph loop's and the pool op's Python (F.max_pool2d's argument checks,
    the op's apply, the kernel registry), which in a whole pass runs cold: ResNet-50 b1's pool
    node took ~140-165 us in the pass around a ~80-100 us kernel call (ad-hoc timings of each
    node's call, medians of 30 passes, 1 and 2 threads). Any other input (not float32, not
    channels-last, or one that records a gradient) goes through the pool node's own function.
    """

    __slots__ = ("conv", "conv_at", "pool", "pool_at", "k", "_geo", "_stems")

    def __init__(self, conv, pool) -> None:
        self.conv, self.conv_at, self.pool, self.pool_at = conv.fn, conv.attrs, pool.fn, pool.attrs
        self.k = list(pool.attrs.get("kernel_shape"))
        self._geo: dict = {}  # conv output shape -> (out shape, stride, pads) of the pool
        self._stems: dict = {}  # (input shape, dtype, threads) -> stem.Plan, or False

    def __call__(self, at, x):
        if _plain(x, None):  # the stem kernel, where it applies (nothing to record)
            d = x._data
            key = (d.shape, d.dtype, get_num_threads())
            plan = self._stems.get(key)
            if plan is None:
                plan = self._stem(d, key[-1])
                if plan is not None and len(self._stems) < _SEEN_MAX:
                    self._stems[key] = plan
            if plan and d.flags.c_contiguous:
                return Tensor._wrap(K.channels_last(plan.run(d)))
        y = self.conv(self.conv_at, x)
        d = y._data
        if (
            d.dtype != _F32
            or d.ndim != 4
            or not d.transpose(0, 2, 3, 1).flags.c_contiguous
            or y.requires_grad  # the op records the pool's backward (whatever the layout)
        ):
            return self.pool(self.pool_at, y)
        geo = self._geo.get(d.shape)
        if geo is None:
            z = self.pool(self.pool_at, y)  # the op's own geometry (ceil_mode included)
            s, _, lo, _ = _geometry(self.pool_at, list(d.shape[2:]), self.k)
            if len(self._geo) < _SEEN_MAX:
                self._geo[d.shape] = (z.shape[0], z.shape[2], z.shape[3], z.shape[1]), s, lo
            return z
        shape, s, lo = geo
        o = np.empty(shape, _F32)
        K.maxpool_nhwc(d.transpose(0, 2, 3, 1), o, *self.k, *s, *lo)
        return Tensor._wrap(K.channels_last(o))

    def _stem(self, d: np.ndarray, threads: int):
        """kernels.cpu.stem's Plan for input d's shape, False where it does not apply, or None
        while the pool's geometry for it is not known yet (the first call works it out)."""
        from ember.kernels.cpu import stem

        run = self.conv
        if (
            d.dtype != _F32 or d.ndim != 4 or run.one_d or run.groups != 1 or self.k != [3, 3]
            or run.act not in ("relu", "relu6") or (run.scale, run.shift) != (1.0, 0.0)
            or tuple(run.w.shape[:2]) != (stem.O, d.shape[1]) or stem.state() is None
        ):  # fmt: skip
            return False
        s, _, lo, hi = _geometry(run.conv_at, list(d.shape[2:]), run.k)
        pads = (lo[0], hi[0], lo[1], hi[1])
        (kh, kw), (n, _, h, w) = run.k, d.shape
        oh, ow = (h + lo[0] + hi[0] - kh) // s[0] + 1, (w + lo[1] + hi[1] - kw) // s[1] + 1
        geo = self._geo.get((n, stem.O, oh, ow))
        if geo is None:
            return None
        (_, ph, pw, _), qs, qlo = geo
        if not stem.applies(d.shape, run.w.shape, s, pads, qs, qlo, (ph, pw)):
            return False
        return stem.Plan(d.shape, np.asarray(run.w._data), run.b._data, s, pads, K.ACTS[run.act],
                         qlo, (ph, pw), threads)  # fmt: skip


def _fuse_conv_max_pool(rw: Rewriter, i: int) -> None:
    nd = rw.nodes[i]
    if len(nd.inputs) != 1 or not isinstance(nd.fn, _ConvRun) or nd.fn.one_d:
        return
    j = rw.sole_user(nd.outputs[0]) if nd.outputs[0] else None
    mp = rw.node(j)
    if mp is None or mp.op != "MaxPool" or mp.inputs[0] != nd.outputs[0] or not mp.outputs[0]:
        return
    at = mp.attrs
    k = list(at.get("kernel_shape", []))
    if len(k) != 2 or (len(mp.outputs) > 1 and mp.outputs[1]):
        return  # 2-D pools without the Indices output only
    if at.get("auto_pad", "NOTSET") != "NOTSET" or any(v != 1 for v in at.get("dilations", [1, 1])):
        return
    p = list(at.get("pads", [0, 0, 0, 0]))
    if len(p) != 4 or p[:2] != p[2:] or any(v < 0 or v > kk // 2 for v, kk in zip(p, k)):
        return  # F.max_pool2d's symmetric pads of at most half the kernel (the kernel's case)
    run = _ConvMaxPool(nd, mp)
    rw.replace([i, j], fused_node("FusedConvMaxPool", [nd.inputs[0]], [mp.outputs[0]], run, nd))


def fuse(rw: Rewriter) -> None:
    """Make every suitable Conv (and the chain it heads) one fused node, then each
    [1x1 ->] depthwise -> 1x1 chain of them one block (``_fuse_block``), and a
    GlobalAveragePool -> Flatten pair one node, and a conv whose result only a MaxPool reads
    one node with it."""
    for i, nd in enumerate(rw.nodes):
        if nd is not None and nd.op == "Conv":
            _fuse_one(rw, i)
        elif nd is not None and nd.op == "ConvTranspose":
            _fuse_transpose(rw, i)
    for i, nd in enumerate(rw.nodes):
        if nd is not None and nd.op == "GlobalAveragePool":
            _fuse_pool_flatten(rw, i)
    from ember.onnx import _fuse_block

    _fuse_block.fuse(rw)  # then MobileNetV2's inverted-residual blocks: one node each
    for i, nd in enumerate(rw.nodes):
        if nd is not None and nd.op == "FusedConv":
            _fuse_conv_max_pool(rw, i)


def donate(graph) -> None:
    """Mark the fused convs whose residual dies with them (``_ConvRun.donate``): their GEMM
    writes its output over the residual (kernels.cpu.conv.fused_conv2d_over_residual).

    A normally stored output first reads each of its lines in, and ResNet-50 b8's 56x56x256
    residual blocks (25.7 MB out, 25.7 MB residual) paid that read on top of the residual's:
    written over the residual, each line is read once and written back. The residual must be
    a fused conv's own output (a fresh array, no other value a view of it), not a graph input
    or output, read only by fused convs (none keeps a view of it), this node its last reader,
    and not also its conv's input.
    """
    from ember.onnx._graph import _subgraphs

    nodes = graph.nodes
    if any(_subgraphs(nd) for nd in nodes):
        return  # values read inside subgraphs: not worth following
    producer = {o: nd for nd in nodes for o in nd.outputs if o}
    readers: dict[str, list] = {}
    for nd in nodes:
        for name in nd.inputs:
            readers.setdefault(name, []).append(nd)
    last = graph._liveness()
    keep = set(graph.outputs) | set(graph.inputs) | set(graph.constants)
    for i, nd in enumerate(nodes):
        run = nd.fn
        if nd.op != "FusedConv" or not isinstance(run, _ConvRun) or len(nd.inputs) != 2:
            continue
        r = nd.inputs[1]
        src = producer.get(r)
        if not r or r in keep or r == nd.inputs[0] or last.get(r) != i or src is None:
            continue
        if src.op != "FusedConv" or not isinstance(src.fn, _ConvRun):
            continue
        if all(u.op == "FusedConv" and isinstance(u.fn, _ConvRun) for u in readers[r]):
            run.donate = True
