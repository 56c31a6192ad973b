"""The one inference rewrite: ``optimize_for_inference(model)``.

Passes run in order over the module tree; each is a function ``pass(model) -> model`` in its own
module here: stacking linears that share an input (q/k/v, gate/up), BatchNorm folding,
channels-last layout and weight packing. The result computes the same function as the model.

    fast = ember.inference.optimize_for_inference(model)     # or model.optimize_for_inference()
    logits = fast(images)                                     # same numbers (float32 rounding)

1. ``stack_linears`` (stack.py): linears that read the same input become one.
2. ``fold_batchnorm`` (fold.py): a BatchNorm2d right after a Conv2d is folded into it.
3. ``channels_last`` (layout.py): convs become ``FusedConv2d`` (the ``fused_conv2d`` op: bias,
   residual and ReLU/ReLU6 in the GEMM's epilogue; channels-last results), residual blocks
   ``Residual`` (the add in the epilogue of the block's last conv).
4. ``pack_weights`` (pack.py): float32 Linear/conv weights become ``PackedWeight`` arrays (the
   original values plus the packed GEMM's panels); the ``linear``/``conv2d``/``fused_conv2d``
   ops pick their packed-GEMM kernels by that weight type (kernels.cpu.gemm, kernels.cpu.conv).

Models need nothing for this but their module tree: a Sequential shows what follows what. A
block whose forward is not a Sequential says what it computes in one declarative attribute
(never code), read by passes 2 and 3::

    inference_block = {
        "chain": ("conv1", "bn1", "relu", "conv2", "bn2"),  # children applied in this order
        "add": "downsample",  # + that child's output (+ x when it is None); "input": + x;
                              # None / absent: no add (forward is just the chain)
        "act": "relu",        # applied after the add (None: none)
    }

The result records no autograd graph (parameters are frozen; the fused op still has a backward)
and is meant for inference. Weights changed in place afterwards drop their packing (the numpy
path runs): optimize again after loading new weights.
"""

from __future__ import annotations

import copy

from ember import nn
from ember.autograd import no_grad
from ember.inference.fold import fold_batchnorm
from ember.inference.layout import channels_last
from ember.inference.pack import pack_weights
from ember.inference.stack import stack_linears


def optimize_for_inference(model: nn.Module, inplace: bool = False) -> nn.Module:
    """The model with linears stacked, BatchNorm folded, epilogues fused and weights packed.

    Returns a new module (the input is left untouched) unless inplace=True, in which case the
    input's submodules are rewritten and the result may still be a different object (when the
    model itself is a declared block). The result is in eval mode, requires no gradients and
    computes the same function in float32.
    """
    if not inplace:
        model = copy.deepcopy(model)
    model.eval()
    with no_grad():
        model = stack_linears(model)
        model = fold_batchnorm(model)
        model = channels_last(model)
        model = pack_weights(model)
    model.eval()
    model.requires_grad_(False)
    return model


__all__ = ["optimize_for_inference"]
