"""The key/value cache of a decoder and the causal mask over it.

``KVCache`` holds one (batch, kv_heads, max_len, head_dim) buffer pair per layer; a forward
writes the new positions' keys and values at ``pos`` and the model advances ``pos`` after its
last layer. ``CausalMask`` says which cached and new keys each new query may see (causal order,
an optional sliding window, left padding) without building a dense mask unless asked.
Attention over the cache is the op ``ember.nn.functional.cached_attention``. ``BatchKVCache``
holds many independent sequences, one row each with its own length, for batched decoding.
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


class BatchKVCache:
    """The KV caches of many independent sequences: one row (a slot) per sequence, each row with
    its own length, in one (slots, kv_heads, max_len, head_dim) buffer pair per layer.

    A server keeps one and gives each running sequence a slot; a forward runs on the cache of
    some of its rows, ``cache.rows(slots)``, which a model uses as it uses a ``KVCache`` (its
    ``pos`` is then one position per row). Row b of such a step computes exactly what that
    sequence alone, with its own ``KVCache``, would (same keys, same order).
    """

    def __init__(
        self,
        num_layers: int,
        slots: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype=np.float32,
    ) -> None:
        shape = (slots, kv_heads, max_len, head_dim)
        self.k = [np.zeros(shape, dtype) for _ in range(num_layers)]
        self.v = [np.zeros(shape, dtype) for _ in range(num_layers)]
        self.max_len = max_len
        self.lengths = np.zeros(slots, np.int64)

    @property
    def slots(self) -> int:
        """How many sequences it holds."""
        return len(self.lengths)

    @property
    def nbytes(self) -> int:
        """Bytes held by all buffers."""
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def rows(self, slots, new_tokens=None) -> KVCacheRows:
        """The cache of a forward over these slots (batch row b is slot ``slots[b]``).

        ``new_tokens``: how many of the forward's t tokens are real in each row, the rest right
        padding (several prompts of different lengths in one forward): the attention then runs
        each row on its own tokens, as it would alone, and only those enter the cache.
        """
        rows = np.asarray(slots, np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= self.slots):
            raise ShapeError(f"BatchKVCache: slots {rows.tolist()} outside 0..{self.slots - 1}")
        if len(np.unique(rows)) != rows.size:
            raise ShapeError(f"BatchKVCache: slot listed twice in {rows.tolist()}")
        ragged = None
        if new_tokens is not None:
            ragged = np.asarray(new_tokens, np.int64).reshape(-1)
            if ragged.shape != rows.shape or (ragged.size and ragged.min() < 1):
                raise ShapeError(
                    f"BatchKVCache: new_tokens {ragged.tolist()} must give each of the "
                    f"{rows.size} rows at least one token"
                )
        return KVCacheRows(self, rows, ragged)

    def reset(self, slot: int) -> None:
        """Forget a slot's sequence (its buffers are reused)."""
        self.lengths[slot] = 0

    def crop(self, slot: int, length: int) -> None:
        """Keep only a slot's first length positions."""
        self.lengths[slot] = min(int(self.lengths[slot]), length)

    def copy(self, src: int, dst: int, length: int | None = None) -> None:
        """Slot dst takes slot src's first length positions (all of them when None)."""
        n = int(self.lengths[src]) if length is None else min(length, int(self.lengths[src]))
        for a in (*self.k, *self.v):
            a[dst, :, :n] = a[src, :, :n]
        self.lengths[dst] = n


class KVCacheRows:
    """Some rows of a ``BatchKVCache``, as one forward sees them (see ``BatchKVCache.rows``)."""

    def __init__(self, cache: BatchKVCache, rows: np.ndarray, ragged=None) -> None:
        self.cache, self.rows, self.ragged = cache, rows, ragged  # ragged: real tokens per row
        self.k, self.v, self.max_len = cache.k, cache.v, cache.max_len

    @property
    def pos(self) -> np.ndarray:
        """Each row's length so far (the position of its next token)."""
        return self.cache.lengths[self.rows]

    def store(self, layer: int, k: np.ndarray, v: np.ndarray) -> int:
        """Store token-major k, v (rows, T, kv_heads, head_dim) at each row's own position;
        return the key count a step must look at (the longest row's, after)."""
        t = k.shape[1]
        pos = self.pos
        if k.shape[0] != len(self.rows):
            raise ShapeError(f"KV cache: {k.shape[0]} batch rows for {len(self.rows)} slots")
        if pos.size and pos.max() + t > self.max_len:
            raise ShapeError(
                f"KV cache overflow: {int(pos.max()) + t} positions needed, the cache holds "
                f"{self.max_len}"
            )
        kb, vb = self.k[layer], self.v[layer]
        for b, (r, p) in enumerate(zip(self.rows.tolist(), pos.tolist())):
            kb[r, :, p : p + t] = k[b].transpose(1, 0, 2)
            vb[r, :, p : p + t] = v[b].transpose(1, 0, 2)
        return int(pos.max(initial=0)) + t

    def advance(self, t: int) -> None:
        """Move each row past the t positions the last forward wrote (its own count when
        the rows are ragged)."""
        self.cache.lengths[self.rows] += t if self.ragged is None else self.ragged


class CausalMask:
    """Which keys the t new queries (after ``past`` cached positions) may see.

    Query i sits at slot past + i (past: an int, or one per batch row) and sees slots up to its own, only the last ``window`` of them
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
        per_row = np.ndim(past) > 0  # a batched step: one position per row
        s = int(np.max(past, initial=0)) + t
        if t == 1 and pad is None and not per_row and (window is None or s <= window):
            return None
        rows = len(pad) if pad is not None else (len(past) if per_row else 1)
        if self.device is META:
            return Tensor._wrap(meta_array((rows, 1, t, s), bool), META)
        qpos = np.reshape(past, (-1, 1, 1)) + np.arange(t)[None, :, None]
        kpos = np.arange(s)[None, None, :]
        allowed = kpos <= qpos
        if window is not None:
            allowed &= kpos > qpos - window
        allowed = allowed[:, None]
        if pad is not None:
            allowed = allowed & pad[:, None, None, :s]
            allowed = allowed | ~allowed.any(-1, keepdims=True)  # padded rows attend anywhere
        return Tensor._wrap(allowed, self.device)


__all__ = ["KVCache", "BatchKVCache", "KVCacheRows", "CausalMask"]
