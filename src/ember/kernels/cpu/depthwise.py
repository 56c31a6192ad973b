"""Depthwise 2-D convolution (groups == in_channels): a per-channel weighted sum over the window.

Forward and both gradients are numba kernels (one plane per parallel task, the inner loop over a
contiguous row so LLVM vectorises it), each beside the numpy reference it must match and that
serves without numba. Measured on MobileNet-like shapes the kernels are 4-6x faster than the
references, which make one or two numpy passes per kernel tap.

Shapes: x (N, C, H, W), w (C*m, 1, kh, kw) (m = channel multiplier), out/g (N, C*m, OH, OW).
``pad`` is (top, left); bottom/right padding is whatever ``out_hw`` implies.
"""

from __future__ import annotations

import numpy as np

from ember.kernels.cpu import numba_or_none

_kernels = None


def _pads(h: int, wd: int, k, s, d, pad, out_hw) -> tuple:
    """(top, bottom, left, right) padding: pad on top/left, whatever out_hw needs at the end."""
    (kh, kw), (sh, sw), (dh, dw), (pt, pl), (oh, ow) = k, s, d, pad, out_hw
    pb = max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - h - pt)
    pr = max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - wd - pl)
    return pt, pb, pl, pr


def _padded(x: np.ndarray, k, s, d, pad, out_hw) -> np.ndarray:
    pt, pb, pl, pr = _pads(*x.shape[2:], k, s, d, pad, out_hw)
    return np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr))) if pt or pb or pl or pr else x


def _tap(xp: np.ndarray, i: int, j: int, s, d, out_hw) -> np.ndarray:
    (sh, sw), (dh, dw), (oh, ow) = s, d, out_hw
    return xp[
        :, :, i * dh : i * dh + sh * (oh - 1) + 1 : sh, j * dw : j * dw + sw * (ow - 1) + 1 : sw
    ]


# ------------------------------------------------------------------ numpy references
def depthwise_conv2d_reference(
    x: np.ndarray, w: np.ndarray, stride, dilation, pad, out_hw
) -> np.ndarray:
    """Forward: out[n, c*m+q] = sum_ij w[c*m+q, 0, i, j] * x_pad[n, c, tap(i, j)]."""
    n, c = x.shape[:2]
    o, _, kh, kw = w.shape
    m = o // c
    xp = _padded(x, (kh, kw), stride, dilation, pad, out_hw)
    out = np.zeros((n, c, m, *out_hw), np.result_type(x, w))
    tmp = np.empty_like(out)
    for i in range(kh):
        for j in range(kw):
            v = _tap(xp, i, j, stride, dilation, out_hw)
            np.multiply(v[:, :, None], w[:, 0, i, j].reshape(1, c, m, 1, 1), out=tmp)
            out += tmp
    return out.reshape(n, o, *out_hw)


def depthwise_grad_input_reference(
    g: np.ndarray, w: np.ndarray, x_shape, stride, dilation, pad
) -> np.ndarray:
    """d(out)/d(x) applied to g: scatter w * g back over each tap."""
    n, c, h, wd = x_shape
    o, _, kh, kw = w.shape
    m = o // c
    oh, ow = g.shape[2:]
    g5 = g.reshape(n, c, m, oh, ow)
    pt, pb, pl, pr = _pads(h, wd, (kh, kw), stride, dilation, pad, (oh, ow))
    xp = np.zeros((n, c, h + pt + pb, wd + pl + pr), g.dtype)
    for i in range(kh):
        for j in range(kw):
            wij = w[:, 0, i, j].reshape(1, c, m, 1, 1)
            _tap(xp, i, j, stride, dilation, (oh, ow))[...] += (g5 * wij).sum(2)
    return xp[:, :, pt : pt + h, pl : pl + wd]


def depthwise_grad_weight_reference(
    g: np.ndarray, x: np.ndarray, w_shape, stride, dilation, pad
) -> np.ndarray:
    """d(out)/d(w) applied to g: per tap, sum over batch and positions of g * x_tap."""
    n, c = x.shape[:2]
    o, _, kh, kw = w_shape
    m = o // c
    oh, ow = g.shape[2:]
    g5 = g.reshape(n, c, m, oh, ow)
    xp = _padded(x, (kh, kw), stride, dilation, pad, (oh, ow))
    gw = np.zeros(w_shape, g.dtype)
    for i in range(kh):
        for j in range(kw):
            v = _tap(xp, i, j, stride, dilation, (oh, ow))
            gw[:, 0, i, j] = np.einsum("ncmhw,nchw->cm", g5, v).reshape(-1)
    return gw


