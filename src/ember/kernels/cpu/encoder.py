"""Kernels for transformer encoders on packed tokens (padding removed), float32, feature-major.

A batch of sequences is packed into one matrix with a column per real token: sequence b is
columns ``cu[b]:cu[b + 1]``. Activations are kept feature-major, (features, tokens), so a linear
layer is ``W @ x`` with the checkpoint's (out, in) weight as stored: OpenBLAS runs that form up to
1.5x faster than ``x @ W.T`` for the few-token inputs of single sentences, and no faster or slower
for large batches. These kernels do the rest of an encoder layer, one pass each, biases folded in:

- ``packed_attention``: softmax(q k^T * scale) v per sequence and head, q/k/v biases added on read
- ``add_layer_norm_``: x <- layer_norm(x + h + bias) over features (residual, bias, norm at once)
- ``bias_gelu_``: u <- gelu(u + bias), exact (erf) form
- ``embed_layer_norm``: layer_norm(word[ids] + pos[pos_ids] + type[type_ids]), feature-major

Each kernel has a numpy reference (``*_reference``) that the tests compare it to and that serves
where numba is absent (EMBER_NO_NUMBA=1).
"""

from __future__ import annotations

import math

import numpy as np

from ember.kernels.cpu import numba_or_none, renamed
from ember.kernels.cpu.special import erf_f32_jit, erf_reference

_K: dict | None = None
_RSQRT2 = 0.7071067811865476
# The kernels run between BLAS calls. Handing work from BLAS's thread pool to numba's and back
# costs more than these passes take, so they run on the calling thread; attention, whose work
# grows with the square of the sequence length, uses numba's threads once a batch holds at
# least this many multiply-adds (hidden * sum of squared lengths).
PARALLEL_ATTENTION_WORK = 1 << 24


def _build() -> dict:
    """Compile (or load from cache) the numba kernels; {} when numba is unavailable."""
    nb = numba_or_none()
    if nb is None:
        return {}
    njit, prange = nb.njit, nb.prange
    erf32 = erf_f32_jit()
    half, one, rsqrt2 = np.float32(0.5), np.float32(1.0), np.float32(_RSQRT2)

    def attention(qkv, bias, cu, nh, scale, out):  # pragma: no cover - compiled
        hidden = out.shape[0]
        hd = hidden // nh
        for p in prange((cu.shape[0] - 1) * nh):
            b = p // nh
            h = p - b * nh
            s0 = cu[b]
            n = cu[b + 1] - s0
            if n <= 0:
                continue
            qo, ko, vo = h * hd, hidden + h * hd, 2 * hidden + h * hd
            q = np.empty((n, hd), np.float32)
            kt = np.empty((hd, n), np.float32)
            v = np.empty((n, hd), np.float32)
            for e in range(hd):
                qr, kr, vr = qkv[qo + e], qkv[ko + e], qkv[vo + e]
                bq, bk, bv = bias[qo + e], bias[ko + e], bias[vo + e]
                for j in range(n):
                    q[j, e] = (qr[s0 + j] + bq) * scale
                    kt[e, j] = kr[s0 + j] + bk
                    v[j, e] = vr[s0 + j] + bv
            s = np.empty(n, np.float32)
            o = np.empty(hd, np.float32)
            for i in range(n):
                qi = q[i]
                s[:] = 0.0
                for e in range(hd):  # scores: j innermost, contiguous in kt
                    qe = qi[e]
                    ke = kt[e]
                    for j in range(n):
                        s[j] += qe * ke[j]
                mx = s[0]
                for j in range(1, n):
                    mx = max(mx, s[j])
                den = np.float32(0.0)
                for j in range(n):
                    s[j] = np.exp(s[j] - mx)
                    den += s[j]
                inv = one / den
                o[:] = 0.0
                for j in range(n):  # weighted values: e innermost, contiguous in v
                    w = s[j] * inv
                    vj = v[j]
                    for e in range(hd):
                        o[e] += w * vj[e]
                for e in range(hd):
                    out[qo + e, s0 + i] = o[e]

    def add_ln(x, h, bias, w, beta, eps):  # pragma: no cover - compiled
        feats, n = x.shape
        mean = np.zeros(n, np.float64)
        var = np.zeros(n, np.float64)
        for c in range(feats):  # tokens innermost: contiguous, vectorized
            xr, hr, bc = x[c], h[c], bias[c]
            for r in range(n):
                t = xr[r] + hr[r] + bc
                hr[r] = t
                mean[r] += t
        mean /= feats
        for c in range(feats):
            hr = h[c]
            for r in range(n):
                d = hr[r] - mean[r]
                var[r] += d * d
        rstd = (1.0 / np.sqrt(var / feats + eps)).astype(np.float32)
        mu = mean.astype(np.float32)
        for c in range(feats):
            xr, hr, wc, bc = x[c], h[c], w[c], beta[c]
            for r in range(n):
                xr[r] = (hr[r] - mu[r]) * rstd[r] * wc + bc

    def bias_gelu(u, bias):  # pragma: no cover - compiled
        feats, n = u.shape
        for c in range(feats):
            ur, bc = u[c], bias[c]
            for r in range(n):
                t = ur[r] + bc
                # erf in float32, inlined and branch-free: the loop vectorizes
                ur[r] = half * t * (one + erf32(t * rsqrt2))

    def embed_ln(word, pos, typ, ids, pids, tids, w, beta, eps, out):  # pragma: no cover
        feats, n = out.shape
        row = np.empty(feats, np.float32)
        for r in range(n):
            a, p, t = ids[r], pids[r], tids[r]
            mean = 0.0
            for c in range(feats):
                v = word[a, c] + pos[p, c] + typ[t, c]
                row[c] = v
                mean += v
            mean /= feats
            var = 0.0
            for c in range(feats):
                d = row[c] - mean
                var += d * d
            rstd = 1.0 / math.sqrt(var / feats + eps)
            for c in range(feats):
                out[c, r] = np.float32((row[c] - mean) * rstd) * w[c] + beta[c]

    opts = dict(cache=True, nogil=True, error_model="numpy")
    kernels = {f.__name__: njit(**opts)(f) for f in (attention, add_ln, bias_gelu, embed_ln)}
    kernels["attention_parallel"] = njit(parallel=True, **opts)(renamed(attention, "parallel"))
    return kernels


