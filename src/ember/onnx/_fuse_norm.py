"""Spelled-out layer norms of an imported graph as one layer-norm call.

Paddle2ONNX (PP-OCRv4's recognizer) and older torch exports write a layer norm over the last
axis as nine nodes::

    m = ReduceMean(x, axes=[-1]);  d = x - m;  v = ReduceMean(d ** 2, axes=[-1])
    y = d / Sqrt(v + eps) [* w] [+ b]

(``Pow(d, 2)`` or ``Mul(d, d)``; ``w`` and ``b`` constants over the last axis). Each of those
nodes is an ember op call and a pass over x: in the recognizer (40 x 120 values) ~75 us a layer
norm (ReduceMean ~17 us, the others 5-8), where the layer-norm kernel (``kernels/cpu/norm.py``)
does the whole of it in one call of ~19 us (11 alone; ad-hoc per-node timings, 2 threads). The fused node calls that kernel on
float32 input whose last dim matches ``w``/``b``, and runs the replaced nodes on anything else
(``Replay``). The kernel multiplies by 1/sqrt(v + eps) where the graph divides by sqrt(v + eps):
the results differ in the last bit or so (float32 rounding), far inside onnxruntime's 1e-4.

An ONNX ``LayerNormalization`` node over the last axis by a constant scale (and bias) calls the
same kernel with its weights prepared once (``norm.layer_norm_last``): through the op
(``F.layer_norm``: dispatch, checks and copies of scale and bias) MiniLM's 128 x 384 took ~33
us a node in the model, directly ~26 (and ~13 with the kernel's float32 fix, see norm.py).
"""

from __future__ import annotations

import numpy as np

import ember
from ember.kernels.cpu import have_numba
from ember.onnx._fuse_dense import Replay, _near, _other, _scalar, _user_op
from ember.onnx._optimize import Rewriter, fused_node
from ember.tensor import Tensor

_F32 = np.dtype(np.float32)


def _last_axis_mean(rw: Rewriter, nd) -> bool:
    """Whether nd is a ReduceMean over axis -1 only, keeping dims (the axis checked at run time)."""
    if nd is None or nd.op != "ReduceMean" or not nd.attrs.get("keepdims", 1):
        return False
    axes = nd.attrs.get("axes", None)
    if axes is None and len(nd.inputs) > 1 and nd.inputs[1]:
        a = rw.const(nd.inputs[1])
        axes = None if a is None else a.reshape(-1).tolist()
    return axes is not None and len(axes) == 1


def _axis(nd, rw: Rewriter) -> int:
    axes = nd.attrs.get("axes", None)
    return int(axes[0]) if axes is not None else int(rw.const(nd.inputs[1]).reshape(-1)[0])


def _affine(rw: Rewriter, name: str) -> np.ndarray | None:
    """A constant float32 w or b over the last axis only (shape (..., 1, D)), flattened."""
    v = rw.const(name)
    if v is None or v.dtype != _F32 or v.ndim < 1 or v.size != v.shape[-1]:
        return None
    return np.ascontiguousarray(v.reshape(-1))


class _LayerNormRun:
    """The layer-norm kernel on float32 x over its last dim; the replaced nodes otherwise."""

    def __init__(self, w, b, eps: float, axes: tuple, rank: int, replay) -> None:
        self.eps, self.axes, self.rank, self.replay = eps, axes, rank, replay
        self.d = next((v.size for v in (w, b) if v is not None), None)
        self.w, self.b = w, b
        self.wb = None if self.d is None else self._prepared(self.d)

    def _prepared(self, d: int) -> tuple:
        w = np.ones(d, _F32) if self.w is None else self.w
        b = np.zeros(d, _F32) if self.b is None else self.b
        return np.ascontiguousarray(w, _F32), np.ascontiguousarray(b, _F32)

    def __call__(self, at, x: Tensor) -> Tensor:
        nd = x.ndim
        if (
            x.dtype != ember.float32
            or nd < max(1, self.rank)
            or not all(a in (-1, nd - 1) for a in self.axes)
            or (self.d is not None and x.shape[-1] != self.d)
            or x.numel() == 0
            or (ember.is_grad_enabled() and x.requires_grad)
        ):
            return self.replay(x)
        from ember.kernels.cpu import norm

        w, b = self.wb or self._prepared(x.shape[-1])
        return Tensor._wrap(norm.layer_norm_last(x._data, w, b, self.eps))


class _NodeReplay:
    """One node as the fallback, its constant inputs bound: fn(x) -> its output."""

    def __init__(self, nd, consts: list) -> None:
        self.nd, self.consts = nd, consts

    def __call__(self, x: Tensor) -> Tensor:
        return self.nd.fn(self.nd.attrs, x, *self.consts)