# ------------------------------------------------------------------ numba kernels
def _build(nb):
    # no jitted helpers captured in the closures: numba's on-disk cache would miss every run
    @nb.njit(parallel=True, nogil=True, cache=True, fastmath=True)
    def fwd(x, w, out, sh, sw, dh, dw, pt, pl):  # pragma: no cover - compiled
        n_, c_, h_, w_ = x.shape
        o_, _, kh, kw = w.shape
        oh_, ow_ = out.shape[2], out.shape[3]
        m = o_ // c_
        for p in nb.prange(n_ * o_):
            n = p // o_
            o = p - n * o_
            xi = x[n, o // m]
            po = out[n, o]
            po[:, :] = 0
            for i in range(kh):
                offh = i * dh - pt
                oh_lo = max(0, (sh - 1 - offh) // sh)
                oh_hi = min(oh_, (h_ - 1 - offh) // sh + 1)
                for j in range(kw):
                    offw = j * dw - pl
                    ow_lo = max(0, (sw - 1 - offw) // sw)
                    ow_hi = min(ow_, (w_ - 1 - offw) // sw + 1)
                    if ow_hi <= ow_lo:
                        continue
                    wv = w[o, 0, i, j]
                    a = ow_lo * sw + offw
                    for oh in range(oh_lo, oh_hi):
                        prow = po[oh, ow_lo:ow_hi]
                        xrow = xi[oh * sh + offh, a : a + (ow_hi - ow_lo - 1) * sw + 1 : sw]
                        for t in range(prow.shape[0]):
                            prow[t] += wv * xrow[t]
        return out

    @nb.njit(parallel=True, nogil=True, cache=True, fastmath=True)
    def grad_input(g, w, gx, sh, sw, dh, dw, pt, pl):  # pragma: no cover - compiled
        n_, c_, h_, w_ = gx.shape
        o_, _, kh, kw = w.shape
        oh_, ow_ = g.shape[2], g.shape[3]
        m = o_ // c_
        for p in nb.prange(n_ * c_):
            n = p // c_
            c = p - n * c_
            gxi = gx[n, c]
            gxi[:, :] = 0
            for o in range(c * m, c * m + m):
                gi = g[n, o]
                for i in range(kh):
                    offh = i * dh - pt
                    oh_lo = max(0, (sh - 1 - offh) // sh)
                    oh_hi = min(oh_, (h_ - 1 - offh) // sh + 1)
                    for j in range(kw):
                        offw = j * dw - pl
                        ow_lo = max(0, (sw - 1 - offw) // sw)
                        ow_hi = min(ow_, (w_ - 1 - offw) // sw + 1)
                        if ow_hi <= ow_lo:
                            continue
                        wv = w[o, 0, i, j]
                        a = ow_lo * sw + offw
                        for oh in range(oh_lo, oh_hi):
                            grow = gi[oh, ow_lo:ow_hi]
                            xrow = gxi[oh * sh + offh, a : a + (ow_hi - ow_lo - 1) * sw + 1 : sw]
                            for t in range(grow.shape[0]):
                                xrow[t] += wv * grow[t]
        return gx

    @nb.njit(parallel=True, nogil=True, cache=True, fastmath=True)
    def grad_weight(g, x, gw, sh, sw, dh, dw, pt, pl):  # pragma: no cover - compiled
        n_, c_, h_, w_ = x.shape
        o_, _, kh, kw = gw.shape
        oh_, ow_ = g.shape[2], g.shape[3]
        m = o_ // c_
        for o in nb.prange(o_):
            for i in range(kh):
                offh = i * dh - pt
                oh_lo = max(0, (sh - 1 - offh) // sh)
                oh_hi = min(oh_, (h_ - 1 - offh) // sh + 1)
                for j in range(kw):
                    offw = j * dw - pl
                    ow_lo = max(0, (sw - 1 - offw) // sw)
                    ow_hi = min(ow_, (w_ - 1 - offw) // sw + 1)
                    acc = 0.0
                    a = ow_lo * sw + offw
                    for n in range(n_ if ow_hi > ow_lo else 0):
                        xi, gi = x[n, o // m], g[n, o]
                        for oh in range(oh_lo, oh_hi):
                            grow = gi[oh, ow_lo:ow_hi]
                            xrow = xi[oh * sh + offh, a : a + (ow_hi - ow_lo - 1) * sw + 1 : sw]
                            for t in range(grow.shape[0]):
                                acc += grow[t] * xrow[t]
                    gw[o, 0, i, j] = acc
        return gw

    return fwd, grad_input, grad_weight


def _get(x: np.ndarray, w: np.ndarray):
    """The compiled kernels when numba is present and the dtypes suit them, else None."""
    global _kernels
    if x.dtype != w.dtype or x.dtype not in (np.float32, np.float64):
        return None
    if _kernels is None:
        nb = numba_or_none()
        _kernels = False if nb is None else _build(nb)
    return _kernels or None


def depthwise_conv2d(x: np.ndarray, w: np.ndarray, stride, dilation, pad, out_hw) -> np.ndarray:
    """Depthwise convolution forward (numba kernel, or the numpy reference)."""
    k = _get(x, w)
    if k is None:
        return depthwise_conv2d_reference(x, w, stride, dilation, pad, out_hw)
    out = np.empty((x.shape[0], w.shape[0], *out_hw), x.dtype)
    return k[0](np.ascontiguousarray(x), np.ascontiguousarray(w), out, *stride, *dilation, *pad)


def depthwise_grad_input(
    g: np.ndarray, w: np.ndarray, x_shape, stride, dilation, pad
) -> np.ndarray:
    """The input gradient of a depthwise convolution (numba kernel, or the numpy reference)."""
    k = _get(g, w)
    if k is None:
        return depthwise_grad_input_reference(g, w, x_shape, stride, dilation, pad)
    gx = np.empty(x_shape, g.dtype)
    return k[1](np.ascontiguousarray(g), np.ascontiguousarray(w), gx, *stride, *dilation, *pad)


def depthwise_grad_weight(
    g: np.ndarray, x: np.ndarray, w_shape, stride, dilation, pad
) -> np.ndarray:
    """The weight gradient of a depthwise convolution (numba kernel, or the numpy reference)."""
    k = _get(g, x)
    if k is None:
        return depthwise_grad_weight_reference(g, x, w_shape, stride, dilation, pad)
    gw = np.empty(w_shape, g.dtype)
    return k[2](np.ascontiguousarray(g), np.ascontiguousarray(x), gw, *stride, *dilation, *pad)
