"""QTensor: a weight kept as raw GGUF blocks, multiplied without being decoded whole."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ember.errors import DTypeError, ShapeError
from ember.quant import kernels
from ember.quant.formats import BlockFormat, as_bytes, block_format, dequantize, quantize


class QTensor:
    """Raw ``qtype`` blocks (uint8, possibly a read-only memory map) with a logical shape.

    ``shape`` is in torch order, so a linear weight is (out_features, in_features) and the
    blocks run along the last dimension. The bytes are never copied: ``data`` is a view of
    whatever array was given. ``dtype`` is float32, the type of ``dequantize()`` and of the
    products.
    """

    __slots__ = ("data", "qtype", "shape", "_fmt", "_w3")

    dtype = np.dtype(np.float32)

    def __init__(self, data: np.ndarray, qtype: str, shape: Sequence[int]) -> None:
        fmt = block_format(qtype)
        shape = tuple(int(s) for s in shape)
        self.data = as_bytes(data, fmt, shape, f"QTensor({fmt.name}, {shape})")
        self.qtype = fmt.name
        self.shape = shape
        self._fmt: BlockFormat = fmt
        self._w3: np.ndarray | None = None

    @classmethod
    def from_float(cls, array: np.ndarray, qtype: str) -> QTensor:
        """Quantize a float array into a new QTensor of the same shape."""
        array = np.asarray(array)
        return cls(quantize(array, qtype), qtype, array.shape)

    @property
    def ndim(self) -> int:
        """Number of logical dimensions."""
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of packed storage (what a matrix-vector product reads)."""
        return int(self.data.nbytes)

    @property
    def numel(self) -> int:
        """Number of logical elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def block_size(self) -> int:
        """Elements per block of this type."""
        return self._fmt.block_size

    def dequantize(self) -> np.ndarray:
        """A new float32 array of ``shape`` holding the decoded values."""
        return dequantize(self.data, self.qtype, self.shape)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self.dequantize()
        return out if dtype is None else out.astype(dtype, copy=False)

    def matmul_t(self, x: np.ndarray) -> np.ndarray:
        """``x @ W.T`` for x of shape (..., in_features): float32 of shape (..., out_features)."""
        if self._w3 is not None and type(x) is np.ndarray and x.ndim == 1:
            # decode hot path: a float32 vector against a weight that already passed checks
            if x.dtype == np.float32 and x.shape[0] == self.shape[1] and x.flags.c_contiguous:
                return kernels.matvec_blocks(kernels.numba_kernels(), self._w3, self.qtype, x)
        if self.ndim != 2:
            raise ShapeError(f"QTensor.matmul_t: needs a 2-d weight, this one is {self.shape}")
        n, k = self.shape
        x = np.asarray(x)
        if x.ndim == 0 or x.shape[-1] != k:
            raise ShapeError(
                f"QTensor.matmul_t: x of shape {x.shape} does not fit a ({n}, {k}) weight "
                f"(x @ W.T needs x.shape[-1] == {k})"
            )
        if x.dtype.kind not in "fiub":
            raise DTypeError(f"QTensor.matmul_t: x must be real, got dtype {x.dtype}")
        lead = x.shape[:-1]
        x2 = np.ascontiguousarray(x.reshape(-1, k), dtype=np.float32)
        if x2.shape[0] == 1 and n and k and self.qtype in kernels.KERNEL_TYPES:
            mod = kernels.numba_kernels()
            if mod is not None:
                if self._w3 is None:  # validated once; later vectors take the path above
                    self._w3 = self.data.reshape(n, k // self.block_size, self._fmt.type_size)
                return kernels.matvec_blocks(mod, self._w3, self.qtype, x2[0]).reshape(*lead, n)
        return kernels.matmul_t(self.data, self.qtype, (n, k), x2).reshape(*lead, n)

    def __repr__(self) -> str:
        return (
            f"QTensor(shape={self.shape}, qtype={self.qtype}, dtype=float32, "
            f"nbytes={self.nbytes}, bits_per_weight={self._fmt.bits_per_weight:.2f})"
        )
