"""Attention: scaled_dot_product_attention (a fused Function) and multi_head_attention_forward."""

from __future__ import annotations

import math

import numpy as np

from ember.autograd import Function, unbroadcast
from ember.errors import DTypeError, ShapeError, UnsupportedError
from ember.nn.functional._util import up
from ember.tensor import Tensor


def _group(a: np.ndarray, hk: int, rep: int) -> np.ndarray:
    """(..., Hk*rep, X, Y) -> (..., Hk, rep, X, Y)."""
    return a.reshape(a.shape[:-3] + (hk, rep) + a.shape[-2:])


def _ungroup(a: np.ndarray) -> np.ndarray:
    """(..., Hk, rep, X, Y) -> (..., Hk*rep, X, Y)."""
    return a.reshape(a.shape[:-4] + (a.shape[-4] * a.shape[-3],) + a.shape[-2:])


def _kv(a: np.ndarray, rep: int) -> np.ndarray:
    """(..., Hk, S, E) -> (..., Hk, 1, S, E) so it broadcasts against grouped queries."""
    return a[..., None, :, :] if rep > 1 else a


class _SDPA(Function):
    """softmax(q k^T * scale + mask) v, with the score matrix kept for a closed-form backward.

    GQA (k/v with fewer heads) is handled by grouping query heads, so k and v are never repeated.
    Rows whose every key is masked give zeros (torch's safe softmax).
    """

    kernel_op = "scaled_dot_product_attention"

    def meta(self, q, k, v, *m, scale, causal, rep, dropout_p):
        lead = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]) if q.ndim >= 3 else ()
        return lead + q.shape[-3:-1] + (v.shape[-1],) if q.ndim >= 3 else q.shape[:-1] + (
            v.shape[-1],
        ), q.dtype

    def forward(self, q, k, v, *m, scale, causal, rep, dropout_p):
        dt = q.dtype
        qf, kf, vf = up(q), up(k), up(v)
        hk = k.shape[-3] if rep > 1 else 0
        if rep > 1:
            qf = _group(qf, hk, rep)
        kg, vg = _kv(kf, rep), _kv(vf, rep)
        s = np.matmul(qf, np.swapaxes(kg, -1, -2))
        s *= scale
        L, S = s.shape[-2], s.shape[-1]
        if causal:
            s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
        if m:
            mask = m[0]
            if rep > 1:
                if mask.ndim >= 3 and mask.shape[-3] != 1:
                    full = (
                        np.broadcast_shapes(mask.shape[:-3], q.shape[:-3])
                        + (hk * rep,)
                        + mask.shape[-2:]
                    )
                    mask = _group(np.broadcast_to(mask, full), hk, rep)
                else:
                    mask = mask[..., None, :, :]
            if mask.dtype == np.bool_:
                s = np.where(mask, s, -np.inf)
            else:
                s = s + up(mask)
        mx = s.max(axis=-1, keepdims=True) if S else np.zeros(s.shape[:-1] + (1,), s.dtype)
        mx = np.where(np.isfinite(mx), mx, 0)
        p = np.exp(s - mx)
        den = p.sum(axis=-1, keepdims=True)
        p /= np.where(den == 0, 1, den)
        self.dmask = None
        pd = p
        if dropout_p > 0:
            from ember.ops.random import default_generator

            keep = default_generator.rng.random(p.shape) >= dropout_p
            self.dmask = keep * (1.0 / (1.0 - dropout_p)) if dropout_p < 1 else np.zeros(p.shape)
            pd = p * self.dmask
        o = np.matmul(pd, vg)
        if rep > 1:
            o = _ungroup(o)
        self.q, self.k, self.v, self.kg, self.vg, self.p, self.pd = qf, kf, vf, kg, vg, p, pd
        self.scale, self.rep, self.hk = scale, rep, hk
        self.shapes = (q.shape, k.shape, v.shape)
        return o.astype(dt, copy=False)

    def backward(self, g):
        gf = up(g)
        rep = self.rep
        if rep > 1:
            gf = _group(gf, self.hk, rep)
        need = self.needs_input_grad
        qs, ks, vs = self.shapes
        dq = dk = dv = None
        if need[2]:
            dv = np.matmul(np.swapaxes(self.pd, -1, -2), gf)
            if rep > 1:
                dv = dv.sum(axis=-3)
            dv = unbroadcast(dv, vs)
        if need[0] or need[1]:
            dp = np.matmul(gf, np.swapaxes(self.vg, -1, -2))
            if self.dmask is not None:
                dp *= self.dmask
            p = self.p
            ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
            ds *= self.scale
            if need[0]:
                dq = np.matmul(ds, self.kg)
                if rep > 1:
                    dq = _ungroup(dq)
                dq = unbroadcast(dq, qs)
            if need[1]:
                dk = np.matmul(np.swapaxes(ds, -1, -2), self.q)
                if rep > 1:
                    dk = dk.sum(axis=-3)
                dk = unbroadcast(dk, ks)
        grads = (dq, dk, dv)
        return grads + (None,) * (len(need) - 3)


