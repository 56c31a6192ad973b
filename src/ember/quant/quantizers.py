"""Pure-numpy block encoders: (n_blocks, block_size) float32 -> (n_blocks, type_size) uint8.

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and BF16 reproduce ``gguf.quants.quantize`` byte for byte (which
in turn reproduces llama.cpp's ``quantize_row_*_ref``). Q4_K and Q6_K follow llama.cpp's
``quantize_row_q4_K_ref`` / ``quantize_row_q6_K_ref`` (no importance matrix), vectorized over
all sub-blocks at once with the same float32 operations in the same order; only the loop over
candidate scales (21 or 19 steps) and over the 16/32 elements of a sub-block runs in Python.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ember.quant.dequant import f16

F32 = np.float32
GROUP_MAX_EPS = F32(1e-15)


def _fp16_bytes(v: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(v, dtype=np.float32).astype(np.float16).view(np.uint8)


def _f16_roundtrip(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).astype(np.float32)


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, F32(0), F32(1) / d).astype(np.float32)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values < 16 -> (n, 16) bytes: element j in the low, j + 16 in the high nibble."""
    return q[:, :16] | (q[:, 16:] << np.uint8(4))


def _round_away(v: np.ndarray) -> np.ndarray:
    """C roundf: halves away from zero."""
    a = np.abs(v)
    fl = np.floor(a)
    return np.sign(v) * (fl + np.floor(2 * (a - fl)))


def _nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: round half to even (the FPU default), as int32."""
    return np.rint(v).astype(np.int32)


def _seqsum(a: np.ndarray) -> np.ndarray:
    """Sum the last axis left to right in float32, as a C loop does."""
    acc = a[..., 0].copy()
    for i in range(1, a.shape[-1]):
        acc += a[..., i]
    return acc


def _abs_argmax_value(x: np.ndarray) -> np.ndarray:
    """The first element of largest magnitude along the last axis (keepdims)."""
    return np.take_along_axis(x, np.abs(x).argmax(axis=-1)[..., None], axis=-1)


def _f32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint8)


def _f16(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.astype(np.float16)).view(np.uint8)


def _bf16(x: np.ndarray) -> np.ndarray:
    n = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    n = np.where(
        (n & 0x7FFFFFFF) > 0x7F800000, (n & np.uint32(0xFFFF0000)) | np.uint32(64 << 16), n
    )
    n = (n.astype(np.uint64) + (0x7FFF + ((n >> 16) & 1))) >> 16  # round to nearest even
    return n.astype(np.uint16).view(np.uint8)


def _q8_0(x: np.ndarray) -> np.ndarray:
    d = np.abs(x).max(axis=1, keepdims=True) / F32(127)
    q = _round_away(x * _inverse(d)).astype(np.int8).view(np.uint8)
    return np.concatenate([_fp16_bytes(d), q], axis=1)


def _q4_0(x: np.ndarray) -> np.ndarray:
    d = _abs_argmax_value(x) / F32(-8)
    q = np.trunc(x * _inverse(d) + F32(8.5)).astype(np.uint8).clip(0, 15)
    return np.concatenate([_fp16_bytes(d), _pack_nibbles(q)], axis=1)


def _q4_1(x: np.ndarray) -> np.ndarray:
    hi, lo = x.max(axis=1, keepdims=True), x.min(axis=1, keepdims=True)
    d = (hi - lo) / F32(15)
    q = np.trunc((x - lo) * _inverse(d) + F32(0.5)).astype(np.uint8).clip(0, 15)
    return np.concatenate([_fp16_bytes(d), _fp16_bytes(lo), _pack_nibbles(q)], axis=1)


def _qh_bytes(q: np.ndarray) -> np.ndarray:
    return np.packbits(q >> np.uint8(4), axis=1, bitorder="little")


def _q5_0(x: np.ndarray) -> np.ndarray:
    d = _abs_argmax_value(x) / F32(-16)
    q = np.trunc(x * _inverse(d) + F32(16.5)).astype(np.uint8).clip(0, 31)
    qs = (q[:, :16] & np.uint8(0x0F)) | (q[:, 16:] << np.uint8(4))
    return np.concatenate([_fp16_bytes(d), _qh_bytes(q), qs], axis=1)


def _q5_1(x: np.ndarray) -> np.ndarray:
    hi, lo = x.max(axis=1, keepdims=True), x.min(axis=1, keepdims=True)
    d = (hi - lo) / F32(31)
    q = np.trunc((x - lo) * _inverse(d) + F32(0.5)).astype(np.uint8).clip(0, 31)
    qs = (q[:, :16] & np.uint8(0x0F)) | (q[:, 16:] << np.uint8(4))
    return np.concatenate([_fp16_bytes(d), _fp16_bytes(lo), _qh_bytes(q), qs], axis=1)


def make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                     nstep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """llama.cpp make_qkx2_quants (use_mad=false) over rows of x: (levels, scale, -min)."""
    mn = np.minimum(x.min(axis=-1), F32(0))
    mx = x.max(axis=-1)
    sum_w = _seqsum(w)
    sum_x = _seqsum(w * x)
    flat = mx == mn
    live = ~flat
    iscale = F32(nmax) / np.where(flat, F32(1), mx - mn)
    scale = F32(1) / iscale
    L = np.clip(_nearest_int(iscale[..., None] * (x - mn[..., None])), 0, nmax)
    diff = scale[..., None] * L.astype(F32) + mn[..., None] - x
    best = _seqsum(w * (diff * diff))
    for step in range(nstep + 1):
        # the C loop reuses `min` as it improves, so the range and offset move with it
        rng = np.where(flat, F32(1), mx - mn)
        iscale = (F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / rng
        la = np.clip(_nearest_int(iscale[..., None] * (x - mn[..., None])), 0, nmax)
        lf = la.astype(F32)
        wl = w * lf
        sum_l = _seqsum(wl)
        sum_l2 = _seqsum(wl * lf)
        sum_xl = _seqsum(wl * x)
        big_d = sum_w * sum_l2 - sum_l * sum_l
        ok = live & (big_d > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / big_d
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / big_d
            pos = this_min > 0
            this_min = np.where(pos, F32(0), this_min)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
            diff = this_scale[..., None] * lf + this_min[..., None] - x
            err = _seqsum(w * (diff * diff))
        better = ok & (err < best)
        L = np.where(better[..., None], la, L)
        best = np.where(better, err, best)
        scale = np.where(better, this_scale, scale)
        mn = np.where(better, this_min, mn)
    L = np.where(flat[..., None], 0, L)
    scale = np.where(flat, F32(0), scale)
    return L, scale.astype(F32), (-mn).astype(F32)


def _q4_k(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    xs = x.reshape(n, 8, 32)
    av_x = np.sqrt(_seqsum(xs * xs) / F32(32))
    w = av_x[..., None] + np.abs(xs)
    L, scales, mins = make_qkx2_quants(xs, w, 15, -1.0, 0.1, 20)
    max_scale = np.maximum(scales.max(axis=1), F32(0))
    max_min = np.maximum(mins.max(axis=1), F32(0))
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0))
        inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0))
    ls = np.minimum(_nearest_int(inv_scale[:, None] * scales) & 0xFF, 63).astype(np.uint8)
    lm = np.minimum(_nearest_int(inv_min[:, None] * mins) & 0xFF, 63).astype(np.uint8)
    sc = np.empty((n, 12), np.uint8)
    sc[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    sc[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    sc[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    d = _f16_roundtrip(max_scale / F32(63))
    dmin = _f16_roundtrip(max_min / F32(63))
    dl = d[:, None] * ls.astype(F32)
    ml = dmin[:, None] * lm.astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        req = np.clip(_nearest_int((xs + ml[..., None]) / dl[..., None]), 0, 15)
    L = np.where((dl != 0)[..., None], req, L).astype(np.uint8).reshape(n, 4, 2, 32)
    qs = (L[:, :, 0] | (L[:, :, 1] << np.uint8(4))).reshape(n, 128)
    return np.concatenate([_fp16_bytes(d[:, None]), _fp16_bytes(dmin[:, None]), sc, qs], axis=1)


def make_qx_quants_rmse1(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp make_qx_quants with rmse_type=1 and no weights: (levels + nmax, scale)."""
    mx = _abs_argmax_value(x)[..., 0]
    zero = np.abs(mx) < GROUP_MAX_EPS
    safe = np.where(zero, F32(1), mx)
    w = x * x

    def levels(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        li = np.clip(_nearest_int(iscale[..., None] * x), -nmax, nmax - 1)
        lf = li.astype(F32)
        return li, _seqsum(w * x * lf), _seqsum(w * lf * lf)

    L, sumlx, suml2 = levels(F32(-nmax) / safe)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0)).astype(F32)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        li, sumlx, suml2 = levels(-(F32(nmax) + F32(0.1) * F32(step)) / safe)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        L = np.where(better[..., None], li, L)
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(better, sumlx / suml2, scale).astype(F32)
        best = np.where(better, scale * sumlx, best)
    L = np.where(zero[..., None], -nmax, L) + nmax
    return L, np.where(zero, F32(0), scale).astype(F32)


