"""Inverted-residual blocks (MobileNetV2's) of fused convs as one node on kernels.cpu.irblock.

After ``_fuse_conv`` a MobileNetV2 block is three ``FusedConv`` nodes: a 1x1 expand (ReLU6), a
depthwise kxk (ReLU6) and a 1x1 project (with the block's residual ``Add`` in it). Where the
expand's output is read by the depthwise only and the depthwise's by the project only, the
three become one ``FusedInvertedResidual`` node whose kernel computes bands of output rows
with the expanded activations kept in L2 (see irblock's docstring). The expand may be any dense
conv (the network's stem, 3x3 stride 2 from the RGB image, is its first block's: the stem's
output never goes through memory either); a depthwise + project pair with no fusable conv
before it fuses without one. Only the activations the kernels apply in their stores qualify
(none, ReLU, ReLU6, no scale or shift after them).

At run time the node checks, once per input shape, that the geometry is what the kernel does
(stride-1 unpadded 1x1 project, channels that chain, a residual of the output's shape, a
non-empty float32 batch) and otherwise runs the three fused convs one after the other, as
before the rewrite. MobileNetV2 at batch 1: 3.8 -> 2.3-2.6 ms, batch 8 29.5 -> 15.5 (see
docs/onnx.md, Speed).

A pointwise fused conv whose output only a ``GlobalAveragePoolFlatten`` reads (MobileNetV2's
last conv, 320 -> 1280 at 7x7) becomes one ``FusedConvPool`` node on irblock's HeadPlan, whose
tasks pool the conv's columns as they compute them; another geometry (a strided conv, an input
it was not made for) runs the two nodes."""

from __future__ import annotations

import numpy as np

import ember
from ember.kernels.cpu import conv as K
from ember.onnx._fuse_conv import _ConvRun
from ember.onnx._ops_conv import _geometry
from ember.onnx._optimize import Rewriter, fused_node
from ember.tensor import Tensor
from ember.threads import get_num_threads

_F32 = np.dtype(np.float32)
_ACT = {None: 0, "relu": 1, "relu6": 2}
_PLANS_MAX = 64  # input shapes a node remembers


def _simple(run) -> bool:
    """A 2-D fused conv whose whole epilogue the kernels' stores do."""
    return (
        isinstance(run, _ConvRun)
        and not run.one_d
        and run.act in _ACT
        and run.scale == 1.0
        and run.shift == 0.0
    )


def _pointwise(run) -> bool:
    return _simple(run) and run.groups == 1 and run.k == [1, 1] and run.w._data.panels is not None


def _dense(run) -> bool:
    return _simple(run) and run.groups == 1 and run.w._data.panels is not None


def _depthwise(run) -> bool:
    w = run.w._data
    return _simple(run) and run.groups > 1 and getattr(w, "panels", None) is not None


class _BlockRun:
    """[expand ->] depthwise -> project [+ residual]: one irblock kernel call, or the three
    fused convs where the shapes do not suit it."""

    def __init__(self, expand: _ConvRun | None, dw: _ConvRun, project: _ConvRun) -> None:
        self.expand, self.dw, self.project = expand, dw, project
        self._plans: dict = {}

    def _replay(self, at, x: Tensor, res: Tensor | None) -> Tensor:
        y = x if self.expand is None else self.expand(at, x)
        y = self.dw(at, y)
        return self.project(at, y) if res is None else self.project(at, y, res)

    def __call__(self, at, x: Tensor, res: Tensor | None = None) -> Tensor:
        d, nchw = x._data, None
        rd = None if res is None else res._data
        key = (d.shape, d.dtype, None if rd is None else (rd.shape, rd.dtype), get_num_threads())
        hit = self._plans.get(key)
        if hit is None:
            hit = self._plan(x, res, key[-1])
            if len(self._plans) < _PLANS_MAX:
                self._plans[key] = hit
        if hit is False or (x.requires_grad and ember.is_grad_enabled()):
            return self._replay(at, x, res)
        plan, pads = hit
        r = None if rd is None else K.nhwc(rd)
        if not any(pads):
            src = K.nhwc(d)
        elif d.flags.c_contiguous:  # an NCHW image: the tasks copy the rows they need
            n, c, h, w = d.shape
            pt, pb, pl, pr = pads
            src = K._buffer(("pad", n, h, w, c, *pads), (n, h + pt + pb, w + pl + pr, c))
            nchw = d
        else:  # the expand's zero-padded NHWC input, as conv_gemm makes it
            src = K._padded(d.transpose(0, 2, 3, 1), *pads)
        return Tensor._wrap(K.channels_last(plan.run(src, r, nchw)))

    def _plan(self, x: Tensor, res: Tensor | None, threads: int):
        """(irblock's Plan for this input shape, the expand's pads), or False (the three convs
        run instead)."""
        from ember.kernels.cpu import irblock

        if irblock.state() is None or x.ndim != 4 or x._data.dtype != _F32:
            return False
        n, c, h, w = x.shape
        if n == 0:  # nothing to compute: the convs make the empty result
            return False
        e, d, p = self.expand, self.dw, self.project
        expand, epads, src = None, (0, 0, 0, 0), (h, w, c)
        if e is not None:
            (esh, esw), _, lo, hi = _geometry(e.conv_at, [h, w], e.k)
            (kh, kw), hp, wp = e.k, h + lo[0] + hi[0], w + lo[1] + hi[1]
            if min(lo + hi) < 0 or e.w.shape[1] != c or hp < kh or wp < kw:
                return False
            epads, src = (lo[0], hi[0], lo[1], hi[1]), (hp, wp, c)
            if c < K.FEW_CHANNELS:  # a kernel row is one tap, as in conv_gemm
                taps, kc = np.arange(kh, dtype=np.int64) * wp * c, kw * c
            else:
                taps = np.array([(i * wp + j) * c for i in range(kh) for j in range(kw)], np.int64)
                kc = c
            expand = (e.w._data, e.b._data, _ACT[e.act], taps, kc, (esh, esw),
                      (kh, lo[0], lo[1], h, w))  # fmt: skip
            h, w, c = (hp - kh) // esh + 1, (wp - kw) // esw + 1, e.w.shape[0]
        wdw = d.w._data.panels
        if wdw.shape[2] != c or d.w.shape[0] != c:
            return False
        s, _, lo, hi = _geometry(d.conv_at, [h, w], d.k)
        kh, kw = d.k
        oh, ow = (h + lo[0] + hi[0] - kh) // s[0] + 1, (w + lo[1] + hi[1] - kw) // s[1] + 1
        if oh <= 0 or ow <= 0 or min(lo + hi) < 0:
            return False
        s2, _, lo2, hi2 = _geometry(p.conv_at, [oh, ow], p.k)
        if list(s2) != [1, 1] or any(lo2) or any(hi2) or p.w.shape[1] != c:
            return False
        co = p.w.shape[0]
        if res is not None and (tuple(res.shape) != (n, co, oh, ow) or res._data.dtype != _F32):
            return False
        plan = irblock.Plan(
            n, h, w, src, expand, (wdw, d.b._data, _ACT[d.act]), tuple(s),
            (lo[0], hi[0], lo[1], hi[1]), (p.w._data, p.b._data, co, _ACT[p.act]),
            res is not None, threads,
        )  # fmt: skip
        return plan, epads


