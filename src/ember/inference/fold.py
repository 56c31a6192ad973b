"""BatchNorm folding: a Conv2d followed by an eval-mode BatchNorm2d becomes one Conv2d.

    conv(x) -> bn   ==   conv'(x)  with  w' = w * g / sqrt(var + eps),
                                         b' = beta + (b - mean) * g / sqrt(var + eps)

A BatchNorm is folded when it is known to read the conv's output and nothing else: the next
module in a Sequential, or the next name in a block's declared ``inference_block["chain"]``
(see ember.inference). The conv gets the folded weight and bias (new Parameters, float64 maths,
the conv's dtype out) and the BatchNorm is replaced by nn.Identity, so the model stays a working
model of the same function after this pass.
"""

from __future__ import annotations

import numpy as np

from ember import nn
from ember.errors import UnsupportedError
from ember.tensor import Tensor


def fold_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> tuple[np.ndarray, np.ndarray]:
    """(weight, bias) of conv with an eval-mode BatchNorm folded in (float64 maths)."""
    if bn.running_mean is None:
        raise UnsupportedError("fold_bn: BatchNorm without running statistics cannot be folded")
    dt = conv.weight._data.dtype
    w = conv.weight._data.astype(np.float64)
    b = 0.0 if conv.bias is None else conv.bias._data.astype(np.float64)
    mean = bn.running_mean._data.astype(np.float64)
    var = bn.running_var._data.astype(np.float64)
    gamma = np.ones_like(mean) if bn.weight is None else bn.weight._data.astype(np.float64)
    beta = np.zeros_like(mean) if bn.bias is None else bn.bias._data.astype(np.float64)
    scale = gamma / np.sqrt(var + bn.eps)
    wf = w * scale.reshape(-1, *([1] * (w.ndim - 1)))
    return wf.astype(dt), (beta + (b - mean) * scale).astype(dt)


def _foldable(conv, bn) -> bool:
    return (
        isinstance(conv, nn.Conv2d)
        and isinstance(bn, nn.BatchNorm2d)
        and bn.running_mean is not None
        and not bn.training
        and bn.num_features == conv.out_channels
        and conv.weight._data.dtype.kind == "f"
    )


def _fold_into(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> None:
    w, b = fold_bn(conv, bn)
    conv.weight = nn.Parameter(Tensor._wrap(w), requires_grad=False)
    conv.bias = nn.Parameter(Tensor._wrap(b), requires_grad=False)


def _fold_chain(owner: nn.Module, names: list) -> None:
    """Fold each (conv, bn) pair of consecutive children `names` of owner (modules: skipped)."""
    mods = owner._modules
    for a, b in zip(names, names[1:]):
        if not (isinstance(a, str) and isinstance(b, str)):
            continue
        conv, bn = mods.get(a), mods.get(b)
        if _foldable(conv, bn):
            _fold_into(conv, bn)
            mods[b] = nn.Identity()


def fold_batchnorm(model: nn.Module) -> nn.Module:
    """Fold every BatchNorm2d that directly follows a Conv2d into it (in place; returns model)."""
    for m in list(model.modules()):
        if isinstance(m, nn.Sequential):
            _fold_chain(m, list(m._modules))
        spec = getattr(m, "inference_block", None)
        if spec:
            _fold_chain(m, list(spec["chain"]))
    return model
