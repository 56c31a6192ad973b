"""Channels-last (NHWC) inference kernels: depthwise conv, max pool, copies, and the BLAS fallback.

These serve ember.models.fuse. Depthwise convolution (bias and activation fused), max pooling
and copy4d spread output rows over numba's threads. im2col (each window row is kw*C contiguous
floats) and the epilogue (bias, optional residual, activation in one pass) serve the fallback
GEMM path, numpy's BLAS, where sgemm's microkernels are missing. Every numba kernel releases the
GIL and has a numpy reference beside it (same name + ``_reference``) that tests compare against
and that serves when numba is absent (EMBER_NO_NUMBA=1). Activations: 0 none, 1 ReLU, 2 ReLU6.
float32 only.
"""

from __future__ import annotations

import numpy as np

from ember.kernels.cpu import numba_or_none

ACTS = {None: 0, "none": 0, "relu": 1, "relu6": 2}
_K: dict = {}


# ------------------------------------------------------------------ numpy references
def _pad_nhwc(x, oh, ow, kh, kw, sh, sw, pt, pl, value=0.0):
    n, h, w, c = x.shape
    pb = max(0, (oh - 1) * sh + kh - h - pt)
    pr = max(0, (ow - 1) * sw + kw - w - pl)
    return np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=value)


def _taps(xp, i, j, sh, sw, oh, ow):
    return xp[:, i : i + sh * (oh - 1) + 1 : sh, j : j + sw * (ow - 1) + 1 : sw]


def im2col_reference(x, out, kh, kw, sh, sw, pt, pl, oh, ow) -> np.ndarray:
    """x (N, H, W, C) -> out (N*OH*OW, kh*kw*C): one row per output pixel, (i, j, c) order."""
    n, c = x.shape[0], x.shape[3]
    xp = _pad_nhwc(x, oh, ow, kh, kw, sh, sw, pt, pl)
    o6 = out.reshape(n, oh, ow, kh, kw, c)
    for i in range(kh):
        for j in range(kw):
            o6[:, :, :, i, j] = _taps(xp, i, j, sh, sw, oh, ow)
    return out


def _act_reference(y: np.ndarray, act: int) -> np.ndarray:
    if act == 1:
        np.maximum(y, 0, out=y)
    elif act == 2:
        np.clip(y, 0, 6, out=y)
    return y


def epilogue_reference(y, bias, res, act: int) -> np.ndarray:
    """In place on y (M, O): y = act(y + bias [+ res])."""
    y += bias
    if res is not None:
        y += res
    return _act_reference(y, act)


def depthwise_reference(x, w, bias, out, sh, sw, pt, pl, act: int) -> np.ndarray:
    """x (N, H, W, C), w (kh, kw, C), bias (C,) -> out (N, OH, OW, C) = act(dwconv + bias)."""
    kh, kw, _ = w.shape
    oh, ow = out.shape[1:3]
    xp = _pad_nhwc(x, oh, ow, kh, kw, sh, sw, pt, pl)
    out[...] = bias
    for i in range(kh):
        for j in range(kw):
            out += _taps(xp, i, j, sh, sw, oh, ow) * w[i, j]
    return _act_reference(out, act)


def maxpool_reference(x, out, kh, kw, sh, sw, pt, pl) -> np.ndarray:
    """x (N, H, W, C) -> out (N, OH, OW, C), padding counts as -inf (torch's max_pool2d)."""
    oh, ow = out.shape[1:3]
    xp = _pad_nhwc(x, oh, ow, kh, kw, sh, sw, pt, pl, -np.inf)
    out[...] = -np.inf
    for i in range(kh):
        for j in range(kw):
            np.maximum(out, _taps(xp, i, j, sh, sw, oh, ow), out=out)
    return out


