"""Squeeze-and-excitation tails and nearest upsamplings of an imported graph, on channels-last data.

Between the fused convs (channels-last results, ``_fuse_conv``) of PP-OCRv4 det's backbone and
FPN, three patterns made whole-map passes of their own:

- squeeze-and-excitation: PP-OCRv4 det's blocks end in ``x + x * HardSigmoid(z)`` (PP-LCNet's SE and the FPN's RSE
layers), z (N, C, 1, 1) computed from x's global average pool: a ``HardSigmoid`` on a few
hundred values (3 ember ops, ~40 us of dispatch), a ``Mul`` and an ``Add`` over the whole map.
``fuse`` makes ``Mul(x, s)`` whose one reader is ``Add(x, that)`` (s optionally a
``HardSigmoid`` read by that Mul alone) one node: ``kernels.cpu.nhwc.scale_add`` on a
channels-last x (one read of x, one write, rounded as the Mul and Add were), the original nodes
for anything else (``Replay``);
- ``Add(a, Resize(x))``, a nearest upsampling read once (the FPN's top-down path): one pass
  that adds x's source pixel to a's (``nhwc.add_gather``), the upsampled copy never made;
- ``Concat(..., Resize(x), ...)`` along channels: each such input's pixels gathered straight
  into the concat's NHWC result (``nhwc.concat_channels`` with indices).

The Resize's own source indices (``_ops_misc.nearest_nhwc_index``) decide at run time: a Resize
that is not a nearest one of channels-last float32 data, or operands of another layout, run the
original nodes.
"""

from __future__ import annotations

import numpy as np

from ember.onnx._fuse_dense import Arena, Replay
from ember.onnx._ops_misc import nearest_nhwc_index
from ember.onnx._optimize import Rewriter, fused_node
from ember.tensor import Tensor

_F32 = np.dtype(np.float32)


def _other(nd, name: str) -> str | None:
    if len(nd.inputs) != 2 or nd.inputs.count(name) != 1:
        return None
    return nd.inputs[1] if nd.inputs[0] == name else nd.inputs[0]


class _ScaleAddRun:
    """The fused node's function: x * s + x, s = clip(z * alpha + beta, 0, 1) or s = z."""

    def __init__(self, hsig: tuple[float, float] | None, replay: Replay, arena: Arena) -> None:
        self.hsig, self.replay, self.arena = hsig, replay, arena

    def __call__(self, at, x: Tensor, z: Tensor) -> Tensor:
        d, s = x._data, z._data
        n, c = d.shape[:2] if d.ndim == 4 else (0, 0)
        if (
            d.ndim != 4
            or d.dtype != _F32
            or s.dtype != _F32
            or s.shape != (n, c, 1, 1)
            or not d.transpose(0, 2, 3, 1).flags.c_contiguous
        ):
            return self.replay(x, z)
        s = s.reshape(n, c)
        if self.hsig is not None:
            alpha, beta = self.hsig
            s = np.clip(s * np.float32(alpha) + np.float32(beta), np.float32(0), np.float32(1))
        from ember.kernels.cpu import nhwc

        h, w = d.shape[2:]
        out = _take(self.arena, (n, h * w, c))
        y = nhwc.scale_add(d.transpose(0, 2, 3, 1).reshape(n, h * w, c), s, out)
        return Tensor._wrap(y.reshape(n, h, w, c).transpose(0, 3, 1, 2))


def _take(arena: Arena, shape: tuple) -> np.ndarray | None:
    """A reused buffer for an output of 32 MB or more (``Arena``: glibc maps those afresh on
    every call, and their first touch dominated these passes at batch 8), else None."""
    buf = arena.take(int(np.prod(shape[:-1])), shape[-1])
    return None if buf is None else buf.reshape(shape)


def _fuse_se(rw: Rewriter, arena: Arena) -> None:
    """Make every ``Add(x, Mul(x, s))`` (s from a HardSigmoid or not) one node."""
    for i, nd in enumerate(rw.nodes):
        if nd is None or nd.op != "Mul" or len(nd.inputs) != 2 or not nd.outputs[0]:
            continue
        j = rw.sole_user(nd.outputs[0])
        add = rw.node(j)
        if add is None or add.op != "Add":
            continue
        x = _other(add, nd.outputs[0])
        s = _other(nd, x) if x else None
        if s is None or rw.const(x) is not None or rw.const(s) is not None:
            continue
        idxs, hsig, z = [i, j], None, s
        k = rw.producer.get(s)
        hs = rw.node(k)
        if hs is not None and hs.op == "HardSigmoid" and rw.sole_user(s) == i and k < i:
            hsig = (hs.attrs.get("alpha", 0.2), hs.attrs.get("beta", 0.5))
            idxs, z = [k, i, j], hs.inputs[0]
        replay = Replay([rw.nodes[q] for q in sorted(idxs)], [x, z], add.outputs[0], rw.consts)
        run = _ScaleAddRun(hsig, replay, arena)
        rw.replace(idxs, fused_node("ScaleAdd", [x, z], [add.outputs[0]], run, add))


def _nhwc(t: Tensor) -> np.ndarray | None:
    """The NHWC array behind channels-last float32 (N, C, H, W) data, else None."""
    d = t._data if t is not None else None
    if d is None or d.ndim != 4 or d.dtype != _F32:
        return None
    a = d.transpose(0, 2, 3, 1)
    return a if a.flags.c_contiguous else None


