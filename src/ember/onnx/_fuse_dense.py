"""Products by constant weights, attention and spelled-out activations of an imported graph.

- ``MatMul(x, W)`` and ``Gemm(x, W, C)`` by a constant 2-D float32 weight become ``F.linear`` on a
  ``PackedWeight`` (the ``linear`` op's packed-GEMM kernel: no BLAS call, no packing per call),
  with a constant bias ``Add`` after a MatMul (or Gemm's constant ``C``) as the linear's bias and
  Gemm's alpha folded into the weight; an ``Add`` of a run-time value after a MatMul (a
  transformer's residual) is added in the GEMM's epilogue when that value has the product's
  shape (``gemm.linear_packed_residual``: no separate pass over the output), and a GELU after
  it (the fused ``Gelu`` node below) is written over the product's fresh output. Plain products
  of one input (a layer's Q, K and V projections) are one product on their weights stacked side
  by side, each result a view of its columns (``_SharedInputLinearRun``). A product of one row
  (a classifier at batch 1) runs kernels.cpu.gemv's ``RowProduct`` on the same panels (one call
  into machine code, the panels split over the pool's threads), and a classifier's
  GlobalAveragePoolFlatten (``_fuse_conv``) and its product become one node (``_PoolLinearRun``:
  the mean and the product in that one call).
- ``MatMul(Q, K^T)`` [``Mul``/``Div`` by a scalar] [``Add`` mask] ``Softmax`` ``MatMul(., V)`` (an
  exporter's eager attention) becomes ``F.scaled_dot_product_attention``: on (B, H, L, D) float32
  inputs and a mask that only drops keys (0 where a key is kept, a large negative number where it
  is not, the same for every query; converted to a bool key mask), ember's blocked attention
  kernel runs; any other additive mask goes to the op as it is. The reshapes and transposes
  that split the (B, L, H*D) projections into heads and merge the result back (and a scalar
  ``Mul`` of Q) go into the attention node too, which then calls the kernel on the (B, L, H*D)
  values themselves (``_HeadsAttentionRun``); the layers' one mask is converted once per call.
- The exporters' spelled-out activations become one op each: ``x * (erf(x / sqrt 2) + 1) * 0.5``
  ``F.gelu``, ``x * clip(x + 3, 0, 6) / 6`` (and ``x * HardSigmoid(x)`` with alpha 1/6)
  ``F.hardswish``, ``x * Sigmoid(x)`` ``F.silu``.

A fused node meets a run-time input it was not made for (a rank or dtype the kernel does not
take) by running the nodes it replaced, in order (``Replay``).
"""

from __future__ import annotations

import math
import sys

import numpy as np

import ember
from ember.kernels.cpu import gemm as G
from ember.kernels.cpu import gemv
from ember.nn import functional as F
from ember.onnx._optimize import Rewriter, fused_node
from ember.tensor import Tensor

_F32 = np.dtype(np.float32)
_FLOAT = 1  # onnx.TensorProto.FLOAT
MASK_DROPS_BELOW = -1e4  # an additive mask value at or below this drops the key (exp underflows)


class Replay:
    """The replaced nodes run as they were, on their own little environment (the fallback)."""

    def __init__(self, nodes: list, inputs: list[str], output: str, consts: dict) -> None:
        self.nodes, self.inputs, self.output = nodes, inputs, output
        names = {n for nd in nodes for n in nd.inputs}
        self.consts = {k: v for k, v in consts.items() if k in names}

    def __call__(self, *args: Tensor | None) -> Tensor:
        env = dict(self.consts)
        env.update(zip(self.inputs, args))
        for nd in self.nodes:
            out = nd.fn(nd.attrs, *[env.get(n) if n else None for n in nd.inputs])
            out = out if isinstance(out, (tuple, list)) else (out,)
            env.update(zip(nd.outputs, out))
        return env[self.output]


def _scalar(rw: Rewriter, name: str) -> float | None:
    v = rw.const(name)
    if v is None or v.size != 1 or v.dtype.kind != "f":
        return None
    return float(v.reshape(-1)[0])


def _other(nd, name: str) -> str | None:
    if len(nd.inputs) != 2 or nd.inputs.count(name) != 1:
        return None
    return nd.inputs[1] if nd.inputs[0] == name else nd.inputs[0]


def _packed(w_out_in: np.ndarray) -> Tensor:
    t = Tensor._wrap(w_out_in)
    t._data = G.PackedWeight(w_out_in)  # set directly: wrapping would make it a plain array
    return t


# ---- products ------------------------------------------------------------------------------


# products of at least this many bytes write into buffers their graph keeps (``Arena``): glibc
# gives an allocation above its largest mmap threshold (32 MB) fresh pages every time, and their
# first touch (page faults, zeroing) inside the GEMM's tasks stalled the pool's worker (Whisper
# tiny encoder b8, 1500 x 8 rows x 1536: 74 MB per MLP product)
ARENA_MIN_BYTES = 32 << 20
ARENA_MAX = 4  # buffers of one shape at most (more alive at once: plain arrays)


