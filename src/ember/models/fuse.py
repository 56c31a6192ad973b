"""Inference-time rewrites: fold BatchNorm into convolutions, fuse activations, go channels-last.

    model = ember.models.vision.resnet50(weights="resnet50.pth").eval()
    fast = optimize_for_inference(model)      # a new module; `model` is left as it was
    logits = fast(images)                      # same numbers (to float32 rounding), less time

What it does:
- Conv2d followed by BatchNorm2d (eval statistics) becomes one FusedConv2d whose weight and bias
  are the folded ones; a ReLU/ReLU6 right after is fused into its epilogue. Residual blocks that
  define ``fuse_for_inference()`` (ResNet, MobileNetV2, EfficientNet) fuse their residual add
  into the epilogue of their last conv as well.
- Activations are kept channels-last: a FusedConv2d returns a tensor of the usual logical shape
  (N, C, H, W) whose memory is NHWC (torch's ``channels_last``), so any ember op downstream reads
  it correctly, and the next fused conv uses it without a copy.
- Convolutions and linear layers run on ember's packed-weight GEMM
  (ember.kernels.cpu.sgemm): the weight is packed into panels once, here; on NHWC data a
  kxk convolution reads its (zero-padded) input in place, each tap a fixed offset from the output
  pixel's window (no im2col), and bias, residual and activation are applied as each output tile
  is stored. Only convs with few input channels (the RGB stem) go through an im2col buffer.
  Depthwise convolutions and max pooling are numba kernels (kernels.conv_nhwc) parallel over
  output rows. Without numba or AVX2 the GEMMs fall back to im2col + numpy's BLAS.
- Float32 inference only: the fused model records no autograd graph (it is not for training).

The rewrite walks the module tree: a module with ``fuse_for_inference()`` is replaced by what that
returns; in a Sequential, (Conv2d, BatchNorm2d[, ReLU/ReLU6]) runs are fused and MaxPool2d /
AdaptiveAvgPool2d(1) get channels-last versions; other Conv2d and Linear layers become their
fused forms; everything else is kept as it is.
"""

from __future__ import annotations

import copy
import threading

import numpy as np

from ember import nn
from ember.autograd import no_grad
from ember.errors import UnsupportedError
from ember.kernels.cpu import conv_nhwc as K
from ember.kernels.cpu import dense
from ember.kernels.cpu import sgemm as G
from ember.kernels.cpu.tiles import blas_single_thread
from ember.tensor import Tensor

_F32 = np.dtype(np.float32)
_buffers = threading.local()
MAX_CACHED = 32  # scratch buffers per thread, offset tables per layer (one per input geometry)


def _buffer(key: tuple, shape: tuple) -> np.ndarray:
    """A per-thread float32 scratch array for `key`, zeroed when first made, reused after."""
    bufs = getattr(_buffers, "d", None)
    if bufs is None:
        bufs = _buffers.d = {}
    buf = bufs.get(key)
    if buf is None:
        if len(bufs) >= MAX_CACHED:  # many input sizes (a server): start over, don't grow
            bufs.clear()
        buf = bufs[key] = np.zeros(shape, _F32)
    return buf


def _padded(a: np.ndarray, pt: int, pb: int, pl: int, pr: int) -> np.ndarray:
    """a (N, H, W, C) copied inside a zero border (the border of a reused buffer stays zero)."""
    n, h, w, c = a.shape
    buf = _buffer(("pad", *a.shape, pt, pb, pl, pr), (n, h + pt + pb, w + pl + pr, c))
    buf[:, pt : pt + h, pl : pl + w] = a
    return buf


WINDOW_ROWS_BELOW_CHANNELS = 16  # kxk convs with fewer input channels run on window rows


def _window_rows(xp: np.ndarray, kw: int, sw: int, ow: int) -> np.ndarray:
    """(N, Hp, Wp, C) -> (N, Hp, OW, kw*C): each output column's window row, contiguous.

    With few channels a tap is only C floats of GEMM depth; on these rows a kxk conv becomes a
    kx1 one whose taps are kw*C deep (an im2col along the width only: kw times the input, not
    kh*kw times).
    """
    n, hp, wp, c = xp.shape
    s = xp.strides
    v = np.lib.stride_tricks.as_strided(xp, (n, hp, ow, kw * c), (s[0], s[1], sw * s[2], s[3]))
    return K.copy4d(v, _buffer(("rows", *v.shape), v.shape))