def _resize_read_once(rw: Rewriter, name: str, user: int):
    """(index, node) of the Resize that makes name, when node `user` is its one reader."""
    k = rw.producer.get(name)
    nd = rw.node(k)
    if nd is None or nd.op != "Resize" or rw.sole_user(name) != user or not nd.inputs[0]:
        return None
    if rw.const(nd.inputs[0]) is not None:
        return None
    return k, nd


class _ResizeAddRun:
    """a + Resize(x): one pass (nhwc.add_gather) when the Resize is a nearest one of channels-
    last data and a is channels-last at its output shape; else the original nodes."""

    def __init__(self, resize, replay: Replay, arena: Arena) -> None:
        self.resize, self.replay, self.arena = resize, replay, arena

    def __call__(self, at, a: Tensor, x: Tensor, *rargs) -> Tensor:
        idx = nearest_nhwc_index(self.resize.attrs, x, *rargs)
        av, xv = _nhwc(a), _nhwc(x)
        if idx is None or av is None or xv is None or av.shape[1:3] != (len(idx[0]), len(idx[1])):
            return self.replay(a, x, *rargs)
        if av.shape[0] != xv.shape[0] or av.shape[3] != xv.shape[3]:
            return self.replay(a, x, *rargs)
        from ember.kernels.cpu import nhwc

        out = _take(self.arena, av.shape)
        return Tensor._wrap(nhwc.add_gather(av, xv, *idx, out).transpose(0, 3, 1, 2))


class _ResizeConcatRun:
    """A channel Concat of channels-last maps, some of them nearest Resizes read in place."""

    def __init__(self, plan: list, replay: Replay, arena: Arena) -> None:
        self.plan, self.replay, self.arena = (
            plan,
            replay,
            arena,
        )  # per concat input: (arg slot, resize node, its
        # other arg slots) or (arg slot, None, ())

    def __call__(self, at, *args: Tensor) -> Tensor:
        xs, gathers = [], []
        for slot, rs, rslots in self.plan:
            v = _nhwc(args[slot])
            if v is None:
                return self.replay(*args)
            g = None
            if rs is not None:
                g = nearest_nhwc_index(rs.attrs, args[slot], *(args[s] for s in rslots))
                if g is None:
                    return self.replay(*args)
            xs.append(v)
            gathers.append(g)
        size = next((len(g[0]), len(g[1])) for g in gathers if g is not None)
        n = xs[0].shape[0]
        for v, g in zip(xs, gathers):
            if v.shape[0] != n or (g is None and v.shape[1:3] != size):
                return self.replay(*args)
            if g is not None and (len(g[0]), len(g[1])) != size:
                return self.replay(*args)
        from ember.kernels.cpu import nhwc

        out = _take(self.arena, (n, *size, sum(v.shape[3] for v in xs)))
        return Tensor._wrap(nhwc.concat_channels(xs, gathers, out).transpose(0, 3, 1, 2))


def _fuse_resize(rw: Rewriter, arena: Arena) -> None:
    """Make Add(a, Resize(x)) and channel Concats of Resizes (each read once) one node."""
    for i, nd in enumerate(rw.nodes):
        if nd is None or not nd.outputs or not nd.outputs[0]:
            continue
        if nd.op == "Add" and len(nd.inputs) == 2 and nd.inputs[0] != nd.inputs[1]:
            for r in (1, 0):
                hit = _resize_read_once(rw, nd.inputs[r], i)
                a = nd.inputs[1 - r]
                if hit is None or not a or rw.const(a) is not None:
                    continue
                k, rs = hit
                rargs = list(rs.inputs[1:])
                ins = [a, rs.inputs[0], *rargs]
                replay = Replay([rs, nd], ins, nd.outputs[0], rw.consts)
                node = fused_node(
                    "ResizeAdd", ins, [nd.outputs[0]], _ResizeAddRun(rs, replay, arena), nd
                )
                rw.replace([k, i], node)
                break
        elif nd.op == "Concat" and nd.attrs.get("axis", 0) in (1, -3) and len(nd.inputs) > 1:
            ins, plan, idxs, fused = [], [], [i], False
            if len(set(nd.inputs)) != len(nd.inputs) or not all(nd.inputs):
                continue
            for name in nd.inputs:
                hit = _resize_read_once(rw, name, i)
                if hit is None:
                    plan.append((len(ins), None, ()))
                    ins.append(name)
                    continue
                k, rs = hit
                idxs.append(k)
                fused = True
                slot = len(ins)
                ins.append(rs.inputs[0])
                rslots = tuple(range(len(ins), len(ins) + len(rs.inputs) - 1))
                ins.extend(rs.inputs[1:])
                plan.append((slot, rs, rslots))
            if not fused:
                continue
            nodes = [rw.nodes[q] for q in sorted(idxs)]
            replay = Replay(nodes, ins, nd.outputs[0], rw.consts)
            node = fused_node("ResizeConcat", ins, [nd.outputs[0]], _ResizeConcatRun(plan, replay, arena),
                              nd)  # fmt: skip
            rw.replace(idxs, node)


def fuse(rw: Rewriter) -> None:
    """The SE tails, then the Resizes read once by an Add or a channel Concat (see above)."""
    arena = Arena()  # the graph's big outputs of these nodes share it
    _fuse_se(rw, arena)
    rw.index()
    _fuse_resize(rw, arena)
