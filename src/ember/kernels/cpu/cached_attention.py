"""Kernels of the ``cached_attention`` op: causal attention of new queries over a KV cache.

The op (``ember.nn.functional.cached_attention``) is called with token-major queries and the
new keys/values, ``(batch, tokens, heads, head_dim)`` views of the projections, the layer's
cache buffers ``(slots, kv_heads, max_len, head_dim)`` and each batch row's position ``past``
(``kc=None``: no cache, the new keys are all there is). It first writes the new keys/values
into the cache at ``[past, past + tokens)`` (``store_kv``), then attends over keys
``[0, max(past) + tokens)``: everything a step changes is read when the op runs, so a captured
decode step (``ember.nn.graph``) replays it with the positions of the step at hand. Grouped
key/value heads, a sliding window, left padding and tanh soft-capping of the scores are handled
in place: no transposes, repeats or mask tensors.

- A few queries (decode): the LLVM IR kernel of ``decode_attention`` on ember's worker pool
  (no padding, no soft-capping, a head size that fills vectors); otherwise one numba pass per
  query row, scores one row at a time, on numba's threads from PARALLEL_WORK multiply-adds on.
- A prompt (BLOCKED_MIN_QUERIES queries or more): blocks of query rows per key/value head as two
  BLAS products on the threads of ``tiles.run_tiles``, at most BLOCK_SCORES scores per block.

``cached_attention_reference`` is the numpy version the tests compare both with.
"""

from __future__ import annotations

import numpy as np

from ember.errors import ShapeError
from ember.kernels.cpu import decode_attention, have_numba, jit, numba_or_none
from ember.kernels.registry import register

# numba's threads from this many multiply-adds on (queries * keys * heads * dim)
PARALLEL_WORK = 1 << 22
# from this many new queries on (a prompt), attention runs as blocks of BLAS products instead,
# unless the keys are in a cache the IR kernel (decode_attention) reads: a prompt's forward of
# the bundled SmolLM2 / TinyLlama Q4_0 took 1.1-1.4x longer through the blocks at 32 to 1024
# queries (they copy the cache rows they read; an ad-hoc run on Zen 5, 2 threads)
BLOCKED_MIN_QUERIES = 16
BLOCK_SCORES = 1 << 18  # float32 scores per block (1 MiB)
BLOCK_ROWS = 64  # query rows per block: later blocks see more keys, earlier ones fewer
_F32 = np.float32
_NO_PAD = np.ones((1, 1), np.bool_)  # the pad argument when there is none (never read)

prange = range  # numba.prange once numba is loaded (see _kernel)


def _rows_py(
    q, kb, vb, rows, n_keys, past, window, pad, has_pad, scale, cap, out
):  # pragma: no cover
    nb_, nt, hq, d = q.shape
    hk = kb.shape[1]
    rep = hq // hk
    ninf = np.float32(-np.inf)
    for item in prange(nb_ * hk * nt):
        # rows alternate from both ends, so contiguous ranges of items cost about the same
        r2 = item % nt
        i = r2 // 2 if r2 % 2 == 0 else nt - 1 - r2 // 2
        bg = item // nt
        b, g = bg // hk, bg % hk
        c = rows[b]  # the cache row of batch row b
        qpos = past[b] + i
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
                kj = kb[c, g, j]
                for r in range(rep):
                    acc = np.float32(0.0)
                    for e in range(d):
                        acc += qh[r, e] * kj[e]
                    if cap > 0:
                        acc = cap * np.tanh(acc / cap)
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
            vj = vb[c, g, j]
            for r in range(rep):
                p = s[r, j]
                for e in range(d):
                    o[r, e] += p * vj[e]
        for r in range(rep):
            base = (g * rep + r) * d
            for e in range(d):
                out[b, i, base + e] = o[r, e] * den[r]


_K: dict = {}


def _kernel(parallel: bool):
    if not _K:
        globals()["prange"] = numba_or_none().prange
        _K[False] = jit(_rows_py)
        _K[True] = jit(_rows_py, suffix="parallel", parallel=True)
    return _K[parallel]