class Arena:
    """The big product outputs of one graph, reused once nothing else holds them.

    A buffer is free when no tensor or view refers to it any more (its reference count is the
    arena's own): the graph dropped the value after its last reader and the caller kept no
    output made from it. Checked and taken under the GIL, before the GEMM releases it.
    """

    def __init__(self) -> None:
        self.bufs: dict[tuple[int, int], list[np.ndarray]] = {}

    def take(self, m: int, o: int) -> np.ndarray | None:
        """A free (m, o) float32 buffer, or None (small, or all ARENA_MAX of them held)."""
        if m * o * 4 < ARENA_MIN_BYTES:
            return None
        have = self.bufs.setdefault((m, o), [])
        for buf in have:
            if sys.getrefcount(buf) == 3:  # the list, this loop's name, the call's argument
                return buf
        if len(have) < ARENA_MAX:
            have.append(np.empty((m, o), _F32))
            return have[-1]
        return None


class _LinearRun:
    """x @ W (+ bias) through F.linear on the packed weight; other ranks/dtypes: the replay."""

    def __init__(
        self, w: Tensor, b: Tensor | None, b_rank: int, replay: Replay, arena: Arena
    ) -> None:
        self.w, self.b, self.b_rank, self.replay, self.arena = w, b, b_rank, replay, arena
        self._row: gemv.RowProduct | None | bool = None  # built at the first one-row product

    def row_product(self) -> gemv.RowProduct | None:
        """The one-row product on the weight's panels (kernels.cpu.gemv), or None where it
        does not run (no kernels, or narrow panels: the GEMM keeps those)."""
        r = self._row
        if r is None:
            w = self.w._data
            p = G.packed_panels(w)
            st = gemv.state()
            r = False
            if p is not None and st is not None and p.ndim == 3 and p.shape[2] == st["nr"]:
                r = gemv.RowProduct(p, w.shape[0], None if self.b is None else self.b._data)
            self._row = r
        return r or None

    def __call__(self, at, x: Tensor, *rest) -> Tensor:
        if x.dtype != ember.float32 or x.ndim < max(1, self.b_rank):
            return self.replay(x, *rest)
        if self._packs(x):
            return Tensor._wrap(self._product(x._data, None))
        return F.linear(x, self.w, self.b)

    def _packs(self, *xs: Tensor) -> bool:
        """Whether the packed product applies: float32 inputs of the bias's rank or more, a
        weight with panels, and no gradient to record."""
        return (
            all(x.dtype == ember.float32 for x in xs)
            and xs[0].ndim >= max(1, self.b_rank)
            and G.packed_panels(self.w._data) is not None
            and not (ember.is_grad_enabled() and any(x.requires_grad for x in xs))
        )

    def _product(self, x: np.ndarray, res: np.ndarray | None) -> np.ndarray:
        w = self.w._data
        m = math.prod(x.shape[:-1])
        if m == 1 and res is None and x.flags.c_contiguous and (r := self.row_product()):
            return r(x.reshape(-1)).reshape(*x.shape[:-1], w.shape[0])
        out = self.arena.take(m, w.shape[0]) if x.size else None
        b = None if self.b is None else self.b._data
        return G.linear_packed_residual(x, w, b, res, out)


class _PoolLinearRun:
    """A classifier's tail, GlobalAveragePoolFlatten (``_fuse_conv``) then a plain product of
    its (1, C) result, as one node: the mean and the product in one call of
    kernels.cpu.gemv (ResNet-50's 7x7x2048 -> 1000).

    In a whole pass the two nodes' Python runs cold and the weight comes from DRAM: ResNet-50
    b1 spent ~80 us in the pool node (~12 us alone) and ~300 us in the product's (~45 us of
    it around the kernel), and the pool's worker, asleep after that long since the last
    conv's job, joined the product 70-150 us late. A channels-last float32 input of batch 1
    runs the fused call; any other, or one that records a gradient, the two nodes.
    """

    __slots__ = ("pool", "pool_at", "lin", "lin_at", "c", "row")

    def __init__(self, pool, lin) -> None:
        self.pool, self.pool_at, self.lin, self.lin_at = pool.fn, pool.attrs, lin.fn, lin.attrs
        self.c = lin.fn.w.shape[1]
        self.row: gemv.RowProduct | None | bool = None  # the product's, at the first call

    def __call__(self, at, x: Tensor) -> Tensor:
        d = x._data
        r = self.row
        if r is None:
            r = self.row = self.lin.row_product() or False
        if r and d.dtype == _F32 and d.ndim == 4 and d.shape[0] == 1 and d.shape[1] == self.c:
            rows = d.shape[2] * d.shape[3]
            nhwc = d.transpose(0, 2, 3, 1)
            if (
                rows
                and nhwc.flags.c_contiguous
                and not (x.requires_grad and ember.is_grad_enabled())
            ):
                return Tensor._wrap(r(nhwc.reshape(-1), rows).reshape(1, -1))
        return self.lin(self.lin_at, self.pool(self.pool_at, x))


