"""Rotary position embeddings (RoPE): frequency tables and the rotation as one op.

Two layouts exist in the wild: Hugging Face rotates the two halves of each head
("half-split", GPT-NeoX style); GGUF/llama.cpp checkpoints of the llama family store q/k rows
permuted so that adjacent pairs rotate ("interleaved"). Both are the same rotation applied to
differently ordered rows, so a model keeps the file's order and picks the matching layout.
"""

from __future__ import annotations

import math

import numpy as np

from ember.autograd import Function, is_grad_enabled, meta_array
from ember.device import CPU, META, Device
from ember.errors import ShapeError
from ember.tensor import Tensor


def rope_inv_freq(
    head_dim: int,
    theta: float = 10000.0,
    scaling: dict | None = None,
    rotary_dim: int | None = None,
) -> np.ndarray:
    """Inverse frequencies (rotary_dim/2,) incl. linear, dynamic-free llama3 and yarn-free scaling."""
    rd = rotary_dim or head_dim
    inv = 1.0 / (theta ** (np.arange(0, rd, 2, dtype=np.float64) / rd))
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        lo = float(scaling.get("low_freq_factor", 1.0))
        hi = float(scaling.get("high_freq_factor", 4.0))
        old = float(scaling.get("original_max_position_embeddings", 8192))
        low_wl, high_wl = old / lo, old / hi
        wavelen = 2 * math.pi / inv
        out = np.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * out / factor + smooth * out
        medium = (wavelen <= low_wl) & (wavelen >= high_wl)
        return np.where(medium, mid, out)
    from ember.errors import UnsupportedError

    raise UnsupportedError(f"rope scaling type {kind!r} is not supported (linear, llama3 are)")


def rope_cos_sin(
    inv_freq: np.ndarray, positions: np.ndarray, dtype=np.float32, attention_factor: float = 1.0
):
    """cos and sin tables of shape positions.shape + (rotary_dim/2,)."""
    ang = np.asarray(positions, dtype=np.float64)[..., None] * inv_freq
    return (np.cos(ang) * attention_factor).astype(dtype), (np.sin(ang) * attention_factor).astype(
        dtype
    )


def rope_tables(
    inv_freq: np.ndarray,
    positions: np.ndarray,
    dtype=np.float32,
    attention_factor: float = 1.0,
    device: Device = CPU,
) -> tuple[Tensor, Tensor]:
    """``rope_cos_sin`` as tensors on ``device``; on the meta device only their shape and dtype."""
    if device is META:
        table = meta_array(np.shape(positions) + (len(inv_freq),), dtype)
        return Tensor._wrap(table, META), Tensor._wrap(table, META)
    cos, sin = rope_cos_sin(inv_freq, positions, dtype, attention_factor)
    return Tensor._wrap(cos, device), Tensor._wrap(sin, device)


def _rotate(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool, sign: float
) -> np.ndarray:
    half = cos.shape[-1]
    rd = 2 * half
    out = np.empty_like(x)
    if interleaved:
        x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]
        out[..., 0:rd:2] = x1 * cos - sign * x2 * sin
        out[..., 1:rd:2] = x2 * cos + sign * x1 * sin
    else:
        x1, x2 = x[..., :half], x[..., half:rd]
        out[..., :half] = x1 * cos - sign * x2 * sin
        out[..., half:rd] = x2 * cos + sign * x1 * sin
    if rd < x.shape[-1]:
        out[..., rd:] = x[..., rd:]
    return out


