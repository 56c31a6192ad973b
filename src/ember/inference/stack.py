"""Stacking linears that share an input: q/k/v, gate/up (and the like) as one product.

``stack_linears(model)`` finds sibling ``nn.Linear`` / ``QLinear`` layers by name group
(``GROUPS``: q_proj/k_proj/v_proj, gate_proj/up_proj, query/key/value, ...) whose weights can
stack: QTensors of one block type, or float weights of one dtype, with the same in_features. The
layers stay where they are, with their parameters, ``state_dict`` keys and training behaviour;
each gets a forward that serves it from one stacked product:

- the first layer of the group called with an input computes ``x @ [W_a; W_b; ...].T`` once and
  keeps the other layers' slices for that same input object; each other layer called with it
  takes its slice (the product runs once per input, not once per layer);
- a layer called with another input, with a graph to record (grad mode and a tensor that
  requires grad), on another device than the CPU, or after its weight was replaced by another
  kind runs its own forward, as before. A group whose slices keep going unused (its layers do
  not share inputs, e.g. cross-attention's q vs k/v) stops stacking.

The stacked weight is built on first use and rebuilt when a layer's weight or bias is replaced.
Float weights are not copied twice: each layer's parameter becomes a view of its rows in the
stacked matrix, so in-place updates (an optimizer step) reach the stacked product too. Quantized
weights (read-only, often memory-mapped) are copied once into the stacked matrix, by the kernels
(``ember.kernels.cpu.quant.stack``): as the panels their products read, where they read panels.
``PackedWeight`` floats (``inference.pack``) stack into one packed matrix; each layer keeps its
own panels (for the calls that run its own forward) on a view of the stacked values.

With a decode step's one-token input this turns three matrix-vector kernel calls into one (two
for gate/up): the per-call overhead, and for quantized weights the pass over x, is paid once.
"""

from __future__ import annotations

import functools

import numpy as np

import ember
from ember import nn
from ember.device import CPU
from ember.kernels.cpu import quant as quant_kernels
from ember.kernels.cpu.gemm import PackedWeight, packed_panels
from ember.nn import functional as F
from ember.quant import QTensor
from ember.quant.nn import QLinear
from ember.tensor import Tensor

# sibling names that read one input, in the order a forward calls them
GROUPS: tuple[tuple[str, ...], ...] = (
    ("q_proj", "k_proj", "v_proj"),
    ("gate_proj", "up_proj"),
    ("query", "key", "value"),  # BERT-style self-attention
    ("wq", "wk", "wv"),  # Meta's llama / Mistral reference names
    ("w1", "w3"),  # their SwiGLU gate and up
    ("to_q", "to_k", "to_v"),  # diffusers attention
)
MAX_MISSES = 3  # unused stacked products before a group stops stacking


def _plain(m) -> bool:
    return type(m) in (nn.Linear, QLinear) and "forward" not in m.__dict__


def _kind(m) -> tuple | None:
    """What must match for weights to stack: (kind, block type or dtype, in_features)."""
    w = m.weight
    if type(w) is QTensor:
        return ("q", w.qtype, w.shape[1]) if w.ndim == 2 else None
    if isinstance(w, ember.Tensor) and w.ndim == 2 and w.is_floating_point():
        return ("f", str(w.dtype), w.shape[1])
    return None


def stack_linears(model: nn.Module) -> nn.Module:
    """Make sibling linears that share an input run as one stacked product (in place)."""
    for parent in list(model.modules()):
        children = parent._modules
        for names in GROUPS:
            present = [children.get(n) for n in names]
            present = [m for m in present if m is not None and _plain(m)]
            if len(present) < 2:
                continue
            runs: dict = {}
            for m in present:
                k = _kind(m)
                if k is not None:
                    runs.setdefault(k, []).append(m)
            for layers in runs.values():
                if len(layers) >= 2:
                    _Stack(layers)
    return model


def unstack_linears(model: nn.Module) -> nn.Module:
    """Undo ``stack_linears``: every layer runs its own forward again (in place)."""
    for m in model.modules():
        if isinstance(m.__dict__.get("forward"), _Member):
            del m.__dict__["forward"]
    return model


class _Member(functools.partial):
    """A stacked layer's forward, ``stack.forward(i, x)``: its slice of the group's product (a
    partial, so that the call adds no Python frame of its own)."""

    __slots__ = ()

    @property
    def stack(self) -> _Stack:
        """The group's shared state."""
        return self.func.__self__

    @property
    def i(self) -> int:
        """This layer's place in the group."""
        return self.args[0]


def _own(lin, x):
    return type(lin).forward(lin, x)