def _fuse_pool_linear(rw: Rewriter, i: int) -> None:
    """A plain product whose input is a GlobalAveragePoolFlatten's, read by it alone."""
    nd = rw.nodes[i]
    p = rw.producer.get(nd.inputs[0])
    pn = rw.node(p)
    if pn is None or pn.op != "GlobalAveragePoolFlatten" or rw.sole_user(nd.inputs[0]) != i:
        return
    run = _PoolLinearRun(pn, nd)
    rw.replace([p, i], fused_node("PoolLinear", [pn.inputs[0]], list(nd.outputs), run, nd))


class _GeluLinearRun(_LinearRun):
    """GELU(x @ W (+ bias)), the GELU written over the GEMM's fresh output (no second array)."""

    def __call__(self, at, x: Tensor) -> Tensor:
        if not self._packs(x):
            return self.replay(x)
        from ember.kernels.cpu import activation

        return Tensor._wrap(activation.gelu_inplace(self._product(x._data, None)))


class _ResidualLinearRun(_LinearRun):
    """x @ W (+ bias) + res, res added in the GEMM's epilogue when it has the product's shape."""

    def __call__(self, at, x: Tensor, res: Tensor) -> Tensor:
        if (
            not self._packs(x, res)
            or res.shape != (*x.shape[:-1], self.w.shape[0])
            or not res._data.flags.c_contiguous
        ):
            return self.replay(x, res)
        return Tensor._wrap(self._product(x._data, res._data))


class _SharedInputLinearRun(_LinearRun):
    """x @ W_i (+ b_i) for several plain products of one x, as one product on the weights
    stacked side by side; each result is a view of its columns (the attention kernel and the
    reshapes after Q/K/V read such views in place). Any other input: each product's replay."""

    def __init__(self, runs: list[_LinearRun], arena: Arena) -> None:
        self.replays, self.arena = [r.replay for r in runs], arena
        ws = [r.w._data.view(np.ndarray) for r in runs]
        bs = [np.zeros(w.shape[0], _F32) if r.b is None else r.b._data for r, w in zip(runs, ws)]
        self.w = _packed(np.ascontiguousarray(np.concatenate(ws, axis=0)))
        self.b = Tensor._wrap(np.ascontiguousarray(np.concatenate(bs)))
        ends = np.cumsum([w.shape[0] for w in ws]).tolist()
        self.cols = list(zip([0, *ends[:-1]], ends))
        self.b_rank = max(r.b_rank for r in runs)

    def __call__(self, at, x: Tensor) -> tuple[Tensor, ...]:
        if not self._packs(x):
            return tuple(r(x) for r in self.replays)
        y = self._product(x._data, None)
        return tuple(Tensor._wrap(y[..., c0:c1]) for c0, c1 in self.cols)


def _fuse_shared_input(rw: Rewriter, arena: Arena) -> None:
    """Plain products (no residual, no GELU) of the same input, as one (Q, K, V: one GEMM)."""
    groups: dict[str, list[int]] = {}
    for i, nd in enumerate(rw.nodes):
        if nd is not None and nd.op == "Linear" and type(nd.fn) is _LinearRun:
            groups.setdefault(nd.inputs[0], []).append(i)
    for x, idxs in groups.items():
        runs = [rw.nodes[i].fn for i in idxs]
        if len(idxs) < 2 or len({r.w.shape[1] for r in runs}) != 1:
            continue
        outs = [rw.nodes[i].outputs[0] for i in idxs]
        node = fused_node(
            "Linear", [x], outs, _SharedInputLinearRun(runs, arena), rw.nodes[idxs[0]]
        )
        for i in idxs:  # at the first product's place: its input is ready there
            rw.nodes[i] = None
        rw.nodes[idxs[0]] = node
    rw.index()


def _bias_of(c: np.ndarray, n: int) -> np.ndarray | None:
    """A constant added to (..., n) products as one (n,) bias vector, or None."""
    if (
        c.dtype != _F32
        or any(s != 1 for s in c.shape[:-1])
        or (c.ndim and c.shape[-1] not in (1, n))
    ):
        return None
    return np.ascontiguousarray(np.broadcast_to(c.reshape(-1), (n,)))


