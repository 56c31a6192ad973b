"""Gradient checkpointing for fine-tuning: keep each decoder layer's input, recompute the rest.

Training keeps every op's saved arrays until backward, so a 30-layer model holds 30 layers of
activations (for SmolLM2 on 128 tokens: ~450 MB, against ~25 MB for an inference forward).
With checkpointing a layer's forward runs without recording and keeps only its input; backward
runs the layer again with the graph on and backpropagates through that one layer at a time, as
``torch.utils.checkpoint`` and QLoRA's ``prepare_model_for_kbit_training`` do. Dropout draws
the same masks in the recomputation (the RNG state is restored).
"""

from __future__ import annotations

import numpy as np

from ember import nn
from ember.autograd import Function, _run_backward, enable_grad, is_grad_enabled, no_grad
from ember.device import CPU
from ember.tensor import Tensor


class _Checkpoint(Function):
    """out = fn(x), recorded as one node; backward recomputes fn with the graph on."""

    def forward(self, x: np.ndarray, *params: np.ndarray, fn, rng_state):
        self.x, self.fn, self.rng_state = x, fn, rng_state
        with no_grad():
            return fn(Tensor._wrap(x, CPU))._data

    def backward(self, g: np.ndarray):
        from ember.ops.random import get_rng_state, set_rng_state

        now = get_rng_state()
        set_rng_state(self.rng_state)
        try:
            with enable_grad():
                x = Tensor._wrap(self.x, CPU)
                x.requires_grad_(self.needs_input_grad[0])
                out = self.fn(x)
                # the layer's parameters are leaves of this inner graph: their .grad accumulates
                _run_backward([out], [g], retain_graph=False)
        finally:
            set_rng_state(now)
        gx = x.grad._data if x.grad is not None else None
        return (gx,) + (None,) * (len(self.needs_input_grad) - 1)


def checkpoint(fn, x: Tensor, params: list[Tensor]) -> Tensor:
    """``fn(x)`` keeping only x for backward; params: the tensors inside fn that need grads."""
    from ember.ops.random import get_rng_state

    return _Checkpoint.apply(x, *params, fn=fn, rng_state=get_rng_state())


def enable_gradient_checkpointing(model: nn.Module) -> nn.Module:
    """Checkpoint every decoder layer of an ember LLM (``model.model.layers``), in place."""
    from ember.models.llama import DecoderLayer

    layers = [m for m in model.modules() if isinstance(m, DecoderLayer)]
    if not layers:
        from ember.errors import UnsupportedError

        raise UnsupportedError(f"{type(model).__name__} has no decoder layers to checkpoint")
    for layer in layers:
        if "forward" in layer.__dict__:
            continue  # already checkpointed
        plain = type(layer).forward.__get__(layer)

        def forward(x, rope, mask, cache=None, _plain=plain, _layer=layer):
            if cache is not None or not is_grad_enabled() or x._device is not CPU:
                return _plain(x, rope, mask, cache)
            params = [p for p in _layer.parameters() if p.requires_grad]
            if not params and not x.requires_grad:
                return _plain(x, rope, mask, cache)
            return checkpoint(lambda t: _plain(t, rope, mask, None), x, params)

        layer.__dict__["forward"] = forward
    return model


def prepare_model_for_kbit_training(
    model: nn.Module, use_gradient_checkpointing: bool = True
) -> nn.Module:
    """peft's name: freeze the base and turn on gradient checkpointing (QLoRA's recipe)."""
    model.requires_grad_(False)
    if use_gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model
