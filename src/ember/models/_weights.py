"""Putting loaded arrays into a model built on the meta device (no copy, no random init)."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

import ember
from ember.errors import FormatError, ShapeError


def _parent(model, name: str):
    prefix, _, leaf = name.rpartition(".")
    try:
        return (model.get_submodule(prefix) if prefix else model), leaf
    except (AttributeError, KeyError, IndexError, ember.errors.EmberError):
        raise FormatError(
            f"checkpoint tensor {name!r} has no place in {type(model).__name__}"
        ) from None


def assign_weights(
    model, weights: dict, dtype=None, strict: bool = True, optional: Collection[str] = ()
) -> None:
    """Set every parameter from weights (numpy arrays or QTensors), replacing layers by quantized ones.

    Float arrays are wrapped without copying when their dtype is the compute dtype (memory-mapped
    files stay mapped); other float dtypes are converted to ``dtype`` (float32 by default).
    With ``dtype`` None, float16/bfloat16 linear and embedding weights stay 16-bit, as BF16/F16
    QTensors (their products decode them on the fly; pass a dtype for trainable copies).
    strict: every parameter but those named in ``optional`` (a tied head) must be given; a
    missing one would stay on the meta device.
    """
    from ember.quant import QTensor
    from ember.quant.nn import QEmbedding, QLinear

    want = ember.dtypes.get_dtype(dtype) if dtype is not None else ember.float32
    expected = dict(model.named_parameters(remove_duplicate=False))
    seen = set()
    for name, value in weights.items():
        mod, leaf = _parent(model, name)
        seen.add(name)
        if (
            dtype is None
            and leaf == "weight"
            and isinstance(mod, (ember.nn.Linear, ember.nn.Embedding))
        ):
            value = _half_weight(value)
        if isinstance(value, QTensor):
            if isinstance(mod, ember.nn.Linear) and leaf == "weight":
                _check_shape(name, expected.get(name), value.shape)
                setattr(*_parent(model, name.rpartition(".")[0]), QLinear(value, bias=mod.bias))
                continue
            if isinstance(mod, ember.nn.Embedding) and leaf == "weight":
                _check_shape(name, expected.get(name), value.shape)
                setattr(
                    *_parent(model, name.rpartition(".")[0]), QEmbedding(value, mod.padding_idx)
                )
                continue
            value = value.dequantize()
        arr = np.asarray(value)
        if arr.dtype.kind == "f" or arr.dtype == ember.bfloat16.np:
            if arr.dtype != want.np:
                arr = arr.astype(want.np)
        _check_shape(name, expected.get(name), arr.shape)
        setattr(mod, leaf, ember.nn.Parameter(ember.from_numpy(arr), requires_grad=False))
    if strict:
        missing = [n for n in expected if n not in seen and n not in optional]
        if missing:
            raise FormatError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:5]}")


def _half_weight(value):
    """A 2-d float16/bfloat16 weight as a BF16/F16 QTensor over the same bytes (decoded by the
    linear_q kernels, never copied to float32); anything else as it is."""
    from ember.quant import QTensor

    if isinstance(value, QTensor):
        return value
    arr = np.asarray(value)
    kind = {np.dtype(np.float16): "F16", ember.bfloat16.np: "BF16"}.get(arr.dtype)
    if kind is None or arr.ndim != 2 or arr.shape[1] % 32 or not arr.flags.c_contiguous:
        return value
    return QTensor(arr.reshape(-1).view(np.uint8), kind, arr.shape)


def _check_shape(name: str, param, shape) -> None:
    if param is not None and tuple(param.shape) != tuple(shape):
        raise ShapeError(
            f"{name}: checkpoint shape {tuple(shape)} does not fit the model's {tuple(param.shape)}"
        )


def tie_embeddings(model) -> None:
    """Make lm_head use the input embedding matrix (dense or quantized)."""
    from ember.quant.nn import QEmbedding, QLinear

    emb = model.model.embed_tokens
    if isinstance(emb, QEmbedding):
        model.lm_head = QLinear(emb.weight)
    else:
        model.lm_head.weight = emb.weight
