"""QTensor: a weight kept as raw GGUF blocks, multiplied without being decoded whole."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ember.errors import ShapeError
from ember.quant.formats import BlockFormat, as_bytes, block_format, dequantize, nbytes_of, quantize


class QTensor:
    """Raw ``qtype`` blocks (uint8, possibly a read-only memory map) with a logical shape.

    ``shape`` is in torch order, so a linear weight is (out_features, in_features) and the
    blocks run along the last dimension. The bytes are never copied: ``data`` is a view of
    whatever array was given. ``dtype`` is float32, the type of ``dequantize()`` and of the
    products.

    Kernels that read a weight in another layout keep that copy in ``_packed`` as
    ``(data it was made from, copy)`` (``ember.kernels.cpu.quant._panels``); a new ``data``
    makes them pack again. A QTensor made by :meth:`packed_only` holds only such a copy (the
    stacked q/k/v and gate/up weights of ``ember.inference.stack``): its ``data`` is unpacked
    from it on first access.
    """

    __slots__ = ("_data", "qtype", "shape", "_fmt", "_w3", "_packed")

    dtype = np.dtype(np.float32)

    def __init__(self, data: np.ndarray, qtype: str, shape: Sequence[int]) -> None:
        fmt = block_format(qtype)
        shape = tuple(int(s) for s in shape)
        self._data: np.ndarray | None = as_bytes(data, fmt, shape, f"QTensor({fmt.name}, {shape})")
        self.qtype = fmt.name
        self.shape = shape
        self._fmt: BlockFormat = fmt
        self._w3: tuple | None = None  # (data, its 3-d view), see blocks3d
        self._packed: tuple | None = None  # (data or None, the kernels' copy), see above

    @classmethod
    def packed_only(cls, qtype: str, shape: Sequence[int], packed) -> QTensor:
        """A QTensor whose bytes exist only in a kernel's layout (``packed``); ``data`` is
        unpacked from it when something asks for it (``ember.kernels.cpu.quant.unpacked``)."""
        q = cls.__new__(cls)
        fmt = block_format(qtype)
        q._data, q.qtype, q.shape, q._fmt, q._w3 = None, fmt.name, tuple(shape), fmt, None
        q._packed = (None, packed)
        return q

    def __getstate__(self) -> dict:  # pickle, copy.deepcopy (the 3-d view is rebuilt on use)
        return {k: getattr(self, k) for k in self.__slots__ if k != "_w3"}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)
        self._w3 = None
        packed = self._packed
        if packed is not None and packed[1].ctypes.data % 64:  # the kernels read it aligned
            raw = np.empty(packed[1].nbytes + 64, np.uint8)
            off = -raw.ctypes.data % 64
            copy = raw[off : off + packed[1].nbytes].reshape(packed[1].shape)
            copy[...] = packed[1]
            self._packed = (packed[0], copy)

    @property
    def data(self) -> np.ndarray:
        """The raw blocks, flat uint8."""
        d = self._data
        if d is None:
            from ember.kernels.cpu.quant import unpacked

            d = self._data = as_bytes(unpacked(self), self._fmt, self.shape, "QTensor.data")
            self._packed = (d, self._packed[1])  # the copy stays valid for these bytes
        return d

    @data.setter
    def data(self, value: np.ndarray) -> None:  # checked where it is used (blocks3d)
        self._data = value

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
        return int(nbytes_of(self.shape, self._fmt))

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

    def blocks3d(self) -> np.ndarray:
        """The packed bytes of a 2-d weight as a (rows, blocks per row, bytes per block) view."""
        cached = self._w3
        if cached is not None and cached[0] is self.data:
            return cached[1]
        if self.ndim != 2:
            raise ShapeError(f"QTensor: needs a 2-d weight, this one is {self.shape}")
        n, k = self.shape
        data = self.data
        as_bytes(data, self._fmt, self.shape, f"QTensor({self.qtype}, {self.shape})")  # rechecks
        w3 = data.reshape(-1).view(np.uint8).reshape(n, k // self.block_size, self._fmt.type_size)
        self._w3 = (data, w3)
        return w3

    def dequantize_rows(self, r0: int, r1: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``[r0, r1)`` of a 2-d weight as float32 (r1 - r0, in_features), into out if given."""
        from ember.kernels.cpu import quant

        return quant.dequantize_rows(self, r0, r1, out)

    def matmul_t(self, x: np.ndarray) -> np.ndarray:
        """``x @ W.T`` for x of shape (..., in_features): float32 of shape (..., out_features).

        The same kernels as ``F.linear(x, W)`` (``ember.kernels.cpu.quant``).
        """
        from ember.kernels.cpu import quant

        return quant.matmul_t(self, x)

    def __repr__(self) -> str:
        return (
            f"QTensor(shape={self.shape}, qtype={self.qtype}, dtype=float32, "
            f"nbytes={self.nbytes}, bits_per_weight={self._fmt.bits_per_weight:.2f})"
        )
