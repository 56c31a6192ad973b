"""The rewrite an imported graph gets once, at load: what ``optimize_for_inference`` does to trees.

``optimize(graph)`` rewrites a ``Graph``'s node list in place; the graph still runs node by node
on ember ops (``Graph.run``), only with fewer, bigger nodes:

1. constant folding: a node whose inputs are all constants (initializers, ``Constant`` nodes and
   what is computed from them only) runs once here and its outputs become constants;
2. activations (``_fuse_dense``): the exporters' spelled-out GELU, hard swish and SiLU become
   the ember ops of those names (one node each), a spelled-out layer norm over the last axis
   one layer-norm kernel call (``_fuse_norm``);
3. convolutions (``_fuse_conv``): a ``Conv`` by a constant weight becomes one ``fused_conv2d``
   call (ember.inference.ops) on a packed weight, with the per-channel scales and shifts,
   ``BatchNormalization``, residual ``Add``, activation and scalar scale/shift that follow it
   folded in; its result is channels-last, which the next fused convolution reads in place
   (and a ``ConvTranspose`` whose kernel is its stride: one product, then depth-to-space);
4. products (``_fuse_dense``): ``MatMul``/``Gemm`` by a constant weight (and a constant bias
   ``Add``) become ``F.linear`` on a packed weight, the MatMul-Softmax-MatMul attention pattern
   ``F.scaled_dot_product_attention``.

Last, the nodes that compute from shapes and constants only (``Shape`` -> ``Gather`` ->
``Concat`` -> ``Reshape`` targets, position ids, their embedding rows) remember their last results:
a ``Shape`` node by its input's shape, the nodes after it by the very tensors they were given
(``Memo``), so a model called again at the same input shapes skips their ops.

A fused node keeps the ONNX semantics of what it replaced: a value that something else reads, or
that the graph returns, is never fused away, and where a run-time shape does not suit the fused
form (a broadcasting residual, a mask the attention kernel cannot take) the node computes the
original ops instead. ``ember.onnx.load(path, optimize=False)`` skips all of this.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import numpy as np

import ember
from ember.errors import EmberError
from ember.onnx._graph import _SCOPED, Graph, _Node, _subgraphs
from ember.onnx._registry import Attrs
from ember.tensor import Tensor

# a folded constant may be this big, or as big as its inputs together (Expand/Tile/ConstantOfShape
# of a small value to a large shape stay nodes: folding them would only hold memory); Constant
# nodes always fold (their value is in the file)
FOLD_MAX_BYTES = 1 << 20
_NO_FOLD = _SCOPED | {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                      "Multinomial", "Bernoulli", "Dropout"}  # fmt: skip


class Rewriter:
    """The graph being rewritten: its nodes (None where removed), constants, users of each value."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes: list[_Node | None] = list(graph.nodes)
        self.consts: dict[str, Tensor] = dict(graph.constants)
        self.keep = set(graph.outputs)  # values the graph returns: never fused away
        self.index()

    def index(self) -> None:
        """Recompute who reads and who produces each value."""
        self.users: dict[str, list[int]] = defaultdict(list)
        self.producer: dict[str, int] = {}
        for i, nd in enumerate(self.nodes):
            if nd is None:
                continue
            for n in nd.inputs:
                if n:
                    self.users[n].append(i)
            for g in _subgraphs(nd):
                for n in g.outer_names:
                    self.users[n].append(i)
            for o in nd.outputs:
                if o:
                    self.producer[o] = i

    def const(self, name: str) -> np.ndarray | None:
        """The constant value of name as an array, or None when it is computed at run time."""
        t = self.consts.get(name) if name else None
        return None if t is None else t._data

    def users_of(self, name: str) -> list[int] | None:
        """The nodes that read name now (None when the graph returns it)."""
        if name in self.keep:
            return None
        return sorted({i for i in self.users.get(name, ()) if self.nodes[i] is not None})

    def sole_user(self, name: str) -> int | None:
        """The index of the one node that reads name, when exactly one does and it is no output."""
        u = self.users_of(name)
        return u[0] if u is not None and len(u) == 1 else None

    def node(self, i: int | None) -> _Node | None:
        """Node i, or None."""
        return None if i is None else self.nodes[i]

    def replace(self, idxs: list[int], node: _Node) -> None:
        """Put node where the last of idxs was and drop the others (their inputs are ready there)."""
        last = max(idxs)
        for i in idxs:
            self.nodes[i] = None
        self.nodes[last] = node
        for n in node.inputs:
            if n:
                self.users[n].append(last)
        for o in node.outputs:
            if o:
                self.producer[o] = last

    def finish(self) -> None:
        """Write the rewritten nodes and the constants still read back to the graph."""
        g = self.graph
        g.nodes = [nd for nd in self.nodes if nd is not None]
        used = set(g.outputs)
        for nd in g.nodes:
            used.update(nd.inputs)
            for sub in _subgraphs(nd):
                used.update(sub.outer_names)
        g.constants = {k: v for k, v in self.consts.items() if k in used}
        g._last_use = g._liveness()


