"""Channels-last layout with fused epilogues: convolutions become FusedConv2d, blocks Residual.

- A Conv2d (zero padding, no dilation, dense or depthwise, float32) becomes a ``FusedConv2d``
  that calls the ``fused_conv2d`` op (ember.inference.ops): bias, an optional residual and a
  ReLU/ReLU6 in one epilogue. A ReLU/ReLU6/Hardtanh(0, 6) that directly follows the conv (the
  next module of a Sequential, the next name of a declared chain) moves into that epilogue.
- A block that declares ``inference_block`` with an ``add`` (see ember.inference) becomes a
  ``Residual``: its chain, then ``+ shortcut(x)`` and the activation, both in the epilogue of the
  chain's last conv. A declared block without ``add`` becomes the Sequential of its chain.
- The fused op's kernels return channels-last tensors (an (N, C, H, W) view of NHWC memory,
  torch's ``channels_last``): every op downstream reads them as usual, and the next fused conv,
  max pool (``max_pool2d``'s NHWC kernel) or global average pool uses them without a copy.

Everything else is kept as it is (its children are rewritten in place).
"""

from __future__ import annotations

import numpy as np

from ember import nn
from ember.inference.ops import fused_conv2d
from ember.nn import functional as F
from ember.tensor import Tensor


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


class FusedConv2d(nn.Module):
    """act(conv2d(x) + bias [+ residual]) through the ``fused_conv2d`` op (weight/bias as conv's)."""

    def __init__(self, conv: nn.Conv2d, act: str | None = None) -> None:
        super().__init__()
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.stride = tuple(conv.kernel_size), tuple(conv.stride)
        self.padding, self.groups, self.act = _padding_of(conv), conv.groups, act
        self.weight = conv.weight
        b = conv.bias
        if b is None:
            b = nn.Parameter(Tensor._wrap(np.zeros(conv.out_channels, np.float32)), False)
        self.bias = b

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """act(conv(x) + bias [+ residual])."""
        return fused_conv2d(
            x, self.weight, self.bias, residual, self.stride, self.padding, self.groups, self.act
        )

    def extra_repr(self) -> str:
        """Channels, kernel, stride, padding, groups, activation."""
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"
        s += f", stride={self.stride}, padding={self.padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s + (f", act={self.act}" if self.act else "")


_ACT_FNS = {None: lambda x: x, "relu": F.relu, "relu6": F.relu6}


class Residual(nn.Module):
    """act(body(x) + shortcut(x)) (shortcut None: x); add and act in the last conv's epilogue."""

    def __init__(self, body: list, shortcut: nn.Module | None = None, act: str | None = None):
        super().__init__()
        *first, last = body
        self.shortcut = shortcut
        self.fused = isinstance(last, FusedConv2d) and last.act is None
        if self.fused:
            last.act = act
        self.act = act
        self.body = nn.Sequential(*first)
        self.last = last

    def forward(self, x: Tensor) -> Tensor:
        """The block's output."""
        identity = x if self.shortcut is None else self.shortcut(x)
        if self.fused:
            return self.last(self.body(x), residual=identity)
        return _ACT_FNS[self.act](self.last(self.body(x)) + identity)


def act_name(m) -> str | None:
    """The name ("relu", "relu6") of an activation the fused epilogue computes, else None."""
    if isinstance(m, nn.ReLU):
        return "relu"
    if isinstance(m, nn.Hardtanh) and m.min_val == 0.0 and m.max_val == 6.0:
        return "relu6"  # ReLU6 is a Hardtanh(0, 6)
    return None


def fusable_conv(m) -> bool:
    """Whether fused_conv2d computes this conv's forward (zero padding, no dilation, float32)."""
    return (
        isinstance(m, nn.Conv2d)
        and (type(m) is nn.Conv2d or getattr(m, "tf_same", False))
        and tuple(m.dilation) == (1, 1)
        and m.padding_mode == "zeros"
        and m.weight._data.dtype == np.float32
        and (m.groups == 1 or m.groups == m.in_channels == m.out_channels)
    )


def _fuse_run(mods: list) -> list:
    """A chain of modules with each (conv, activation) pair made one FusedConv2d."""
    out, i = [], 0
    while i < len(mods):
        m = mods[i]
        if fusable_conv(m):
            act = act_name(mods[i + 1]) if i + 1 < len(mods) else None  # Identities are gone
            out.append(FusedConv2d(m, act))
            i += 2 if act is not None else 1
            continue
        out.append(_rewrite(m))
        i += 1
    return out


def _flat(mods: list) -> list:
    """Nested plain Sequentials spliced in, Identities left out."""
    out = []
    for m in mods:
        if _plain_sequential(m):
            out += _flat(list(m))
        elif not isinstance(m, nn.Identity):
            out.append(m)
    return out


def _chain_module(m: nn.Module, entry) -> nn.Module | None:
    """A chain entry: a child's name (a ModuleList is applied in order) or a module."""
    c = getattr(m, entry) if isinstance(entry, str) else entry
    return nn.Sequential(*c) if isinstance(c, nn.ModuleList) else c


def _block(m: nn.Module, spec: dict) -> nn.Module:
    chain = [_chain_module(m, e) for e in spec["chain"]]
    body = _fuse_run([c for c in chain if c is not None and not isinstance(c, nn.Identity)])
    add = spec.get("add")
    if add is None:
        return nn.Sequential(*body)
    shortcut = None if add == "input" else getattr(m, add)
    shortcut = None if shortcut is None else _rewrite(shortcut)
    return Residual(_flat(body), shortcut, spec.get("act"))


def _plain_sequential(m) -> bool:
    return isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward


def _sequential(seq: nn.Sequential) -> nn.Sequential:
    mods, names = seq._modules, list(seq._modules)
    for i, name in enumerate(names):
        m = mods[name]
        if fusable_conv(m):
            j = i + 1  # the next module that does something (a folded BatchNorm is an Identity)
            while j < len(names) and isinstance(mods[names[j]], nn.Identity):
                j += 1
            act = act_name(mods[names[j]]) if j < len(names) else None
            mods[name] = FusedConv2d(m, act)
            if act is not None:
                mods[names[j]] = nn.Identity()
        elif m is not None:
            mods[name] = _rewrite(m)
    return seq


def _rewrite(m: nn.Module) -> nn.Module:
    spec = getattr(m, "inference_block", None)
    if spec:
        return _block(m, spec)
    if _plain_sequential(m):
        return _sequential(m)
    if fusable_conv(m):
        return FusedConv2d(m)
    for name, child in list(m._modules.items()):
        if child is not None:
            m._modules[name] = _rewrite(child)
    return m


def channels_last(model: nn.Module) -> nn.Module:
    """The layout pass: convs fused with their activation, residual blocks fused (see module doc).

    Rewrites model's children in place; the result may be a new module (when model itself is a
    conv or a declared block).
    """
    return _rewrite(model)
