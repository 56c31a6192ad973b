"""Convolution kernels: the channels-last (NHWC) inference kernels and the NCHW depthwise conv.

Inference (float32, no gradient recorded), behind ops: ``fused_conv2d`` (ember.inference.ops:
act(conv2d + bias [+ residual]), ReLU/ReLU6) runs on the packed GEMM's implicit-GEMM form
(``conv_gemm``, kernels.cpu.gemm) when its weight is a ``gemm.PackedWeight`` (stride-1 3x3
convs with enough channels and output tiles: Winograd F(4x4, 3x3) on the same microkernel,
kernels.cpu.winograd), or on the NHWC depthwise kernel when it is depthwise; ``conv2d`` with a PackedWeight takes the same GEMM, and
``max_pool2d`` of channels-last data the NHWC max pool; a 1-D ``conv2d`` (conv1d, e.g. Whisper's
stem) with a plain weight runs on the same GEMM, its weight packed per call (``conv1d_gemm``).
Their results are channels-last: an (N, C, H, W) view of NHWC memory (an (N, C, L) view of
(N, L, C) for conv1d), which the next of these kernels reads without a copy. For the ONNX
importer's nodes around them: ``conv_transpose`` (a narrow transposed conv whose kernel is its
stride, one direct pass) and ``channel_mean`` (the global average pool of channels-last data).
Depthwise conv (its rows on kernels.cpu.dwconv's vector kernels where they build), max pooling
and the post pass run their rows as tasks on ember's worker pool (kernels.cpu.pool_tasks),
copy4d over numba's threads; im2col (each window row kw*C contiguous floats) serves
bench/gemm.py's BLAS comparison.

Training: depthwise convolution (groups == in_channels) over NCHW, forward and both gradients
(``depthwise_nchw``, the conv2d op's kernel, which its ``saved`` lets run in training too;
``depthwise_grad_input`` and ``depthwise_grad_weight``, which the op's backward calls),
one plane per parallel task, the inner loop over a contiguous row so LLVM vectorises it
(measured 4-6x faster than the references on MobileNet shapes). Shapes there: x (N, C, H, W),
w (C*m, 1, kh, kw) (m = channel multiplier); ``pad`` is (top, left), bottom/right padding is
whatever ``out_hw`` implies.

Every kernel releases the GIL and keeps a numpy reference beside it (``*_reference``), which
the tests compare it with and which serves where numba is absent (EMBER_NO_NUMBA=1).
Activations: 0 none, 1 ReLU, 2 ReLU6.
"""

from __future__ import annotations

import threading

import numpy as np

from ember.errors import ShapeError
from ember.kernels.cpu import FASTMATH, have_numba, numba_or_none
from ember.kernels.cpu import gemm as G
from ember.kernels.cpu import pool_tasks as _PT
from ember.kernels.registry import register
from ember.threads import get_num_threads

ACTS = {None: 0, "none": 0, "relu": 1, "relu6": 2, "hardswish": 3, "silu": 4}
_F32 = np.dtype(np.float32)
_K: dict = {}
_NCHW = None


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
    elif act in (3, 4):
        with np.errstate(over="ignore", invalid="ignore"):  # -inf: NaN, as in the kernel
            if act == 3:
                y *= np.clip(y + 3, 0, 6) / 6
            else:
                y /= 1 + np.exp(-y)
    return y


def post_reference(y: np.ndarray, act: int, scale: float, shift: float) -> np.ndarray:
    """y (M, C) <- act(y) * scale + shift in place (act 0 none, 3 hard swish, 4 SiLU)."""
    _act_reference(y, act)
    if scale != 1.0:
        y *= np.float32(scale)
    if shift != 0.0:
        y += np.float32(shift)
    return y


def depthwise_nhwc_reference(x, w, bias, out, sh, sw, pt, pl, act: int) -> np.ndarray:
    """x (N, H, W, C), w (kh, kw, C), bias (C,) -> out (N, OH, OW, C) = act(dwconv + bias)."""
    kh, kw, _ = w.shape
    oh, ow = out.shape[1:3]
    xp = _pad_nhwc(x, oh, ow, kh, kw, sh, sw, pt, pl)
    out[...] = bias
    for i in range(kh):
        for j in range(kw):
            out += _taps(xp, i, j, sh, sw, oh, ow) * w[i, j]
    return _act_reference(out, act)


def maxpool_nhwc_reference(x, out, kh, kw, sh, sw, pt, pl) -> np.ndarray:
    """x (N, H, W, C) -> out (N, OH, OW, C), padding counts as -inf (torch's max_pool2d)."""
    oh, ow = out.shape[1:3]
    xp = _pad_nhwc(x, oh, ow, kh, kw, sh, sw, pt, pl, -np.inf)
    out[...] = -np.inf
    for i in range(kh):
        for j in range(kw):
            np.maximum(out, _taps(xp, i, j, sh, sw, oh, ow), out=out)
    return out


# ------------------------------------------------------------------ numba kernels
# row bodies shared by the parallel kernels, their serial variants and the pool's tasks
# (kernels.cpu.pool_tasks); module globals so that numba's cache keys them on their code
def _dw_rows_py(x, w, bias, out, sh, sw, pt, pl, act, r0, r1):  # pragma: no cover - compiled
    """Output rows r0..r1-1 (of N * OH) of the NHWC depthwise conv (+ bias, ReLU/ReLU6)."""
    n, h, wd, c = x.shape
    kh, kw = w.shape[0], w.shape[1]
    oh, ow = out.shape[1], out.shape[2]
    for r in range(r0, r1):
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


def _post_rows_py(y, act, scale, shift, r0, r1):  # pragma: no cover - compiled
    """Rows r0..r1-1 of y (M, C) <- act(y) * scale + shift (act 0, 3 hard swish, 4 SiLU)."""
    c = y.shape[1]
    three, six, sixth, one = np.float32(3), np.float32(6), np.float32(1 / 6), np.float32(1)
    zero = np.float32(0)
    for r in range(r0, r1):
        row = y[r]
        if act == 3:
            for t in range(c):
                v = row[t]
                row[t] = v * min(max(v + three, zero), six) * sixth * scale + shift
        elif act == 4:
            for t in range(c):
                v = row[t]
                row[t] = v / (one + np.exp(-v)) * scale + shift
        else:
            for t in range(c):
                row[t] = row[t] * scale + shift


