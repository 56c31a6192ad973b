"""Quantized weights: GGUF block formats, QTensor, and the kernels that multiply with them.

Array level only for now; ``QLinear`` and ``ember.quant.quantize(model, ...)`` come once
``ember.nn`` exists (the name ``quantize`` is kept free for that).
"""

from ember.kernels.cpu.quant import KERNEL_TYPES
from ember.quant.formats import (
    FORMATS,
    QUANTIZE_TYPES,
    SUPPORTED_TYPES,
    BlockFormat,
    block_format,
    byte_shape,
    dequantize,
    nbytes_of,
)
from ember.quant.formats import quantize as quantize_array
from ember.quant.qtensor import QTensor


def __getattr__(name: str):
    """QLinear, QEmbedding and quantize(model, qtype) live in ember.quant.nn (it imports ember.nn)."""
    if name in ("QLinear", "QEmbedding", "quantize"):
        from ember.quant import nn

        return getattr(nn, name)
    raise AttributeError(f"module 'ember.quant' has no attribute {name!r}")


__all__ = [
    "FORMATS",
    "KERNEL_TYPES",
    "QUANTIZE_TYPES",
    "SUPPORTED_TYPES",
    "BlockFormat",
    "QEmbedding",
    "QLinear",
    "QTensor",
    "block_format",
    "byte_shape",
    "dequantize",
    "nbytes_of",
    "quantize",
    "quantize_array",
]