def window_offsets(shape, kernel, stride, oh: int, ow: int) -> tuple[np.ndarray, np.ndarray]:
    """Offsets into an (N, H, W, C) array of each output pixel's window origin and of each tap."""
    n, h, w, c = shape
    (kh, kw), (sh, sw), i8 = kernel, stride, np.int64
    b, y, x = np.ix_(np.arange(n, dtype=i8), np.arange(oh, dtype=i8), np.arange(ow, dtype=i8))
    rowoff = (((b * h + y * sh) * w + x * sw) * c).reshape(-1)
    tapoff = np.array([(i * w + j) * c for i in range(kh) for j in range(kw)], i8)
    return rowoff, tapoff


def nhwc(x: Tensor) -> np.ndarray:
    """The (N, H, W, C) contiguous float32 array behind an (N, C, H, W) tensor (copy if needed)."""
    a = x._data
    if a.ndim != 4:
        raise UnsupportedError(f"fused conv: expected a 4-D (N, C, H, W) input, got {a.shape}")
    t = a.transpose(0, 2, 3, 1)
    if t.dtype != _F32:
        t = t.astype(_F32)
    return t if t.flags.c_contiguous else np.ascontiguousarray(t)


def channels_last(a: np.ndarray) -> Tensor:
    """An (N, C, H, W) tensor over an (N, H, W, C) array (torch's channels_last memory format)."""
    return Tensor._wrap(a.transpose(0, 3, 1, 2))


def tf_same_pads(size: int, k: int, s: int, d: int = 1) -> tuple[int, int]:
    """TensorFlow 'SAME' padding for one dim: (before, after), the extra pixel after."""
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2, total - total // 2


class FusedConv2d(nn.Module):
    """Conv2d with BatchNorm folded in, bias + residual + activation fused, NHWC in and out."""

    def __init__(
        self,
        weight: np.ndarray,
        bias: np.ndarray | None,
        stride=(1, 1),
        padding=(0, 0, 0, 0),
        groups: int = 1,
        act: str | None = None,
    ) -> None:
        super().__init__()
        o, cg, kh, kw = weight.shape
        self.out_channels, self.in_channels = o, cg * groups
        self.kernel_size, self.stride, self.groups = (kh, kw), tuple(stride), groups
        self.padding = padding  # (top, bottom, left, right) or "tf_same"
        self.act = act
        self._act = K.ACTS[act]
        self.depthwise = groups > 1 and groups == o and cg == 1
        w = np.asarray(weight, _F32)
        self.bias_np = np.ascontiguousarray(
            np.zeros(o, _F32) if bias is None else np.asarray(bias, _F32)
        )
        self.packed = None
        if self.depthwise:
            self.w_np = np.ascontiguousarray(w[:, 0].transpose(1, 2, 0))  # (kh, kw, C)
        elif groups == 1:
            w2 = np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(kh * kw * cg, o))
            nr = G.panel_width()  # the packed panels, or (K, O) for BLAS: one copy, not both
            self.packed = None if nr is None else G.pack_weight(w2, nr)
            self.w_np = w2 if self.packed is None else None
        else:
            raise UnsupportedError(
                f"FusedConv2d: grouped convolutions other than depthwise (groups={groups})"
            )
        self._geom: dict = {}

    def _pads(self, h: int, w: int) -> tuple:
        if self.padding == "tf_same":
            (kh, kw), (sh, sw) = self.kernel_size, self.stride
            return (*tf_same_pads(h, kh, sh), *tf_same_pads(w, kw, sw))
        return self.padding

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """act(conv(x) + bias [+ residual]), as a channels-last tensor."""
        a = nhwc(x)
        n, h, w, c = a.shape
        if c != self.in_channels:
            raise UnsupportedError(f"FusedConv2d: expected {self.in_channels} channels, got {c}")
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        pt, pb, pl, pr = self._pads(h, w)
        oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
        o, m = self.out_channels, n * oh * ow
        out = np.empty((n, oh, ow, o), _F32)
        res = None if residual is None else nhwc(residual).reshape(m, o)
        if self.depthwise:
            self._depthwise(a, out, res, (sh, sw, pt, pl))
            return channels_last(out)
        y = out.reshape(m, o)
        kk = kh * kw * c
        if self.packed is None:  # no microkernels (no numba, or no AVX2/FMA): im2col + BLAS
            if kh == kw == 1 and not (pt or pb or pl or pr):
                cols = np.ascontiguousarray(a[:, ::sh, ::sw]).reshape(m, c)
            else:
                cols = K.im2col(a, np.empty((m, kk), _F32), kh, kw, sh, sw, pt, pl, oh, ow)
            K.epilogue(np.matmul(cols, self.w_np, out=y), self.bias_np, res, self._act)
            return channels_last(out)
        src = _padded(a, pt, pb, pl, pr) if (pt or pb or pl or pr) else a
        if c < WINDOW_ROWS_BELOW_CHANNELS and kw > 1:  # few channels (the RGB stem): see below
            src = _window_rows(src, kw, sw, ow)
            key, geom = ("rows", n, h, w), ((kh, 1), (sh, 1))
        else:  # the GEMM reads the (padded) input in place, tap by tap
            key, geom = (n, h, w), ((kh, kw), (sh, sw))
        make = lambda: window_offsets(src.shape, *geom, oh, ow)  # noqa: E731
        if key not in self._geom and len(self._geom) >= MAX_CACHED:
            self._geom.clear()
        rowoff, tapoff = self._geom.get(key) or self._geom.setdefault(key, make())
        kc = kk // len(tapoff)
        G.gemm(src.reshape(-1), rowoff, tapoff, kc, self.packed, self.bias_np, res, self._act, y)
        return channels_last(out)

    def _depthwise(self, a, out, res, geom) -> None:
        sh, sw, pt, pl = geom
        act = self._act if res is None else 0
        K.depthwise(a, self.w_np, self.bias_np, out, sh, sw, pt, pl, act)
        if res is not None:
            o = out.shape[3]
            K.epilogue(out.reshape(-1, o), np.zeros(o, _F32), res, self._act)

    def extra_repr(self) -> str:
        """Channels, kernel, stride, padding, activation."""
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"
        s += f", stride={self.stride}, padding={self.padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s + (f", act={self.act}" if self.act else "")