def allowed_keys(nb: int, nt: int, n_keys: int, past, window: int, pad) -> np.ndarray:
    """Bool (B, T, n_keys): query i of row b (at position past[b] + i; past an int or (B,)) may
    see key j; a query that may see no key sees all keys."""
    qpos = np.reshape(past, (-1, 1, 1)) + np.arange(nt)[None, :, None]
    kpos = np.arange(n_keys)[None, None, :]
    ok = kpos <= qpos
    if window > 0:
        ok &= kpos > qpos - window
    ok = np.broadcast_to(ok, (nb, nt, n_keys))
    if pad is not None:
        ok = ok & pad[:, None, :n_keys]
    return ok | ~ok.any(-1, keepdims=True)


def _rows_of(nb: int, past, rows) -> tuple[np.ndarray, np.ndarray]:
    """(past, rows) as (B,) int64 arrays: each batch row's position and its cache row."""
    pa = np.ascontiguousarray(np.broadcast_to(np.asarray(past, np.int64), (nb,)))
    ra = np.arange(nb, dtype=np.int64) if rows is None else np.ascontiguousarray(rows, np.int64)
    return pa, ra


def _buffers(k, v, kc, vc):
    """The head-major key/value buffers the kernels read: the cache's, or the new keys'."""
    if kc is not None:
        return kc, vc
    return (
        np.ascontiguousarray(k.transpose(0, 2, 1, 3)),
        np.ascontiguousarray(v.transpose(0, 2, 1, 3)),
    )


def store_kv(kc, vc, k, v, past, rows=None) -> int:
    """Write token-major k, v (B, T, Hk, D) into the cache buffers (slots, Hk, max_len, D) at
    [past, past + T) of each batch row's slot (rows[b], or b); return the keys a step sees
    (max(past) + T). past: an int, or one position per batch row."""
    nb, t = k.shape[:2]
    max_len = kc.shape[2]
    pa = np.asarray(past).reshape(-1)
    if rows is not None and len(rows) != nb:
        raise ShapeError(f"KV cache: {nb} batch rows for {len(rows)} slots")
    end = int(pa.max(initial=0)) + t
    if end > max_len:
        raise ShapeError(f"KV cache overflow: {end} positions needed, the cache holds {max_len}")
    if pa.size == 1 and rows is None:  # every row at one position
        p = int(pa[0])
        kc[:nb, :, p : p + t] = k.transpose(0, 2, 1, 3)
        vc[:nb, :, p : p + t] = v.transpose(0, 2, 1, 3)
        return end
    if pa.size != nb:
        raise ShapeError(f"KV cache: {pa.size} positions for {nb} batch rows")
    for b, p in enumerate(pa.tolist()):
        r = b if rows is None else int(rows[b])
        kc[r, :, p : p + t] = k[b].transpose(1, 0, 2)
        vc[r, :, p : p + t] = v[b].transpose(1, 0, 2)
    return end


