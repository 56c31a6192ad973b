"""Kernels for decoder-only language models (the LLaMA family), float32, inference only.

Token-major layout throughout: a projection's output ``(batch, tokens, heads * head_dim)`` is
viewed as ``(batch, tokens, heads, head_dim)`` and read in place, so no transposes or copies sit
between the matrix products. The key/value cache is ``(batch, kv_heads, max_len, head_dim)``.

- ``rms_norm``: x * rsqrt(mean(x**2) + eps) * w over the last dim
- ``rope_qk``: rotary embeddings on queries and keys in one call (half-split or interleaved)
- ``attention``: causal attention of new queries over the cache (grouped key/value heads,
  sliding window, left padding). A few queries (decode): one numba pass per query row, scores
  one row at a time. A prompt: blocks of query rows per key/value head as two BLAS products on
  the threads of ``tiles.run_tiles``, at most ATTENTION_BLOCK_SCORES scores per block.
- ``silu_mul``: silu(gate) * up, the SwiGLU gate

Each kernel has a numpy reference (``*_reference``) that the tests compare it to and that serves
where numba is absent (EMBER_NO_NUMBA=1). The kernels run on the calling thread (a decode step's
work is microseconds: waking a thread costs more), except attention over long prompts.
"""

from __future__ import annotations

import math

import numpy as np

from ember.kernels.cpu import numba_or_none, renamed

_K: dict | None = None
# attention uses numba's threads from this many multiply-adds on (queries * keys * heads * dim)
PARALLEL_ATTENTION_WORK = 1 << 22
# from this many new queries on (a prompt), attention runs as blocks of BLAS products instead
BLOCKED_MIN_QUERIES = 16
ATTENTION_BLOCK_SCORES = 1 << 18  # float32 scores per block (1 MiB)
ATTENTION_BLOCK_ROWS = 64  # query rows per block: later blocks see more keys, earlier ones fewer
NUMPY_SILU_MIN = 1 << 14  # from this many elements on, silu_mul runs as numpy passes
_F32 = np.float32


def _build() -> dict:
    """Compile (or load from cache) the numba kernels; {} when numba is unavailable."""
    nb = numba_or_none()
    if nb is None:
        return {}
    njit, prange = nb.njit, nb.prange
    ninf = np.float32(-np.inf)

    def rms_norm(x, w, eps, out):  # pragma: no cover - compiled
        rows, n = x.shape
        for r in range(rows):
            ss = np.float32(0.0)
            for c in range(n):
                ss += x[r, c] * x[r, c]
            inv = np.float32(1.0 / math.sqrt(ss / n + eps))
            for c in range(n):
                out[r, c] = (x[r, c] * inv) * w[c]

    def rope_qk(q, k, cos, sin, interleaved, qo, ko):  # pragma: no cover - compiled
        half = cos.shape[2]
        for which in range(2):
            x, out = (q, qo) if which == 0 else (k, ko)
            nb_, nt, nh, d = x.shape
            for b in range(nb_):
                for t in range(nt):
                    c, s = cos[b, t], sin[b, t]
                    for h in range(nh):
                        xi, o = x[b, t, h], out[b, t, h]
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

    def attention(q, kb, vb, n_keys, past, window, pad, has_pad, scale, out):  # pragma: no cover
        nb_, nt, hq, d = q.shape
        hk = kb.shape[1]
        rep = hq // hk
        for item in prange(nb_ * hk * nt):
            # rows alternate from both ends, so contiguous ranges of items cost about the same
            r2 = item % nt
            i = r2 // 2 if r2 % 2 == 0 else nt - 1 - r2 // 2
            bg = item // nt
            b, g = bg // hk, bg % hk
            qpos = past + i
            lo = max(0, qpos - window + 1) if window > 0 else 0
            hi = min(qpos + 1, n_keys)
            qh = np.empty((rep, d), np.float32)
            for r in range(rep):
                for e in range(d):
                    qh[r, e] = q[b, i, g * rep + r, e] * scale
            s = np.empty((rep, n_keys), np.float32)
            full = False
            while True:
                for j in range(lo, hi):
                    kj = kb[b, g, j]
                    for r in range(rep):
                        acc = np.float32(0.0)
                        for e in range(d):
                            acc += qh[r, e] * kj[e]
                        s[r, j] = acc
                if full or not has_pad:
                    break
                seen = 0
                for j in range(lo, hi):
                    if pad[b, j]:
                        seen += 1
                    else:
                        for r in range(rep):
                            s[r, j] = ninf
                if seen > 0:
                    break
                lo, hi, full = 0, n_keys, True  # a padding row sees no key: let it see all
            den = np.empty(rep, np.float32)
            for r in range(rep):
                mx = ninf
                for j in range(lo, hi):
                    mx = max(mx, s[r, j])
                acc = np.float32(0.0)
                for j in range(lo, hi):
                    p = np.exp(s[r, j] - mx)
                    s[r, j] = p
                    acc += p
                den[r] = np.float32(1.0) / acc
            o = np.zeros((rep, d), np.float32)
            for j in range(lo, hi):
                vj = vb[b, g, j]
                for r in range(rep):
                    p = s[r, j]
                    for e in range(d):
                        o[r, e] += p * vj[e]
            for r in range(rep):
                base = (g * rep + r) * d
                for e in range(d):
                    out[b, i, base + e] = o[r, e] * den[r]

    def silu_mul(g, u, out):  # pragma: no cover - compiled
        rows, n = g.shape
        for r in range(rows):
            for c in range(n):
                x = g[r, c]
                out[r, c] = x / (np.float32(1.0) + np.exp(-x)) * u[r, c]

    # fast-math without "no infinities/NaNs": masked scores are -inf and must stay so
    fast = {"nsz", "arcp", "contract", "afn", "reassoc"}
    opts = dict(cache=True, nogil=True, fastmath=fast, error_model="numpy")
    kernels = {f.__name__: njit(**opts)(f) for f in (rms_norm, rope_qk, attention, silu_mul)}
    kernels["attention_parallel"] = njit(parallel=True, **opts)(renamed(attention, "parallel"))
    return kernels