def _maxpool3_rows_py(x, out, sh, sw, pt, pl, r0, r1):  # pragma: no cover - compiled
    """Output rows r0..r1-1 of a 3x3 NHWC max pool whose every window meets the image.

    A tap outside the image is replaced by the nearest one inside the window (the same row or
    column clamped to the image): a repeated tap leaves the max unchanged, so the padding needs
    no branch and every output pixel is one loop over its channels with the 9 taps' loads and
    selects in registers and one store. ``_maxpool_rows`` kept its output row in memory and
    re-entered a channel loop per tap (9 loads, selects and stores per output vector, plus a
    loop setup per tap): ResNet-50's 112x112x64 -> 56x56 pool took 166 us alone on one thread
    there.
    """
    n, h, w, c = x.shape
    oh, ow = out.shape[1], out.shape[2]
    for r in range(r0, r1):
        b = r // oh
        y = r - b * oh
        i0 = y * sh - pt
        ra = x[b, min(max(i0, 0), h - 1)]
        rb = x[b, min(max(i0 + 1, 0), h - 1)]
        rc = x[b, min(max(i0 + 2, 0), h - 1)]
        for xo in range(ow):
            j0 = xo * sw - pl
            a0 = ra[min(max(j0, 0), w - 1)]
            a1 = ra[min(max(j0 + 1, 0), w - 1)]
            a2 = ra[min(max(j0 + 2, 0), w - 1)]
            b0 = rb[min(max(j0, 0), w - 1)]
            b1 = rb[min(max(j0 + 1, 0), w - 1)]
            b2 = rb[min(max(j0 + 2, 0), w - 1)]
            c0 = rc[min(max(j0, 0), w - 1)]
            c1 = rc[min(max(j0 + 1, 0), w - 1)]
            c2 = rc[min(max(j0 + 2, 0), w - 1)]
            o = out[b, y, xo]
            for t in range(c):
                v0, v1, v2 = a0[t], a1[t], a2[t]
                v3, v4, v5 = b0[t], b1[t], b2[t]
                v6, v7, v8 = c0[t], c1[t], c2[t]
                m = v0 if v0 > v1 else v1  # "m if m > v else v": one vmaxps each
                m = m if m > v2 else v2
                m = m if m > v3 else v3
                m = m if m > v4 else v4
                m = m if m > v5 else v5
                m = m if m > v6 else v6
                m = m if m > v7 else v7
                m = m if m > v8 else v8
                # NaN wins, as in torch (vmaxps keeps a NaN only from its second operand)
                nan = (v0 != v0) | (v1 != v1) | (v2 != v2) | (v3 != v3) | (v4 != v4)
                nan |= (v5 != v5) | (v6 != v6) | (v7 != v7) | (v8 != v8)
                o[t] = np.float32(np.nan) if nan else m


def _maxpool_rows_py(x, out, kh, kw, sh, sw, pt, pl, r0, r1):  # pragma: no cover - compiled
    """Output rows r0..r1-1 (of N * OH) of NHWC max pooling (-inf padding, NaN wins).

    A 3x3 pool whose every window meets the image (any torch/ONNX pool with pads <= 1) runs
    ``_maxpool3_rows``. Otherwise each window row's taps are folded into the output row in
    place, channels innermost with a branch-free select (LLVM vectorises it; the old per-pixel
    loop with ``or`` did not).
    """
    n, h, w, c = x.shape
    oh, ow = out.shape[1], out.shape[2]
    if (
        kh == 3
        and kw == 3
        and pt <= 2
        and pl <= 2
        and (oh - 1) * sh - pt < h
        and (ow - 1) * sw - pl < w
    ):
        _maxpool3_rows(x, out, sh, sw, pt, pl, r0, r1)
        return
    ninf = np.float32(-np.inf)
    for r in range(r0, r1):
        b = r // oh
        y = r - b * oh
        orow = out[b, y]
        for xo in range(ow):
            for t in range(c):
                orow[xo, t] = ninf
        for i in range(kh):
            ih = y * sh - pt + i
            if ih < 0 or ih >= h:
                continue
            src = x[b, ih]
            for xo in range(ow):
                acc = orow[xo]
                for j in range(kw):
                    iw = xo * sw - pl + j
                    if iw < 0 or iw >= w:
                        continue
                    s = src[iw]
                    for t in range(c):
                        v = s[t]
                        a = acc[t]
                        acc[t] = v if (v > a) | (v != v) else a  # NaN wins, as in torch


_dw_rows = _post_rows = _maxpool_rows = _maxpool3_rows = None  # compiled by _build_nhwc


def _build_nhwc(nb):
    # no "nnan"/"ninf" fast-math: NaN must win max pooling and pass through ReLU, as in torch
    opts = dict(nogil=True, cache=True, fastmath=set(FASTMATH))

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

    g = globals()
    g["_dw_rows"] = nb.njit(**opts)(_dw_rows_py)
    g["_post_rows"] = nb.njit(**opts)(_post_rows_py)
    g["_maxpool3_rows"] = nb.njit(**opts)(_maxpool3_rows_py)
    g["_maxpool_rows"] = nb.njit(**opts)(_maxpool_rows_py)

    @nb.njit(parallel=True, **opts)
    def depthwise(x, w, bias, out, sh, sw, pt, pl, act):  # pragma: no cover - compiled
        rows = out.shape[0] * out.shape[1]
        for r in nb.prange(rows):
            _dw_rows(x, w, bias, out, sh, sw, pt, pl, act, r, r + 1)
        return out

    @nb.njit(**opts)
    def depthwise_serial(x, w, bias, out, sh, sw, pt, pl, act):  # pragma: no cover - compiled
        _dw_rows(x, w, bias, out, sh, sw, pt, pl, act, 0, out.shape[0] * out.shape[1])
        return out

    @nb.njit(parallel=True, **opts)
    def maxpool(x, out, kh, kw, sh, sw, pt, pl):  # pragma: no cover - compiled
        rows = out.shape[0] * out.shape[1]
        for r in nb.prange(rows):
            _maxpool_rows(x, out, kh, kw, sh, sw, pt, pl, r, r + 1)
        return out

    @nb.njit(**opts)
    def maxpool_serial(x, out, kh, kw, sh, sw, pt, pl):  # pragma: no cover - compiled
        _maxpool_rows(x, out, kh, kw, sh, sw, pt, pl, 0, out.shape[0] * out.shape[1])
        return out

    @nb.njit(**opts)
    def nchw_to_nhwc(src, dst):  # pragma: no cover - compiled
        n, c, h, w = src.shape
        for b in range(n):
            for y in range(h):
                d = dst[b, y]
                for ch in range(c):  # contiguous reads, a C-strided write
                    s = src[b, ch, y]
                    for x in range(w):
                        d[x, ch] = s[x]

    @nb.njit(parallel=True, **opts)
    def copy4d(src, dst):  # pragma: no cover - compiled
        n, h, w, c = dst.shape
        for r in nb.prange(n * h):
            b, y = r // h, r % h
            for x in range(w):
                s, d = src[b, y, x], dst[b, y, x]
                for t in range(c):
                    d[t] = s[t]

    @nb.njit(parallel=True, **opts)
    def post(y, act, scale, shift):  # pragma: no cover - compiled
        for r in nb.prange(y.shape[0]):
            _post_rows(y, act, scale, shift, r, r + 1)
        return y

    @nb.njit(**opts)
    def post_serial(y, act, scale, shift):  # pragma: no cover - compiled
        _post_rows(y, act, scale, shift, 0, y.shape[0])
        return y

    return {
        "im2col": im2col, "depthwise": depthwise, "maxpool": maxpool,
        "maxpool_serial": maxpool_serial,
        "copy4d": copy4d, "depthwise_serial": depthwise_serial, "post": post,
        "post_serial": post_serial,
        "nchw_to_nhwc": nchw_to_nhwc,
    }  # fmt: skip