def cached_attention_reference(
    q, k, v, *, kc, vc, past, window, pad, scale, softcap, rows=None
) -> np.ndarray:
    """Store k, v in the cache, then softmax(cap(q k^T * scale)) v per head over keys
    [0, max(past) + T) of the cache; (B, T, Hq * D)."""
    nb, nt, hq, d = q.shape
    n_keys = nt if kc is None else store_kv(kc, vc, k, v, past, rows)
    kb, vb = _buffers(k, v, kc, vc)
    if rows is not None:
        kb, vb = kb[rows], vb[rows]
    hk = kb.shape[1]
    rep = hq // hk
    kf = np.repeat(kb[:, :, :n_keys], rep, axis=1).astype(_F32)  # (B, Hq, S, D)
    vf = np.repeat(vb[:, :, :n_keys], rep, axis=1).astype(_F32)
    s = np.einsum("bthd,bhsd->bhts", q.astype(_F32), kf) * _F32(scale)
    if softcap:
        s = _F32(softcap) * np.tanh(s / _F32(softcap))
    ok = allowed_keys(nb, nt, n_keys, past, int(window or 0), pad)[:, None]
    s = np.where(ok, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = np.einsum("bhts,bhsd->bthd", p, vf)
    return np.ascontiguousarray(o.reshape(nb, nt, hq * d), dtype=_F32)


def _blocked(q, kb, vb, rows, n_keys: int, past, window: int, pad, scale: float, cap: float):
    """Many queries: blocks of query rows per key/value head, two BLAS products each; only a
    (rows * group, keys) score block per thread exists at a time."""
    from ember.kernels.cpu.tiles import run_tiles, scratch

    nb, nt, hq, d = q.shape
    hk = kb.shape[1]
    rep = hq // hk
    out = np.empty((nb, nt, hq, d), _F32)
    step = max(1, min(BLOCK_ROWS, BLOCK_SCORES // max(1, rep * n_keys)))
    nblocks = -(-nt // step)

    def block(i: int) -> None:
        b, rest = divmod(i, nblocks * hk)
        r0, g = divmod(rest, hk)
        r0 *= step
        r1 = min(nt, r0 + step)
        pb_, c = int(past[b]), rows[b]
        k0, k1 = 0, n_keys  # the keys this block's rows may see
        if pad is None:
            k0 = max(0, pb_ + r0 - window + 1) if window > 0 else 0
            k1 = min(n_keys, pb_ + r1)
        pb = None if pad is None else pad[b : b + 1]
        ok = allowed_keys(1, r1 - r0, n_keys, pb_ + r0, window, pb)[0, :, k0:k1]
        qg = q[b, r0:r1, g * rep : (g + 1) * rep].reshape((r1 - r0) * rep, d)
        s = scratch(((r1 - r0) * rep, k1 - k0))
        np.matmul(qg, kb[c, g, k0:k1].T, out=s)
        s3 = s.reshape(r1 - r0, rep, k1 - k0)
        s3 *= _F32(scale)
        if cap > 0:
            s3 /= _F32(cap)
            np.tanh(s3, out=s3)
            s3 *= _F32(cap)
        s3 += np.where(ok, _F32(0.0), _F32(-np.inf))[:, None, :]
        s3 -= s3.max(-1, keepdims=True)
        np.exp(s3, out=s3)
        s3 /= s3.sum(-1, keepdims=True)
        o = np.matmul(s, vb[c, g, k0:k1])
        out[b, r0:r1, g * rep : (g + 1) * rep] = o.reshape(r1 - r0, rep, d)

    run_tiles(block, nb * nblocks * hk)
    return out.reshape(nb, nt, hq * d)


def _when(q, k, v, *, kc, vc, past, window, pad, scale, softcap, rows=None) -> bool:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or q.shape[2] % k.shape[2]:
        return False
    if kc is None:
        return True
    return kc.dtype == _F32 and vc.dtype == _F32 and kc.flags.c_contiguous and vc.flags.c_contiguous


def _prepare(out, q, k, v, *, kc, vc, past, window, pad, scale, softcap, rows=None):
    """For a captured decode step (ember.nn.graph): ``decode_attention.bind`` on these arrays,
    the positions read from the (B,) int64 buffer ``past`` at each call; None where the step
    does not take that kernel."""
    nb, nt = q.shape[:2]
    ra = np.arange(nb, dtype=np.int64) if rows is None else rows
    ok = (
        kc is not None and nt < BLOCKED_MIN_QUERIES
        and isinstance(past, np.ndarray) and past.dtype == np.int64 and past.shape == (nb,)
        and past.flags.c_contiguous and isinstance(ra, np.ndarray) and ra.dtype == np.int64
        and ra.flags.c_contiguous and out.dtype == _F32 and out.flags.c_contiguous
        and decode_attention.applies(q, kc, pad, softcap)
    )  # fmt: skip
    if not ok:
        return None
    return decode_attention.bind(q, k, v, kc, vc, ra, past, int(window or 0), scale, out)


@register(
    "cached_attention",
    reference=cached_attention_reference,
    when=_when,
    available=have_numba,
    prepare=_prepare,
)
def cached_attention(
    q, k, v, *, kc, vc, past, window, pad, scale, softcap, rows=None
) -> np.ndarray:
    """Causal attention of q (B, T, Hq, D) at positions past.. over cache keys [0, n_keys),
    n_keys = max(past) + T, after storing k, v there (``store_kv``).

    kc, vc: C-contiguous (slots, Hk, max_len, D) cache buffers, or None (the keys are k, v).
    past: an int, or one position per batch row (B,) (rows of a
    batched decode, each with its own history: row b sees keys [0, past[b] + i]). rows: the
    cache row of each batch row ((B,) ints; None: row b is cache row b). window: keys within that many positions (None/0: all). pad: bool
    (B, >= n_keys), False = a padding slot nobody sees, or None. A query that may see no key
    at all sees every key (a padding row's output is never used; this keeps it finite).
    softcap: scores become cap * tanh(score / cap) (None: as they are). Returns (B, T, Hq * D).
    """
    nb, nt, hq, d = q.shape
    n_keys = nt if kc is None else store_kv(kc, vc, k, v, past, rows)
    kb, vb = _buffers(k, v, kc, vc)
    w = int(window or 0)
    cap = float(softcap or 0.0)
    pa, ra = _rows_of(nb, past, None if kc is None else rows)
    ir = kc is not None and decode_attention.applies(q, kc, pad, cap)
    if nt >= BLOCKED_MIN_QUERIES and not ir:
        return _blocked(q, kb, vb, ra, n_keys, pa, w, pad, scale, cap)
    if ir:
        return decode_attention.attend(q, kc, vc, ra, pa, n_keys, w, scale)
    parallel = nt * n_keys * hq * d >= PARALLEL_WORK
    out = np.empty((nb, nt, hq * d), _F32)
    has_pad = pad is not None
    pad_arr = np.ascontiguousarray(pad, np.bool_) if has_pad else _NO_PAD
    _kernel(parallel)(q, kb, vb, ra, n_keys, pa, w, pad_arr, has_pad, _F32(scale), _F32(cap), out)
    return out


# --- the gradient (op ``cached_attention_grad``: the op's backward when the kernel ran forward) --


def _softmax_rows(s: np.ndarray, ok: np.ndarray, scale: float, cap: float):
    """Scores -> probabilities in place (scaled, soft-capped, masked); returns tanh of the capped
    scores (None without a cap), which the gradient needs."""
    s *= _F32(scale)
    th = None
    if cap > 0:
        s /= _F32(cap)
        th = np.tanh(s)
        np.multiply(th, _F32(cap), out=s)
    s += np.where(ok, _F32(0.0), _F32(-np.inf))
    s -= s.max(-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(-1, keepdims=True)
    return th


def cached_attention_grad_reference(
    g, q, k, v, *, kc, vc, n_keys, past, window, pad, scale, softcap, rows=None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) of ``cached_attention`` for the output gradient g (B, T, Hq * Dv), float32.

    The probabilities are recomputed from q and the keys; dk and dv are those of the new keys
    (the last T of the n_keys), the cached past being a constant. One position per batch row
    (``past`` an array) has no gradient: ValueError.
    """
    if np.ndim(past):
        raise ValueError("cached_attention: no gradient through a step with one position per row")
    nb, nt, hq, d = q.shape
    kb, vb = _buffers(k, v, kc, vc)
    if rows is not None:
        kb, vb = kb[rows], vb[rows]
    hk = kb.shape[1]
    rep = hq // hk
    kh = kb[:, :, :n_keys].astype(_F32)  # (B, Hk, S, D)
    vh = vb[:, :, :n_keys].astype(_F32)
    dv = vh.shape[-1]
    qg = q.astype(_F32).transpose(0, 2, 1, 3).reshape(nb, hk, rep, nt, d)
    s = np.matmul(qg, kh[:, :, None].swapaxes(-1, -2))  # (B, Hk, rep, T, S)
    ok = allowed_keys(nb, nt, n_keys, int(past), int(window or 0), pad)[:, None, None]
    th = _softmax_rows(s, ok, scale, float(softcap or 0.0))
    p = s
    go = g.astype(_F32).reshape(nb, nt, hk, rep, dv).transpose(0, 2, 3, 1, 4)  # (B,Hk,rep,T,Dv)
    gv = np.matmul(p.swapaxes(-1, -2), go).sum(2)[:, :, n_keys - nt :]
    dp = np.matmul(go, vh[:, :, None].swapaxes(-1, -2))
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    if th is not None:
        ds *= 1 - th * th
    ds *= _F32(scale)
    gq = np.matmul(ds, kh[:, :, None]).reshape(nb, hq, nt, d).transpose(0, 2, 1, 3)
    gk = np.matmul(ds.swapaxes(-1, -2), qg).sum(2)[:, :, n_keys - nt :]
    return (
        np.ascontiguousarray(gq, _F32),
        np.ascontiguousarray(gk.transpose(0, 2, 1, 3), _F32),
        np.ascontiguousarray(gv.transpose(0, 2, 1, 3), _F32),
    )


def _grad_when(g, q, k, v, *, kc, vc, n_keys, past, window, pad, scale, softcap, rows=None):
    return (
        kc is None and np.ndim(past) == 0 and q.ndim == 4 and k.ndim == 4 and v.ndim == 4
        and q.shape[2] % k.shape[2] == 0 and g.shape == q.shape[:2] + (q.shape[2] * v.shape[3],)
    )  # fmt: skip


@register(
    "cached_attention_grad",
    reference=cached_attention_grad_reference,
    when=_grad_when,
    available=have_numba,
)
def cached_attention_grad(
    g, q, k, v, *, kc, vc, n_keys, past, window, pad, scale, softcap, rows=None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The reference's gradient as tasks of ``tiles.run_tiles``, one per (batch row, key/value
    head): each recomputes its probabilities a block of BLOCK_ROWS query rows at a time (only
    the keys the block may see) and sums its keys' gradients itself, with BLAS on one thread.
    Training without a cache (kc None, the keys are k and v)."""
    from ember.kernels.cpu.tiles import run_tiles

    nb, nt, hq, d = q.shape
    hk = k.shape[2]
    rep, dv = hq // hk, v.shape[3]
    past, w, cap = int(past), int(window or 0), float(softcap or 0.0)
    gq = np.empty((nb, nt, hq, d), _F32)
    gk = np.empty((nb, nt, hk, d), _F32)
    gv = np.empty((nb, nt, hk, dv), _F32)
    g4 = g.reshape(nb, nt, hq, dv)

    def task(i: int) -> None:
        b, h = divmod(i, hk)
        heads = slice(h * rep, (h + 1) * rep)
        kk, vv = k[b, :, h].astype(_F32, copy=False), v[b, :, h].astype(_F32, copy=False)
        dk = np.zeros((n_keys, d), _F32)
        dvv = np.zeros((n_keys, dv), _F32)
        for r0 in range(0, nt, BLOCK_ROWS):
            r1 = min(nt, r0 + BLOCK_ROWS)
            k0, k1 = 0, n_keys
            if pad is None:
                k0 = max(0, past + r0 - w + 1) if w > 0 else 0
                k1 = min(n_keys, past + r1)
            pb = None if pad is None else pad[b : b + 1]
            ok = allowed_keys(1, r1 - r0, n_keys, past + r0, w, pb)[0, :, k0:k1]
            qb = np.ascontiguousarray(q[b, r0:r1, heads], _F32).reshape(-1, d)  # rows (t, rep)
            gob = np.ascontiguousarray(g4[b, r0:r1, heads], _F32).reshape(-1, dv)
            p = np.matmul(qb, kk[k0:k1].T)
            th = _softmax_rows(p.reshape(r1 - r0, rep, k1 - k0), ok[:, None], scale, cap)
            dvv[k0:k1] += np.matmul(p.T, gob)
            ds = np.matmul(gob, vv[k0:k1].T)  # dp
            ds -= (ds * p).sum(-1, keepdims=True)
            ds *= p
            if th is not None:
                ds *= (1 - th * th).reshape(ds.shape)
            ds *= _F32(scale)
            gq[b, r0:r1, heads] = np.matmul(ds, kk[k0:k1]).reshape(r1 - r0, rep, d)
            dk[k0:k1] += np.matmul(ds.T, qb)
        gk[b, :, h] = dk[n_keys - nt :]
        gv[b, :, h] = dvv[n_keys - nt :]

    run_tiles(task, nb * hk)
    return gq, gk, gv