def _padding_of(conv: nn.Conv2d):
    if getattr(conv, "tf_same", False):
        return "tf_same"
    p = conv.padding
    if isinstance(p, str):
        if p == "valid":
            return (0, 0, 0, 0)
        rp = conv._reversed_padding_repeated_twice  # (left, right, top, bottom)
        return (rp[2], rp[3], rp[0], rp[1])
    return (p[0], p[0], p[1], p[1])


def fold_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d | None) -> tuple[np.ndarray, np.ndarray | None]:
    """(weight, bias) of conv with an eval-mode BatchNorm folded in (float64 maths, float32 out)."""
    w = conv.weight._data.astype(np.float64)
    b = None if conv.bias is None else conv.bias._data.astype(np.float64)
    if bn is None:
        return w.astype(_F32), None if b is None else b.astype(_F32)
    if bn.running_mean is None:
        raise UnsupportedError("fold_bn: BatchNorm without running statistics cannot be folded")
    mean = bn.running_mean._data.astype(np.float64)
    var = bn.running_var._data.astype(np.float64)
    gamma = np.ones_like(mean) if bn.weight is None else bn.weight._data.astype(np.float64)
    beta = np.zeros_like(mean) if bn.bias is None else bn.bias._data.astype(np.float64)
    scale = gamma / np.sqrt(var + bn.eps)
    wf = w * scale[:, None, None, None]
    bf = beta + ((0.0 if b is None else b) - mean) * scale
    return wf.astype(_F32), bf.astype(_F32)


def fuse_conv_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d | None = None, act: str | None = None):
    """One FusedConv2d doing conv -> bn -> act (bn and act optional)."""
    if tuple(conv.dilation) != (1, 1) or conv.padding_mode != "zeros":
        raise UnsupportedError("fuse_conv_bn: dilated or non-zero-padded convs are not fused")
    w, b = fold_bn(conv, bn)
    return FusedConv2d(w, b, conv.stride, _padding_of(conv), conv.groups, act)


class FusedResidual(nn.Module):
    """act(convs(x) + shortcut(x)): the add and act run in the last conv's epilogue."""

    def __init__(self, convs: list, shortcut: nn.Module | None = None, act: str | None = None):
        super().__init__()
        *first, last = convs
        self.body = nn.Sequential(*first)
        self.last = last
        self.shortcut = shortcut
        last.act, last._act = act, K.ACTS[act]

    def forward(self, x: Tensor) -> Tensor:
        """The block's output (channels-last)."""
        identity = x if self.shortcut is None else self.shortcut(x)
        return self.last(self.body(x), residual=identity)


class MaxPool2dNHWC(nn.Module):
    """MaxPool2d over channels-last data (no dilation, no ceil_mode)."""

    def __init__(self, kernel_size, stride, padding) -> None:
        super().__init__()
        pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
        self.kernel_size, self.stride, self.padding = pair(kernel_size), pair(stride), pair(padding)

    def forward(self, x: Tensor) -> Tensor:
        """Window maxima; the result is channels-last."""
        a = nhwc(x)
        n, h, w, c = a.shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
        out = np.empty((n, oh, ow, c), _F32)
        K.maxpool(a, out, kh, kw, sh, sw, ph, pw)
        return channels_last(out)