def _fuse_matmul(rw: Rewriter, i: int, arena: Arena) -> None:
    nd = rw.nodes[i]
    if len(nd.inputs) != 2 or nd.inputs[0] in rw.consts:
        return
    w = rw.const(nd.inputs[1])
    if w is None or w.dtype != _F32 or w.ndim != 2 or 0 in w.shape:
        return
    idxs, out, nodes, b, b_rank = [i], nd.outputs[0], [nd], None, 0
    j = rw.sole_user(out)
    m = rw.node(j)
    if m is not None and m.op == "Add" and (o := _other(m, out)) is not None:
        c = rw.const(o)
        bias = None if c is None else _bias_of(c, w.shape[1])
        if bias is not None:
            b, b_rank = Tensor._wrap(bias), c.ndim
            idxs.append(j)
            nodes.append(m)
            out = m.outputs[0]
    inputs, kind = [nd.inputs[0]], _LinearRun
    j = rw.sole_user(out)
    m = rw.node(j)
    if m is not None and m.op == "Add" and (o := _other(m, out)) is not None:
        if o not in rw.consts:  # a residual computed at run time: into the GEMM's epilogue
            idxs.append(j)
            nodes.append(m)
            out = m.outputs[0]
            inputs.append(o)
            kind = _ResidualLinearRun
    elif m is not None and m.op == "Gelu" and m.inputs == [out] and _gelu_inplace():
        idxs.append(j)
        nodes.append(m)
        out = m.outputs[0]
        kind = _GeluLinearRun
    replay = Replay(nodes, inputs, out, rw.consts)
    run = kind(_packed(w.T), b, b_rank, replay, arena)
    rw.replace(idxs, fused_node("Linear", inputs, [out], run, nd))


def _gelu_inplace() -> bool:
    from ember.kernels.cpu import activation

    return activation.gelu_inplace_available()


def _fuse_gemm(rw: Rewriter, i: int, arena: Arena) -> None:
    nd = rw.nodes[i]
    at = nd.attrs
    if len(nd.inputs) < 2 or at.get("transA", 0) or nd.inputs[0] in rw.consts:
        return
    w = rw.const(nd.inputs[1])
    if w is None or w.dtype != _F32 or w.ndim != 2 or 0 in w.shape:
        return
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    wt = w if at.get("transB", 0) else w.T  # (out, in)
    if alpha != 1.0:
        wt = (wt.astype(np.float64) * alpha).astype(_F32)
    b = None
    if len(nd.inputs) > 2 and nd.inputs[2] and beta != 0.0:
        c = rw.const(nd.inputs[2])
        bias = None if c is None or c.ndim > 2 else _bias_of(c, wt.shape[0])
        if bias is None:
            return
        b = Tensor._wrap((bias.astype(np.float64) * beta).astype(_F32) if beta != 1.0 else bias)
    replay = Replay([nd], [nd.inputs[0]], nd.outputs[0], rw.consts)
    run = _LinearRun(_packed(wt), b, 0, replay, arena)
    rw.replace([i], fused_node("Linear", [nd.inputs[0]], [nd.outputs[0]], run, nd))


# ---- attention -----------------------------------------------------------------------------


class _KeyMasks:
    """The last additive mask converted to a key mask, shared by a graph's attention nodes: the
    layers of a model read one mask value, converted once per call instead of once per layer
    (MiniLM-L6: 6 conversions of ~10 us each). Keeps the array, so its identity stays its own."""

    def __init__(self) -> None:
        self.key: tuple = (None, None)
        self.val: Tensor | None = None