# ------------------------------------------------------------------ numba kernels
def _build(nb):
    opts = dict(nogil=True, cache=True, fastmath=True)

    @nb.njit(**opts)
    def im2col(x, out, kh, kw, sh, sw, pt, pl, oh, ow):  # pragma: no cover - compiled
        n, h, w, c = x.shape
        xf = x.reshape(n, h, w * c)
        seg = kw * c
        for r in range(n * oh):
            b = r // oh
            y = r - b * oh
            for xo in range(ow):
                row = out[r * ow + xo]
                iw0 = xo * sw - pl
                j_lo = max(0, -iw0)
                j_hi = min(kw, w - iw0)
                for i in range(kh):
                    ih = y * sh - pt + i
                    d0 = i * seg
                    if ih < 0 or ih >= h or j_hi <= j_lo:
                        for t in range(seg):
                            row[d0 + t] = 0.0
                        continue
                    for t in range(j_lo * c):
                        row[d0 + t] = 0.0
                    src = xf[b, ih]
                    s0 = (iw0 + j_lo) * c
                    d1 = d0 + j_lo * c
                    for t in range((j_hi - j_lo) * c):
                        row[d1 + t] = src[s0 + t]
                    for t in range(j_hi * c, seg):
                        row[d0 + t] = 0.0
        return out

    @nb.njit(**opts)
    def epilogue(y, bias, res, has_res, act):  # pragma: no cover - compiled
        m, o = y.shape
        for r in range(m):
            row = y[r]
            if has_res:
                rr = res[r]
                for t in range(o):
                    row[t] += bias[t] + rr[t]
            else:
                for t in range(o):
                    row[t] += bias[t]
            if act == 1:
                for t in range(o):
                    row[t] = max(row[t], 0.0)
            elif act == 2:
                for t in range(o):
                    row[t] = min(max(row[t], 0.0), 6.0)
        return y

    @nb.njit(parallel=True, **opts)
    def depthwise(x, w, bias, out, sh, sw, pt, pl, act):  # pragma: no cover - compiled
        n, h, wd, c = x.shape
        kh, kw = w.shape[0], w.shape[1]
        oh, ow = out.shape[1], out.shape[2]
        for r in nb.prange(n * oh):
            b = r // oh
            y = r - b * oh
            for xo in range(ow):
                acc = out[b, y, xo]
                for t in range(c):
                    acc[t] = bias[t]
                for i in range(kh):
                    ih = y * sh - pt + i
                    if ih < 0 or ih >= h:
                        continue
                    for j in range(kw):
                        iw = xo * sw - pl + j
                        if iw < 0 or iw >= wd:
                            continue
                        src = x[b, ih, iw]
                        wt = w[i, j]
                        for t in range(c):
                            acc[t] += src[t] * wt[t]
                if act == 1:
                    for t in range(c):
                        acc[t] = max(acc[t], 0.0)
                elif act == 2:
                    for t in range(c):
                        acc[t] = min(max(acc[t], 0.0), 6.0)
        return out

    @nb.njit(parallel=True, **opts)
    def maxpool(x, out, kh, kw, sh, sw, pt, pl):  # pragma: no cover - compiled
        n, h, w, c = x.shape
        oh, ow = out.shape[1], out.shape[2]
        for r in nb.prange(n * oh):
            b = r // oh
            y = r - b * oh
            for xo in range(ow):
                acc = out[b, y, xo]
                for t in range(c):
                    acc[t] = -np.inf
                for i in range(kh):
                    ih = y * sh - pt + i
                    if ih < 0 or ih >= h:
                        continue
                    for j in range(kw):
                        iw = xo * sw - pl + j
                        if iw < 0 or iw >= w:
                            continue
                        src = x[b, ih, iw]
                        for t in range(c):
                            acc[t] = max(acc[t], src[t])
        return out

    @nb.njit(parallel=True, **opts)
    def copy4d(src, dst):  # pragma: no cover - compiled
        n, h, w, c = dst.shape
        for r in nb.prange(n * h):
            b, y = r // h, r % h
            for x in range(w):
                s, d = src[b, y, x], dst[b, y, x]
                for t in range(c):
                    d[t] = s[t]

    return {
        "im2col": im2col, "epilogue": epilogue, "depthwise": depthwise, "maxpool": maxpool,
        "copy4d": copy4d,
    }  # fmt: skip


def _kernels():
    if not _K:
        nb = numba_or_none()
        _K.update(_build(nb) if nb is not None else {"none": None})
    return None if "none" in _K else _K


# ------------------------------------------------------------------ dispatchers
def im2col(x, out, kh, kw, sh, sw, pt, pl, oh, ow) -> np.ndarray:
    """x (N, H, W, C) float32 contiguous -> out (N*OH*OW, kh*kw*C), zero padding."""
    k = _kernels()
    if k is None:
        return im2col_reference(x, out, kh, kw, sh, sw, pt, pl, oh, ow)
    return k["im2col"](x, out, kh, kw, sh, sw, pt, pl, oh, ow)


def epilogue(y: np.ndarray, bias: np.ndarray, res: np.ndarray | None, act: int) -> np.ndarray:
    """In place: y (M, O) = act(y + bias [+ res (M, O)]); y/res may be column slices."""
    k = _kernels()
    if k is None:
        return epilogue_reference(y, bias, res, act)
    return k["epilogue"](y, bias, y if res is None else res, res is not None, act)


def depthwise(x, w, bias, out, sh, sw, pt, pl, act: int) -> np.ndarray:
    """Depthwise kxk conv over NHWC with bias and activation fused."""
    k = _kernels()
    if k is None:
        return depthwise_reference(x, w, bias, out, sh, sw, pt, pl, act)
    return k["depthwise"](x, w, bias, out, sh, sw, pt, pl, act)


def maxpool(x, out, kh, kw, sh, sw, pt, pl) -> np.ndarray:
    """Max pooling over NHWC (padding is -inf)."""
    k = _kernels()
    if k is None:
        return maxpool_reference(x, out, kh, kw, sh, sw, pt, pl)
    return k["maxpool"](x, out, kh, kw, sh, sw, pt, pl)


def copy4d(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """dst[...] = src for 4-D arrays of one shape (any strides), rows spread over the threads."""
    k = _kernels()
    if k is None:
        np.copyto(dst, src)
    else:
        k["copy4d"](src, dst)
    return dst