class _HeadRun:
    """A 1x1 fused conv whose output only GlobalAveragePoolFlatten reads: irblock's HeadPlan
    (the pooled sums made by the conv's tasks), or the two nodes where it does not suit."""

    def __init__(self, conv: _ConvRun, pool_node) -> None:
        self.conv, self.pool, self.pool_at = conv, pool_node.fn, pool_node.attrs
        self._plans: dict = {}

    def __call__(self, at, x: Tensor) -> Tensor:
        d = x._data
        key = (d.shape, d.dtype, get_num_threads())
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(x, key[-1])
            if len(self._plans) < _PLANS_MAX:
                self._plans[key] = plan
        if plan is False or (x.requires_grad and ember.is_grad_enabled()):
            return self.pool(self.pool_at, self.conv(at, x))
        return Tensor._wrap(plan.run(K.nhwc(d)))

    def _plan(self, x: Tensor, threads: int):
        """irblock's HeadPlan for this input shape, or False (conv, then pool)."""
        from ember.kernels.cpu import irblock

        if irblock.state() is None or x.ndim != 4 or x._data.dtype != _F32:
            return False
        n, c, h, w = x.shape
        p = self.conv
        s, _, lo, hi = _geometry(p.conv_at, [h, w], p.k)
        if n * h * w == 0 or list(s) != [1, 1] or any(lo) or any(hi) or p.w.shape[1] != c:
            return False
        return irblock.HeadPlan(n, h * w, c, (p.w._data, p.b._data, p.w.shape[0], _ACT[p.act]),
                                threads)  # fmt: skip


def fuse(rw: Rewriter) -> None:
    """Make each [expand ->] depthwise -> project chain of fused convs one node, and a 1x1
    fused conv read only by a GlobalAveragePoolFlatten (MobileNetV2's head) another."""
    from ember.kernels.cpu import irblock

    if irblock.state() is None:
        return
    for i, nd in enumerate(rw.nodes):
        if nd is None or nd.op != "FusedConv" or len(nd.inputs) != 1 or not _depthwise(nd.fn):
            continue
        j = rw.sole_user(nd.outputs[0])
        pn = rw.node(j)
        if pn is None or pn.op != "FusedConv" or pn.inputs[0] != nd.outputs[0]:
            continue
        if not _pointwise(pn.fn) or nd.outputs[0] in pn.inputs[1:]:
            continue
        idxs, x, expand = [i, j], nd.inputs[0], None
        k = rw.producer.get(x)
        en = rw.node(k)
        if (
            en is not None
            and en.op == "FusedConv"
            and len(en.inputs) == 1
            and _dense(en.fn)
            and rw.sole_user(x) == i
        ):
            idxs, x, expand = [k, i, j], en.inputs[0], en.fn
        run = _BlockRun(expand, nd.fn, pn.fn)
        rw.replace(idxs, fused_node("FusedInvertedResidual", [x, *pn.inputs[1:]], pn.outputs,
                                    run, nd))  # fmt: skip
    for i, nd in enumerate(rw.nodes):
        if nd is None or nd.op != "FusedConv" or len(nd.inputs) != 1 or not _pointwise(nd.fn):
            continue
        j = rw.sole_user(nd.outputs[0])
        gn = rw.node(j)
        if gn is None or gn.op != "GlobalAveragePoolFlatten" or gn.inputs[0] != nd.outputs[0]:
            continue
        rw.replace([i, j], fused_node("FusedConvPool", [nd.inputs[0]], gn.outputs,
                                      _HeadRun(nd.fn, gn), nd))  # fmt: skip
