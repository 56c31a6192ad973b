"""Weight packing: float32 Linear and convolution weights carry the packed GEMM's panels.

Each weight array becomes a ``PackedWeight`` (ember.kernels.cpu.gemm): the same values, so
``state_dict()`` and ``parameters()`` still see the original weight, plus the panels the
microkernels read, packed once here. The ``linear``, ``conv2d`` and ``fused_conv2d`` ops pick
their packed-GEMM kernels by that weight type. Where this process has no microkernels (no numba,
no AVX2+FMA, EMBER_SGEMM_ISA=none) nothing is packed and the ops' numpy paths run.
"""

from __future__ import annotations

import numpy as np

from ember import nn
from ember.device import META
from ember.inference.layout import FusedConv2d
from ember.kernels.cpu import gemm as G


def _packable(m: nn.Module) -> bool:
    if isinstance(m, nn.Linear):
        return True
    if isinstance(m, FusedConv2d):
        return m.groups == 1
    return type(m) is nn.Conv2d and m.groups == 1 and tuple(m.dilation) == (1, 1)


def pack_weights(model: nn.Module) -> nn.Module:
    """Pack the weights of model's float32 Linear and (non-grouped) conv layers, in place."""
    if not G.microkernels_available():
        return model
    for m in model.modules():
        w = getattr(m, "weight", None)
        if not _packable(m) or not isinstance(w, nn.Parameter) or w._device is META:
            continue
        a = w._data
        if a.dtype == np.float32 and a.ndim in (2, 4) and G.packed_panels(a) is None:
            w._data = G.PackedWeight(a)
    return model