def _kernel(name: str):
    """The compiled kernel, or None without numba."""
    global _K
    if _K is None:
        _K = _build()
    return _K.get(name) if _K else None


# --- numpy references (same feature-major layout) ----------------------------------------------


def packed_attention_reference(
    qkv: np.ndarray, bias: np.ndarray, cu: np.ndarray, num_heads: int, scale: float
) -> np.ndarray:
    """Self-attention of each packed sequence; qkv (3*H, tokens) without bias -> (H, tokens)."""
    hidden = qkv.shape[0] // 3
    hd = hidden // num_heads
    out = np.zeros((hidden, qkv.shape[1]), np.float32)
    x = qkv + bias[:, None]
    for b in range(len(cu) - 1):
        s0, s1 = int(cu[b]), int(cu[b + 1])
        if s1 <= s0:
            continue
        q, k, v = (x[i * hidden : (i + 1) * hidden, s0:s1].reshape(num_heads, hd, s1 - s0)
                   for i in range(3))  # fmt: skip
        s = (q.transpose(0, 2, 1) * np.float32(scale)) @ k  # (heads, n, n)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[:, s0:s1] = (v @ p.transpose(0, 2, 1)).reshape(hidden, s1 - s0)
    return out


def _ln_reference(t: np.ndarray, w: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """layer_norm over axis 0 of a (features, tokens) array."""
    t64 = t.astype(np.float64)
    mu = t64.mean(0, keepdims=True)
    var = ((t64 - mu) ** 2).mean(0, keepdims=True)
    return ((t64 - mu) / np.sqrt(var + eps)).astype(np.float32) * w[:, None] + beta[:, None]


def add_layer_norm_reference(x, h, bias, w, beta, eps: float) -> np.ndarray:
    """layer_norm(x + h + bias) over the features (axis 0) of (features, tokens) arrays."""
    return _ln_reference(x + h + bias[:, None], w, beta, eps)


def bias_gelu_reference(u: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """gelu(u + bias[:, None]), exact erf form."""
    t = u + bias[:, None]
    return np.float32(0.5) * t * (np.float32(1.0) + erf_reference(t * np.float32(_RSQRT2)))


def embed_layer_norm_reference(word, pos, typ, ids, pids, tids, w, beta, eps: float) -> np.ndarray:
    """layer_norm(word[ids] + pos[pids] + typ[tids]) as (features, tokens)."""
    return _ln_reference((word[ids] + pos[pids] + typ[tids]).T, w, beta, eps)


# --- entry points -----------------------------------------------------------------------------


def packed_attention(
    qkv: np.ndarray, bias: np.ndarray, cu: np.ndarray, num_heads: int, scale: float
) -> np.ndarray:
    """Self-attention within each packed sequence (columns cu[b]:cu[b+1]); (3H, T) -> (H, T)."""
    n = np.diff(cu)
    work = qkv.shape[0] // 3 * int((n * n).sum())
    k = _kernel("attention_parallel" if work >= PARALLEL_ATTENTION_WORK else "attention")
    if k is None:
        return packed_attention_reference(qkv, bias, cu, num_heads, scale)
    out = np.empty((qkv.shape[0] // 3, qkv.shape[1]), np.float32)
    k(qkv, bias, cu.astype(np.int64, copy=False), num_heads, np.float32(scale), out)
    return out


def add_layer_norm_(x, h, bias, w, beta, eps: float) -> np.ndarray:
    """x <- layer_norm(x + h + bias) over features, in place (h is scratch); returns x."""
    k = _kernel("add_ln")
    if k is None:
        x[...] = add_layer_norm_reference(x, h, bias, w, beta, eps)
    else:
        k(x, h, bias, w, beta, float(eps))
    return x


def bias_gelu_(u: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """u <- gelu(u + bias[:, None]) in place; returns u."""
    k = _kernel("bias_gelu")
    if k is None:
        u[...] = bias_gelu_reference(u, bias)
    else:
        k(u, bias)
    return u


def embed_layer_norm(word, pos, typ, ids, pids, tids, w, beta, eps: float) -> np.ndarray:
    """layer_norm(word[ids] + pos[pids] + typ[tids]) for 1-d index arrays; (H, len(ids))."""
    k = _kernel("embed_ln")
    if k is None:
        return embed_layer_norm_reference(word, pos, typ, ids, pids, tids, w, beta, eps)
    out = np.empty((word.shape[1], len(ids)), np.float32)
    i64 = np.int64
    k(word, pos, typ, ids.astype(i64, copy=False), pids.astype(i64, copy=False),
      tids.astype(i64, copy=False), w, beta, float(eps), out)  # fmt: skip
    return out
