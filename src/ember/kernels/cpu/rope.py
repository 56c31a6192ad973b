"""Kernel of the ``rope`` op (``ember.ops.rope.Rotary``): rotary embeddings, float32.

Token-major layout: x is (batch, tokens, heads, head_dim), typically a strided view of a
projection's output, read in place; cos and sin are (batch | 1, tokens, 1, rotary_dim / 2), one
angle per position shared by every head. Pairs rotate as halves of each head (Hugging Face,
"half-split") or as adjacent features (GGUF's llama layout, "interleaved"); features past
rotary_dim (partial rotary) pass through. One numba pass on the calling thread: a decode step
rotates a few thousand numbers.
"""

from __future__ import annotations

import numpy as np

from ember.kernels.cpu import have_numba, jit
from ember.kernels.registry import register

_F32 = np.float32


def rope_reference(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, interleaved: bool):
    """Rotate x (..., head_dim) by cos/sin broadcastable to (..., rotary_dim / 2); a new array."""
    half = cos.shape[-1]
    rd = 2 * half
    out = np.array(x, copy=True)
    if interleaved:
        x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]
        out[..., 0:rd:2] = x1 * cos - x2 * sin
        out[..., 1:rd:2] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., :half], x[..., half:rd]
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:rd] = x2 * cos + x1 * sin
    return out


def _when(x, cos, sin, *, interleaved) -> bool:
    """Token-major x (B, T, H, D) with one angle per (batch | 1, position): (B|1, T, 1, half)."""
    cs = cos.shape
    return (
        x.ndim == 4
        and len(cs) == 4
        and sin.shape == cs
        and cs[2] == 1
        and cs[1] == x.shape[1]
        and cs[0] in (1, x.shape[0])
        and 2 * cs[3] <= x.shape[3]
    )


@register("rope", reference=rope_reference, when=_when, available=have_numba)
def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, interleaved: bool) -> np.ndarray:
    """Rotated copy of float32 x (B, T, H, D); cos, sin (B|1, T, 1, rotary_dim / 2)."""
    out = np.empty(x.shape, _F32)
    c = cos.reshape(cos.shape[0], cos.shape[1], cos.shape[3])
    s = sin.reshape(sin.shape[0], sin.shape[1], sin.shape[3])
    _rope_qk(x, x[:, :, :0], c, s, bool(interleaved), out)  # no key heads: x's rotation only
    return out


# --- rope_qk: queries and keys in one call -----------------------------------------------------
# The ``rope_qk`` op (``ember.ops.rope.apply_rotary_qk`` when no graph is recorded) rotates q
# (B, T, Hq, D) and k (B, T, Hk, D) by the same angles into one (B, T, Hq + Hk, D) array: one
# dispatch and one kernel call per attention layer instead of two.


def _rope_qk_py(q, k, cos, sin, interleaved, out):  # pragma: no cover - compiled
    nb, nt, hq, d = q.shape
    hk = k.shape[2]
    half = cos.shape[2]
    cb = cos.shape[0]
    for b in range(nb):
        bc = b if cb > 1 else 0
        for t in range(nt):
            c, s = cos[bc, t], sin[bc, t]
            for h in range(hq + hk):
                xi = q[b, t, h] if h < hq else k[b, t, h - hq]
                o = out[b, t, h]
                if interleaved:
                    for i in range(half):
                        x1, x2 = xi[2 * i], xi[2 * i + 1]
                        o[2 * i] = x1 * c[i] - x2 * s[i]
                        o[2 * i + 1] = x2 * c[i] + x1 * s[i]
                else:
                    for i in range(half):
                        x1, x2 = xi[i], xi[half + i]
                        o[i] = x1 * c[i] - x2 * s[i]
                        o[half + i] = x2 * c[i] + x1 * s[i]
                for e in range(2 * half, d):
                    o[e] = xi[e]


_rope_qk = jit(_rope_qk_py)


def rope_qk_reference(q, k, cos, sin, *, interleaved: bool) -> np.ndarray:
    """[rotated q | rotated k] along the heads axis: (B, T, Hq + Hk, D), a new array."""
    return np.concatenate(
        [rope_reference(q, cos, sin, interleaved=interleaved),
         rope_reference(k, cos, sin, interleaved=interleaved)], axis=2,
    )  # fmt: skip


def _when_qk(q, k, cos, sin, *, interleaved) -> bool:
    return (
        k.ndim == 4
        and k.shape[:2] == q.shape[:2]
        and k.shape[3] == q.shape[3]
        and _when(q, cos, sin, interleaved=interleaved)
    )


@register("rope_qk", reference=rope_qk_reference, when=_when_qk, available=have_numba)
def rope_qk(q, k, cos, sin, *, interleaved: bool) -> np.ndarray:
    """Rotated q (B, T, Hq, D) and k (B, T, Hk, D), float32, as one (B, T, Hq + Hk, D) array."""
    nb, nt, hq, d = q.shape
    out = np.empty((nb, nt, hq + k.shape[2], d), _F32)
    if out.size:
        c = cos.reshape(cos.shape[0], cos.shape[1], cos.shape[3])
        s = sin.reshape(sin.shape[0], sin.shape[1], sin.shape[3])
        _rope_qk(q, k, c, s, bool(interleaved), out)
    return out
