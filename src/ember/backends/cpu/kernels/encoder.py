"""Kernels for transformer encoders on packed rows (padding removed), float32.

A batch of sequences is packed into one (tokens, features) matrix: sequence b occupies rows
``cu[b]:cu[b + 1]``. Linear layers then run as single BLAS calls on real tokens only, and these
kernels do the rest of an encoder layer in one pass each, bias adds folded in:

- ``packed_attention``: softmax(q k^T * scale) v per sequence and head, q/k/v biases added on read
- ``add_layer_norm_``: x <- layer_norm(x + h + bias) (residual, bias and norm in one pass)
- ``bias_gelu_``: u <- gelu(u + bias) with the exact erf form
- ``embed_layer_norm``: layer_norm(word[ids] + pos[pos_ids] + type[type_ids])

Each kernel has a numpy reference (``*_reference``) that the tests compare it to and that serves
where numba is absent (EMBER_NO_NUMBA=1).
"""

from __future__ import annotations

import math
import types

import numpy as np

from ember.backends.cpu.kernels import numba_or_none

_K: dict | None = None
# erf(x) ~ x * P(x^2) / Q(x^2) on [-4, 4] (|error| < 2e-7; Eigen's float erf, also PyTorch's)
_ERF_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
              -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
              -1.60960333262415e-02)  # fmt: skip
_ERF_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
             -7.37332916720468e-03, -1.42647390514189e-02)  # fmt: skip
_RSQRT2 = 0.7071067811865476
# below this many rows the kernels run on one thread (thread hand-off costs more than it saves)
# The kernels run between BLAS calls. Handing work from BLAS's thread pool to numba's and back
# costs more than these row-wise passes take, so they run on the calling thread; attention, whose
# work grows with the square of the sequence length, uses numba's threads once a batch holds
# at least this many multiply-adds (hidden * sum of squared lengths).
PARALLEL_ATTENTION_WORK = 1 << 24


def _build() -> dict:
    """Compile (or load from cache) the numba kernels; {} when numba is unavailable."""
    nb = numba_or_none()
    if nb is None:
        return {}
    njit, prange = nb.njit, nb.prange

    def attention(qkv, bias, cu, nh, scale, out):  # pragma: no cover - compiled
        n_seq = cu.shape[0] - 1
        hidden = out.shape[1]
        hd = hidden // nh
        for p in prange(n_seq * nh):
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
            for j in range(n):
                row = qkv[s0 + j]
                for e in range(hd):
                    q[j, e] = (row[qo + e] + bias[qo + e]) * scale
                    kt[e, j] = row[ko + e] + bias[ko + e]
                    v[j, e] = row[vo + e] + bias[vo + e]
            s = np.empty(n, np.float32)
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
                inv = np.float32(1.0) / den
                o = out[s0 + i, qo : qo + hd]
                o[:] = 0.0
                for j in range(n):  # weighted values: e innermost, contiguous in v
                    w = s[j] * inv
                    vj = v[j]
                    for e in range(hd):
                        o[e] += w * vj[e]

    def add_ln(x, h, bias, w, beta, eps):  # pragma: no cover - compiled
        rows, cols = x.shape
        for r in prange(rows):
            mean = 0.0
            for c in range(cols):
                t = x[r, c] + h[r, c] + bias[c]
                h[r, c] = t
                mean += t
            mean /= cols
            var = 0.0
            for c in range(cols):
                d = h[r, c] - mean
                var += d * d
            rstd = 1.0 / math.sqrt(var / cols + eps)
            for c in range(cols):
                x[r, c] = np.float32((h[r, c] - mean) * rstd) * w[c] + beta[c]

    a1, a3, a5, a7, a9, a11, a13 = (np.float32(c) for c in _ERF_ALPHA)
    b0, b2, b4, b6, b8 = (np.float32(c) for c in _ERF_BETA)
    half, one, four, rsqrt2 = np.float32(0.5), np.float32(1.0), np.float32(4.0), np.float32(_RSQRT2)

    def bias_gelu(u, bias):  # pragma: no cover - compiled
        rows, cols = u.shape
        for r in prange(rows):
            for c in range(cols):
                t = u[r, c] + bias[c]
                # erf(t / sqrt 2) as a rational function in float32 (branch-free: vectorizes)
                x = min(max(t * rsqrt2, -four), four)
                x2 = x * x
                p = x2 * a1 + a3
                p = x2 * p + a5
                p = x2 * p + a7
                p = x2 * p + a9
                p = x2 * p + a11
                p = x2 * p + a13
                q = x2 * b0 + b2
                q = x2 * q + b4
                q = x2 * q + b6
                q = x2 * q + b8
                u[r, c] = half * t * (one + x * p / q)

    def embed_ln(word, pos, typ, ids, pids, tids, w, beta, eps, out):  # pragma: no cover
        rows, cols = out.shape
        for r in prange(rows):
            a, p, t = ids[r], pids[r], tids[r]
            mean = 0.0
            for c in range(cols):
                v = word[a, c] + pos[p, c] + typ[t, c]
                out[r, c] = v
                mean += v
            mean /= cols
            var = 0.0
            for c in range(cols):
                d = out[r, c] - mean
                var += d * d
            rstd = 1.0 / math.sqrt(var / cols + eps)
            for c in range(cols):
                out[r, c] = np.float32((out[r, c] - mean) * rstd) * w[c] + beta[c]

    opts = dict(cache=True, nogil=True, error_model="numpy")
    kernels = {f.__name__: njit(**opts)(f) for f in (attention, add_ln, bias_gelu, embed_ln)}
    # numba's on-disk cache tells functions apart by qualified name, not by options: the
    # multi-threaded variant is a copy of the function under another name
    g = types.FunctionType(attention.__code__, attention.__globals__, "attention_parallel",
                           None, attention.__closure__)  # fmt: skip
    g.__qualname__ = attention.__qualname__ + "_parallel"
    kernels["attention_parallel"] = njit(parallel=True, **opts)(g)
    return kernels


