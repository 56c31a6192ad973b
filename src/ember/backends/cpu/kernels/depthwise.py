"""Depthwise 2-D convolution (groups == in_channels): a per-channel weighted sum over the window.

``depthwise_conv2d`` is a numba kernel (one output plane per parallel task, the inner loop over a
contiguous output row so LLVM vectorises it); ``depthwise_conv2d_reference`` is the numpy version
it must match and the fallback without numba. Measured on MobileNet-like shapes the kernel is
about 6x faster than the reference (which makes two numpy passes per kernel tap).
"""

from __future__ import annotations

import numpy as np

from ember.backends.cpu.kernels import numba_or_none

_kernel = None


def depthwise_conv2d_reference(
    x: np.ndarray, w: np.ndarray, stride, dilation, pad, out_hw
) -> np.ndarray:
    """x (N, C, H, W), w (C*m, 1, kh, kw) -> (N, C*m, OH, OW); pad = (top, left), rest implied."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    m = o // c
    (sh, sw), (dh, dw), (pt, pl), (oh, ow) = stride, dilation, pad, out_hw
    pb = max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - h - pt)
    pr = max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - wd - pl)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr))) if pt or pb or pl or pr else x
    out = np.zeros((n, c, m, oh, ow), np.result_type(x, w))
    tmp = np.empty_like(out)
    for i in range(kh):
        for j in range(kw):
            hi, wj = i * dh, j * dw
            v = xp[:, :, hi : hi + sh * (oh - 1) + 1 : sh, wj : wj + sw * (ow - 1) + 1 : sw]
            np.multiply(v[:, :, None], w[:, 0, i, j].reshape(1, c, m, 1, 1), out=tmp)
            out += tmp
    return out.reshape(n, o, oh, ow)


def _build(nb):
    @nb.njit(parallel=True, nogil=True, cache=True, fastmath=True)
    def kernel(x, w, out, sh, sw, dh, dw, pt, pl):  # pragma: no cover - compiled
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
                    for oh in range(oh_lo, oh_hi):
                        prow = po[oh, ow_lo:ow_hi]
                        a = ow_lo * sw + offw
                        xrow = xi[oh * sh + offh, a : a + (ow_hi - ow_lo - 1) * sw + 1 : sw]
                        for t in range(prow.shape[0]):
                            prow[t] += wv * xrow[t]
        return out

    return kernel


def depthwise_conv2d(x: np.ndarray, w: np.ndarray, stride, dilation, pad, out_hw) -> np.ndarray:
    """Depthwise convolution; the numba kernel for float32/float64, else the numpy reference."""
    global _kernel
    if x.dtype != w.dtype or x.dtype not in (np.float32, np.float64):
        return depthwise_conv2d_reference(x, w, stride, dilation, pad, out_hw)
    if _kernel is None:
        nb = numba_or_none()
        _kernel = False if nb is None else _build(nb)
    if _kernel is False:
        return depthwise_conv2d_reference(x, w, stride, dilation, pad, out_hw)
    n, o = x.shape[0], w.shape[0]
    out = np.empty((n, o, *out_hw), x.dtype)
    _kernel(np.ascontiguousarray(x), np.ascontiguousarray(w), out, *stride, *dilation, *pad)
    return out