def _sdpa_composed(q, k, v, mask, scale, causal, dropout_p):
    """The same attention as ember ops (used when a float mask itself needs a gradient)."""
    from ember.nn.functional._dropout import dropout
    from ember.ops import creation, elementwise, reduce

    s = q.matmul(k.transpose(-2, -1)) * scale
    L, S = s.shape[-2], s.shape[-1]
    if causal:
        tri = creation.ones(L, S, dtype="bool").tril()
        s = elementwise.where(tri, s, float("-inf"))
    if mask is not None:
        s = s + mask
    p = reduce.softmax(s, -1)
    if dropout_p > 0:
        p = dropout(p, dropout_p)
    return p.matmul(v)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """softmax(q k^T / sqrt(E) + mask) v over (..., L, E) queries and (..., S, E) keys.

    attn_mask: bool (True = attend) or float (added to the scores), broadcastable to (..., L, S).
    is_causal: a lower-triangular mask (top-left aligned, as torch). enable_gqa: key/value may
    have fewer heads (dim -3) than query, each shared by a group of query heads.
    """
    if query.ndim < 2 or key.ndim < 2 or value.ndim < 2:
        raise ShapeError("scaled_dot_product_attention: query, key and value need at least 2 dims")
    E = query.shape[-1]
    if key.shape[-1] != E:
        raise ShapeError(
            f"scaled_dot_product_attention: query (..., L, {E}) and key of shape "
            f"{tuple(key.shape)} "
            "differ in the embedding dim"
        )
    if key.shape[-2] != value.shape[-2]:
        raise ShapeError(
            f"scaled_dot_product_attention: key {tuple(key.shape)} and value {tuple(value.shape)} "
            "differ in sequence length"
        )
    if is_causal and attn_mask is not None:
        raise ShapeError(
            "scaled_dot_product_attention: pass either attn_mask or is_causal=True, not both"
        )
    if not (query.is_floating_point() and key.is_floating_point() and value.is_floating_point()):
        raise DTypeError(
            "scaled_dot_product_attention: query, key and value must be floating point"
        )
    rep = 1
    if query.ndim >= 3 and key.ndim >= 3 and query.shape[-3] != key.shape[-3]:
        hq, hk = query.shape[-3], key.shape[-3]
        if not enable_gqa or hq % hk or value.shape[-3] != hk:
            raise ShapeError(
                f"scaled_dot_product_attention: query has {hq} heads and key/value {hk}; pass "
                "enable_gqa=True with a head count that divides the query's"
            )
        rep = hq // hk
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
    if attn_mask is not None and attn_mask.requires_grad:
        if rep > 1:
            key = key.repeat_interleave(rep, -3)
            value = value.repeat_interleave(rep, -3)
        return _sdpa_composed(query, key, value, attn_mask, scale, is_causal, dropout_p)
    masks = () if attn_mask is None else (attn_mask,)
    return _SDPA.apply(
        query, key, value, *masks, scale=scale, causal=is_causal, rep=rep, dropout_p=dropout_p
    )