def _kernel(name: str):
    """The compiled kernel, or None without numba."""
    global _K
    if _K is None:
        _K = _build()
    return _K.get(name) if _K else None


# --- numpy references -------------------------------------------------------------------------


def rms_norm_reference(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x * rsqrt(mean(x**2, -1) + eps) * w in float32."""
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))
    return ((x * r) * w).astype(_F32, copy=False)


def rope_reference(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool
) -> np.ndarray:
    """Rotate x (B, T, H, D) by cos/sin (B, T, rotary_dim / 2); features past rotary_dim pass."""
    half = cos.shape[-1]
    rd = 2 * half
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    out = np.array(x, dtype=_F32, copy=True)
    if interleaved:
        x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]
        out[..., 0:rd:2] = x1 * c - x2 * s
        out[..., 1:rd:2] = x2 * c + x1 * s
    else:
        x1, x2 = x[..., :half], x[..., half:rd]
        out[..., :half] = x1 * c - x2 * s
        out[..., half:rd] = x2 * c + x1 * s
    return out


def allowed_keys(nb: int, nt: int, n_keys: int, past: int, window: int, pad) -> np.ndarray:
    """Bool (B, T, n_keys): query i (at position past + i) may see key j; no key -> all keys."""
    qpos = np.arange(past, past + nt)[:, None]
    kpos = np.arange(n_keys)[None, :]
    ok = kpos <= qpos
    if window > 0:
        ok &= kpos > qpos - window
    ok = np.broadcast_to(ok, (nb, nt, n_keys))
    if pad is not None:
        ok = ok & pad[:, None, :n_keys]
    return ok | ~ok.any(-1, keepdims=True)


def attention_reference(q, kb, vb, n_keys: int, past: int, window: int, pad, scale: float):
    """softmax(q k^T * scale) v per head over keys [0, n_keys) of the cache; (B, T, Hq * D)."""
    nb, nt, hq, d = q.shape
    hk = kb.shape[1]
    rep = hq // hk
    k = np.repeat(kb[:, :, :n_keys], rep, axis=1)  # (B, Hq, S, D)
    v = np.repeat(vb[:, :, :n_keys], rep, axis=1)
    s = np.einsum("bthd,bhsd->bhts", q.astype(_F32), k) * _F32(scale)
    ok = allowed_keys(nb, nt, n_keys, past, window, pad)[:, None]
    s = np.where(ok, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = np.einsum("bhts,bhsd->bthd", p, v)
    return np.ascontiguousarray(o.reshape(nb, nt, hq * d), dtype=_F32)


def silu_mul_reference(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """silu(g) * u = g / (1 + exp(-g)) * u, in place on one temporary."""
    t = np.negative(g, dtype=_F32)
    with np.errstate(over="ignore"):
        np.exp(t, out=t)
    t += _F32(1.0)
    np.divide(g, t, out=t)
    t *= u
    return t


# --- entry points -----------------------------------------------------------------------------


def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """RMS norm of float32 x over its last dim, times w (None: no scale); a new array."""
    n = x.shape[-1]
    w = np.ones(n, _F32) if w is None else w
    k = _kernel("rms_norm")
    if k is None:
        return rms_norm_reference(x, w, eps)
    x2 = np.ascontiguousarray(x).reshape(-1, n)
    out = np.empty(x2.shape, _F32)
    k(x2, w, _F32(eps), out)
    return out.reshape(x.shape)


def rope_qk(q: np.ndarray, k: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool):
    """Rotated copies of q (B, T, Hq, D) and k (B, T, Hk, D); cos, sin (B, T, rotary_dim / 2)."""
    kern = _kernel("rope_qk")
    if kern is None:
        return rope_reference(q, cos, sin, interleaved), rope_reference(k, cos, sin, interleaved)
    qo, ko = np.empty(q.shape, _F32), np.empty(k.shape, _F32)
    kern(q, k, cos, sin, bool(interleaved), qo, ko)
    return qo, ko


def attention_blocked(q, kb, vb, n_keys: int, past: int, window: int, pad, scale: float):
    """The same attention for many queries: blocks of query rows per key/value head, two BLAS
    products each; only a (rows * group, keys) score block per thread exists at a time."""
    from ember.kernels.cpu.tiles import run_tiles, scratch

    nb, nt, hq, d = q.shape
    hk = kb.shape[1]
    rep = hq // hk
    out = np.empty((nb, nt, hq, d), _F32)
    rows = max(1, min(ATTENTION_BLOCK_ROWS, ATTENTION_BLOCK_SCORES // max(1, rep * n_keys)))
    nblocks = -(-nt // rows)

    def block(i: int) -> None:
        b, rest = divmod(i, nblocks * hk)
        r0, g = divmod(rest, hk)
        r0 *= rows
        r1 = min(nt, r0 + rows)
        k0, k1 = 0, n_keys  # the keys this block's rows may see
        if pad is None:
            k0 = max(0, past + r0 - window + 1) if window > 0 else 0
            k1 = min(n_keys, past + r1)
        pb = None if pad is None else pad[b : b + 1]
        ok = allowed_keys(1, r1 - r0, n_keys, past + r0, window, pb)[0, :, k0:k1]
        qg = q[b, r0:r1, g * rep : (g + 1) * rep].reshape((r1 - r0) * rep, d)
        s = scratch(((r1 - r0) * rep, k1 - k0))
        np.matmul(qg, kb[b, g, k0:k1].T, out=s)
        s3 = s.reshape(r1 - r0, rep, k1 - k0)
        s3 *= _F32(scale)
        s3 += np.where(ok, _F32(0.0), _F32(-np.inf))[:, None, :]
        s3 -= s3.max(-1, keepdims=True)
        np.exp(s3, out=s3)
        s3 /= s3.sum(-1, keepdims=True)
        o = np.matmul(s, vb[b, g, k0:k1])
        out[b, r0:r1, g * rep : (g + 1) * rep] = o.reshape(r1 - r0, rep, d)

    run_tiles(block, nb * nblocks * hk)
    return out.reshape(nb, nt, hq * d)


def attention(q, kb, vb, n_keys: int, past: int, window: int | None, pad, scale: float):
    """Causal attention of q (B, T, Hq, D) at positions past.. over cache keys [0, n_keys).

    kb, vb: C-contiguous (B, Hk, max_len, D) buffers; Hq a multiple of Hk. window: keys within
    that many positions (None: all). pad: bool (B, >= n_keys), False = a padding slot nobody
    sees, or None. A query that may see no key at all sees every key (a padding row's output is
    never used; this keeps it finite). Returns (B, T, Hq * D).
    """
    w = int(window or 0)
    nb, nt, hq, d = q.shape
    if nt >= BLOCKED_MIN_QUERIES:
        return attention_blocked(q, kb, vb, n_keys, past, w, pad, scale)
    parallel = nt * n_keys * hq * d >= PARALLEL_ATTENTION_WORK
    kern = _kernel("attention_parallel" if parallel else "attention")
    if kern is None:
        return attention_reference(q, kb, vb, n_keys, past, w, pad, scale)
    out = np.empty((nb, nt, hq * d), _F32)
    has_pad = pad is not None
    pad_arr = np.ascontiguousarray(pad, np.bool_) if has_pad else np.ones((1, 1), np.bool_)
    kern(q, kb, vb, n_keys, past, w, pad_arr, has_pad, _F32(scale), out)
    return out


def silu_mul(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """silu(g) * u for float32 arrays of one shape (strided views allowed); a new array."""
    k = _kernel("silu_mul")
    if k is None or g.size >= NUMPY_SILU_MIN:  # numpy's exp is SIMD, numba's calls expf
        return silu_mul_reference(g, u)
    n = g.shape[-1]
    out = np.empty(g.shape, _F32)
    k(g.reshape(-1, n), u.reshape(-1, n), out.reshape(-1, n))
    return out