def _kernels():
    if not _K:
        nb = numba_or_none()
        _K.update(_build_nhwc(nb) if nb is not None else {"none": None})
    return None if "none" in _K else _K


# ------------------------------------------------------------------ NHWC entry points
# depthwise convs of fewer multiply-adds run on the calling thread (see gemm.SERIAL_BELOW)
DEPTHWISE_SERIAL_BELOW = 1 << 19


def im2col(x, out, kh, kw, sh, sw, pt, pl, oh, ow) -> np.ndarray:
    """x (N, H, W, C) float32 contiguous -> out (N*OH*OW, kh*kw*C), zero padding."""
    k = _kernels()
    if k is None:
        return im2col_reference(x, out, kh, kw, sh, sw, pt, pl, oh, ow)
    return k["im2col"](x, out, kh, kw, sh, sw, pt, pl, oh, ow)


def depthwise_nhwc(x, w, bias, out, sh, sw, pt, pl, act: int) -> np.ndarray:
    """Depthwise kxk conv over NHWC, w (kh, kw, C), with bias and activation fused."""
    k = _kernels()
    if k is None:
        return depthwise_nhwc_reference(x, w, bias, out, sh, sw, pt, pl, act)
    small = out.size * w.shape[0] * w.shape[1] < DEPTHWISE_SERIAL_BELOW
    if not small and _on_pool(x, w, bias, out):
        from ember.kernels.cpu import pool_tasks

        pool_tasks.depthwise(x, w, bias, out, sh, sw, pt, pl, act, get_num_threads())
        return out
    from ember.kernels.cpu import dwconv

    v = dwconv.state()  # the vector kernels (numba's loop where they do not build)
    if v is not None:
        return v["serial" if small else "parallel"](x, w, bias, out, sh, sw, pt, pl, act)
    return k["depthwise_serial" if small else "depthwise"](x, w, bias, out, sh, sw, pt, pl, act)


def _on_pool(*arrays) -> bool:
    """Whether a kernel's parallel work goes to ember's pool (kernels.cpu.pool_tasks)."""
    if not G.USE_POOL or get_num_threads() == 1:
        return False
    for a in arrays:
        if a.dtype != _F32 or not a.flags.c_contiguous:
            return False
    from ember.kernels.cpu import pool_tasks

    return pool_tasks.state() is not None


POST_SERIAL_BELOW = 1 << 16  # elements: smaller results get their post pass on this thread


def post(y: np.ndarray, act: int, scale: float = 1.0, shift: float = 0.0) -> np.ndarray:
    """y (M, C) contiguous float32 <- act(y) * scale + shift in place (act 0, 3 or 4)."""
    k = _kernels()
    if k is None:
        return post_reference(y, act, scale, shift)
    small = y.size < POST_SERIAL_BELOW
    if not small and _on_pool(y):
        from ember.kernels.cpu import pool_tasks

        pool_tasks.post(y, act, scale, shift, get_num_threads())
        return y
    return k["post_serial" if small else "post"](y, act, np.float32(scale), np.float32(shift))


# max pools of fewer window taps (output elements x kernel area) run on the calling thread
MAXPOOL_SERIAL_BELOW = 1 << 18


def maxpool_nhwc(x, out, kh, kw, sh, sw, pt, pl) -> np.ndarray:
    """Max pooling over NHWC (padding is -inf); output rows as tasks on ember's pool."""
    k = _kernels()
    if k is None:
        return maxpool_nhwc_reference(x, out, kh, kw, sh, sw, pt, pl)
    small = out.size * kh * kw < MAXPOOL_SERIAL_BELOW
    if not small and _on_pool(x, out):
        from ember.kernels.cpu import pool_tasks

        pool_tasks.maxpool(x, out, kh, kw, sh, sw, pt, pl, get_num_threads())
        return out
    return k["maxpool_serial" if small else "maxpool"](x, out, kh, kw, sh, sw, pt, pl)


def conv_transpose_reference(x, wt, bias, out, act: int) -> np.ndarray:
    """x (N, H, W, C), wt (kh, kw*O, C), bias (kh*kw*O,) -> out (N, H*kh, W*kw, O): a
    transposed conv whose kernel is its stride (act 0 none, 1 ReLU, 2 ReLU6)."""
    n, h, w, c = x.shape
    kh, q_n = wt.shape[:2]
    y = np.einsum("nhwc,aqc->nhawq", x, wt) + bias.reshape(kh, q_n)[:, None, :]
    out.reshape(n, h, kh, w, q_n)[...] = _act_reference(y.astype(_F32), act)
    return out


def conv_transpose(x, wt, bias, out, act: int) -> np.ndarray:
    """``conv_transpose_reference`` (contiguous float32 operands) as one numba pass, input
    pixel rows as tasks on the pool (kernels.cpu.nhwc): for narrow outputs (PP-OCR's last upsampling, one channel) instead of the packed GEMM, whose
    32-column panel would be mostly padding, and the depth-to-space copy after it."""
    from ember.kernels.cpu import nhwc

    for a in (x, wt, bias, out):
        if a.dtype != _F32 or not a.flags.c_contiguous:
            raise ShapeError("conv_transpose: contiguous float32 operands expected")
    if nhwc.conv_transpose_direct(x, wt, bias, out, act) is None:
        return conv_transpose_reference(x, wt, bias, out, act)
    return out


def channel_mean(x: np.ndarray) -> np.ndarray:
    """x (N, M, C) contiguous float32 -> (N, C) float32: the mean over M, summed in float64.

    A channels-last global average pool: numpy's reduction over the middle axis ran at ~12 GB/s
    (0.8 ms for PP-OCRv4 det's 96x160x160 map); here row blocks are summed in parallel, a
    vector of C float64 sums per block, as tasks on the pool (kernels.cpu.nhwc: the prange
    region right after the conv before it waited ~0.2 ms for the core the pool's worker spun
    on; the detector's 10 global pools took 1.0 ms of a b1 pass that way, ad-hoc timing).
    """
    from ember.kernels.cpu import nhwc

    n, m, c = x.shape
    if m == 0:  # the mean of nothing is NaN, as numpy's (without its warning)
        return np.full((n, c), np.nan, _F32)
    return (nhwc.channel_sums(x).sum(axis=1) / m).astype(_F32)