class _AttentionRun:
    """softmax(Q K^T * scale + mask) V through F.scaled_dot_product_attention."""

    def __init__(self, scale: float, replay: Replay, masks: _KeyMasks | None = None) -> None:
        self.scale, self.replay = scale, replay
        self.masks = _KeyMasks() if masks is None else masks

    def __call__(self, at, q: Tensor, kt: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        f32 = ember.float32
        if not (q.ndim == kt.ndim == v.ndim == 4) or not (q.dtype == kt.dtype == v.dtype == f32):
            return self.replay(q, kt, v, mask)
        b, h, lq, d = q.shape
        s = kt.shape[3]
        if kt.shape[:3] != (b, h, d) or v.shape[:3] != (b, h, s):
            return self.replay(q, kt, v, mask)
        m = None
        if mask is not None:
            m = self._key_mask(mask, b, lq, s)
            if m is None:
                if mask.dtype != f32:
                    return self.replay(q, kt, v, mask)
                m = mask
        return F.scaled_dot_product_attention(q, kt.mT, v, attn_mask=m, scale=self.scale)

    def _key_mask(self, mask: Tensor, b: int, lq: int, s: int) -> Tensor | None:
        """An additive mask that only drops keys, as a bool (B, 1, 1, S) key mask; else None."""
        a, c = mask._data, self.masks
        if a is c.key[0] and c.key[1] == (b, lq, s):  # the layers' one mask: converted once
            return c.val
        out = _drop_keys(a, b, lq, s)
        c.key, c.val = (a, (b, lq, s)), None if out is None else Tensor._wrap(out)
        return c.val


def _drop_keys(a: np.ndarray, b: int, lq: int, s: int) -> np.ndarray | None:
    if a.dtype != _F32 or a.ndim > 4:
        return None
    a4 = a.reshape((1,) * (4 - a.ndim) + a.shape)
    if a4.shape[1] != 1 or a4.shape[0] not in (1, b) or a4.shape[2] not in (1, lq):
        return None
    if a4.shape[3] != s:
        return None
    row = a4[:, :, :1, :]
    if a4.shape[2] != 1 and not np.array_equal(a4, np.broadcast_to(row, a4.shape)):
        return None
    keep = row == 0
    if not np.all(keep | (row <= MASK_DROPS_BELOW)) or not keep.any(axis=3).all():
        return None
    return np.ascontiguousarray(keep)


def _softmax_last(nd) -> bool:
    ax = nd.attrs.get("axis", -1 if nd.attrs.opset >= 13 else 1)
    return ax in (-1, 3)


def _scores(rw: Rewriter, name: str) -> bool:
    """Whether name is Q @ K^T of two computed values, perhaps times or over a scalar."""
    nd = rw.node(rw.producer.get(name))
    if nd is None or len(nd.inputs) != 2:
        return False
    if nd.op in ("Mul", "Div"):
        a, c = nd.inputs
        if _scalar(rw, c) is None and nd.op == "Mul":
            a, c = c, a
        return _scalar(rw, c) is not None and _scores(rw, a)
    return nd.op == "MatMul" and not any(n in rw.consts for n in nd.inputs)


def _fuse_attention(rw: Rewriter, i: int, masks: _KeyMasks) -> None:
    """Softmax at i, between MatMul(Q, K^T) [* or / scale] [+ mask] and MatMul(., V)."""
    sm = rw.nodes[i]
    if not _softmax_last(sm) or len(sm.inputs) != 1:
        return
    chain, idxs, p_out = [sm], [i], sm.outputs[0]
    while True:  # Cast to float32 of the (float32) probabilities: no-ops on the kernel's path
        j = rw.sole_user(p_out)
        pv = rw.node(j)
        if pv is None or pv.op != "Cast" or pv.attrs.get("to") != _FLOAT:
            break
        chain.append(pv)
        idxs.append(j)
        p_out = pv.outputs[0]
    if pv is None or pv.op != "MatMul" or pv.inputs[0] != p_out or len(pv.inputs) != 2:
        return
    if pv.inputs[1] == p_out or pv.inputs[1] in rw.consts:
        return
    chain.append(pv)
    idxs.append(j)
    cur, mask, scale = sm.inputs[0], None, 1.0
    while True:
        p = rw.producer.get(cur)
        nd = rw.node(p)
        if nd is None or rw.sole_user(cur) is None or len(nd.inputs) != 2:
            return
        chain.insert(0, nd)
        idxs.insert(0, p)
        if nd.op == "MatMul":
            break
        a, c = nd.inputs
        if nd.op == "Add" and mask is None and a != c:
            if not _scores(rw, a):
                a, c = c, a
            if not _scores(rw, a):
                return
            cur, mask = a, c
        elif nd.op in ("Mul", "Div") and scale == 1.0:
            sc = _scalar(rw, c)
            if sc is None and nd.op == "Mul":
                a, c = c, a
                sc = _scalar(rw, c)
            if sc is None or sc == 0.0:
                return
            cur, scale = a, (sc if nd.op == "Mul" else 1.0 / sc)
        else:
            return
    q, kt = nd.inputs
    if q in rw.consts or kt in rw.consts:
        return
    inputs = [q, kt, pv.inputs[1]] + ([mask] if mask is not None else [])
    run = _AttentionRun(scale, Replay(chain, inputs, pv.outputs[0], rw.consts), masks)
    rw.replace(idxs, fused_node("Attention", inputs, [pv.outputs[0]], run, sm))


class _HeadsAttentionRun:
    """The attention op with the head split and merge around it: (B, L, H*D) projections in,
    (B, L, H*D) out, straight through the blocked attention kernel (``attention.attention``
    reads the heads as column slices of its inputs, views of the fused Q/K/V product too).

    Replaces Reshape (B, L, H, D) + Transpose of Q, K (to K^T) and V, the attention node, and
    Transpose + Reshape (B, L, H*D) of its result (eight nodes, each a view, ~8 us of Python a
    node: ~0.35 ms of MiniLM-L6's ~10 ms at batch 1), and a scalar Mul of Q (Whisper's
    scaling) into the softmax scale. The Reshape targets are run-time values: shapes that do
    not split the last axis into the same H heads, a mask that does not only drop keys, another
    dtype, few queries or a gradient run the replaced nodes.
    """

    def __init__(self, attn: _AttentionRun, q_scale: float, has_mask: bool, replay: Replay):
        self.attn, self.scale, self.has_mask, self.replay = (
            attn,
            attn.scale * q_scale,
            has_mask,
            replay,
        )
        self._last: tuple = ()  # the last call's shapes and reshape targets, and its H
        self._keep: tuple = (None, None)  # the last key mask and what the kernel gets for it

    def __call__(self, at, xq, xk, xv, sq, sk, sv, so, mask=None) -> Tensor:
        heads = self._heads_cached(xq, xk, xv, sq, sk, sv, so)
        if heads is None or (self.has_mask and mask is None):
            return self.replay(xq, xk, xv, sq, sk, sv, so, mask)
        b, lq = xq.shape[:2]
        s = xk.shape[1]
        keep = None
        if mask is not None:
            m = self.attn._key_mask(mask, b, lq, s)
            if m is None:
                return self.replay(xq, xk, xv, sq, sk, sv, so, mask)
            if self._keep[0] is not m:
                k = np.broadcast_to(m._data[:, 0, 0, :], (b, s))
                self._keep = (m, None if k.all() else k)  # keeps every key: no mask
            keep = self._keep[1]
        from ember.kernels.cpu import attention as A

        y = A.attention(xq._data, xk._data, xv._data, heads, self.scale, keep)
        return Tensor._wrap(y)

    def _heads_cached(self, xq, xk, xv, sq, sk, sv, so) -> int | None:
        """``_heads``, kept for the last shapes and reshape-target tensors (the same objects
        from call to call: the graph keeps shape-only results), so a call skips its checks
        (~10 us of Python a node); no gradient to record is checked every call."""
        key = (xq.shape, xk.shape, xv.shape, xq.dtype, xk.dtype, xv.dtype)
        last = self._last
        if last and last[0] == key and last[1] is sq and last[2] is sk and last[3] is sv:
            if last[4] is so and not (
                ember.is_grad_enabled() and any(t.requires_grad for t in (xq, xk, xv))
            ):
                return last[5]
        heads = self._heads(xq, xk, xv, sq, sk, sv, so)
        self._last = () if heads is None else (key, sq, sk, sv, so, heads)
        return heads

    @staticmethod
    def _heads(xq, xk, xv, sq, sk, sv, so) -> int | None:
        """H when the reshapes split (B, L, H*D) Q and (B, S, H*D) K, V into the same H heads
        and merge them back, and the kernel takes the operands; else None."""
        f32 = ember.float32
        if not (xq.ndim == xk.ndim == xv.ndim == 3) or not (
            xq.dtype == xk.dtype == xv.dtype == f32
        ):
            return None
        from ember.kernels.cpu import attention as A

        b, lq, e = xq.shape
        if xk.shape != xv.shape or xk.shape[0] != b or xk.shape[2] != e or lq < A.SDPA_MIN_QUERIES:
            return None
        if ember.is_grad_enabled() and any(t.requires_grad for t in (xq, xk, xv)):
            return None
        tq = _target(sq, xq.shape)
        if tq is None or len(tq) != 4 or tq[:2] != (b, lq) or tq[2] * tq[3] != e:
            return None
        h = tq[2]
        kv = (b, xk.shape[1], h, tq[3])
        if _target(sk, xk.shape) != kv or _target(sv, xv.shape) != kv:
            return None
        if _target(so, (b, lq, h, tq[3])) != (b, lq, e) or not A._kernels():
            return None
        return h


def _target(shape: Tensor | None, have: tuple) -> tuple | None:
    """A Reshape's target (ONNX rules, allowzero 0) for an input of shape have, or None."""
    if shape is None or shape.ndim != 1 or shape.dtype != ember.int64:
        return None
    out = shape._data.tolist()
    for i, d in enumerate(out):
        if d == 0:
            if i >= len(have):
                return None
            out[i] = have[i]
    n = math.prod(have)
    if out.count(-1) == 1:
        known = -math.prod(out)
        if known <= 0 or n % known:
            return None
        out[out.index(-1)] = n // known
    if any(d < 0 for d in out) or math.prod(out) != n:
        return None
    return tuple(out)


def _split_heads(rw: Rewriter, name: str, at: int, perm: list[int]):
    """(transpose index, reshape index, x, target) when name = Transpose(Reshape(x, target))
    with this perm, each read only by the next; else None."""
    pt = rw.producer.get(name)
    tr = rw.node(pt)
    if tr is None or tr.op != "Transpose" or tr.attrs.get("perm") != perm:
        return None
    if rw.sole_user(name) != at:
        return None
    pr = rw.producer.get(tr.inputs[0])
    rs = rw.node(pr)
    if rs is None or rs.op != "Reshape" or len(rs.inputs) != 2 or rs.attrs.get("allowzero", 0):
        return None
    if rw.sole_user(tr.inputs[0]) != pt or rs.inputs[0] in rw.consts:
        return None
    return pt, pr, rs.inputs[0], rs.inputs[1]


def _fuse_attention_heads(rw: Rewriter, i: int) -> None:
    """The attention node at i with its inputs' head split and its output's merge (see
    ``_HeadsAttentionRun``)."""
    att = rw.nodes[i]
    if len(att.inputs) not in (3, 4) or len(set(att.inputs[:3])) != 3:
        return
    parts = [_split_heads(rw, n, i, p) for n, p in zip(att.inputs[:3], _HEAD_PERMS)]
    if any(p is None for p in parts):
        return
    jt = rw.sole_user(att.outputs[0])
    tr = rw.node(jt)
    if tr is None or tr.op != "Transpose" or tr.attrs.get("perm") != [0, 2, 1, 3]:
        return
    jr = rw.sole_user(tr.outputs[0])
    rs = rw.node(jr)
    if rs is None or rs.op != "Reshape" or len(rs.inputs) != 2 or rs.attrs.get("allowzero", 0):
        return
    idxs = [k for p in parts for k in p[:2]] + [i, jt, jr]
    xq, q_scale = parts[0][2], 1.0
    pm = rw.producer.get(xq)
    mul = rw.node(pm)
    if mul is not None and mul.op == "Mul" and rw.sole_user(xq) == parts[0][1]:
        c = next((n for n in mul.inputs if _scalar(rw, n) is not None), None)
        c = c if c is not None and rw.const(c).ndim <= 1 else None  # no broadcast to a rank
        x = _other(mul, c) if c is not None else None
        if x is not None and x not in rw.consts and _scalar(rw, c) != 0.0:
            xq, q_scale = x, _scalar(rw, c)
            idxs.insert(0, pm)
    nodes = [rw.nodes[k] for k in sorted(idxs)]
    mask = att.inputs[3:]
    inputs = [xq, parts[1][2], parts[2][2], parts[0][3], parts[1][3], parts[2][3], rs.inputs[1]]
    inputs += mask
    replay = Replay(nodes, inputs, rs.outputs[0], rw.consts)
    run = _HeadsAttentionRun(att.fn, q_scale, bool(mask), replay)
    rw.replace(idxs, fused_node("Attention", inputs, [rs.outputs[0]], run, att))


_HEAD_PERMS = ([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3])  # Q, K (as K^T), V


# ---- activations ---------------------------------------------------------------------------


def _near(v: float | None, want: float) -> bool:
    return v is not None and abs(v - want) <= 1e-6 * max(1.0, abs(want))


class _ActRun:
    """fn(x) on float32 input; the replaced nodes on any other."""

    def __init__(self, fn, replay: Replay) -> None:
        self.fn, self.replay = fn, replay

    def __call__(self, at, x: Tensor) -> Tensor:
        return self.fn(x) if x.dtype == ember.float32 else self.replay(x)


def _finish_act(rw: Rewriter, x: str, nodes: list, idxs: list[int], fn, like, op: str) -> None:
    """Replace the pattern's nodes by one fn(x) node, when only they read its inner values."""
    out = nodes[-1].outputs[0]
    inside = set(idxs)
    for nd in nodes:
        o = nd.outputs[0]
        if o != out:
            users = rw.users_of(o)
            if users is None or set(users) - inside:
                return
    order = [nd for _, nd in sorted(zip(idxs, nodes), key=lambda t: t[0])]
    replay = Replay(order, [x], out, rw.consts)
    rw.replace(idxs, fused_node(op, [x], [out], _ActRun(fn, replay), like))


def _user_op(rw: Rewriter, name: str, op: str):
    j = rw.sole_user(name)
    m = rw.node(j)
    return (j, m) if m is not None and m.op == op else (None, None)


def _fuse_gelu(rw: Rewriter, i: int) -> None:
    """Erf at i: x / sqrt2 -> erf -> + 1 -> * x -> * 0.5 (any operand order)."""
    erf = rw.nodes[i]
    p = rw.producer.get(erf.inputs[0])
    d = rw.node(p)
    if d is None or d.op not in ("Div", "Mul") or len(d.inputs) != 2:
        return
    x, c = d.inputs
    if (d.op == "Div" and not _near(_scalar(rw, c), math.sqrt(2))) or (
        d.op == "Mul" and not _near(_scalar(rw, c), 1 / math.sqrt(2))
    ):
        return
    ja, add = _user_op(rw, erf.outputs[0], "Add")
    if add is None or not _near(_scalar(rw, _other(add, erf.outputs[0]) or ""), 1.0):
        return
    jm, mul = _user_op(rw, add.outputs[0], "Mul")
    if mul is None:
        return
    o = _other(mul, add.outputs[0])
    nodes, idxs = [d, erf, add, mul], [p, i, ja, jm]
    if o == x:  # (x * (erf + 1)) * 0.5
        jh, half = _user_op(rw, mul.outputs[0], "Mul")
        if half is None or not _near(_scalar(rw, _other(half, mul.outputs[0]) or ""), 0.5):
            return
        nodes.append(half)
        idxs.append(jh)
    else:  # (x * 0.5) * (erf + 1)
        ph = rw.producer.get(o)
        half = rw.node(ph)
        if half is None or half.op != "Mul" or _other(half, x) is None:
            return
        if not _near(_scalar(rw, _other(half, x)), 0.5) or rw.sole_user(o) != jm:
            return
        nodes.insert(0, half)
        idxs.insert(0, ph)
    _finish_act(rw, x, nodes, idxs, F.gelu, erf, "Gelu")


def _fuse_hardswish(rw: Rewriter, i: int) -> None:
    """Clip at i: x + 3 -> clip(0, 6) -> * x -> / 6 (or * 1/6); or HardSigmoid(1/6, 1/2) * x."""
    nd = rw.nodes[i]
    if nd.op == "HardSigmoid":
        if not (_near(nd.attrs.get("alpha", 0.2), 1 / 6) and _near(nd.attrs.get("beta", 0.5), 0.5)):
            return
        x = nd.inputs[0]
        jm, mul = _user_op(rw, nd.outputs[0], "Mul")
        if mul is None or _other(mul, nd.outputs[0]) != x:
            return
        _finish_act(rw, x, [nd, mul], [i, jm], F.hardswish, nd, "HardSwish")
        return
    from ember.onnx._fuse_conv import _act

    if len(nd.inputs) != 3 or _act(rw, nd) != "relu6":
        return
    p = rw.producer.get(nd.inputs[0])
    add = rw.node(p)
    if add is None or add.op != "Add" or len(add.inputs) != 2:
        return
    x = next((n for n in add.inputs if _near(_scalar(rw, _other(add, n) or ""), 3.0)), None)
    if x is None:
        return
    jm, mul = _user_op(rw, nd.outputs[0], "Mul")
    if mul is None or _other(mul, nd.outputs[0]) != x:
        return
    jd = rw.sole_user(mul.outputs[0])
    div = rw.node(jd)
    if div is None or div.inputs[0] != mul.outputs[0] or len(div.inputs) != 2:
        return
    k = _scalar(rw, div.inputs[1])
    if not ((div.op == "Div" and _near(k, 6.0)) or (div.op == "Mul" and _near(k, 1 / 6))):
        return
    _finish_act(rw, x, [add, nd, mul, div], [p, i, jm, jd], F.hardswish, nd, "HardSwish")


def _fuse_silu(rw: Rewriter, i: int) -> None:
    sg = rw.nodes[i]
    x = sg.inputs[0]
    jm, mul = _user_op(rw, sg.outputs[0], "Mul")
    if mul is None or _other(mul, sg.outputs[0]) != x:
        return
    _finish_act(rw, x, [sg, mul], [i, jm], F.silu, sg, "Silu")


_ACTS = {"Erf": _fuse_gelu, "Clip": _fuse_hardswish, "HardSigmoid": _fuse_hardswish,
         "Sigmoid": _fuse_silu}  # fmt: skip


def fuse_activations(rw: Rewriter) -> None:
    """The spelled-out GELU, hard swish and SiLU as one node each (before convs take theirs)."""
    for i, nd in enumerate(rw.nodes):
        if nd is not None and nd.op in _ACTS:
            _ACTS[nd.op](rw, i)


def fuse(rw: Rewriter, products: bool = True) -> None:
    """Products by constant weights and attention (see the module doc)."""
    if products and G.microkernels_available():
        arena = Arena()  # the graph's products share it
        for i, nd in enumerate(rw.nodes):
            if nd is not None and nd.op == "MatMul":
                _fuse_matmul(rw, i, arena)
            elif nd is not None and nd.op == "Gemm":
                _fuse_gemm(rw, i, arena)
        rw.index()
        _fuse_shared_input(rw, arena)
        for i, nd in enumerate(rw.nodes):
            if nd is not None and type(nd.fn) is _LinearRun and len(nd.inputs) == 1:
                _fuse_pool_linear(rw, i)
    masks = _KeyMasks()  # the graph's attention nodes share it
    for i, nd in enumerate(rw.nodes):
        if nd is not None and nd.op == "Softmax":
            _fuse_attention(rw, i, masks)
    rw.index()
    for i, nd in enumerate(rw.nodes):
        if nd is not None and nd.op == "Attention" and type(nd.fn) is _AttentionRun:
            _fuse_attention_heads(rw, i)
