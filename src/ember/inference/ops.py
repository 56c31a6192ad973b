"""The fused convolution op of optimized models: act(conv2d(x, w) + bias [+ residual]).

``fused_conv2d`` is an ordinary op: its ``forward`` is the numpy reference (ember.ops.conv's
convolution, then bias, residual, the activation and an optional scalar scale and shift) with a
``backward``, so it runs anywhere and trains; its kernels (kernels.cpu.conv, registered for
``fused_conv2d``) are the implicit GEMM on a ``PackedWeight`` (kernels.cpu.gemm) and the
channels-last depthwise kernel, both returning channels-last results (ReLU/ReLU6 in the GEMM's
epilogue; hard swish, SiLU and the scale/shift in one pass over the result after it). Without
numba or the microkernels the reference runs.
"""

from __future__ import annotations

import numpy as np

from ember.autograd import Function
from ember.errors import DTypeError, ShapeError
from ember.ops.conv import Geom, _conv_bwd, _conv_fwd, _out_size
from ember.tensor import Tensor

ACTS = (None, "relu", "relu6", "hardswish", "silu")


def tf_same_pads(size: int, k: int, s: int, d: int = 1) -> tuple[int, int]:
    """TensorFlow 'SAME' padding for one dim: (before, after), the extra pixel after."""
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2, total - total // 2


def _act(y: np.ndarray, act: str | None) -> np.ndarray:
    if act == "relu":
        np.maximum(y, 0, out=y)
    elif act == "relu6":
        np.clip(y, 0, 6, out=y)
    elif act in ("hardswish", "silu"):
        with np.errstate(over="ignore", invalid="ignore"):
            if act == "hardswish":
                y *= np.clip(y + 3, 0, 6) / 6
            else:
                y /= 1 + np.exp(-y)
    return y


def _act_grad(g: np.ndarray, y: np.ndarray, z: np.ndarray | None, act: str | None) -> np.ndarray:
    """g through the activation: y its output, z its input (kept for hard swish and SiLU)."""
    if act == "relu":
        return g * (y > 0)
    if act == "relu6":
        return g * ((y > 0) & (y < 6))
    if act == "hardswish":
        return g * np.where(z < -3, 0.0, np.where(z > 3, 1.0, (2 * z + 3) / 6)).astype(g.dtype)
    if act == "silu":
        with np.errstate(over="ignore"):
            s = 1 / (1 + np.exp(-z))
        return g * (s * (1 + z * (1 - s))).astype(g.dtype)
    return g


class FusedConv(Function):
    """act(conv2d(x, w, stride, pads, groups) + b [+ res]) on (N, C, H, W) float arrays."""

    kernel_op = "fused_conv2d"

    def forward(self, x, w, b, res=None, *, stride, pads, groups, act, scale=1.0, shift=0.0):
        self.geom = Geom(stride, (1, 1), pads, groups, 2, True)
        self.x, self.w = x, w
        y = _conv_fwd(x, np.asarray(w), self.geom)
        y += b[:, None, None]
        if res is not None:
            y += res
        self.z = y.copy() if act in ("hardswish", "silu") else None
        self.y = _act(y, act)
        self.act, self.scale = act, scale
        if scale != 1.0 or shift != 0.0:
            y = y * np.float32(scale) + np.float32(shift)
        return y

    def meta(self, x, w, b, res=None, *, stride, pads, groups, act, scale=1.0, shift=0.0):
        (sh, sw), (pt, pb, pl, pr) = stride, pads
        oh = _out_size(x.shape[2], w.shape[2], sh, 1, pt, pb)
        ow = _out_size(x.shape[3], w.shape[3], sw, 1, pl, pr)
        return (x.shape[0], w.shape[0], oh, ow), x.dtype

    def backward(self, g):
        if self.scale != 1.0:
            g = g * np.float32(self.scale)
        g = _act_grad(g, self.y, self.z, self.act)
        need = self.needs_input_grad
        w = np.asarray(self.w)
        gx, gw = _conv_bwd(self.x, w, g, self.geom, need[0], need[1])
        gw = None if gw is None else gw.reshape(w.shape)
        gb = g.sum((0, 2, 3)) if need[2] else None
        gres = g if len(need) > 3 and need[3] else None
        return gx, gw, gb, gres


def _pads(padding, x_hw, k, stride) -> tuple:
    if isinstance(padding, str):
        if padding != "tf_same":
            raise ValueError(f"fused_conv2d: padding must be ints or 'tf_same', got {padding!r}")
        return (*tf_same_pads(x_hw[0], k[0], stride[0]), *tf_same_pads(x_hw[1], k[1], stride[1]))
    p = (padding,) * 2 if isinstance(padding, int) else tuple(padding)
    return (p[0], p[0], p[1], p[1]) if len(p) == 2 else tuple(int(v) for v in p)


def fused_conv2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor,
    residual: Tensor | None = None,
    stride=1,
    padding=0,
    groups: int = 1,
    act: str | None = None,
    scale: float = 1.0,
    shift: float = 0.0,
) -> Tensor:
    """act(conv2d(input, weight, bias, stride, padding, groups=groups) [+ residual]) * scale + shift.

    input (N, C, H, W) float32; padding: an int, (h, w), (top, bottom, left, right) or
    "tf_same" (TensorFlow's SAME, from the input size); act: None, "relu", "relu6", "hardswish"
    or "silu"; scale and shift: numbers (an exported model's affine after the activation). With a
    packed weight the result is channels-last (an (N, O, OH, OW) view of NHWC memory).
    """
    if act not in ACTS:
        raise ValueError(f"fused_conv2d: act must be one of {ACTS}, got {act!r}")
    if input.ndim != 4 or weight.ndim != 4:
        raise ShapeError(
            f"fused_conv2d: expected a 4-D input and weight, got {tuple(input.shape)} and "
            f"{tuple(weight.shape)}"
        )
    if input._data.dtype != np.float32 or weight._data.dtype != np.float32:
        raise DTypeError(f"fused_conv2d: float32 only, got {input.dtype} and {weight.dtype}")
    o, cg, kh, kw = weight.shape
    if cg * groups != input.shape[1] or o % groups:
        raise ShapeError(
            f"fused_conv2d: weight {tuple(weight.shape)} with groups={groups} does not fit "
            f"input {tuple(input.shape)}"
        )
    stride = (stride, stride) if isinstance(stride, int) else tuple(stride)
    pads = _pads(padding, tuple(input.shape[2:]), (kh, kw), stride)
    kw_ = dict(stride=stride, pads=pads, groups=int(groups), act=act)
    if scale != 1.0 or shift != 0.0:
        kw_.update(scale=float(scale), shift=float(shift))
    if residual is None:
        return FusedConv.apply(input, weight, bias, **kw_)
    return FusedConv.apply(input, weight, bias, residual, **kw_)