def copy4d(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """dst[...] = src for 4-D arrays of one shape (any strides), rows spread over the threads."""
    k = _kernels()
    if k is None:
        np.copyto(dst, src)
    else:
        k["copy4d"](src, dst)
    return dst


# ------------------------------------------------------------------ the implicit GEMM
_buffers = threading.local()
MAX_CACHED = 64  # scratch buffers per thread; offset tables (one per input geometry)
_OFFSETS: dict = {}
# kxk convs with fewer input channels take each output pixel's kw*C floats of a kernel row as one
# tap (contiguous in the padded NHWC input): kh taps of kw*C instead of kh*kw taps of C. PP-OCRv4
# det's 640x640 RGB stem (3x3 stride 2): 2.7 ms when those rows were copied out first (a window
# row per output column: 7.4 MB), 1.46 ms read in place (ad-hoc timing of the node, 2 threads)
FEW_CHANNELS = 16


def empty_aligned(shape: tuple, dtype=_F32) -> np.ndarray:
    """An uninitialised array whose data starts on a 64-byte cache line (a large np.empty
    starts 16 bytes into a page: each vector load or store of it touches two lines)."""
    size, item = int(np.prod(shape)), np.dtype(dtype).itemsize
    buf = np.empty(size + 64 // item, dtype)
    off = (-buf.ctypes.data % 64) // item
    return buf[off : off + size].reshape(shape)


def nhwc(x: np.ndarray) -> np.ndarray:
    """The (N, H, W, C) contiguous float32 array behind an (N, C, H, W) one (a copy if needed)."""
    t = x.transpose(0, 2, 3, 1)
    if t.dtype != _F32:
        t = t.astype(_F32)
    return t if t.flags.c_contiguous else _store_nhwc(t, np.empty(t.shape, _F32))


def _store_nhwc(a: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """dst[...] = a for (N, H, W, C) arrays; the NHWC view of a contiguous NCHW array by a numba
    loop (numpy's copy of that view took 118 us for a 3x224x224 image, the loop 24)."""
    k = _kernels()
    src = a.transpose(0, 3, 1, 2)
    if k is not None and a.dtype == _F32 and dst.dtype == _F32 and src.flags.c_contiguous:
        k["nchw_to_nhwc"](src, dst)
    else:
        dst[...] = a
    return dst


def channels_last(a: np.ndarray) -> np.ndarray:
    """The (N, C, H, W) view of an (N, H, W, C) array (torch's channels_last memory format)."""
    return a.transpose(0, 3, 1, 2)


def is_channels_last(x: np.ndarray) -> bool:
    """Whether a 4-D (N, C, H, W) array is stored NHWC-contiguous."""
    return x.ndim == 4 and x.transpose(0, 2, 3, 1).flags.c_contiguous


def _buffer(key: tuple, shape: tuple) -> np.ndarray:
    """A per-thread float32 scratch array for `key`, zeroed when first made, reused after."""
    bufs = getattr(_buffers, "d", None)
    if bufs is None:
        bufs = _buffers.d = {}
    buf = bufs.get(key)
    if buf is None:
        if len(bufs) >= MAX_CACHED:  # many input sizes (a server): start over, don't grow
            bufs.clear()
        buf = bufs[key] = np.zeros(shape, _F32)
    return buf


def _padded(a: np.ndarray, pt: int, pb: int, pl: int, pr: int) -> np.ndarray:
    """a (N, H, W, C) copied inside a zero border (the border of a reused buffer stays zero)."""
    n, h, w, c = a.shape
    buf = _buffer(("pad", *a.shape, pt, pb, pl, pr), (n, h + pt + pb, w + pl + pr, c))
    _store_nhwc(a, buf[:, pt : pt + h, pl : pl + w])
    return buf


def window_offsets(shape, kernel, stride, oh: int, ow: int) -> tuple[np.ndarray, np.ndarray]:
    """Offsets into an (N, H, W, C) array of each output pixel's window origin and of each tap."""
    n, h, w, c = shape
    (kh, kw), (sh, sw), i8 = kernel, stride, np.int64
    b, y, x = np.ix_(np.arange(n, dtype=i8), np.arange(oh, dtype=i8), np.arange(ow, dtype=i8))
    rowoff = (((b * h + y * sh) * w + x * sw) * c).reshape(-1)
    tapoff = np.array([(i * w + j) * c for i in range(kh) for j in range(kw)], i8)
    return rowoff, tapoff


def _out_hw(h: int, w: int, kh: int, kw: int, stride, pads) -> tuple[int, int]:
    (sh, sw), (pt, pb, pl, pr) = stride, pads
    return (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1


def conv_gemm(
    x, panels, o: int, kernel, bias, res, stride, pads, act: int, over_res: bool = False
) -> np.ndarray:
    """act(conv2d(x) + bias [+ res]) on packed panels, read from x in place; channels-last out.

    x and res: (N, C, H, W) arrays (channels-last ones are read without a copy); kernel (kh, kw).
    A kxk conv reads its (zero-padded) NHWC input tap by tap, each tap a fixed offset from the
    output pixel's window (no im2col); bias, residual and activation are applied as each output
    tile is stored. With few input channels (the RGB stem) a tap is a kernel row's kw*C floats.
    over_res: the output is written over res (an NHWC-contiguous float32 array, the caller's to
    give up; K must be one block of the GEMM, see ``fused_conv2d_over_residual``).
    """
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (pt, pb, pl, pr) = kernel, stride, pads
    oh, ow = _out_hw(h, w, kh, kw, stride, pads)
    m = n * oh * ow
    stream = m * o * 4 >= G.STREAM_BYTES and not over_res  # streamed out, rows on cache lines
    r = None if res is None else nhwc(res).reshape(m, o)
    if over_res:
        out = r.reshape(n, oh, ow, o)
    else:
        out = empty_aligned((n, oh, ow, o)) if stream else np.empty((n, oh, ow, o), _F32)
    pad = pt or pb or pl or pr
    # a padded NCHW float32 input is transposed straight into the padded buffer (one copy)
    a = x.transpose(0, 2, 3, 1) if pad and x.dtype == _F32 else nhwc(x)
    src = _padded(a, pt, pb, pl, pr) if pad else a
    geom = ((kh, kw), (sh, sw))
    if c < FEW_CHANNELS and kw > 1:  # a window row's kw*C floats are contiguous: one tap each
        geom = ((kh, 1), (sh, sw))
    key = (src.shape, geom, oh, ow)
    offs = _OFFSETS.get(key)
    if offs is None:
        if len(_OFFSETS) >= MAX_CACHED:
            _OFFSETS.clear()
        rowoff, tapoff = window_offsets(src.shape, *geom, oh, ow)
        # the offsets' span (gemm's bounds check) with them: its four numpy reductions were
        # ~3.5 us of every call (ad-hoc timing, 196 rows)
        span = (int(rowoff.min() + tapoff.min()), int(rowoff.max() + tapoff.max())) if m else None
        offs = _OFFSETS[key] = (rowoff, tapoff, span)
    rowoff, tapoff, span = offs
    kc = kh * kw * c // len(tapoff)
    a1, out2 = src.reshape(-1), out.reshape(m, o)
    plan = (
        None
        if stream
        else _gemm_plan(key, a1, rowoff, tapoff, span, kc, panels, bias, r, act, out2)
    )
    if plan is None:  # on the calling thread (one thread, a small product), or streamed
        rows = None
        if m <= ONE_BLOCK_ROWS and panels.shape[0] >= ONE_BLOCK_PANELS:  # see gemm.CHUNK_PIXELS
            mr = G._state()["mr"]
            rows = -(-m // mr) * mr
        G.gemm(a1, rowoff, tapoff, kc, panels, bias, r, act, out2, span, stream=stream, rows=rows)
        return channels_last(out)
    from ember.kernels.cpu import pool_tasks as PT

    kept = getattr(_kept, "jobs", None)
    if kept is not None:  # a caller keeps this call's steps (keep_conv)
        kept.append(KeptConv(plan, (rowoff, tapoff, panels, bias), (pt, pb, pl, pr) if pad else None,
                             (n, oh, ow, o), r is not None, over_res))  # fmt: skip
    PT.rerun_gemm(plan, a1, out2, r)
    return channels_last(out)


_kept = threading.local()  # .jobs: a list while keep_conv records conv_gemm's pool jobs


class KeptConv:
    """One conv_gemm call's pool job, the steps before it taken once: per call only the input's
    NHWC view (or its zero-padded copy), the output and the rerun of the kept job.

    A fused conv node calls conv_gemm with the same weight and input geometry every pass; the
    op's dispatch, the kernel's checks and conv_gemm's lookups were ~5 us of a ~6 us call's
    Python (ResNet-50's 14x14 1x1 convs, hot; ~11-16 us in the network, where each node's Python
    runs with the caches full of the last weight). The caller checks that the call is the kept
    one (input and residual of the shapes, dtype and strides it was kept for, same thread count).
    """

    __slots__ = ("job", "refs", "pads", "shape", "has_res", "over_res")

    def __init__(self, job, refs, pads, shape, has_res: bool, over_res: bool) -> None:
        self.job, self.refs, self.pads = job, refs, pads  # refs: the arrays the job points into
        self.shape, self.has_res, self.over_res = shape, has_res, over_res

    def __call__(self, x: np.ndarray, res: np.ndarray | None) -> np.ndarray:
        """act(conv(x) + bias [+ res]) as kept: x (N, C, H, W) float32 of the kept shape, res
        of the output's (a residual exactly where the kept call had one); the channels-last
        result. Inputs of another layout are copied (as conv_gemm's nhwc would)."""
        if (res is not None) != self.has_res:
            raise ValueError("KeptConv: a residual exactly where the kept call had one")
        n, oh, ow, o = self.shape
        # (reshape alone may return a strided view of NCHW memory: nhwc makes it contiguous)
        a = nhwc(x) if self.pads is None else _padded(x.transpose(0, 2, 3, 1), *self.pads)
        r = None if res is None else nhwc(res).reshape(n * oh * ow, o)
        out = r if self.over_res else np.empty((n * oh * ow, o), _F32)
        _PT.rerun_gemm(self.job, a.reshape(-1), out, r)
        return out.reshape(n, oh, ow, o).transpose(0, 3, 1, 2)


def keep_conv(fn) -> tuple:
    """(fn(), the KeptConv of the one pooled conv_gemm call fn made, or None (none or
    several such calls, or another path: Winograd, the streamed or serial GEMM))."""
    prev, jobs = getattr(_kept, "jobs", None), []
    _kept.jobs = jobs
    try:
        y = fn()
    finally:
        _kept.jobs = prev
    return y, (jobs[0] if len(jobs) == 1 else None)


# A conv of at most ONE_BLOCK_ROWS output pixels (ResNet-50 b1's 14x14 and 7x7 layers) runs its
# pool tasks over all of its pixels, each task a group of panels: every panel streams in once.
# In CHUNK_PIXELS blocks (196 pixels: 96 + 96 + 4) each block re-read the whole weight, from
# memory in the network (0.5-9.4 MB), the 4-pixel block included. ResNet-50 b1 in the network
# (each node's call wrapped, medians of 15 passes, the two settings alternated, ad hoc): 14x14
# 1x1 convs 0.25-0.30 -> 0.23-0.25 ms, 3x3 256 0.53-0.56 -> 0.50-0.52. Taller products lost
# that way: batch 8's 7x7 layers (392 pixels) 1.84 -> 2.02 ms, b1's 56x56 1x1 64 -> 256 (A: 0.8
# MB) 0.34 -> 0.50 (each task's output a column strip of all rows)
ONE_BLOCK_ROWS = 256
ONE_BLOCK_PANELS = 8  # and enough panels for a few tasks per thread
# ... and with fewer than ONE_BLOCK_SPLIT_PANELS panels a thread (2 threads: up to 480 outputs),
# the pixels are cut in two halves, a panel's two halves taken one after the other (PANEL_MAJOR:
# the second reads the panel from L1/L2): twice the tasks, a shorter wait for the last one.
# ResNet-50 b1 in the network (one process alternating, medians of 15 passes, twice): its 14x14
# 1x1 1024 -> 256 convs 0.255 -> 0.245 ms and 0.243 -> 0.233 ms, the 3x3 256s 1-3 % faster.
# Whole-K blocks (tx3's for linears) won 3-5 % alone but lost in the network: layer4's 3x3
# panels (590 KB) and the next one prefetched left no room in L2 (0.61 -> 0.65-0.71 ms)
ONE_BLOCK_SPLIT_PANELS = 2 * 4
# Their 1x1 convs at 2 threads (branch pw2): alone with warm caches 1024 -> 256 at 14x14 runs at
# ~207 us (~495 GFLOP/s), with the weight cold (64 MB of weights cycled) ~217, in the network
# ~221-235 (onnxruntime's profile: 217-219, ~5 us of it the profiler's); 2048 -> 512 at 7x7 207-221
# warm, 240-260 cold, 234-268 in the network (onnxruntime 253-255). Python per kept conv node
# ~2 us hot, ~5-6 us in the network. Tried and left out, none beyond the noise (one process
# alternating the variants, medians of 20-30 passes, node sums within +-1 %): the task's first
# block of weights prefetched at its start; the residual rows of the tile 1-2 tiles on
# prefetched (into L1 or L2: layer3's conv + residual 0.31-0.33 -> 0.32-0.34 ms); tile heights
# balanced over a task's rows (49 = 9 + 4 x 10, not 4 x 12 + 1: 207.4 against 207.5 us alone);
# K in one block up to 2048 channels; the back half of the tasks (the worker's) taking their
# panels in descending order, so each thread's weight stream and prefetch run on into its next
# task; 8 tasks per thread; the rows-first order from 256 KB outputs (layer2's 1x1s); the
# plain full-panel store for a residual added in panel order.
_PLANS: dict = {}  # (geometry, weight, ...) -> (gemm's pool job, the arrays its words point to)


def _gemm_plan(key, a, rowoff, tapoff, span, kc, panels, bias, r, act, out) -> tuple | None:
    """conv_gemm's pool job as gemm builds it (its operand checks passed once), or None where
    gemm runs the product otherwise (on the calling thread, narrow panels, numba's driver).

    A conv node calls gemm with the same weight, offsets and shapes every pass; building and
    checking its job (seven ``ctypes.data`` at ~0.9 us, the checks, the parameter block) was
    ~7 us of a call's Python, as ``G._pool_plan`` found for linears. Per call only the input,
    output and residual addresses change (a, out and r: contiguous float32, conv_gemm's own).
    """
    threads = get_num_threads()
    pkey = (key, id(panels), id(bias), kc, r is not None, act, out.shape, threads)
    hit = _PLANS.get(pkey)
    if hit is not None and G.USE_POOL:
        return hit[0]
    m, o = out.shape
    small = m * o * panels.shape[1] < G.SERIAL_BELOW and panels.nbytes < G.SERIAL_MAX_WEIGHT_BYTES
    if threads == 1 or small or not m or not G.USE_POOL or panels.shape[2] != G.panel_width():
        return None
    from ember.kernels.cpu import pool_tasks as PT

    if PT.state() is None:
        return None
    G._check(a, rowoff, tapoff, kc, panels, bias, r, out, G.panel_width(), span)
    one = m <= ONE_BLOCK_ROWS and panels.shape[0] >= ONE_BLOCK_PANELS
    mr = G._state()["mr"]
    split = one and panels.shape[0] < ONE_BLOCK_SPLIT_PANELS * threads
    rows = -(-m // ((2 if split else 1) * mr)) * mr if one else None
    plan = PT.gemm_params(a, rowoff, tapoff, kc, panels, bias, r, act, out, threads, rows)
    if split:
        plan[0][PT.P_HAS_RES] |= PT.PANEL_MAJOR
    if len(_PLANS) >= MAX_CACHED:
        _PLANS.clear()
    _PLANS[pkey] = (plan, (panels, bias, rowoff, tapoff))  # ids stay those of live arrays
    return plan


# ------------------------------------------------------------------ registered kernels
def conv2d_nchw_reference(x, w, stride, pads, groups: int) -> np.ndarray:
    """Cross-correlation of (N, C, H, W) x with (O, C/groups, kh, kw) w, zero padding, float32."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (pt, pb, pl, pr), g = stride, pads, groups
    oh, ow = _out_hw(h, wd, kh, kw, stride, pads)
    xp = np.pad(np.asarray(x, _F32), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    xg = xp.reshape(n, g, cg, *xp.shape[2:])
    wg = np.asarray(w, _F32).reshape(g, o // g, cg, kh, kw)
    out = np.zeros((n, g, o // g, oh, ow), _F32)
    for i in range(kh):
        for j in range(kw):
            v = xg[:, :, :, i : i + sh * (oh - 1) + 1 : sh, j : j + sw * (ow - 1) + 1 : sw]
            out += np.einsum("ngchw,goc->ngohw", v, wg[:, :, :, i, j], optimize=True)
    return out.reshape(n, o, oh, ow)


def fused_conv2d_reference(x, w, b, res=None, *, stride, pads, groups, act, scale=1.0, shift=0.0):
    """act(conv2d(x, w) + b [+ res]) * scale + shift: the fused_conv2d op's numpy reference."""
    y = conv2d_nchw_reference(x, w, stride, pads, groups) + b[:, None, None]
    if res is not None:
        y += res
    return _act_reference(y, ACTS[act]) * np.float32(scale) + np.float32(shift)


def _post(out: np.ndarray, code: int, scale: float, shift: float) -> np.ndarray:
    """The part of the epilogue after the kernel (hard swish, SiLU, scale and shift): in place."""
    if code > 2 or scale != 1.0 or shift != 0.0:
        n, h, w, c = out.shape
        post(out.reshape(n * h * w, c), code if code > 2 else 0, scale, shift)
    return out


# stride-1 3x3 convs of at least this many channels in and out and this many 4x4 output tiles
# (over the batch) run as Winograd F(4x4, 3x3) (kernels.cpu.winograd). ResNet-50's, alone, 2
# threads (ad hoc): 56x56x64 0.52 -> 0.33 ms, 28x28x128 0.50 -> 0.31-0.44; batch 8 4.1 -> 2.6,
# 3.9 -> 1.8, 14x14x256 3.9 -> 1.8. At batch 1 the 14x14 layers (16 tiles) were faster alone
# (0.40 ms) but not in the network (0.74-0.91 against 0.56-0.58): their transformed weight,
# 4x the direct one (9.4 MB), then comes from memory for few tiles
WINOGRAD_MIN_CHANNELS = 32
WINOGRAD_MIN_TILES = 48


def _winograd(x, w, bias, res, stride, pads, act: int) -> np.ndarray | None:
    """The conv by Winograd F(4x4, 3x3) where it applies and pays (see above), else None."""
    o, c, kh, kw = w.shape
    if (kh, kw) != (3, 3) or tuple(stride) != (1, 1) or tuple(pads) != (1, 1, 1, 1):
        return None
    n, _, h, wd = x.shape
    if min(c, o) < WINOGRAD_MIN_CHANNELS or n * -(-h // 4) * -(-wd // 4) < WINOGRAD_MIN_TILES:
        return None
    from ember.kernels.cpu import winograd

    if winograd.state() is None or bias.dtype != _F32 or (res is not None and res.dtype != _F32):
        return None
    u = winograd.weights(w)
    out = np.empty((n, h, wd, o), _F32)
    r = None if res is None else nhwc(res)
    winograd.conv(nhwc(x), u, bias, r, act, out)
    return channels_last(out)


def _gemm_applies(x, w, b, res=None, *, stride, pads, groups, act, scale=1.0, shift=0.0) -> bool:
    return groups == 1 and G.packed_panels(w) is not None and x.ndim == 4


@register(
    "fused_conv2d",
    reference=fused_conv2d_reference,
    when=_gemm_applies,
    available=G.microkernels_available,
)
def fused_conv2d_gemm(x, w, b, res=None, *, stride, pads, groups, act, scale=1.0, shift=0.0):
    """The implicit GEMM on w's panels (``conv_gemm``); channels-last result."""
    bias = np.ascontiguousarray(b)
    code = ACTS[act]
    ir_act = code if code <= 2 else 0  # ReLU/ReLU6 in the GEMM epilogue, the rest after it
    y = _winograd(x, w, bias, res, stride, pads, ir_act)
    if y is None:
        y = conv_gemm(x, w.panels, w.shape[0], w.shape[2:], bias, res, stride, pads, ir_act)
    _post(y.transpose(0, 2, 3, 1), code, scale, shift)
    return y


def fused_conv2d_over_residual(
    x, w, b, res, *, stride, pads, groups, act, scale=1.0, shift=0.0
) -> np.ndarray | None:
    """fused_conv2d's GEMM result written over res, which the caller gives up (the ONNX
    importer, where the residual dies with the conv: onnx._fuse_conv.donate); None where that
    does not apply (then run the op). The microkernel loads each residual tile before it
    stores the output over it, so this holds when K is one block of the GEMM (no partial sums
    stored before the last block reads the residual). ResNet-50 b8's 1x1 64 -> 256 + residual
    conv alone, 2 threads: 2.5 -> 2.3 ms (ad hoc); the whole network, one process alternating
    (2 runs of 15, median / best ms): 161.8 / 147.1 and 173.6 / 148.6 -> 141.2 / 138.9 and
    147.1 / 139.5."""
    if groups != 1 or x.ndim != 4 or x.dtype != _F32 or res.dtype != _F32 or b.dtype != _F32:
        return None
    panels = G.packed_panels(w)
    if panels is None or panels.shape[2] != G.panel_width() or not is_channels_last(res):
        return None
    kk = panels.shape[1]
    if kk > G.k_block(panels.shape[0], kk) or tuple(w.shape[2:]) == (3, 3):
        return None  # K in blocks, or a 3x3 conv (Winograd's when stride 1)
    if tuple(res.shape) != (
        x.shape[0],
        w.shape[0],
        *_out_hw(*x.shape[2:], *w.shape[2:], stride, pads),
    ):
        return None
    code = ACTS[act]
    y = conv_gemm(x, panels, w.shape[0], w.shape[2:], np.ascontiguousarray(b), res, stride, pads,
                  code if code <= 2 else 0, over_res=True)  # fmt: skip
    _post(y.transpose(0, 2, 3, 1), code, scale, shift)
    return y


def _depthwise_applies(
    x, w, b, res=None, *, stride, pads, groups, act, scale=1.0, shift=0.0
) -> bool:
    return res is None and x.ndim == 4 and w.shape[1] == 1 and groups == x.shape[1] == w.shape[0]


@register(
    "fused_conv2d",
    reference=fused_conv2d_reference,
    when=_depthwise_applies,
    available=have_numba,
)
def fused_conv2d_depthwise(x, w, b, res=None, *, stride, pads, groups, act, scale=1.0, shift=0.0):
    """Depthwise conv (+ bias, activation) over NHWC rows in parallel; channels-last result."""
    a = nhwc(x)
    n, h, wd, c = a.shape
    kh, kw = w.shape[2:]
    oh, ow = _out_hw(h, wd, kh, kw, stride, pads)
    wt = G.packed_panels(w)  # a weight packed for this kernel carries its (kh, kw, C) layout
    if wt is None or wt.shape != (kh, kw, c):
        wt = np.ascontiguousarray(np.asarray(w)[:, 0].transpose(1, 2, 0))
    out = np.empty((n, oh, ow, c), _F32)
    code = ACTS[act]
    depthwise_nhwc(
        a, wt, np.ascontiguousarray(b), out, *stride, pads[0], pads[2], code if code <= 2 else 0
    )
    return channels_last(_post(out, code, scale, shift))


def conv2d_reference(x, w, b=None, *, geom):
    """The conv2d op (ember.ops.conv.Conv) on 2-D batched input, in numpy."""
    y = conv2d_nchw_reference(x, w, geom.stride, geom.pad, geom.groups)
    return y if b is None else y + b[:, None, None]


def _conv2d_applies(x, w, b=None, *, geom) -> bool:
    return (
        G.packed_panels(w) is not None
        and geom.nd == 2
        and geom.batched
        and geom.groups == 1
        and tuple(geom.dilation) == (1, 1)
        and x.ndim == 4
    )


@register(
    "conv2d", reference=conv2d_reference, when=_conv2d_applies, available=G.microkernels_available
)
def conv2d_packed(x, w, b=None, *, geom):
    """conv2d with a PackedWeight: the implicit GEMM (bias in its epilogue), channels-last out."""
    o = w.shape[0]
    bias = np.zeros(o, _F32) if b is None else np.ascontiguousarray(b)
    return conv_gemm(x, w.panels, o, w.shape[2:], bias, None, geom.stride, geom.pad, 0)


# conv1d (the conv2d op with geom.nd == 1): a plain (O, C, K) weight is packed on every call (a
# cached packing would go stale when the weight changes in place); from this many multiply-adds
# per output element (C * K) the GEMM on numba's threads beats im2col + BLAS, whose idle workers
# also spin on the cores for ~0.1 s after the call and slow the numba kernels that follow
CONV1D_MIN_DEPTH = 64


def conv1d_reference(x, w, b=None, *, geom):
    """The conv2d op on 1-D input (x (N, C, L) or (C, L), w (O, C, K)), in numpy."""
    x3 = x if geom.batched else x[None]
    y = conv2d_nchw_reference(x3[:, :, None, :], w[:, :, None, :], geom.stride, geom.pad, 1)
    y = y[:, :, 0, :]
    if b is not None:
        y = y + b[:, None]
    return y if geom.batched else y[0]


def _conv1d_applies(x, w, b=None, *, geom) -> bool:
    return (
        geom.nd == 1
        and geom.groups == 1
        and tuple(geom.dilation) == (1, 1)
        and w.ndim == 3
        and x.ndim == (3 if geom.batched else 2)
        and w.shape[1] * w.shape[2] >= CONV1D_MIN_DEPTH
        and G.packed_panels(w) is None
    )


@register(
    "conv2d", reference=conv1d_reference, when=_conv1d_applies, available=G.microkernels_available
)
def conv1d_gemm(x, w, b=None, *, geom):
    """conv1d on the packed GEMM (weight packed per call, bias in the epilogue); channels-last out.

    The result is an (N, O, L') view of (N, L', O) memory: a following conv1d reads it without a
    copy, and transposing it to (N, L', O) (a Transformer's token-major layout) is free.
    """
    o, c, k = w.shape
    if x.shape[-2] != c:
        raise ShapeError(f"conv1d: input {x.shape} has not the weight's {c} channels")
    panels = G.pack_weight(np.asarray(w, _F32).transpose(2, 1, 0).reshape(k * c, o), _nr())
    bias = np.zeros(o, _F32) if b is None else np.ascontiguousarray(b, _F32)
    x4 = (x if geom.batched else x[None])[:, :, None, :]
    y = conv_gemm(x4, panels, o, (1, k), bias, None, geom.stride, geom.pad, 0)[:, :, 0, :]
    return y if geom.batched else y[0]


def _nr() -> int:
    nr = G.panel_width()
    if nr is None:  # pragma: no cover - the kernel's available() says so first
        raise RuntimeError("conv1d_gemm called without the packed GEMM's microkernels")
    return nr


def max_pool2d_reference(x, *, k, s, p, d, out, nd, batched, track):
    """max_pool2d (no dilation) of an (N, C, H, W) array, -inf padding."""
    o = np.empty((x.shape[0], *out, x.shape[1]), x.dtype)
    a = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    return channels_last(maxpool_nhwc_reference(a, o, *k, *s, *p))


def _pool_applies(x, *, k, s, p, d, out, nd, batched, track) -> bool:
    return nd == 2 and batched and not track and tuple(d) == (1, 1) and is_channels_last(x)


@register("max_pool2d", reference=max_pool2d_reference, when=_pool_applies, available=have_numba)
def max_pool2d_nhwc(x, *, k, s, p, d, out, nd, batched, track):
    """Max pooling of channels-last data, output rows in parallel; channels-last result."""
    o = np.empty((x.shape[0], *out, x.shape[1]), _F32)
    return channels_last(maxpool_nhwc(x.transpose(0, 2, 3, 1), o, *k, *s, *p))


# ------------------------------------------------------------------ NCHW depthwise
# the conv2d op's kernel for groups == channels (forward), and the op's backward kernels
def _pads_nchw(h: int, wd: int, k, s, d, pad, out_hw) -> tuple:
    """(top, bottom, left, right) padding: pad on top/left, whatever out_hw needs at the end."""
    (kh, kw), (sh, sw), (dh, dw), (pt, pl), (oh, ow) = k, s, d, pad, out_hw
    pb = max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - h - pt)
    pr = max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - wd - pl)
    return pt, pb, pl, pr


def _padded_nchw(x: np.ndarray, k, s, d, pad, out_hw) -> np.ndarray:
    pt, pb, pl, pr = _pads_nchw(*x.shape[2:], k, s, d, pad, out_hw)
    return np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr))) if pt or pb or pl or pr else x


def _tap_nchw(xp: np.ndarray, i: int, j: int, s, d, out_hw) -> np.ndarray:
    (sh, sw), (dh, dw), (oh, ow) = s, d, out_hw
    return xp[
        :, :, i * dh : i * dh + sh * (oh - 1) + 1 : sh, j * dw : j * dw + sw * (ow - 1) + 1 : sw
    ]


def depthwise_conv2d_reference(
    x: np.ndarray, w: np.ndarray, stride, dilation, pad, out_hw
) -> np.ndarray:
    """Forward: out[n, c*m+q] = sum_ij w[c*m+q, 0, i, j] * x_pad[n, c, tap(i, j)]."""
    n, c = x.shape[:2]
    o, _, kh, kw = w.shape
    m = o // c
    xp = _padded_nchw(x, (kh, kw), stride, dilation, pad, out_hw)
    out = np.zeros((n, c, m, *out_hw), np.result_type(x, w))
    tmp = np.empty_like(out)
    for i in range(kh):
        for j in range(kw):
            v = _tap_nchw(xp, i, j, stride, dilation, out_hw)
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
    pt, pb, pl, pr = _pads_nchw(h, wd, (kh, kw), stride, dilation, pad, (oh, ow))
    xp = np.zeros((n, c, h + pt + pb, wd + pl + pr), g.dtype)
    for i in range(kh):
        for j in range(kw):
            wij = w[:, 0, i, j].reshape(1, c, m, 1, 1)
            _tap_nchw(xp, i, j, stride, dilation, (oh, ow))[...] += (g5 * wij).sum(2)
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
    xp = _padded_nchw(x, (kh, kw), stride, dilation, pad, (oh, ow))
    gw = np.zeros(w_shape, g.dtype)
    for i in range(kh):
        for j in range(kw):
            v = _tap_nchw(xp, i, j, stride, dilation, (oh, ow))
            gw[:, 0, i, j] = np.einsum("ncmhw,nchw->cm", g5, v).reshape(-1)
    return gw


def _build_nchw(nb):
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


def _nchw_kernels(x: np.ndarray, w: np.ndarray):
    """The compiled kernels when numba is present and the dtypes suit them, else None."""
    global _NCHW
    if x.dtype != w.dtype or x.dtype not in (np.float32, np.float64):
        return None
    if _NCHW is None:
        nb = numba_or_none()
        _NCHW = False if nb is None else _build_nchw(nb)
    return _NCHW or None


def _as4(x: np.ndarray, w: np.ndarray, geom) -> tuple[np.ndarray, np.ndarray]:
    """The conv2d op's (x, w) as 4-d NCHW arrays (1-d convs have height 1, as in ops.conv)."""
    if not geom.batched:
        x = x[None]
    return (x[:, :, None, :], w[:, :, None, :]) if geom.nd == 1 else (x, w)


def _nchw_out_hw(x4: np.ndarray, w4: np.ndarray, geom) -> tuple[int, int]:
    (sh, sw), (dh, dw), (pt, pb, pl, pr) = geom.stride, geom.dilation, geom.pad
    kh, kw = w4.shape[2:]
    oh = (x4.shape[2] + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (x4.shape[3] + pl + pr - dw * (kw - 1) - 1) // sw + 1
    return oh, ow


def depthwise_reference(x, w, b=None, *, geom):
    """The conv2d op on a depthwise (groups == channels) NCHW conv, in numpy."""
    x4, w4 = _as4(x, w, geom)
    (pt, _, pl, _), out_hw = geom.pad, _nchw_out_hw(x4, w4, geom)
    y = depthwise_conv2d_reference(x4, w4, geom.stride, geom.dilation, (pt, pl), out_hw)
    if b is not None:
        y += b[:, None, None]
    y = y[:, :, 0, :] if geom.nd == 1 else y
    return y if geom.batched else y[0]


def _depthwise_nchw_applies(x, w, b=None, *, geom) -> bool:
    c = x.shape[1 if geom.batched else 0]
    return (
        geom.groups == c > 1
        and w.shape[1] == 1
        and x.dtype == w.dtype
        and (b is None or b.dtype == x.dtype)
    )


@register(
    "conv2d",
    reference=depthwise_reference,
    dtypes=(np.float32, np.float64),
    when=_depthwise_nchw_applies,
    available=have_numba,
)
def depthwise_nchw(x, w, b=None, *, geom):
    """Depthwise conv over NCHW (any channel multiplier, stride, dilation), planes in parallel."""
    x4, w4 = _as4(x, w, geom)
    (pt, _, pl, _), out_hw = geom.pad, _nchw_out_hw(x4, w4, geom)
    y = np.empty((x4.shape[0], w4.shape[0], *out_hw), x.dtype)
    fwd = _nchw_kernels(x4, w4)[0]
    fwd(np.ascontiguousarray(x4), np.ascontiguousarray(w4), y, *geom.stride, *geom.dilation, pt, pl)
    if b is not None:
        y += b[:, None, None]
    y = y[:, :, 0, :] if geom.nd == 1 else y
    return y if geom.batched else y[0]


def depthwise_grad_input(
    g: np.ndarray, w: np.ndarray, x_shape, stride, dilation, pad
) -> np.ndarray:
    """The input gradient of a depthwise convolution (numba kernel, or the numpy reference)."""
    k = _nchw_kernels(g, w)
    if k is None:
        return depthwise_grad_input_reference(g, w, x_shape, stride, dilation, pad)
    gx = np.empty(x_shape, g.dtype)
    return k[1](np.ascontiguousarray(g), np.ascontiguousarray(w), gx, *stride, *dilation, *pad)


def depthwise_grad_weight(
    g: np.ndarray, x: np.ndarray, w_shape, stride, dilation, pad
) -> np.ndarray:
    """The weight gradient of a depthwise convolution (numba kernel, or the numpy reference)."""
    k = _nchw_kernels(g, x)
    if k is None:
        return depthwise_grad_weight_reference(g, x, w_shape, stride, dilation, pad)
    gw = np.empty(w_shape, g.dtype)
    return k[2](np.ascontiguousarray(g), np.ascontiguousarray(x), gw, *stride, *dilation, *pad)