def fused_node(op: str, inputs: list[str], outputs: list[str], fn: Callable, like: _Node) -> _Node:
    """A node of the rewritten graph: fn(attrs, *inputs), named after the node it grew from."""
    at = Attrs({}, like.attrs.opset, len(outputs), op, like.attrs.name)
    return _Node(op, list(inputs), list(outputs), at, fn)


def fold_constants(rw: Rewriter) -> None:
    """Run every node whose inputs are all constants now; its outputs become constants."""
    with ember.no_grad():
        for i, nd in enumerate(rw.nodes):
            if nd is None or nd.op in _NO_FOLD or _subgraphs(nd):
                continue
            if not all(not n or n in rw.consts for n in nd.inputs):
                continue
            args = [rw.consts[n] if n else None for n in nd.inputs]
            try:
                out = nd.fn(nd.attrs, *args)
            except (EmberError, ValueError, TypeError, IndexError, ZeroDivisionError, KeyError):
                continue  # it fails at run time too, with the graph's message
            out = out if isinstance(out, (tuple, list)) else (out,)
            if not all(isinstance(v, Tensor) for v in out):
                continue
            limit = max(FOLD_MAX_BYTES, sum(a._data.nbytes for a in args if a is not None))
            if nd.op != "Constant" and any(v._data.nbytes > limit for v in out):
                continue
            for name, v in zip(nd.outputs, out):
                if name:
                    rw.consts[name] = v
            rw.nodes[i] = None


MEMO_ENTRIES = 4  # input shapes a static node remembers results for (b1 and b8 alternating...)


class Memo:
    """A static node's function with its last results remembered (see the module docstring).

    A ``Shape``/``Size`` node is keyed by its input's shape, any other by the identity of its
    inputs (constants, or tensors a memo handed out; the inputs are kept, so the identities
    stay theirs). Ops are pure functions of their inputs, so a hit returns what the op would.
    """

    __slots__ = ("fn", "by_shape", "cache")

    def __init__(self, fn: Callable, by_shape: bool) -> None:
        self.fn, self.by_shape, self.cache = fn, by_shape, {}

    def __call__(self, at: Attrs, *args):
        if self.by_shape:
            key = tuple(a.shape if a is not None else None for a in args)
        else:
            key = tuple(id(a) for a in args)
        hit = self.cache.get(key)
        if hit is not None:
            return hit[1]
        out = self.fn(at, *args)
        if len(self.cache) >= MEMO_ENTRIES:
            self.cache.clear()
        self.cache[key] = (None if self.by_shape else args, out)
        return out


_SHAPE_OPS = {"Shape", "Size"}


def memoize_static(rw: Rewriter) -> None:
    """Wrap the nodes that compute from shapes and constants only in a ``Memo``."""
    static = set(rw.consts)
    for nd in rw.nodes:
        if nd is None or nd.op in _NO_FOLD or _subgraphs(nd):
            continue
        by_shape = nd.op in _SHAPE_OPS
        if not by_shape and not all(not n or n in static for n in nd.inputs):
            continue
        nd.fn = Memo(nd.fn, by_shape)
        static.update(o for o in nd.outputs if o)


def optimize(graph: Graph) -> Graph:
    """Rewrite graph's nodes in place (see the module docstring); returns graph."""
    from ember.onnx import _fuse_conv, _fuse_dense, _fuse_nhwc, _fuse_norm

    rw = Rewriter(graph)
    fold_constants(rw)
    rw.index()
    _fuse_dense.fuse_activations(rw)
    rw.index()
    _fuse_norm.fuse(rw)
    rw.index()
    _fuse_conv.fuse(rw)
    rw.index()
    _fuse_nhwc.fuse(rw)
    rw.index()
    _fuse_dense.fuse(rw)
    memoize_static(rw)
    rw.finish()
    _fuse_conv.donate(graph)
    return graph