class FusedLinear(nn.Module):
    """Linear on the fused path: the packed-weight GEMM (bias in its epilogue)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = dense.pack(linear.weight._data)  # packed once: the module is frozen
        b = linear.bias
        self.bias_np = np.zeros(self.out_features, _F32) if b is None else b._data.astype(_F32)

    def forward(self, x: Tensor) -> Tensor:
        """x @ W.T + b over the last dim."""
        a = x._data
        if a.shape[-1] != self.in_features:
            raise UnsupportedError(
                f"FusedLinear: expected {self.in_features} features, got {a.shape}"
            )
        y = dense.linear(a.reshape(-1, self.in_features), self.weight, self.bias_np)
        return Tensor._wrap(y.reshape(*a.shape[:-1], self.out_features))

    def extra_repr(self) -> str:
        """in_features, out_features."""
        return f"in_features={self.in_features}, out_features={self.out_features}"


class GlobalAvgPool2d(nn.Module):
    """AdaptiveAvgPool2d(1) over channels-last data: (N, C, H, W) -> (N, C, 1, 1)."""

    def forward(self, x: Tensor) -> Tensor:
        """Mean over H and W."""
        a = nhwc(x)
        n, h, w, c = a.shape
        return Tensor._wrap(a.reshape(n, h * w, c).mean(1, dtype=_F32).reshape(n, c, 1, 1))


def _act_name(m) -> str | None:
    if isinstance(m, nn.ReLU):
        return "relu"
    if isinstance(m, nn.ReLU6):
        return "relu6"
    if isinstance(m, nn.Hardtanh) and m.min_val == 0.0 and m.max_val == 6.0:
        return "relu6"
    return None


def _fusable_conv(m) -> bool:
    return (
        (type(m) is nn.Conv2d or getattr(m, "tf_same", False))
        and tuple(m.dilation) == (1, 1)
        and m.padding_mode == "zeros"
        and (m.groups == 1 or m.groups == m.in_channels == m.out_channels)
    )


def _rewrite_sequential(seq: nn.Sequential) -> None:
    names = list(seq._modules)
    i = 0
    while i < len(names):
        m = seq._modules[names[i]]
        nxt = [seq._modules[n] for n in names[i + 1 : i + 3]]
        if _fusable_conv(m):
            bn = nxt[0] if nxt and isinstance(nxt[0], nn.BatchNorm2d) else None
            after = nxt[1 if bn is not None else 0 : 2 if bn is not None else 1]
            act = _act_name(after[0]) if after else None
            seq._modules[names[i]] = fuse_conv_bn(m, bn, act)
            used = (bn is not None) + (act is not None)
            for k in range(1, used + 1):
                seq._modules[names[i + k]] = nn.Identity()
            i += used + 1
            continue
        seq._modules[names[i]] = _rewrite(m)
        i += 1


class OneThreadBLAS(nn.Module):
    """Runs `module` with numpy's BLAS on one thread (the fused layers inside use the pool)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module" or "module" not in self.__dict__.get("_modules", {}):
                raise
            return getattr(self._modules["module"], name)  # config, num_labels, ...

    def forward(self, *args, **kwargs):
        """module(*args, **kwargs) under blas_single_thread(), without autograd."""
        with blas_single_thread(), no_grad():
            return self.module(*args, **kwargs)


def fuse_children(m: nn.Module) -> nn.Module:
    """Apply the generic rewrites to m's children (for fuse_for_inference hooks); returns m."""
    for name, child in list(m._modules.items()):
        if child is not None:
            m._modules[name] = _rewrite(child)
    return m


def _rewrite(m: nn.Module) -> nn.Module:
    hook = getattr(m, "fuse_for_inference", None)
    if hook is not None:
        return hook()
    if isinstance(m, nn.Sequential):
        _rewrite_sequential(m)
        return m
    if type(m) is nn.MaxPool2d and m.dilation in (1, (1, 1)) and not m.ceil_mode:
        if not m.return_indices:
            return MaxPool2dNHWC(m.kernel_size, m.stride, m.padding)
    if type(m) is nn.AdaptiveAvgPool2d and m.output_size in (1, (1, 1)):
        return GlobalAvgPool2d()
    if _fusable_conv(m):
        return fuse_conv_bn(m)
    if type(m) is nn.Linear and m.weight._data.dtype.kind == "f":
        return FusedLinear(m)
    return fuse_children(m)


def optimize_for_inference(model: nn.Module, inplace: bool = False) -> nn.Module:
    """The model with BatchNorm folded, activations fused and channels-last kernels (eval mode).

    Returns a new module (the input is left untouched) unless inplace=True, in which case the
    input's submodules are rewritten and the result may still be a different object (a model
    with ``fuse_for_inference`` is replaced as a whole). The result computes the same function in
    float32, records no gradients and is meant for inference only.
    """
    if not inplace:
        model = copy.deepcopy(model)
    model.eval()
    with no_grad():
        out = _rewrite(model)
    out.eval()
    out.requires_grad_(False)
    return out