class Rotary(Function):
    """Rotate pairs of features by position-dependent angles; backward rotates back.

    The float32 kernel (``ember.kernels.cpu.rope``) takes token-major x (b, t, heads, d) with
    cos/sin (b|1, t, 1, rotary_dim / 2); it runs in training too (backward needs only the angles).
    """

    kernel_op = "rope"

    def meta(self, x, cos, sin, interleaved):
        """x's shape and dtype, without the work (and the x-sized scratch) of a rotation."""
        np.broadcast_shapes(x.shape[:-1], cos.shape[:-1], sin.shape[:-1])  # ValueError: ShapeError
        return x.shape, x.dtype

    def saved(self, x, cos, sin, interleaved):
        self.cos, self.sin, self.interleaved = cos, sin, interleaved

    def forward(self, x, cos, sin, interleaved):
        self.saved(x, cos, sin, interleaved)
        return _rotate(
            x, cos.astype(x.dtype, copy=False), sin.astype(x.dtype, copy=False), interleaved, 1.0
        )

    def backward(self, g):
        c, s = self.cos.astype(g.dtype, copy=False), self.sin.astype(g.dtype, copy=False)
        return _rotate(g, c, s, self.interleaved, -1.0), None, None


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """Apply RoPE to x (..., seq, head_dim) with cos/sin broadcastable to (..., seq, rotary_dim/2)."""
    if 2 * cos.shape[-1] > x.shape[-1]:
        raise ShapeError(
            f"apply_rotary: rotary dim {2 * cos.shape[-1]} exceeds head dim {x.shape[-1]}"
        )
    return Rotary.apply(x, cos, sin, interleaved=interleaved)


class RotaryQK(Function):
    """RoPE on queries and keys with the same angles, as one (b, t, hq + hk, d) array.

    Inference only (no backward): ``apply_rotary_qk`` runs it when no graph is recorded and
    hands out the two halves as plain views; with a graph it runs two ``Rotary`` ops. The
    float32 kernel is ``ember.kernels.cpu.rope.rope_qk``.
    """

    kernel_op = "rope_qk"

    def meta(self, q, k, cos, sin, interleaved):
        """The stacked shape and q's dtype, without the rotation."""
        np.broadcast_shapes(q.shape[:-1], cos.shape[:-1], sin.shape[:-1])
        return q.shape[:2] + (q.shape[2] + k.shape[2], q.shape[3]), q.dtype

    def forward(self, q, k, cos, sin, interleaved):
        rot = [
            _rotate(a, cos.astype(a.dtype, copy=False), sin.astype(a.dtype, copy=False),
                    interleaved, 1.0)
            for a in (q, k)
        ]  # fmt: skip
        return np.concatenate(rot, axis=2)


def apply_rotary_qk(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False
) -> tuple[Tensor, Tensor]:
    """RoPE on queries (b, t, hq, d) and keys (b, t, hk, d) with the same angles.

    Without a graph to record this is one op (one dispatch, one kernel call per attention
    layer) whose output's two halves come back as views; otherwise two ``apply_rotary`` calls.
    Other layouts (not token-major 4-d of one head_dim and dtype) also take two calls.
    """
    qd, kd = q._data, k._data
    if (
        is_grad_enabled()
        and (q.requires_grad or k.requires_grad or cos.requires_grad or sin.requires_grad)
        or qd.ndim != 4
        or kd.ndim != 4
        or qd.shape[:2] != kd.shape[:2]
        or qd.shape[3] != kd.shape[3]
        or qd.dtype != kd.dtype
        or q._device is not k._device
    ):
        return apply_rotary(q, cos, sin, interleaved), apply_rotary(k, cos, sin, interleaved)
    if 2 * cos.shape[-1] > qd.shape[-1]:
        raise ShapeError(
            f"apply_rotary: rotary dim {2 * cos.shape[-1]} exceeds head dim {qd.shape[-1]}"
        )
    both = RotaryQK.apply(q, k, cos, sin, interleaved=interleaved)
    out, dev, hq = both._data, both._device, qd.shape[2]
    return Tensor._wrap(out[:, :, :hq], dev), Tensor._wrap(out[:, :, hq:], dev)


__all__ = ["apply_rotary", "apply_rotary_qk", "rope_inv_freq", "rope_cos_sin", "rope_tables"]