def _float_mask(mask: Tensor | None, like: Tensor, name: str) -> Tensor | None:
    """A bool mask (True = masked out) as an additive float mask (-inf where True)."""
    if mask is None:
        return None
    if mask.dtype.name == "bool":
        arr = np.where(mask._data, -np.inf, 0.0).astype(like._data.dtype)
        return Tensor._wrap(arr, like.device)
    if not mask.is_floating_point():
        raise DTypeError(f"only bool and floating types of {name} are supported, got {mask.dtype}")
    return mask


def multi_head_attention_forward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    embed_dim_to_check: int,
    num_heads: int,
    in_proj_weight: Tensor | None,
    in_proj_bias: Tensor | None,
    bias_k: Tensor | None,
    bias_v: Tensor | None,
    add_zero_attn: bool,
    dropout_p: float,
    out_proj_weight: Tensor,
    out_proj_bias: Tensor | None,
    training: bool = True,
    key_padding_mask: Tensor | None = None,
    need_weights: bool = True,
    attn_mask: Tensor | None = None,
    use_separate_proj_weight: bool = False,
    q_proj_weight: Tensor | None = None,
    k_proj_weight: Tensor | None = None,
    v_proj_weight: Tensor | None = None,
    static_k: Tensor | None = None,
    static_v: Tensor | None = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
) -> tuple:
    """torch's multi-head attention on (L, N, E) or unbatched (L, E) inputs: (out, weights)."""
    from ember.nn.functional._dropout import dropout
    from ember.ops import creation, linalg, movement, reduce

    batched = query.ndim == 3
    if not batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    L, N, E = query.shape
    S = key.shape[0]
    if E != embed_dim_to_check:
        raise ShapeError(f"was expecting embedding dimension of {embed_dim_to_check}, but got {E}")
    H = num_heads
    hd = E // H
    if hd * H != E:
        raise ShapeError(f"embed_dim {E} not divisible by num_heads {H}")
    if key.shape[:2] != value.shape[:2]:
        raise ShapeError(
            f"key shape {tuple(key.shape)} does not match value shape {tuple(value.shape)}"
        )
    key_padding_mask = _float_mask(key_padding_mask, query, "key_padding_mask")
    attn_mask = _float_mask(attn_mask, query, "attn_mask")
    if is_causal and attn_mask is None:
        tri = np.triu(np.full((L, S), -np.inf, query._data.dtype), 1)
        attn_mask = Tensor._wrap(tri, query.device)

    # input projections
    if not use_separate_proj_weight:
        wq, wk, wv = movement.chunk(in_proj_weight, 3)
    else:
        wq, wk, wv = q_proj_weight, k_proj_weight, v_proj_weight
    if in_proj_bias is not None:
        bq, bk, bv = movement.chunk(in_proj_bias, 3)
    else:
        bq = bk = bv = None
    if not use_separate_proj_weight and query is key and key is value:
        q, k, v = movement.chunk(linalg.linear(query, in_proj_weight, in_proj_bias), 3, -1)
    else:
        q = linalg.linear(query, wq, bq)
        k = linalg.linear(key, wk, bk)
        v = linalg.linear(value, wv, bv)

    if attn_mask is not None:
        if attn_mask.ndim == 2:
            if tuple(attn_mask.shape) != (L, S):
                raise ShapeError(
                    f"The shape of the 2D attn_mask is {tuple(attn_mask.shape)}, but "
                    f"should be {(L, S)}."
                )
            attn_mask = attn_mask.unsqueeze(0)
        elif attn_mask.ndim == 3:
            if tuple(attn_mask.shape) != (N * H, L, S):
                raise ShapeError(
                    f"The shape of the 3D attn_mask is {tuple(attn_mask.shape)}, but "
                    f"should be {(N * H, L, S)}."
                )
        else:
            raise ShapeError(f"attn_mask's dimension {attn_mask.ndim} is not supported")

    def pad_last(m: Tensor | None) -> Tensor | None:
        if m is None:
            return None
        return movement.cat([m, creation.zeros(tuple(m.shape[:-1]) + (1,), dtype=m.dtype)], -1)

    if bias_k is not None and bias_v is not None:
        k = movement.cat([k, bias_k.reshape(1, 1, E).expand(1, N, E)], 0)
        v = movement.cat([v, bias_v.reshape(1, 1, E).expand(1, N, E)], 0)
        attn_mask = pad_last(attn_mask)
        key_padding_mask = pad_last(key_padding_mask)

    q = q.reshape(L, N * H, hd).transpose(0, 1)
    k = k.reshape(k.shape[0], N * H, hd).transpose(0, 1) if static_k is None else static_k
    v = v.reshape(v.shape[0], N * H, hd).transpose(0, 1) if static_v is None else static_v
    if add_zero_attn:
        k = movement.cat([k, creation.zeros(N * H, 1, hd, dtype=k.dtype)], 1)
        v = movement.cat([v, creation.zeros(N * H, 1, hd, dtype=v.dtype)], 1)
        attn_mask = pad_last(attn_mask)
        key_padding_mask = pad_last(key_padding_mask)
    S = k.shape[1]
    if key_padding_mask is not None:
        if tuple(key_padding_mask.shape) != (N, S):
            raise ShapeError(
                f"expecting key_padding_mask shape of {(N, S)}, but got "
                f"{tuple(key_padding_mask.shape)}"
            )
        kpm = key_padding_mask.reshape(N, 1, 1, S).expand(N, H, 1, S).reshape(N * H, 1, S)
        attn_mask = kpm if attn_mask is None else attn_mask + kpm
    if not training:
        dropout_p = 0.0

    if need_weights:
        s = linalg.matmul(q * (1.0 / math.sqrt(hd)), k.transpose(-2, -1))
        if attn_mask is not None:
            s = s + attn_mask
        w = reduce.softmax(s, -1)
        if dropout_p > 0:
            w = dropout(w, dropout_p)
        out = linalg.matmul(w, v)
        out = out.transpose(0, 1).reshape(L * N, E)
        out = linalg.linear(out, out_proj_weight, out_proj_bias).reshape(L, N, E)
        w = w.reshape(N, H, L, S)
        if average_attn_weights:
            w = w.mean(1)
        if not batched:
            out, w = out.squeeze(1), w.squeeze(0)
        return out, w

    if attn_mask is not None:
        attn_mask = (
            attn_mask.unsqueeze(0) if attn_mask.shape[0] == 1 else attn_mask.reshape(N, H, -1, S)
        )
    q = q.reshape(N, H, L, hd)
    k = k.reshape(N, H, S, hd)
    v = v.reshape(N, H, S, hd)
    out = scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, False)
    out = out.permute(2, 0, 1, 3).reshape(L * N, E)
    out = linalg.linear(out, out_proj_weight, out_proj_bias).reshape(L, N, E)
    if not batched:
        out = out.squeeze(1)
    return out, None


