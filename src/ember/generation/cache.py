"""A preallocated key/value cache: one (batch, kv_heads, max_len, head_dim) buffer pair per layer."""

from __future__ import annotations

import numpy as np

from ember.errors import ShapeError
from ember.tensor import Tensor


class KVCache:
    """Keys and values of past positions; layers write at ``pos`` and read ``[:pos + T]``."""

    def __init__(
        self,
        num_layers: int,
        batch: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype=np.float32,
    ) -> None:
        shape = (batch, kv_heads, max_len, head_dim)
        self.k = [np.zeros(shape, dtype) for _ in range(num_layers)]
        self.v = [np.zeros(shape, dtype) for _ in range(num_layers)]
        self.max_len = max_len
        self.pos = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by all buffers."""
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v (batch, kv_heads, T, head_dim) at the current position; return all keys/values so far."""
        t = k.shape[2]
        end = self.pos + t
        if end > self.max_len:
            raise ShapeError(
                f"KV cache overflow: {end} positions needed, the cache holds {self.max_len}"
            )
        kb, vb = self.k[layer], self.v[layer]
        kb[:, :, self.pos : end] = k._data
        vb[:, :, self.pos : end] = v._data
        return Tensor._wrap(kb[:, :, :end]), Tensor._wrap(vb[:, :, :end])

    def advance(self, t: int) -> None:
        """Move past the t positions written by the last forward."""
        self.pos += t

    def reset(self) -> None:
        """Forget everything (buffers are reused)."""
        self.pos = 0

    def crop(self, length: int) -> None:
        """Keep only the first length positions (e.g. to reuse a shared prompt prefix)."""
        self.pos = min(self.pos, length)
