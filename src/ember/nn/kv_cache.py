"""The key/value cache of a decoder and the causal mask over it.

``KVCache`` holds one (batch, kv_heads, max_len, head_dim) buffer pair per layer; a forward
writes the new positions' keys and values at ``pos`` and the model advances ``pos`` after its
last layer. ``CausalMask`` says which cached and new keys each new query may see (causal order,
an optional sliding window, left padding) without building a dense mask unless asked.
Attention over the cache is the op ``ember.nn.functional.cached_attention``.
"""

from __future__ import annotations

import numpy as np

from ember.autograd import meta_array
from ember.device import CPU, META, Device
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

    def _end(self, t: int) -> int:
        end = self.pos + t
        if end > self.max_len:
            raise ShapeError(
                f"KV cache overflow: {end} positions needed, the cache holds {self.max_len}"
            )
        return end

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v (batch, kv_heads, T, head_dim) at the current position; return all keys/values so far."""
        end = self._end(k.shape[2])
        kb, vb = self.k[layer], self.v[layer]
        kb[:, :, self.pos : end] = k._data
        vb[:, :, self.pos : end] = v._data
        return Tensor._wrap(kb[:, :, :end]), Tensor._wrap(vb[:, :, :end])

    def store(self, layer: int, k: np.ndarray, v: np.ndarray) -> int:
        """Store token-major k, v arrays (batch, T, kv_heads, head_dim); the key count after."""
        end = self._end(k.shape[1])
        self.k[layer][:, :, self.pos : end] = k.transpose(0, 2, 1, 3)
        self.v[layer][:, :, self.pos : end] = v.transpose(0, 2, 1, 3)
        return end

    def advance(self, t: int) -> None:
        """Move past the t positions written by the last forward."""
        self.pos += t

    def reset(self) -> None:
        """Forget everything (buffers are reused)."""
        self.pos = 0

    def crop(self, length: int) -> None:
        """Keep only the first length positions (e.g. to reuse a shared prompt prefix)."""
        self.pos = min(self.pos, length)


class CausalMask:
    """Which keys the t new queries (after ``past`` cached positions) may see.

    Query i sits at slot past + i and sees slots up to its own, only the last ``window`` of them
    when a window is set, and never a slot where ``pad`` (batch, >= past + t) is False. A query
    that would see nothing (a padding row) sees every slot instead, so its output stays finite.
    """

    def __init__(
        self,
        t: int,
        past: int,
        pad: np.ndarray | None = None,
        window: int | None = None,
        device: Device = CPU,
    ):
        self.t, self.past, self.pad, self.window = t, past, pad, window
        self.device = device  # on the meta device the dense mask has a shape and no values
        self._dense: Tensor | None | bool = False

    def dense(self) -> Tensor | None:
        """The bool (batch|1, 1, t, past + t) mask, True = attend; None when nothing is masked."""
        if self._dense is False:
            self._dense = self._build()
        return self._dense

    def _build(self) -> Tensor | None:
        t, past, pad, window = self.t, self.past, self.pad, self.window
        s = past + t
        if t == 1 and pad is None and (window is None or s <= window):
            return None
        if self.device is META:
            return Tensor._wrap(meta_array((1 if pad is None else len(pad), 1, t, s), bool), META)
        qpos = np.arange(past, s)[:, None]
        kpos = np.arange(s)[None, :]
        allowed = kpos <= qpos
        if window is not None:
            allowed &= kpos > qpos - window
        allowed = allowed[None, None]
        if pad is not None:
            allowed = allowed & pad[:, None, None, :s]
            allowed = allowed | ~allowed.any(-1, keepdims=True)  # padded rows attend anywhere
        return Tensor._wrap(allowed, self.device)


__all__ = ["KVCache", "CausalMask"]