__all__ = ["scaled_dot_product_attention", "multi_head_attention_forward"]


# --- attention over a KV cache (decoders) ------------------------------------------------------


class _CachedAttention(Function):
    """Causal attention of token-major q (b, t, hq, d) over the keys of a KV cache.

    ``kc``/``vc`` are the layer's (slots, hk, max_len, d) buffers: the op first writes the new
    k, v (b, t, hk, d) there at [past, past + t) of each row's slot (``rows``, or row b), then
    attends over keys [0, max(past) + t); None: the new keys are all the keys. Scores are
    ``q k^T * scale``, optionally soft-capped (``cap * tanh(s / cap)``), masked causally, by a
    sliding ``window`` and by ``pad`` (b, >= n_keys; False = a padding slot), then softmaxed. A
    query that may see no key sees every key. Gradients reach q and the new k, v; the cached
    past is a constant. Kernels: ``ember.kernels.cpu.cached_attention``.
    """

    kernel_op = "cached_attention"

    def saved(self, q, k, v, **kw):
        # the kernel ran forward while a graph is recorded: backward recomputes the probabilities
        # from the inputs (op ``cached_attention_grad``) instead of keeping them
        t = q.shape[1]  # the keys the kernel attended over (stored in the cache by then)
        n_keys = t if kw["kc"] is None else int(np.max(kw["past"])) + t
        self.inputs, self.kw = (q, k, v), {**kw, "n_keys": n_keys}
        self.dts = (q.dtype, k.dtype, v.dtype)
        self.per_row = np.ndim(kw["past"]) > 0

    def meta(self, q, k, v, **kw):
        b, t, hq, _ = q.shape
        return (b, t, hq * v.shape[-1]), q.dtype

    def forward(self, q, k, v, *, kc, vc, past, window, pad, scale, softcap, rows=None):
        from ember.kernels.cpu.cached_attention import allowed_keys, store_kv  # the kernels'

        n_keys = q.shape[1] if kc is None else store_kv(kc, vc, k, v, past, rows)
        dt = q.dtype
        b, t, hq, d = q.shape
        hk = k.shape[2]
        rep = hq // hk
        qf = up(q)
        cd = qf.dtype
        kh = up(k).transpose(0, 2, 1, 3).astype(cd, copy=False)  # (b, hk, t, d)
        vh = up(v).transpose(0, 2, 1, 3).astype(cd, copy=False)
        self.per_row = np.ndim(past) > 0
        if kc is not None and rows is not None:  # a batched step over some rows of the cache
            kc, vc = kc[rows], vc[rows]
        if kc is not None and self.per_row:  # each row's new keys sit at its own position
            kh = up(kc[:, :, :n_keys]).astype(cd, copy=False)
            vh = up(vc[:, :, :n_keys]).astype(cd, copy=False)
        elif kc is not None and n_keys > t:
            kh = np.concatenate([up(kc[:, :, : n_keys - t]).astype(cd, copy=False), kh], axis=2)
            vh = np.concatenate([up(vc[:, :, : n_keys - t]).astype(cd, copy=False), vh], axis=2)
        n = kh.shape[2]
        qg = qf.transpose(0, 2, 1, 3).reshape(b, hk, rep, t, d)
        s = np.matmul(qg, kh[:, :, None].swapaxes(-1, -2)) * cd.type(scale)  # (b, hk, rep, t, n)
        th = None
        if softcap:
            th = np.tanh(s / cd.type(softcap))
            s = th * cd.type(softcap)
        ok = allowed_keys(b, t, n, past, int(window or 0), pad)[:, None, None]
        s = np.where(ok, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = np.matmul(p, vh[:, :, None])  # (b, hk, rep, t, dv)
        self.qg, self.kh, self.vh, self.p, self.th = qg, kh, vh, p, th
        self.scale, self.softcap, self.dts = scale, softcap, (q.dtype, k.dtype, v.dtype)
        dv = o.shape[-1]
        return o.reshape(b, hq, t, dv).transpose(0, 2, 1, 3).reshape(b, t, hq * dv).astype(dt)

    def backward(self, g):
        if self.per_row:
            raise UnsupportedError(
                "cached_attention: no gradient through a batched step with one position per row"
            )
        if not hasattr(self, "p"):
            return self._backward_recomputed(g)
        qg, kh, vh, p = self.qg, self.kh, self.vh, self.p
        b, hk, rep, t, d = qg.shape
        dv = vh.shape[-1]
        go = up(g).reshape(b, t, hk, rep, dv).transpose(0, 2, 3, 1, 4)  # (b, hk, rep, t, dv)
        need = self.needs_input_grad
        dq = dk = dvv = None
        if need[2]:
            gv = np.matmul(p.swapaxes(-1, -2), go).sum(2)[:, :, -t:]  # (b, hk, t, dv)
            dvv = gv.transpose(0, 2, 1, 3).astype(self.dts[2], copy=False)
        if need[0] or need[1]:
            dp = np.matmul(go, vh[:, :, None].swapaxes(-1, -2))
            ds = p * (dp - (dp * p).sum(-1, keepdims=True))
            if self.th is not None:
                ds *= 1 - self.th * self.th
            ds *= self.scale
            if need[0]:
                gq = np.matmul(ds, kh[:, :, None])  # (b, hk, rep, t, d)
                dq = gq.reshape(b, hk * rep, t, d).transpose(0, 2, 1, 3)
                dq = dq.astype(self.dts[0], copy=False)
            if need[1]:
                gk = np.matmul(ds.swapaxes(-1, -2), qg).sum(2)[:, :, -t:]
                dk = gk.transpose(0, 2, 1, 3).astype(self.dts[1], copy=False)
        return dq, dk, dvv

    def _backward_recomputed(self, g):
        from ember.kernels import registry
        from ember.kernels.cpu.cached_attention import cached_attention_grad_reference

        arrays = (g, *self.inputs)
        kern = registry.pick("cached_attention_grad", "cpu", arrays, self.kw)
        fn = kern.fn if kern is not None else cached_attention_grad_reference
        grads = fn(*arrays, **self.kw)
        need = self.needs_input_grad
        return tuple(
            gr.astype(dt, copy=False) if n else None for gr, dt, n in zip(grads, self.dts, need)
        )


def cached_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask=None,
    cache=None,
    layer: int = 0,
    scale: float | None = None,
    softcap: float | None = None,
) -> Tensor:
    """Causal attention of token-major query (b, t, hq, d) over the cached and the new key/value.

    key, value: (b, t, hk, d), hq a multiple of hk (grouped-query attention); they are stored in
    ``cache`` (an ``ember.nn.KVCache``, or ``BatchKVCache.rows(...)``: one position per row) at
    its current position first; rows of ``BatchKVCache.rows(slots, new_tokens)`` run each on
    its own first new_tokens[b] tokens, exactly as alone (the padding after them gives zeros
    and never enters the cache). ``mask``: an
    ``ember.nn.CausalMask`` (positions, sliding window, left padding; None: causal from the
    cache's position). scale: None for d ** -0.5. softcap: scores become
    ``softcap * tanh(scores / softcap)`` before the softmax (Gemma 2). Returns (b, t, hq * d).
    """
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        raise ShapeError(
            "cached_attention: expected token-major (batch, tokens, heads, head_dim) query, key "
            f"and value, got {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    b, t, hq, d = query.shape
    hk = key.shape[2]
    if key.shape[:3] != value.shape[:3] or key.shape[3] != d or hq % hk:
        raise ShapeError(
            f"cached_attention: query {tuple(query.shape)}, key {tuple(key.shape)} and value "
            f"{tuple(value.shape)} do not fit (query heads must be a multiple of key heads)"
        )
    past = mask.past if mask is not None else (cache.pos if cache is not None else 0)
    window = mask.window if mask is not None else None
    pad = mask.pad if mask is not None else None
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    kc = vc = rows = None
    if cache is not None:  # the op stores key, value there (at past) before it attends
        kc, vc = cache.k[layer], cache.v[layer]
        rows = getattr(cache, "rows", None)  # a batched step over some rows (BatchKVCache)
    ragged = getattr(cache, "ragged", None)
    if ragged is not None:  # right-padded rows: each row on its own tokens, as alone
        from ember.ops import creation, movement

        parts = []
        for i, n in enumerate(ragged.tolist()):
            one = _CachedAttention.apply(
                query[i : i + 1, :n],
                key[i : i + 1, :n],
                value[i : i + 1, :n],
                kc=kc,
                vc=vc,
                past=past[i : i + 1],
                window=window,
                pad=None,
                scale=scale,
                softcap=None if softcap is None else float(softcap),
                rows=rows[i : i + 1],
            )
            if n < t:  # the padding's outputs: zeros, never read
                zeros = creation.zeros(1, t - n, one.shape[2], dtype=one.dtype)
                one = movement.cat([one, zeros], 1)
            parts.append(one)
        return movement.cat(parts, 0)
    return _CachedAttention.apply(
        query,
        key,
        value,
        kc=kc,
        vc=vc,
        past=past,
        window=window,
        pad=pad,
        scale=scale,
        softcap=None if softcap is None else float(softcap),
        rows=rows,
    )


__all__.append("cached_attention")