def _kernel(name: str):
    """The compiled kernel, or None without numba."""
    global _K
    if _K is None:
        _K = _build()
    return _K.get(name) if _K else None


# --- numpy references -------------------------------------------------------------------------


def packed_attention_reference(
    qkv: np.ndarray, bias: np.ndarray, cu: np.ndarray, num_heads: int, scale: float
) -> np.ndarray:
    """Self-attention of each packed sequence; qkv (tokens, 3*H) without bias -> (tokens, H)."""
    hidden = qkv.shape[1] // 3
    hd = hidden // num_heads
    out = np.zeros((qkv.shape[0], hidden), np.float32)
    x = qkv + bias
    for b in range(len(cu) - 1):
        s0, s1 = int(cu[b]), int(cu[b + 1])
        if s1 <= s0:
            continue
        q, k, v = (x[s0:s1, i * hidden : (i + 1) * hidden] for i in range(3))
        q = q.reshape(s1 - s0, num_heads, hd).transpose(1, 0, 2) * np.float32(scale)
        k = k.reshape(s1 - s0, num_heads, hd).transpose(1, 2, 0)
        v = v.reshape(s1 - s0, num_heads, hd).transpose(1, 0, 2)
        s = q @ k
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[s0:s1] = (p @ v).transpose(1, 0, 2).reshape(s1 - s0, hidden)
    return out


def _ln_reference(t: np.ndarray, w: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    t64 = t.astype(np.float64)
    mu = t64.mean(-1, keepdims=True)
    var = ((t64 - mu) ** 2).mean(-1, keepdims=True)
    return ((t64 - mu) / np.sqrt(var + eps)).astype(np.float32) * w + beta


def add_layer_norm_reference(x, h, bias, w, beta, eps: float) -> np.ndarray:
    """layer_norm(x + h + bias) over the last dim."""
    return _ln_reference(x + h + bias, w, beta, eps)


def bias_gelu_reference(u: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """gelu(u + bias), exact erf form."""
    from ember.backends.cpu.kernels.special import erf_reference

    t = u + bias
    return (
        np.float32(0.5) * t * (np.float32(1.0) + erf_reference(t * np.float32(0.7071067811865476)))
    )


def embed_layer_norm_reference(word, pos, typ, ids, pids, tids, w, beta, eps: float) -> np.ndarray:
    """layer_norm(word[ids] + pos[pids] + typ[tids])."""
    return _ln_reference(word[ids] + pos[pids] + typ[tids], w, beta, eps)


# --- entry points -----------------------------------------------------------------------------


def packed_attention(
    qkv: np.ndarray, bias: np.ndarray, cu: np.ndarray, num_heads: int, scale: float
) -> np.ndarray:
    """Self-attention within each packed sequence (rows cu[b]:cu[b+1]); returns (tokens, H)."""
    n = np.diff(cu)
    work = qkv.shape[1] // 3 * int((n * n).sum())
    k = _kernel("attention_parallel" if work >= PARALLEL_ATTENTION_WORK else "attention")
    if k is None:
        return packed_attention_reference(qkv, bias, cu, num_heads, scale)
    out = np.empty((qkv.shape[0], qkv.shape[1] // 3), np.float32)
    k(qkv, bias, cu.astype(np.int64, copy=False), num_heads, np.float32(scale), out)
    return out


def add_layer_norm_(x, h, bias, w, beta, eps: float) -> np.ndarray:
    """x <- layer_norm(x + h + bias) in place (h is used as scratch); returns x."""
    k = _kernel("add_ln")
    if k is None:
        x[...] = add_layer_norm_reference(x, h, bias, w, beta, eps)
    else:
        k(x, h, bias, w, beta, float(eps))
    return x


def bias_gelu_(u: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """u <- gelu(u + bias) in place; returns u."""
    k = _kernel("bias_gelu")
    if k is None:
        u[...] = bias_gelu_reference(u, bias)
    else:
        k(u, bias)
    return u


def embed_layer_norm(word, pos, typ, ids, pids, tids, w, beta, eps: float) -> np.ndarray:
    """layer_norm(word[ids] + pos[pids] + typ[tids]) for 1-d index arrays; (len(ids), H)."""
    k = _kernel("embed_ln")
    if k is None:
        return embed_layer_norm_reference(word, pos, typ, ids, pids, tids, w, beta, eps)
    out = np.empty((len(ids), word.shape[1]), np.float32)
    i64 = np.int64
    k(word, pos, typ, ids.astype(i64, copy=False), pids.astype(i64, copy=False),
      tids.astype(i64, copy=False), w, beta, float(eps), out)  # fmt: skip
    return out
