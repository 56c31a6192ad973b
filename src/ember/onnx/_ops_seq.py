"""ONNX attention, rotary embedding and recurrent (RNN, GRU, LSTM) operators."""

from __future__ import annotations

import math

import numpy as np

import ember
from ember.errors import ShapeError
from ember.nn import functional as F
from ember.onnx._proto import np_dtype
from ember.onnx._registry import Attrs, const, op
from ember.tensor import Tensor

# ---- attention ---------------------------------------------------------------------------


def _heads(t: Tensor, n: int) -> Tensor:
    b, s, hid = t.shape
    return t.reshape(b, s, n, hid // n).permute(0, 2, 1, 3)


def _neg_inf_where(allowed, dtype) -> Tensor:
    return ember.where(allowed, const(0.0, dtype), const(-math.inf, dtype))


@op("Attention")
def _attention(a: Attrs, q, k, v, mask=None, past_k=None, past_v=None, nonpad=None):
    three = q.ndim == 3
    if three:
        qh, kvh = a.get("q_num_heads"), a.get("kv_num_heads")
        if not qh or not kvh:
            raise ShapeError(f"ONNX {a.where()}: 3-D inputs need q_num_heads and kv_num_heads")
        q, k, v = _heads(q, qh), _heads(k, kvh), _heads(v, kvh)
    dt = q.dtype.np
    if past_k is not None:
        k = ember.cat([past_k, k], dim=2)
        v = ember.cat([past_v, v], dim=2)
    present_k, present_v = k, v
    sq, skv = q.shape[2], k.shape[2]
    scale = a.get("scale", None)
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else scale
    bias = None
    if mask is not None:
        padw = skv - mask.shape[-1]
        if mask.dtype == ember.bool_:
            if padw > 0:
                mask = ember.pad(mask, [0, padw], value=False)
            mask = _neg_inf_where(mask, dt)
        elif padw > 0:
            mask = ember.pad(mask, [0, padw], value=-math.inf)
        bias = mask
    i = np.arange(sq).reshape(sq, 1)
    j = np.arange(skv).reshape(1, skv)
    if nonpad is not None:
        offset = np.asarray(nonpad.numpy()).reshape(-1, 1, 1, 1) - sq
    else:
        offset = past_k.shape[2] if past_k is not None else 0
    if a.get("is_causal", 0):
        c = _neg_inf_where(const(j <= i + offset, np.bool_), dt)
        bias = c if bias is None else bias + c
    lw, rw = a.get("left_window_size", -1), a.get("right_window_size", -1)
    if lw >= 0 or rw >= 0:
        diff = (i + offset) - j
        ok = np.ones(np.broadcast_shapes(np.shape(diff)), bool)
        if lw >= 0:
            ok &= diff <= lw
        if rw >= 0:
            ok &= -diff <= rw
        w = _neg_inf_where(const(ok, np.bool_), dt)
        bias = w if bias is None else bias + w
    if nonpad is not None:
        keep = np.arange(skv).reshape(1, 1, 1, skv) < np.asarray(nonpad.numpy()).reshape(
            -1, 1, 1, 1
        )
        p = _neg_inf_where(const(keep, np.bool_), dt)
        bias = p if bias is None else bias + p
    hq, hk = q.shape[1], k.shape[1]
    if hq != hk:
        if hq % hk:
            raise ShapeError(f"ONNX {a.where()}: {hq} query heads for {hk} key/value heads")
        k = k.repeat_interleave(hq // hk, dim=1)
        v = v.repeat_interleave(hq // hk, dim=1)
    mode = a.get("qk_matmul_output_mode", 0)
    softcap = a.get("softcap", 0.0)
    if bias is None and not softcap and a.n_out < 4 and q.dtype == ember.float32:
        y = F.scaled_dot_product_attention(q, k, v, scale=scale)
        qk_out = None
    else:
        s = math.sqrt(scale)
        qk = ember.matmul(q * s, (k * s).mT)
        if softcap:
            qk = ember.tanh(qk / softcap) * softcap
        qk_out = qk
        biased = qk if bias is None else qk + bias
        if mode == 2:
            qk_out = biased
        sp = a.get("softmax_precision", None)
        work = biased.to(ember.dtypes.from_numpy_dtype(np_dtype(sp, a.where()))) if sp else biased
        mx = ember.amax(work, dim=-1, keepdim=True)
        dead = ember.isinf(mx) & (mx < 0)
        e = ember.exp(work - ember.where(dead, ember.zeros_like(mx), mx))
        tot = ember.sum(e, dim=-1, keepdim=True)
        prob = e / ember.where(tot == 0, ember.ones_like(tot), tot)
        if bias is not None:
            bm = ember.amax(bias, dim=-1, keepdim=True)
            allmasked = ember.isinf(bm) & (bm < 0)
            prob = ember.where(allmasked, ember.zeros_like(prob), prob)
        if mode == 3:
            qk_out = prob
        prob = prob.to(q.dtype)
        qk_out = qk_out.to(q.dtype)
        y = ember.matmul(prob, v)
    if three:
        y = y.permute(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1)
    outs = (y, present_k, present_v, qk_out)
    return outs[: max(a.n_out, 1)]


@op("RotaryEmbedding")
def _rotary(a: Attrs, x, cos, sin, pos=None):
    shape = tuple(x.shape)
    if x.ndim == 4:
        x = x.permute(0, 2, 1, 3)
    b, s = x.shape[:2]
    if x.ndim == 3:
        nh = a.get("num_heads", 0)
        if not nh:
            raise ShapeError(f"ONNX {a.where()}: a 3-D input needs num_heads")
        x = x.reshape(b, s, nh, -1)
    hd = x.shape[3]
    rd = a.get("rotary_embedding_dim", 0) or hd
    if pos is not None:
        p = pos.to(ember.int64)
        cos = ember.index_select(cos, 0, p.reshape(-1)).reshape(tuple(p.shape) + (-1,))
        sin = ember.index_select(sin, 0, p.reshape(-1)).reshape(tuple(p.shape) + (-1,))
    if cos.shape[-1] != rd // 2:
        raise ShapeError(f"ONNX {a.where()}: cos cache last dim {cos.shape[-1]} != {rd // 2}")
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    rot, rest = x[..., :rd], x[..., rd:]
    if a.get("interleaved", 0):
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., : rd // 2], rot[..., rd // 2 :]
    re = cos * x1 - sin * x2
    im = sin * x1 + cos * x2
    if a.get("interleaved", 0):
        rot = ember.stack([re, im], dim=-1).reshape(tuple(rot.shape))
    else:
        rot = ember.cat([re, im], dim=-1)
    out = ember.cat([rot, rest], dim=-1)
    if len(shape) == 3:
        return out.reshape(shape)
    return out.permute(0, 2, 1, 3).contiguous()


# ---- recurrent ---------------------------------------------------------------------------


def _act(name: str, alpha, beta):
    name = name.lower()
    if name == "sigmoid":
        return ember.sigmoid
    if name == "tanh":
        return ember.tanh
    if name == "relu":
        return F.relu
    if name == "leakyrelu":
        return lambda x: F.leaky_relu(x, 0.01 if alpha is None else alpha)
    if name == "thresholdedrelu":
        t = 1.0 if alpha is None else alpha
        return lambda x: ember.where(x > t, x, ember.zeros_like(x))
    if name == "hardsigmoid":
        al, be = (0.2 if alpha is None else alpha), (0.5 if beta is None else beta)
        return lambda x: ember.clamp(x * al + be, 0.0, 1.0)
    if name == "elu":
        return lambda x: F.elu(x, 1.0 if alpha is None else alpha)
    if name == "softsign":
        return F.softsign
    if name == "softplus":
        return F.softplus
    if name == "affine":
        return lambda x: x * (1.0 if alpha is None else alpha) + (0.0 if beta is None else beta)
    if name == "scaledtanh":
        return lambda x: (
            ember.tanh(x * (1.0 if beta is None else beta)) * (1.0 if alpha is None else alpha)
        )
    raise ShapeError(f"unknown RNN activation {name!r}")


def _acts(a: Attrs, defaults: list[str], ndir: int):
    names = a.get("activations", defaults * ndir)
    al = list(a.get("activation_alpha", []))
    be = list(a.get("activation_beta", []))
    out = []
    for i, n in enumerate(names):
        out.append(_act(n, al[i] if i < len(al) else None, be[i] if i < len(be) else None))
    per = len(defaults)
    if len(out) == per and ndir == 2:
        out = out * 2
    return [out[d * per : (d + 1) * per] for d in range(ndir)]


def _rnn_common(a: Attrs, x, w, r, b, lens, h0, gates: int):
    layout = a.get("layout", 0)
    if layout:
        x = x.permute(1, 0, 2)
        if h0 is not None:
            h0 = h0.permute(1, 0, 2)
    seq, batch = x.shape[:2]
    ndir = w.shape[0]
    hid = a.get("hidden_size", r.shape[-1])
    direction = a.get("direction", "forward")
    if (direction == "bidirectional") != (ndir == 2):
        raise ShapeError(f"ONNX {a.where()}: direction {direction} with W of {ndir} directions")
    if b is None:
        b = ember.zeros((ndir, 2 * gates * hid), dtype=x.dtype)
    lens_np = np.full(batch, seq) if lens is None else np.asarray(lens.numpy()).reshape(-1)
    masks = [const((t < lens_np).reshape(batch, 1), np.bool_) for t in range(seq)]
    full = bool((lens_np >= seq).all())
    if h0 is None:
        h0 = ember.zeros((ndir, batch, hid), dtype=x.dtype)
    return x, seq, batch, ndir, hid, direction, b, masks, full, h0, layout


def _finish(a: Attrs, ys, hs, cs, layout):
    y = ember.stack([ember.stack(yd) for yd in ys], dim=1)  # seq, dirs, batch, hid
    yh = ember.stack(hs)
    yc = ember.stack(cs) if cs else None
    if layout:
        y = y.permute(2, 0, 1, 3)
        yh = yh.permute(1, 0, 2)
        yc = yc.permute(1, 0, 2) if yc is not None else None
    out = (y.contiguous(), yh.contiguous()) + ((yc.contiguous(),) if yc is not None else ())
    return out[: a.n_out]


def _step_mask(full, m, new, old):
    return new if full else ember.where(m, new, old)


def _clip(a: Attrs, g):
    c = a.get("clip", None)
    return ember.clamp(g, -c, c) if c is not None else g


def _times(direction, d, seq):
    rev = direction == "reverse" or (direction == "bidirectional" and d == 1)
    return range(seq - 1, -1, -1) if rev else range(seq)


@op("RNN")
def _rnn(a: Attrs, x, w, r, b=None, lens=None, h0=None):
    x, seq, batch, ndir, hid, direction, b, masks, full, h0, layout = _rnn_common(
        a, x, w, r, b, lens, h0, 1
    )
    acts = _acts(a, ["Tanh"], ndir)
    ys, hs = [], []
    for d in range(ndir):
        xw = ember.matmul(x, w[d].mT) + (b[d, :hid] + b[d, hid:])
        h = h0[d]
        yd = [None] * seq
        zero = ember.zeros((batch, hid), dtype=x.dtype)
        for t in _times(direction, d, seq):
            hn = acts[d][0](_clip(a, xw[t] + ember.matmul(h, r[d].mT)))
            h = _step_mask(full, masks[t], hn, h)
            yd[t] = _step_mask(full, masks[t], hn, zero)
        ys.append(yd)
        hs.append(h)
    return _finish(a, ys, hs, None, layout)


@op("GRU")
def _gru(a: Attrs, x, w, r, b=None, lens=None, h0=None):
    x, seq, batch, ndir, hid, direction, b, masks, full, h0, layout = _rnn_common(
        a, x, w, r, b, lens, h0, 3
    )
    acts = _acts(a, ["Sigmoid", "Tanh"], ndir)
    lbr = a.get("linear_before_reset", 0)
    ys, hs = [], []
    for d in range(ndir):
        f, g = acts[d]
        wb, rb = b[d, : 3 * hid], b[d, 3 * hid :]
        xw = ember.matmul(x, w[d].mT) + wb  # z r h
        rz, rr, rh = r[d, :hid], r[d, hid : 2 * hid], r[d, 2 * hid :]
        h = h0[d]
        zero = ember.zeros((batch, hid), dtype=x.dtype)
        yd = [None] * seq
        for t in _times(direction, d, seq):
            xt = xw[t]
            z = f(_clip(a, xt[:, :hid] + ember.matmul(h, rz.mT) + rb[:hid]))
            rr_ = f(_clip(a, xt[:, hid : 2 * hid] + ember.matmul(h, rr.mT) + rb[hid : 2 * hid]))
            if lbr:
                hh = g(_clip(a, xt[:, 2 * hid :] + rr_ * (ember.matmul(h, rh.mT) + rb[2 * hid :])))
            else:
                hh = g(_clip(a, xt[:, 2 * hid :] + ember.matmul(rr_ * h, rh.mT) + rb[2 * hid :]))
            hn = (1.0 - z) * hh + z * h
            h = _step_mask(full, masks[t], hn, h)
            yd[t] = _step_mask(full, masks[t], hn, zero)
        ys.append(yd)
        hs.append(h)
    return _finish(a, ys, hs, None, layout)


@op("LSTM")
def _lstm(a: Attrs, x, w, r, b=None, lens=None, h0=None, c0=None, p=None):
    if a.get("layout", 0) and c0 is not None:
        c0 = c0.permute(1, 0, 2)
    x, seq, batch, ndir, hid, direction, b, masks, full, h0, layout = _rnn_common(
        a, x, w, r, b, lens, h0, 4
    )
    if c0 is None:
        c0 = ember.zeros((ndir, batch, hid), dtype=x.dtype)
    acts = _acts(a, ["Sigmoid", "Tanh", "Tanh"], ndir)
    couple = a.get("input_forget", 0)
    ys, hs, cs = [], [], []
    for d in range(ndir):
        f, g, hact = acts[d]
        bias = b[d, : 4 * hid] + b[d, 4 * hid :]
        xw = ember.matmul(x, w[d].mT) + bias  # i o f c
        h, c = h0[d], c0[d]
        pi = po = pf = None
        if p is not None:
            pi, po, pf = p[d, :hid], p[d, hid : 2 * hid], p[d, 2 * hid :]
        zero = ember.zeros((batch, hid), dtype=x.dtype)
        yd = [None] * seq
        for t in _times(direction, d, seq):
            gts = xw[t] + ember.matmul(h, r[d].mT)
            gi, go, gf, gc = (gts[:, k * hid : (k + 1) * hid] for k in range(4))
            if pi is not None:
                gi, gf = gi + pi * c, gf + pf * c
            i_ = f(_clip(a, gi))
            f_ = (1.0 - i_) if couple else f(_clip(a, gf))
            cn = f_ * c + i_ * g(_clip(a, gc))
            if po is not None:
                go = go + po * cn
            o_ = f(_clip(a, go))
            hn = o_ * hact(cn)
            h = _step_mask(full, masks[t], hn, h)
            c = _step_mask(full, masks[t], cn, c)
            yd[t] = _step_mask(full, masks[t], hn, zero)
        ys.append(yd)
        hs.append(h)
        cs.append(c)
    return _finish(a, ys, hs, cs, layout)
