"""Modules whose weight is a QTensor: QLinear and QEmbedding, and quantize(model, qtype)."""

from __future__ import annotations

import numpy as np

import ember
from ember import nn
from ember.errors import DTypeError, ShapeError
from ember.quant.formats import dequantize


class QLinear(nn.Module):
    """y = x @ W.T + b with W kept in a GGUF block format (no float copy of W is ever made)."""

    def __init__(self, weight, bias=None) -> None:
        super().__init__()
        self.weight = weight  # a QTensor: a plain attribute, not a Parameter (it is not trained)
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        self.bias = bias

    def forward(self, x):
        return ember.nn.functional.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, qtype={self.weight.qtype}"


class QEmbedding(nn.Module):
    """A lookup table stored quantized; only the looked-up rows are dequantized."""

    def __init__(self, weight, padding_idx: int | None = None) -> None:
        super().__init__()
        self.weight = weight
        self.num_embeddings, self.embedding_dim = weight.shape
        self.padding_idx = padding_idx

    def forward(self, ids):
        idx = ids._data if isinstance(ids, ember.Tensor) else np.asarray(ids)
        if idx.dtype.kind not in "iu":
            raise DTypeError(f"embedding indices must be integers, got {idx.dtype}")
        if idx.size and (idx.min() < -self.num_embeddings or idx.max() >= self.num_embeddings):
            raise IndexError(
                f"embedding index out of range for a table of {self.num_embeddings} rows"
            )
        flat = idx.reshape(-1) % self.num_embeddings
        w = self.weight
        raw = w.data.reshape(self.num_embeddings, -1)[flat]
        rows = dequantize(raw, w.qtype, (flat.size, self.embedding_dim))
        return ember.from_numpy(rows.reshape(idx.shape + (self.embedding_dim,)))

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, qtype={self.weight.qtype}"


def quantize(model: nn.Module, qtype: str = "q8_0", skip: tuple[str, ...] = ()) -> nn.Module:
    """Swap every nn.Linear whose in_features fits the block size for a QLinear, in place."""
    from ember.quant import QTensor

    qt = qtype.upper()
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, nn.Linear) or any(s in name for s in skip):
            continue
        w = mod.weight.detach().float().numpy()
        try:
            q = QTensor.from_float(w, qt)
        except ShapeError:
            continue  # in_features not a multiple of the block size: keep it in float
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, QLinear(q, mod.bias))
    return model
