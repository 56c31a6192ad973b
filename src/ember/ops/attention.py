"""Attention over packed variable-length sequences: ``varlen_attn``, one op.

Sequences of different lengths are packed end to end along the token axis, with no padding
anywhere: query rows ``cu_seq_q[b]:cu_seq_q[b + 1]`` of a (tokens, heads, head_dim) tensor are
sequence b's, and they attend to key/value rows ``cu_seq_k[b]:cu_seq_k[b + 1]`` only. This is
flash-attn's ``flash_attn_varlen_func`` and torch's ``torch.nn.attention.varlen.varlen_attn``
(same argument names): what padding removal in an encoder and a batching server's prefill need.

The forward here is the numpy reference and the autograd path (each sequence's probabilities
are kept for the closed-form backward); ``ember.kernels.cpu.attention`` registers the fast
kernels for it (float32, no gradient recorded, full window, as many key heads as query heads).
"""

from __future__ import annotations

import math

import numpy as np

from ember.autograd import Function
from ember.errors import DTypeError, ShapeError
from ember.tensor import Tensor

_LOW = ("float16", "bfloat16")


def _up(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if a.dtype.name in _LOW else a


def _allowed(lq: int, lk: int, window: tuple[int, int]) -> np.ndarray | None:
    """(lq, lk) bool: which keys each query may see; None when all of them (full window).

    Queries are aligned to the end of the keys (query i sits at key position i + lk - lq), as
    flash-attn aligns them, so (-1, 0) is causal attention over a prefix of cached keys too.
    """
    left, right = window
    if left < 0 and right < 0:
        return None
    d = np.arange(lk)[None, :] - (np.arange(lq) + (lk - lq))[:, None]  # key pos - query pos
    ok = np.ones((lq, lk), bool)
    if left >= 0:
        ok &= d >= -left
    if right >= 0:
        ok &= d <= right
    return ok


class VarlenAttn(Function):
    """softmax(q k^T * scale) v within each packed sequence; q (Tq, Hq, D), k/v (Tk, Hk, D)."""

    kernel_op = "varlen_attn"

    def meta(self, q, k, v, *, cu_q, cu_k, scale, window, rep):
        return q.shape[:-1] + (v.shape[-1],), q.dtype

    def forward(self, q, k, v, *, cu_q, cu_k, scale, window, rep):
        dt = q.dtype
        qf, kf, vf = _up(q), _up(k), _up(v)
        hq = q.shape[1]
        out = np.zeros(q.shape[:-1] + (v.shape[-1],), qf.dtype)
        self.ps = []
        for b in range(len(cu_q) - 1):
            q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
            if q1 <= q0:
                self.ps.append(None)
                continue
            qb = qf[q0:q1].transpose(1, 0, 2)  # (Hq, Lq, D)
            kb = (
                np.repeat(kf[k0:k1], rep, axis=1).transpose(1, 0, 2)
                if rep > 1
                else (kf[k0:k1].transpose(1, 0, 2))
            )
            vb = (
                np.repeat(vf[k0:k1], rep, axis=1).transpose(1, 0, 2)
                if rep > 1
                else (vf[k0:k1].transpose(1, 0, 2))
            )
            s = np.matmul(qb, kb.transpose(0, 2, 1)) * scale  # (Hq, Lq, Lk)
            ok = _allowed(q1 - q0, k1 - k0, window)
            if ok is not None:
                s = np.where(ok, s, -np.inf)
            mx = s.max(axis=-1, keepdims=True) if k1 > k0 else np.zeros((hq, q1 - q0, 1), s.dtype)
            mx = np.where(np.isfinite(mx), mx, 0)
            p = np.exp(s - mx)
            den = p.sum(axis=-1, keepdims=True)
            p /= np.where(den == 0, 1, den)  # a query with no key to see gets zeros
            out[q0:q1] = np.matmul(p, vb).transpose(1, 0, 2)
            self.ps.append(p.astype(qf.dtype, copy=False))
        self.q, self.k, self.v = qf, kf, vf
        self.cu_q, self.cu_k, self.scale, self.rep = cu_q, cu_k, scale, rep
        return out.astype(dt, copy=False)

    def backward(self, g):
        gf = _up(g)
        qf, kf, vf, rep = self.q, self.k, self.v, self.rep
        need = self.needs_input_grad
        dq, dk, dv = np.zeros_like(qf), np.zeros_like(kf), np.zeros_like(vf)
        for b, p in enumerate(self.ps):
            if p is None:
                continue
            q0, q1 = int(self.cu_q[b]), int(self.cu_q[b + 1])
            k0, k1 = int(self.cu_k[b]), int(self.cu_k[b + 1])
            gb = gf[q0:q1].transpose(1, 0, 2)  # (Hq, Lq, Dv)
            kb = np.repeat(kf[k0:k1], rep, axis=1) if rep > 1 else kf[k0:k1]
            vb = np.repeat(vf[k0:k1], rep, axis=1) if rep > 1 else vf[k0:k1]
            kb, vb = kb.transpose(1, 0, 2), vb.transpose(1, 0, 2)
            dvb = np.matmul(p.transpose(0, 2, 1), gb)  # (Hq, Lk, Dv)
            dp = np.matmul(gb, vb.transpose(0, 2, 1))
            ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * self.scale
            dqb = np.matmul(ds, kb)
            dkb = np.matmul(ds.transpose(0, 2, 1), qf[q0:q1].transpose(1, 0, 2))
            if rep > 1:  # query heads of a group share their key head: sum their gradients
                hk = kf.shape[1]
                dvb = dvb.reshape(hk, rep, *dvb.shape[1:]).sum(1)
                dkb = dkb.reshape(hk, rep, *dkb.shape[1:]).sum(1)
            dq[q0:q1] = dqb.transpose(1, 0, 2)
            dk[k0:k1] += dkb.transpose(1, 0, 2)
            dv[k0:k1] += dvb.transpose(1, 0, 2)
        ins = self.in_meta
        return tuple(
            d.astype(m[1], copy=False) if n else None for d, n, m in zip((dq, dk, dv), need, ins)
        )


def _offsets(cu, name: str) -> np.ndarray:
    a = cu._data if isinstance(cu, Tensor) else cu
    a = np.asarray(a)
    if a.ndim != 1 or a.size < 1 or a.dtype.kind not in "iu":
        raise ShapeError(f"varlen_attn: {name} must be a 1-d integer tensor (N+1,), got {a!r}")
    return a.astype(np.int64, copy=False)


def varlen_attn(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    cu_seq_q,
    cu_seq_k=None,
    max_q: int | None = None,
    max_k: int | None = None,
    *,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    enable_gqa: bool = False,
) -> Tensor:
    """Attention within each of N packed sequences (torch's ``varlen_attn``).

    query (Tq, Hq, D), key and value (Tk, Hk, D); cu_seq_q / cu_seq_k (N+1,) rise from 0 to Tq /
    Tk (cu_seq_k None: the same as cu_seq_q). max_q / max_k bound the sequence lengths (checked
    when given). window_size (left, right): keys at most left before / right after the query's
    position (-1: unbounded), queries aligned to the end of their keys; (-1, 0) is causal.
    enable_gqa: key/value may have fewer heads, each shared by Hq / Hk query heads.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.ndim != 3:
            raise ShapeError(f"varlen_attn: {name} must be (tokens, heads, head_dim), got "
                             f"{tuple(t.shape)}")  # fmt: skip
    if not (query.is_floating_point() and key.is_floating_point() and value.is_floating_point()):
        raise DTypeError("varlen_attn: query, key and value must be floating point")
    (tq, hq, d), (tk, hk, dk) = query.shape, key.shape
    if dk != d or value.shape[:2] != key.shape[:2]:
        raise ShapeError(
            f"varlen_attn: query {tuple(query.shape)}, key {tuple(key.shape)} and value "
            f"{tuple(value.shape)} do not fit (same head_dim for query and key, same tokens "
            "and heads for key and value)"
        )
    rep = 1
    if hq != hk:
        if not enable_gqa or hk == 0 or hq % hk:
            raise ShapeError(
                f"varlen_attn: query has {hq} heads and key/value {hk}; pass enable_gqa=True "
                "with a head count that divides the query's"
            )
        rep = hq // hk
    cu_q = _offsets(cu_seq_q, "cu_seq_q")
    cu_k = cu_q if cu_seq_k is None else _offsets(cu_seq_k, "cu_seq_k")
    for name, cu, total, bound in (("cu_seq_q", cu_q, tq, max_q), ("cu_seq_k", cu_k, tk, max_k)):
        n = np.diff(cu)
        if cu[0] != 0 or cu[-1] != total or (n < 0).any():
            raise ShapeError(
                f"varlen_attn: {name} must rise from 0 to {total} (the packed tokens), got "
                f"{cu.tolist()[:8]}"
            )
        if bound is not None and n.size and n.max() > bound:
            raise ShapeError(f"varlen_attn: a sequence of {n.max()} tokens exceeds {bound}")
    if cu_k.shape != cu_q.shape:
        raise ShapeError(
            f"varlen_attn: cu_seq_q has {cu_q.size - 1} sequences, cu_seq_k {cu_k.size - 1}"
        )
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    window = (int(window_size[0]), int(window_size[1]))
    return VarlenAttn.apply(
        query, key, value, cu_q=cu_q, cu_k=cu_k, scale=scale, window=window, rep=rep
    )


__all__ = ["varlen_attn"]
