"""GGUF block layouts and the array-level ``dequantize`` / ``quantize`` entry points.

A quantized tensor of logical shape ``(..., K)`` is stored row-major as ``K // block_size``
blocks per row, each ``type_size`` bytes. The layouts are those of ggml (llama.cpp); every
multi-byte field is little-endian. ``dequantize`` equals ``gguf.quants.dequantize`` bit for bit;
``quantize`` equals ``gguf.quants.quantize`` bit for bit where gguf implements the type and
follows llama.cpp's ``quantize_row_*_ref`` for Q4_K and Q6_K, which gguf's numpy code lacks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ember.errors import DTypeError, FormatError, ShapeError, UnsupportedError

QK_K = 256  # elements in a K-quant super-block


@dataclass(frozen=True)
class BlockFormat:
    """One GGUF tensor type: ``block_size`` elements packed into ``type_size`` bytes."""

    name: str
    ggml_type: int  # the GGMLQuantizationType value written in GGUF files
    block_size: int
    type_size: int
    layout: str  # byte layout of one block, for readers of the code and the docs

    @property
    def bits_per_weight(self) -> float:
        """Storage cost per element, scales included."""
        return 8.0 * self.type_size / self.block_size


FORMATS: dict[str, BlockFormat] = {
    f.name: f
    for f in (
        BlockFormat("F32", 0, 1, 4, "f32"),
        BlockFormat("F16", 1, 1, 2, "f16"),
        BlockFormat("BF16", 30, 1, 2, "bf16 (upper half of an f32)"),
        BlockFormat("Q4_0", 2, 32, 18, "d:f16 | qs:16B (x = d*(q-8); lo nibbles = 0..15)"),
        BlockFormat("Q4_1", 3, 32, 20, "d:f16 m:f16 | qs:16B (x = d*q + m)"),
        BlockFormat("Q5_0", 6, 32, 22, "d:f16 | qh:u32 | qs:16B (x = d*(q-16))"),
        BlockFormat("Q5_1", 7, 32, 24, "d:f16 m:f16 | qh:u32 | qs:16B (x = d*q + m)"),
        BlockFormat("Q8_0", 8, 32, 34, "d:f16 | qs:32 x i8 (x = d*q)"),
        BlockFormat(
            "Q2_K", 10, QK_K, 84, "scales:16B (4-bit scale|4-bit min) | qs:64B | d:f16 dmin:f16"
        ),
        BlockFormat("Q3_K", 11, QK_K, 110, "hmask:32B | qs:64B | scales:12B (6-bit) | d:f16"),
        BlockFormat("Q4_K", 12, QK_K, 144, "d:f16 dmin:f16 | scales:12B (6-bit sc,m x8) | qs:128B"),
        BlockFormat("Q5_K", 13, QK_K, 176, "d:f16 dmin:f16 | scales:12B | qh:32B | qs:128B"),
        BlockFormat("Q6_K", 14, QK_K, 210, "ql:128B | qh:64B | scales:16 x i8 | d:f16"),
    )
}

SUPPORTED_TYPES: tuple[str, ...] = tuple(FORMATS)
QUANTIZE_TYPES: tuple[str, ...] = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                                   "Q4_K", "Q6_K")  # fmt: skip
_BY_ID = {f.ggml_type: f for f in FORMATS.values()}


def block_format(qtype: object) -> BlockFormat:
    """Look up a type by name ('q4_0', 'Q4_K'), by ggml id, or by a gguf enum member."""
    if isinstance(qtype, BlockFormat):
        return qtype
    name = getattr(qtype, "name", qtype)  # gguf.GGMLQuantizationType members carry .name
    if isinstance(name, str):
        fmt = FORMATS.get(name.upper())
    elif isinstance(qtype, (int, np.integer)):
        fmt = _BY_ID.get(int(qtype))
    else:
        fmt = None
    if fmt is None:
        raise UnsupportedError(
            f"quant type {qtype!r} is not supported; supported: {', '.join(SUPPORTED_TYPES)}"
        )
    return fmt


def _check_shape(shape: Sequence[int], fmt: BlockFormat, what: str) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ShapeError(f"{what}: negative dimension in shape {shape}")
    if len(shape) == 0:
        if fmt.block_size != 1:
            raise ShapeError(f"{what}: a 0-d tensor cannot be stored as {fmt.name} blocks")
        return shape
    if shape[-1] % fmt.block_size:
        raise ShapeError(
            f"{what}: last dimension {shape[-1]} of shape {shape} is not a multiple of the "
            f"{fmt.name} block size {fmt.block_size}"
        )
    return shape


def nbytes_of(shape: Sequence[int], qtype: object) -> int:
    """Number of bytes that a tensor of logical ``shape`` takes in ``qtype`` blocks."""
    fmt = block_format(qtype)
    shape = _check_shape(shape, fmt, "nbytes_of")
    n = int(np.prod(shape, dtype=np.int64))
    return n // fmt.block_size * fmt.type_size


def byte_shape(shape: Sequence[int], qtype: object) -> tuple[int, ...]:
    """Shape of the uint8 array holding ``shape`` in ``qtype``: (..., bytes per row)."""
    fmt = block_format(qtype)
    shape = _check_shape(shape, fmt, "byte_shape")
    if not shape:
        return (fmt.type_size,)
    return (*shape[:-1], shape[-1] // fmt.block_size * fmt.type_size)


def as_bytes(data: np.ndarray, qtype: object, shape: Sequence[int], what: str) -> np.ndarray:
    """View ``data`` as a flat uint8 array after checking it holds ``shape`` in ``qtype``."""
    fmt = block_format(qtype)
    shape = _check_shape(shape, fmt, what)
    if not isinstance(data, np.ndarray):
        raise DTypeError(f"{what}: expected a numpy array of raw bytes, got {type(data).__name__}")
    if not data.flags.c_contiguous:
        raise FormatError(f"{what}: the raw {fmt.name} data must be C-contiguous")
    expected = nbytes_of(shape, fmt)
    if data.nbytes != expected:
        n = int(np.prod(shape, dtype=np.int64))
        raise FormatError(
            f"{what}: a {fmt.name} tensor of shape {shape} takes {expected} bytes "
            f"({n // fmt.block_size} blocks of {fmt.type_size} bytes), got {data.nbytes} bytes "
            f"(array of shape {data.shape}, dtype {data.dtype})"
        )
    return data.reshape(-1).view(np.uint8)


def dequantize(data: np.ndarray, qtype: object, shape: Sequence[int]) -> np.ndarray:
    """Decode raw ``qtype`` blocks into a new float32 array of logical ``shape``."""
    from ember.quant.dequant import DEQUANTIZERS

    fmt = block_format(qtype)
    raw = as_bytes(data, fmt, shape, f"dequantize({fmt.name})")
    shape = tuple(int(s) for s in shape)
    out = np.empty(shape, np.float32)
    if out.size == 0:
        return out
    flat = out.reshape(-1, fmt.block_size)
    blocks = raw.reshape(-1, fmt.type_size)
    step = max(1, (1 << 20) // fmt.block_size)  # bound the temporaries to a few MiB
    fn = DEQUANTIZERS[fmt.name]
    for i in range(0, blocks.shape[0], step):
        flat[i : i + step] = fn(blocks[i : i + step])
    return out


def quantize(array: np.ndarray, qtype: object) -> np.ndarray:
    """Encode a float array into ``qtype`` blocks: uint8 of shape (..., bytes per row)."""
    from ember.quant.quantizers import QUANTIZERS

    fmt = block_format(qtype)
    if fmt.name not in QUANTIZERS:
        raise UnsupportedError(
            f"quantizing to {fmt.name} is not implemented; quantize supports "
            f"{', '.join(QUANTIZE_TYPES)}"
        )
    array = np.asarray(array)
    if array.dtype.kind not in "fiub":
        raise DTypeError(f"quantize({fmt.name}): expected a float array, got dtype {array.dtype}")
    shape = _check_shape(array.shape, fmt, f"quantize({fmt.name})")
    out = np.empty(byte_shape(shape, fmt), np.uint8)
    if array.size == 0:
        return out
    src = np.ascontiguousarray(array, dtype=np.float32).reshape(-1, fmt.block_size)
    dst = out.reshape(-1, fmt.type_size)
    step = max(1, (1 << 18) // fmt.block_size)
    fn = QUANTIZERS[fmt.name]
    for i in range(0, src.shape[0], step):
        dst[i : i + step] = fn(src[i : i + step])
    return out
