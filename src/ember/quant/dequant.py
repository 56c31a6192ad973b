"""Pure-numpy block decoders, one per GGUF type: (n_blocks, type_size) uint8 -> (n, block) f32.

Each decoder performs the same float32 operations in the same order as ggml's
``dequantize_row_*`` (and gguf's numpy port), so results agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

QK_K = 256
_NIB = np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)  # low nibbles first, then high
_CRUMB = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)  # 2-bit fields, low first
_BITS = np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)


def f16(b: np.ndarray) -> np.ndarray:
    """Little-endian fp16 field(s) of a block array -> float32, shape (n, k)."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, group: int) -> np.ndarray:
    """Split bytes into 4-bit values: each run of ``group`` bytes gives its lows then highs."""
    n = qs.shape[0]
    return ((qs.reshape(n, -1, 1, group) >> _NIB) & np.uint8(0x0F)).reshape(n, -1)


def _f32(blocks: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(blocks).view(np.float32)


def _f16(blocks: np.ndarray) -> np.ndarray:
    return f16(blocks)


def _bf16(blocks: np.ndarray) -> np.ndarray:
    b = np.ascontiguousarray(blocks).view(np.uint16).astype(np.uint32) << np.uint32(16)
    return b.view(np.float32)


def _q4_0(blocks: np.ndarray) -> np.ndarray:
    d = f16(blocks[:, :2])
    q = _nibbles(blocks[:, 2:], 16).astype(np.int8) - np.int8(8)
    return d * q.astype(np.float32)


def _q4_1(blocks: np.ndarray) -> np.ndarray:
    d, m = f16(blocks[:, :2]), f16(blocks[:, 2:4])
    return d * _nibbles(blocks[:, 4:], 16).astype(np.float32) + m


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1: 32 high bits from a little-endian u32 -> (n, 32) values 0 or 16."""
    bits = np.unpackbits(np.ascontiguousarray(qh), axis=1, bitorder="little")
    return bits << np.uint8(4)


def _q5_0(blocks: np.ndarray) -> np.ndarray:
    d = f16(blocks[:, :2])
    q = (_nibbles(blocks[:, 6:], 16) | _fifth_bits(blocks[:, 2:6])).astype(np.int8) - np.int8(16)
    return d * q.astype(np.float32)


def _q5_1(blocks: np.ndarray) -> np.ndarray:
    d, m = f16(blocks[:, :2]), f16(blocks[:, 2:4])
    q = _nibbles(blocks[:, 8:], 16) | _fifth_bits(blocks[:, 4:8])
    return d * q.astype(np.float32) + m


def _q8_0(blocks: np.ndarray) -> np.ndarray:
    d = f16(blocks[:, :2])
    return np.ascontiguousarray(blocks[:, 2:]).view(np.int8).astype(np.float32) * d


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """2-bit values: each 32-byte run gives shift 0, 2, 4, 6 over its 32 bytes in turn."""
    n = qs.shape[0]
    return ((qs.reshape(n, -1, 1, 32) >> _CRUMB) & np.uint8(3)).reshape(n, -1)


def _q2_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    scales, qs = blocks[:, :16], blocks[:, 16:80]
    d, dmin = f16(blocks[:, 80:82]), f16(blocks[:, 82:84])
    dl = (d * (scales & np.uint8(0xF)).astype(np.float32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> np.uint8(4)).astype(np.float32)).reshape(n, 16, 1)
    q = _crumbs(qs).reshape(n, 16, 16).astype(np.float32)
    return (dl * q - ml).reshape(n, QK_K)


def unpack_q3_k_scales(sc: np.ndarray) -> np.ndarray:
    """Q3_K: 16 signed 6-bit scales from 12 bytes (low nibbles in 0..7, high crumbs in 8..11)."""
    n = sc.shape[0]
    lo = (sc[:, :8].reshape(n, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(n, 16)
    hi = (sc[:, 8:].reshape(n, 1, 4) >> _CRUMB.reshape(1, 4, 1)).reshape(n, 16)
    s = (lo & np.uint8(0x0F)) | ((hi & np.uint8(3)) << np.uint8(4))
    return s.astype(np.int8) - np.int8(32)


def _q3_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    hmask, qs = blocks[:, :32], blocks[:, 32:96]
    scales = unpack_q3_k_scales(blocks[:, 96:108])
    d = f16(blocks[:, 108:110])
    dl = (d * scales.astype(np.float32)).reshape(n, 16, 1)
    ql = _crumbs(qs).reshape(n, 16, 16)
    qh = ((hmask.reshape(n, 1, 1, 32) >> _BITS) & np.uint8(1)).reshape(n, 16, 16)
    q = ql.astype(np.int8) - ((qh ^ np.uint8(1)) << np.uint8(2)).astype(np.int8)
    return (dl * q.astype(np.float32)).reshape(n, QK_K)


def unpack_k4_scales(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 8 six-bit scales and 8 six-bit mins from 12 bytes (get_scale_min_k4)."""
    n = sc.shape[0]
    s = sc.reshape(n, 3, 4)
    a, b, c = s[:, 0], s[:, 1], s[:, 2]
    scale = np.concatenate([a & 0x3F, (c & 0x0F) | ((a >> 2) & 0x30)], axis=1)
    mins = np.concatenate([b & 0x3F, (c >> 4) | ((b >> 2) & 0x30)], axis=1)
    return scale, mins


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin = f16(blocks[:, 0:2]), f16(blocks[:, 2:4])
    sc, m = unpack_k4_scales(blocks[:, 4:16])
    dl = (d * sc.astype(np.float32)).reshape(n, 8, 1)
    ml = (dmin * m.astype(np.float32)).reshape(n, 8, 1)
    q = _nibbles(blocks[:, 16:], 32).reshape(n, 8, 32).astype(np.float32)
    return (dl * q - ml).reshape(n, QK_K)


def _q5_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin = f16(blocks[:, 0:2]), f16(blocks[:, 2:4])
    sc, m = unpack_k4_scales(blocks[:, 4:16])
    dl = (d * sc.astype(np.float32)).reshape(n, 8, 1)
    ml = (dmin * m.astype(np.float32)).reshape(n, 8, 1)
    qh = ((blocks[:, 16:48].reshape(n, 1, 1, 32) >> _BITS) & np.uint8(1)).reshape(n, 8, 32)
    q = _nibbles(blocks[:, 48:], 32).reshape(n, 8, 32) | (qh << np.uint8(4))
    return (dl * q.astype(np.float32) - ml).reshape(n, QK_K)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    ql, qh = blocks[:, :128], blocks[:, 128:192]
    scales = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)
    d = f16(blocks[:, 208:210])
    dl = (d * scales).reshape(n, 16, 1)
    lo = _nibbles(ql, 64).reshape(n, 8, 32)
    hi = ((qh.reshape(n, 2, 1, 32) >> _CRUMB) & np.uint8(3)).reshape(n, 8, 32)
    q = (lo | (hi << np.uint8(4))).astype(np.int8) - np.int8(32)
    return (dl * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)


DEQUANTIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "F32": _f32,
    "F16": _f16,
    "BF16": _bf16,
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}
