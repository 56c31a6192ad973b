"""Normalisation: layer_norm, rms_norm, group_norm, batch_norm, instance_norm as fused Functions.

One Function (_Norm) standardises x over some axes (of x, or of a grouped view of x) and applies
an optional per-feature affine; its backward is the closed form, not a chain of small ops.
Float16/bfloat16 compute in float32 and round the result once, as torch does.
"""

from __future__ import annotations

import numpy as np

from ember.autograd import Function
from ember.errors import ShapeError
from ember.nn.functional._util import up
from ember.tensor import Tensor


def _sum_to(a: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum a over the axes where shape (same ndim) is 1, then reshape to the parameter shape."""
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and a.shape[i] != 1)
    return a.sum(axis=axes, keepdims=True) if axes else a


class _Norm(Function):
    """(x - mean) / sqrt(var + eps) over `axes` of x viewed as `view`, then * w + b."""

    def meta(self, x, *wb, **kw):
        return x.shape, np.result_type(x.dtype, *[a.dtype for a in wb])

    def forward(self, x, *wb, view, axes, eps, pshape, has_w, has_b, stats=None, sink=None):
        dt = x.dtype
        xf = up(x)
        shape = xf.shape
        xv = xf.reshape(view) if view is not None else xf
        if stats is None:
            mu = xv.mean(axis=axes, keepdims=True)
            xc = xv - mu
            var = np.mean(xc * xc, axis=axes, keepdims=True)
            if sink is not None:
                sink["mean"], sink["var"] = mu, var
        else:
            mu, var = stats
            xc = xv - mu
        rstd = 1.0 / np.sqrt(var + eps)
        xhat = (xc * rstd).reshape(shape)
        y = xhat
        self.w = None
        if has_w:
            self.w = up(wb[0]).reshape(pshape)
            y = y * self.w
        if has_b:
            y = y + up(wb[-1]).reshape(pshape)
        self.xhat, self.rstd, self.view, self.axes, self.pshape = xhat, rstd, view, axes, pshape
        self.fixed = stats is not None
        self.has_w, self.has_b = has_w, has_b
        self.wshapes = [a.shape for a in wb]
        return y.astype(np.result_type(dt, *[a.dtype for a in wb]) if wb else dt, copy=False)

    def backward(self, g):
        gf = up(g)
        xhat, need = self.xhat, self.needs_input_grad
        grads = [None]
        if self.has_w:
            grads.append(
                _sum_to(gf * xhat, self.pshape).reshape(self.wshapes[0]) if need[1] else None
            )
        if self.has_b:
            grads.append(_sum_to(gf, self.pshape).reshape(self.wshapes[-1]) if need[-1] else None)
        if need[0]:
            gy = gf * self.w if self.w is not None else gf
            if self.view is not None:
                gy = gy.reshape(self.view)
                xh = xhat.reshape(self.view)
            else:
                xh = xhat
            if self.fixed:
                dx = gy * self.rstd
            else:
                ax = self.axes
                dx = self.rstd * (
                    gy
                    - gy.mean(axis=ax, keepdims=True)
                    - xh * np.mean(gy * xh, axis=ax, keepdims=True)
                )
            grads[0] = dx.reshape(xhat.shape)
        return tuple(grads)


class _LayerNorm(_Norm):
    """_Norm over the trailing dims, with the layer_norm kernels (ember.kernels.cpu.norm)."""

    kernel_op = "layer_norm"


def _affine_args(weight, bias) -> tuple:
    ts = [t for t in (weight, bias) if t is not None]
    return ts, weight is not None, bias is not None


def layer_norm(
    input: Tensor,
    normalized_shape,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Standardise over the trailing normalized_shape dims, then scale and shift."""
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    n = len(ns)
    if tuple(input.shape[input.ndim - n :]) != ns or input.ndim < n:
        raise ShapeError(
            f"layer_norm: expected input with shape [*, {', '.join(map(str, ns))}], got "
            f"{tuple(input.shape)}"
        )
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != ns:
            raise ShapeError(
                f"layer_norm: {name} of shape {tuple(t.shape)} does not match normalized_shape {ns}"
            )
    ts, hw, hb = _affine_args(weight, bias)
    axes = tuple(range(input.ndim - n, input.ndim))
    pshape = (1,) * (input.ndim - n) + ns
    return _LayerNorm.apply(
        input, *ts, view=None, axes=axes, eps=eps, pshape=pshape, has_w=hw, has_b=hb
    )


class _RMSNorm(Function):
    """x * rsqrt(mean(x**2) + eps) over the last n dims, then * weight."""

    kernel_op = "rms_norm"

    def meta(self, x, *w, **kw):
        return x.shape, np.result_type(x.dtype, *[a.dtype for a in w])

    def forward(self, x, *w, n, eps):
        dt = x.dtype
        xf = up(x)
        axes = tuple(range(x.ndim - n, x.ndim))
        r = 1.0 / np.sqrt(np.mean(xf * xf, axis=axes, keepdims=True) + eps)
        xhat = xf * r
        self.r, self.xhat, self.axes = r, xhat, axes
        self.w = up(w[0]) if w else None
        if self.w is None:
            return xhat.astype(dt, copy=False)
        y = xhat.astype(dt, copy=False)
        out_dt = np.result_type(dt, w[0].dtype)
        return (up(y) * self.w).astype(out_dt, copy=False)

    def backward(self, g):
        gf = up(g)
        gx = gw = None
        if self.w is not None and self.needs_input_grad[1]:
            lead = tuple(range(gf.ndim - self.w.ndim))
            gw = (gf * self.xhat).sum(axis=lead) if lead else gf * self.xhat
        if self.needs_input_grad[0]:
            gy = gf * self.w if self.w is not None else gf
            gx = self.r * (gy - self.xhat * np.mean(gy * self.xhat, axis=self.axes, keepdims=True))
        return (gx, gw) if self.w is not None else gx


def _finfo_eps(dt: np.dtype) -> float:
    """Machine epsilon of the compute type (float32 for float16/bfloat16, as torch's opmath)."""
    return float(np.finfo(np.float64 if dt == np.float64 else np.float32).eps)


def rms_norm(
    input: Tensor, normalized_shape, weight: Tensor | None = None, eps: float | None = None
) -> Tensor:
    """Root-mean-square norm over the trailing dims (eps=None: the compute type's epsilon)."""
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    n = len(ns)
    xs = input._data.shape
    if len(xs) < n or xs[len(xs) - n :] != ns:
        raise ShapeError(
            f"rms_norm: expected input with shape [*, {', '.join(map(str, ns))}], got "
            f"{tuple(input.shape)}"
        )
    if weight is not None and weight._data.shape != ns:
        raise ShapeError(
            f"rms_norm: weight of shape {tuple(weight.shape)} does not match normalized_shape {ns}"
        )
    if eps is None:
        eps = _finfo_eps(input._data.dtype)
    if weight is None:
        return _RMSNorm.apply(input, n=n, eps=eps)
    return _RMSNorm.apply(input, weight, n=n, eps=eps)


def group_norm(
    input: Tensor,
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Standardise each group of channels (dim 1) over the group and the spatial dims."""
    if input.ndim < 2:
        raise ShapeError(f"group_norm: expected input of shape (N, C, *), got {tuple(input.shape)}")
    N, C = input.shape[0], input.shape[1]
    if C % num_groups:
        raise ShapeError(
            f"group_norm: expected number of channels {C} to be divisible by num_groups "
            f"{num_groups}"
        )
    ts, hw, hb = _affine_args(weight, bias)
    pshape = (1, C) + (1,) * (input.ndim - 2)
    return _Norm.apply(
        input, *ts, view=(N, num_groups, -1), axes=(2,), eps=eps, pshape=pshape, has_w=hw, has_b=hb
    )


def batch_norm(
    input: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Standardise per channel (dim 1) with batch statistics (training) or running ones (eval).

    In training, running_mean/running_var (when given) are updated in place with momentum and the
    unbiased batch variance, as torch does.
    """
    if input.ndim < 2:
        raise ShapeError(f"batch_norm: expected input of shape (N, C, *), got {tuple(input.shape)}")
    C = input.shape[1]
    axes = (0,) + tuple(range(2, input.ndim))
    pshape = (1, C) + (1,) * (input.ndim - 2)
    ts, hw, hb = _affine_args(weight, bias)
    if training:
        count = input.numel() // max(C, 1)
        if count <= 1:
            raise ShapeError(
                "Expected more than 1 value per channel when training, got input size "
                f"{tuple(input.shape)}"
            )
        sink: dict = {}
        out = _Norm.apply(
            input, *ts, view=None, axes=axes, eps=eps, pshape=pshape, has_w=hw, has_b=hb, sink=sink
        )
        if running_mean is not None and "mean" in sink:
            m = momentum
            rm = running_mean._data
            rm[...] = (1 - m) * up(rm) + m * sink["mean"].reshape(rm.shape)
        if running_var is not None and "var" in sink:
            m = momentum
            rv = running_var._data
            rv[...] = (1 - m) * up(rv) + m * sink["var"].reshape(rv.shape) * (count / (count - 1))
        return out
    if running_mean is None or running_var is None:
        raise ShapeError(
            "batch_norm: running_mean and running_var must be given when training=False"
        )
    stats = (up(running_mean._data).reshape(pshape), up(running_var._data).reshape(pshape))
    return _Norm.apply(
        input, *ts, view=None, axes=axes, eps=eps, pshape=pshape, has_w=hw, has_b=hb, stats=stats
    )


def instance_norm(
    input: Tensor,
    running_mean: Tensor | None = None,
    running_var: Tensor | None = None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Standardise each (sample, channel) over its spatial dims."""
    if input.ndim < 3:
        raise ShapeError(
            f"instance_norm: expected input of shape (N, C, *spatial), got {tuple(input.shape)}"
        )
    N, C = input.shape[0], input.shape[1]
    axes = tuple(range(2, input.ndim))
    pshape = (1, C) + (1,) * (input.ndim - 2)
    ts, hw, hb = _affine_args(weight, bias)
    if not use_input_stats:
        stats = (up(running_mean._data).reshape(pshape), up(running_var._data).reshape(pshape))
        return _Norm.apply(
            input,
            *ts,
            view=None,
            axes=axes,
            eps=eps,
            pshape=pshape,
            has_w=hw,
            has_b=hb,
            stats=stats,
        )
    sink: dict = {}
    out = _Norm.apply(
        input, *ts, view=None, axes=axes, eps=eps, pshape=pshape, has_w=hw, has_b=hb, sink=sink
    )
    count = input.numel() // max(N * C, 1)
    if running_mean is not None and "mean" in sink:
        rm = running_mean._data
        rm[...] = (1 - momentum) * up(rm) + momentum * sink["mean"].reshape(N, C).mean(0)
    if running_var is not None and "var" in sink:
        rv = running_var._data
        unb = sink["var"].reshape(N, C).mean(0) * (count / max(count - 1, 1))
        rv[...] = (1 - momentum) * up(rv) + momentum * unb
    return out


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out=None) -> Tensor:
    """input / max(||input||_p along dim, eps)."""
    denom = input.norm(p, dim, keepdim=True).clamp_min(eps)
    return input / denom


__all__ = ["layer_norm", "rms_norm", "group_norm", "batch_norm", "instance_norm", "normalize"]
