"""Fused recurrent layers: one Function runs a whole sequence for one layer and direction.

The input projection of every time step is one matmul; the loop does only the recurrent
product and the gates. Backward is backpropagation through time in numpy, gathering the gate
gradients of all steps so the weight gradients are again one matmul each.

Output layout (one array, so one Function output): (T + k, N, H) holding the per-position
outputs, then the final hidden state (and for the LSTM the final cell state).
"""

from __future__ import annotations

import numpy as np

from ember.autograd import Function
from ember.nn.functional._util import up


def _sig(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _prev(states: np.ndarray, init: np.ndarray, reverse: bool) -> np.ndarray:
    """The state each step starts from, per position."""
    if reverse:
        return np.concatenate([states[1:], init[None]], 0)
    return np.concatenate([init[None], states[:-1]], 0)


def _in_proj(x: np.ndarray, w: np.ndarray, b) -> np.ndarray:
    T, N, n_in = x.shape
    xw = (x.reshape(T * N, n_in) @ w.T).reshape(T, N, w.shape[0])
    if b is not None:
        xw += b
    return xw


def _weight_grads(dG: np.ndarray, inp: np.ndarray) -> np.ndarray:
    return dG.reshape(-1, dG.shape[-1]).T @ inp.reshape(-1, inp.shape[-1])


class LSTMLayer(Function):
    """One LSTM layer-direction: inputs x (T, N, I), h0, c0 (N, H), w_ih, w_hh[, b_ih, b_hh]."""

    def meta(self, x, h0, c0, w_ih, w_hh, *b, reverse):
        return (x.shape[0] + 2,) + h0.shape, np.result_type(x.dtype, w_ih.dtype)

    def forward(self, x, h0, c0, w_ih, w_hh, *b, reverse):
        dt = np.result_type(x.dtype, w_ih.dtype)
        x, h0, c0, w_ih, w_hh = up(x), up(h0), up(c0), up(w_ih), up(w_hh)
        bias = (up(b[0]) + up(b[1])) if b else None
        T, N = x.shape[:2]
        H = w_hh.shape[1]
        xw = _in_proj(x, w_ih, bias)
        acts = np.empty((T, N, 4 * H), xw.dtype)
        hs = np.empty((T, N, H), xw.dtype)
        cs = np.empty((T, N, H), xw.dtype)
        h, c = h0, c0
        whT = w_hh.T
        for t in range(T - 1, -1, -1) if reverse else range(T):
            gt = xw[t] + h @ whT
            a = acts[t]
            a[:, : 2 * H] = _sig(gt[:, : 2 * H])
            a[:, 2 * H : 3 * H] = np.tanh(gt[:, 2 * H : 3 * H])
            a[:, 3 * H :] = _sig(gt[:, 3 * H :])
            c = a[:, H : 2 * H] * c + a[:, :H] * a[:, 2 * H : 3 * H]
            h = a[:, 3 * H :] * np.tanh(c)
            hs[t], cs[t] = h, c
        self.saved = (x, h0, c0, w_ih, w_hh, acts, hs, cs)
        self.reverse, self.has_b = reverse, bool(b)
        return np.concatenate([hs, h[None], c[None]], 0).astype(dt, copy=False)

    def backward(self, g):
        x, h0, c0, w_ih, w_hh, acts, hs, cs = self.saved
        g = up(g)
        T = x.shape[0]
        H = w_hh.shape[1]
        dh = g[T].copy()
        dc = g[T + 1].copy()
        c_prev = _prev(cs, c0, self.reverse)
        dG = np.empty_like(acts)
        for t in range(T) if self.reverse else range(T - 1, -1, -1):
            dh += g[t]
            a = acts[t]
            i, f, gg, o = a[:, :H], a[:, H : 2 * H], a[:, 2 * H : 3 * H], a[:, 3 * H :]
            tc = np.tanh(cs[t])
            dc = dc + dh * o * (1 - tc * tc)
            d = dG[t]
            d[:, :H] = dc * gg * i * (1 - i)
            d[:, H : 2 * H] = dc * c_prev[t] * f * (1 - f)
            d[:, 2 * H : 3 * H] = dc * i * (1 - gg * gg)
            d[:, 3 * H :] = dh * tc * o * (1 - o)
            dc = dc * f
            dh = d @ w_hh
        need = self.needs_input_grad
        dx = (dG.reshape(-1, 4 * H) @ w_ih).reshape(x.shape) if need[0] else None
        dw_ih = _weight_grads(dG, x) if need[3] else None
        dw_hh = _weight_grads(dG, _prev(hs, h0, self.reverse)) if need[4] else None
        out = [dx, dh, dc, dw_ih, dw_hh]
        if self.has_b:
            db = dG.sum((0, 1))
            out += [db, db]
        return tuple(out)


class GRULayer(Function):
    """One GRU layer-direction: inputs x (T, N, I), h0 (N, H), w_ih, w_hh[, b_ih, b_hh]."""

    def meta(self, x, h0, w_ih, w_hh, *b, reverse):
        return (x.shape[0] + 1,) + h0.shape, np.result_type(x.dtype, w_ih.dtype)

    def forward(self, x, h0, w_ih, w_hh, *b, reverse):
        dt = np.result_type(x.dtype, w_ih.dtype)
        x, h0, w_ih, w_hh = up(x), up(h0), up(w_ih), up(w_hh)
        b_ih, b_hh = (up(b[0]), up(b[1])) if b else (None, None)
        T, N = x.shape[:2]
        H = w_hh.shape[1]
        xw = _in_proj(x, w_ih, b_ih)
        rz = np.empty((T, N, 2 * H), xw.dtype)
        ns = np.empty((T, N, H), xw.dtype)
        hn = np.empty((T, N, H), xw.dtype)
        hs = np.empty((T, N, H), xw.dtype)
        h = h0
        whT = w_hh.T
        for t in range(T - 1, -1, -1) if reverse else range(T):
            hw = h @ whT
            if b_hh is not None:
                hw += b_hh
            rz[t] = _sig(xw[t, :, : 2 * H] + hw[:, : 2 * H])
            r, z = rz[t, :, :H], rz[t, :, H:]
            hn[t] = hw[:, 2 * H :]
            ns[t] = np.tanh(xw[t, :, 2 * H :] + r * hn[t])
            h = (1 - z) * ns[t] + z * h
            hs[t] = h
        self.saved = (x, h0, w_ih, w_hh, rz, ns, hn, hs)
        self.reverse, self.has_b = reverse, bool(b)
        return np.concatenate([hs, h[None]], 0).astype(dt, copy=False)

    def backward(self, g):
        x, h0, w_ih, w_hh, rz, ns, hn, hs = self.saved
        g = up(g)
        T = x.shape[0]
        H = w_hh.shape[1]
        dh = g[T].copy()
        h_prev = _prev(hs, h0, self.reverse)
        dGi = np.empty(rz.shape[:2] + (3 * H,), rz.dtype)
        dGh = np.empty_like(dGi)
        for t in range(T) if self.reverse else range(T - 1, -1, -1):
            dh += g[t]
            r, z, n = rz[t, :, :H], rz[t, :, H:], ns[t]
            dn = dh * (1 - z) * (1 - n * n)
            dz = dh * (h_prev[t] - n) * z * (1 - z)
            dr = dn * hn[t] * r * (1 - r)
            gi, gh = dGi[t], dGh[t]
            gi[:, :H] = dr
            gi[:, H : 2 * H] = dz
            gi[:, 2 * H :] = dn
            gh[:, : 2 * H] = gi[:, : 2 * H]
            gh[:, 2 * H :] = dn * r
            dh = dh * z + gh @ w_hh
        need = self.needs_input_grad
        dx = (dGi.reshape(-1, 3 * H) @ w_ih).reshape(x.shape) if need[0] else None
        dw_ih = _weight_grads(dGi, x) if need[2] else None
        dw_hh = _weight_grads(dGh, h_prev) if need[3] else None
        out = [dx, dh, dw_ih, dw_hh]
        if self.has_b:
            out += [dGi.sum((0, 1)), dGh.sum((0, 1))]
        return tuple(out)


class RNNLayer(Function):
    """One Elman RNN layer-direction (tanh or relu): x (T, N, I), h0 (N, H), weights."""

    def meta(self, x, h0, w_ih, w_hh, *b, reverse, relu):
        return (x.shape[0] + 1,) + h0.shape, np.result_type(x.dtype, w_ih.dtype)

    def forward(self, x, h0, w_ih, w_hh, *b, reverse, relu):
        dt = np.result_type(x.dtype, w_ih.dtype)
        x, h0, w_ih, w_hh = up(x), up(h0), up(w_ih), up(w_hh)
        bias = (up(b[0]) + up(b[1])) if b else None
        T, N = x.shape[:2]
        H = w_hh.shape[1]
        xw = _in_proj(x, w_ih, bias)
        hs = np.empty((T, N, H), xw.dtype)
        h = h0
        whT = w_hh.T
        for t in range(T - 1, -1, -1) if reverse else range(T):
            pre = xw[t] + h @ whT
            h = np.maximum(pre, 0) if relu else np.tanh(pre)
            hs[t] = h
        self.saved = (x, h0, w_ih, w_hh, hs)
        self.reverse, self.relu, self.has_b = reverse, relu, bool(b)
        return np.concatenate([hs, h[None]], 0).astype(dt, copy=False)

    def backward(self, g):
        x, h0, w_ih, w_hh, hs = self.saved
        g = up(g)
        T = x.shape[0]
        dh = g[T].copy()
        dP = np.empty_like(hs)
        for t in range(T) if self.reverse else range(T - 1, -1, -1):
            dh += g[t]
            dP[t] = dh * (hs[t] > 0) if self.relu else dh * (1 - hs[t] * hs[t])
            dh = dP[t] @ w_hh
        need = self.needs_input_grad
        H = w_hh.shape[1]
        dx = (dP.reshape(-1, H) @ w_ih).reshape(x.shape) if need[0] else None
        dw_ih = _weight_grads(dP, x) if need[2] else None
        dw_hh = _weight_grads(dP, _prev(hs, h0, self.reverse)) if need[3] else None
        out = [dx, dh, dw_ih, dw_hh]
        if self.has_b:
            db = dP.sum((0, 1))
            out += [db, db]
        return tuple(out)