def _q6_k(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    xs = x.reshape(n, 16, 16)
    L, scales = make_qx_quants_rmse1(xs, 32)
    max_scale = _abs_argmax_value(scales)[:, 0]
    empty = np.abs(max_scale) < GROUP_MAX_EPS
    safe = np.where(empty, F32(1), max_scale)
    iscale = F32(-128) / safe
    d = _f16_roundtrip(F32(1) / iscale)
    sc = np.minimum(_nearest_int(iscale[:, None] * scales), 127).astype(np.int8)
    dl = d[:, None] * sc.astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        req = np.clip(_nearest_int(xs / dl[..., None]), -32, 31) + 32
    L = np.where((dl != 0)[..., None], req, L).astype(np.uint8).reshape(n, 2, 4, 32)
    ql = np.concatenate([L[:, :, 0] & 0xF, L[:, :, 1] & 0xF], axis=2) | (
        np.concatenate([L[:, :, 2] & 0xF, L[:, :, 3] & 0xF], axis=2) << 4
    )
    qh = (
        (L[:, :, 0] >> 4)
        | ((L[:, :, 1] >> 4) << 2)
        | ((L[:, :, 2] >> 4) << 4)
        | ((L[:, :, 3] >> 4) << 6)
    )
    out = np.concatenate(
        [ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), _fp16_bytes(d[:, None])],
        axis=1,
    )
    out[empty] = 0
    return out


QUANTIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "F32": _f32,
    "F16": _f16,
    "BF16": _bf16,
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q4_K": _q4_k,
    "Q6_K": _q6_k,
}

__all__ = ["QUANTIZERS", "f16", "make_qkx2_quants", "make_qx_quants_rmse1"]