class _Stack:
    """The shared state of one group: the stacked weight and the slices of the last product."""

    def __init__(self, layers: list) -> None:
        self.layers = layers
        self.key: list | None = None  # the weights/biases (and their arrays) the stack is of
        self.w = self.b = None
        self.spans: list[tuple[int, int]] = []
        self.x = None  # the input of the last product, and the slices not yet taken
        self.outs: list = []
        self.left = 0
        self.misses = 0
        self.enabled = True
        for i, lin in enumerate(layers):
            lin.__dict__["forward"] = _Member(self.forward, i)

    def forward(self, i: int, x):
        if x is self.x:  # the product for this input is made: hand out this layer's slice
            y = self.outs[i]
            if y is not None and not self._records(x):
                self.outs[i] = None
                self.left -= 1
                if not self.left:
                    self.x, self.outs = None, []
                return y
        lin = self.layers[i]
        if not self.enabled or x._device is not CPU or self._records(x):
            return _own(lin, x)
        if i:  # not the group's first layer, and no product for this input
            self._miss()
            return _own(lin, x)
        if self.x is not None:  # the last product's slices went unused
            self._miss()
            if not self.enabled:
                return _own(lin, x)
        if not self._current():
            self._build()
        if self.w is None:
            self.enabled = False
            return _own(lin, x)
        y = F.linear(x, self.w, self.b)
        yd, dev = y._data, y._device  # slices as plain views: no graph is recorded here
        outs = [Tensor._wrap(yd[..., a:b], dev) for a, b in self.spans]
        self.x, self.outs, self.left = x, [None, *outs[1:]], len(outs) - 1
        return outs[0]

    def _records(self, x) -> bool:
        if not ember.is_grad_enabled():
            return False
        if x.requires_grad:
            return True
        for lin in self.layers:
            for p in (lin.weight, lin.bias):
                if isinstance(p, ember.Tensor) and p.requires_grad:
                    return True
        return False

    def _miss(self) -> None:
        self.x, self.outs, self.left = None, [], 0
        self.misses += 1
        if self.misses >= MAX_MISSES:
            self.enabled = False

    def _now(self) -> list:
        key = []
        for lin in self.layers:
            w, b = lin.weight, lin.bias
            key += [w, getattr(w, "_data", None), b, getattr(b, "_data", None)]
        return key

    def _current(self) -> bool:
        key = self.key
        if key is None:
            return False
        j = 0
        for lin in self.layers:  # the _now() list, compared without building it
            w, b = lin.weight, lin.bias
            d = getattr(w, "_data", None)
            if (
                key[j] is not w
                or key[j + 1] is not d
                or (type(d) is PackedWeight and d.panels is None)  # written in place
                or key[j + 2] is not b
                or key[j + 3] is not getattr(b, "_data", None)
            ):
                return False
            j += 4
        return True

    def _build(self) -> None:
        """Stack the weights (and biases) as they are now; self.w None when they cannot."""
        self.w = self.b = None
        layers = self.layers
        ws = [lin.weight for lin in layers]
        if len({_kind(lin) for lin in layers}) != 1 or _kind(layers[0]) is None:
            return
        rows = [int(w.shape[0]) for w in ws]
        ends = np.cumsum([0, *rows])
        self.spans = [(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:])]
        if type(ws[0]) is QTensor:  # the kernels' stacked weight (panels, or the blocks)
            self.w = quant_kernels.stack(ws)
            dt = np.dtype(np.float32)
        else:
            arrays = [w._data for w in ws]
            panels = [packed_panels(a) for a in arrays]
            packed = all(p is not None for p in panels)
            if any(w._device is not CPU for w in ws) or not (
                packed or all(type(a) is np.ndarray for a in arrays)
            ):
                return  # meta, another device, or some packed and some not
            buf = np.concatenate([a.view(np.ndarray) for a in arrays])
            for w, p, (a, b) in zip(ws, panels, self.spans):  # parameters: views of the stack
                w._data = buf[a:b] if p is None else PackedWeight(buf[a:b], p)
            self.w = ember.from_numpy(buf)
            if packed:
                self.w._data = PackedWeight(buf)  # (set directly: wrapping would unpack it)
            dt = buf.dtype
        if any(lin.bias is not None for lin in layers):
            parts = []
            for lin, r in zip(layers, rows):
                b = lin.bias
                parts.append(np.zeros(r, dt) if b is None else np.asarray(b._data, dt))
            bbuf = np.concatenate(parts)
            for lin, (a, b) in zip(layers, self.spans):
                p = lin.bias
                if p is not None and type(p._data) is np.ndarray and p._data.dtype == dt:
                    p._data = bbuf[a:b]
            self.b = ember.from_numpy(bbuf)
        self.key = self._now()


__all__ = ["stack_linears", "unstack_linears", "GROUPS"]