def _fuse_layer_norm_node(rw: Rewriter, i: int) -> None:
    """An ONNX ``LayerNormalization`` over the last axis by constant scale (and bias)."""
    nd = rw.nodes[i]
    if len(nd.inputs) < 2 or any(nd.outputs[1:]):
        return
    names = [n for n in nd.inputs[1:3] if n]
    consts = [rw.consts.get(n) for n in nd.inputs[1:3]]
    if any(n not in rw.consts for n in names) or len(names) != len(nd.inputs[1:3]):
        return
    vals = [_affine(rw, n) for n in names]
    if any(v is None or rw.const(n).ndim != 1 for v, n in zip(vals, names)):
        return
    w, b = vals[0], vals[1] if len(vals) > 1 else None
    if b is not None and b.size != w.size:
        return
    eps = float(nd.attrs.get("epsilon", 1e-5))
    axis = int(nd.attrs.get("axis", -1))
    run = _LayerNormRun(w, b, eps, (axis,), 1, _NodeReplay(nd, consts))
    rw.replace([i], fused_node("LayerNorm", [nd.inputs[0]], nd.outputs[:1], run, nd))


def _fuse_layer_norm(rw: Rewriter, i: int) -> None:
    """ReduceMean at i: the layer-norm pattern of the module docstring."""
    m = rw.nodes[i]
    if not _last_axis_mean(rw, m):
        return
    x = m.inputs[0]
    js, sub = _user_op(rw, m.outputs[0], "Sub")
    if sub is None or sub.inputs != [x, m.outputs[0]]:
        return
    d = sub.outputs[0]
    users = rw.users_of(d)
    if users is None or len(users) != 2:
        return
    sq_i = next((j for j in users if rw.nodes[j].op in ("Pow", "Mul")), None)
    dv_i = next((j for j in users if rw.nodes[j].op == "Div"), None)
    if sq_i is None or dv_i is None:
        return
    sq, dv = rw.nodes[sq_i], rw.nodes[dv_i]
    if sq.op == "Pow" and not (sq.inputs[0] == d and _near(_scalar(rw, sq.inputs[1]), 2.0)):
        return
    if sq.op == "Mul" and sq.inputs != [d, d]:
        return
    jv, var = _user_op(rw, sq.outputs[0], "ReduceMean")
    if var is None or not _last_axis_mean(rw, var):
        return
    je, add = _user_op(rw, var.outputs[0], "Add")
    if add is None:
        return
    eps = _scalar(rw, _other(add, var.outputs[0]) or "")
    if eps is None or eps < 0:
        return
    jq, sqrt = _user_op(rw, add.outputs[0], "Sqrt")
    if sqrt is None or rw.sole_user(sqrt.outputs[0]) != dv_i or dv.inputs != [d, sqrt.outputs[0]]:
        return
    nodes, idxs = [m, sub, sq, var, add, sqrt, dv], [i, js, sq_i, jv, je, jq, dv_i]
    w = b = None
    rank = 1
    jm, mul = _user_op(rw, dv.outputs[0], "Mul")
    if mul is not None and (w := _affine(rw, _other(mul, dv.outputs[0]) or "")) is not None:
        rank = max(rank, rw.const(_other(mul, dv.outputs[0])).ndim)
        nodes.append(mul)
        idxs.append(jm)
    ja, badd = _user_op(rw, nodes[-1].outputs[0], "Add")
    if (
        badd is not None
        and (b := _affine(rw, _other(badd, nodes[-1].outputs[0]) or "")) is not None
    ):
        rank = max(rank, rw.const(_other(badd, nodes[-1].outputs[0])).ndim)
        nodes.append(badd)
        idxs.append(ja)
    if w is not None and b is not None and w.size != b.size:
        return
    out = nodes[-1].outputs[0]
    inside = set(idxs)
    for nd in nodes:  # no inner value is read outside the pattern or returned
        if nd.outputs[0] != out:
            u = rw.users_of(nd.outputs[0])
            if u is None or set(u) - inside:
                return
    axes = (_axis(m, rw), _axis(var, rw))
    order = [nd for _, nd in sorted(zip(idxs, nodes), key=lambda t: t[0])]
    replay = Replay(order, [x], out, rw.consts)
    run = _LayerNormRun(w, b, eps, axes, rank, replay)
    rw.replace(idxs, fused_node("LayerNorm", [x], [out], run, m))


def fuse(rw: Rewriter) -> None:
    """Every spelled-out layer norm over the last axis as one node (see the module doc)."""
    if not have_numba():
        return
    for i, nd in enumerate(rw.nodes):
        if nd is not None and nd.op == "ReduceMean":
            _fuse_layer_norm(rw, i)
        elif nd is not None and nd.op == "LayerNormalization":
            _fuse_layer_norm_node(rw, i)
