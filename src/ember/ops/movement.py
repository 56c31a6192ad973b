"""Movement ops: reshape, view, permute, expand, squeeze, narrow, select, split, diagonal, ...

Views share memory with their input as in PyTorch (numpy views underneath). The core views
(reshape, view, permute, transpose, expand, Index) live below this module in _view, and ops that
copy in PyTorch live beside it, in _rearrange (flip, roll, repeat, pad, tril, diag, ...) and
_join (cat, stack, hstack, ...); all are re-exported here.
"""

from __future__ import annotations

import operator

import numpy as np

from ember.autograd import Function
from ember.errors import ShapeError
from ember.ops import _join, _rearrange
from ember.ops._join import *  # noqa: F403  (re-exported)
from ember.ops._rearrange import *  # noqa: F403  (re-exported)
from ember.ops._rearrange import diag_view
from ember.ops._util import wrap_dim
from ember.ops._view import (  # noqa: F401  (re-exported: the core views live below us)
    Expand,
    Index,
    Permute,
    Reshape,
    View,
    _dims_arg,
    expand,
    flatten,
    moveaxis,
    movedim,
    permute,
    ravel,
    reshape,
    reshape_as,
    squeeze,
    swapaxes,
    swapdims,
    t,
    transpose,
    unflatten,
    unsqueeze,
    view,
    view_as,
)
from ember.tensor import Tensor


def expand_as(input: Tensor, other: Tensor) -> Tensor:
    """Expand to other's shape."""
    return expand(input, other.shape)


def broadcast_to(input: Tensor, shape) -> Tensor:
    """Expand to shape (torch.broadcast_to)."""
    return expand(input, tuple(shape))


def broadcast_shapes(*shapes) -> tuple:
    """The shape that the given shapes broadcast to (ShapeError when they do not)."""
    try:
        return np.broadcast_shapes(*(tuple(s) if not isinstance(s, int) else (s,) for s in shapes))
    except ValueError:
        shapes = [tuple(s) if not isinstance(s, int) else (s,) for s in shapes]
        raise ShapeError(f"shapes {shapes} do not broadcast") from None


def broadcast_tensors(*tensors: Tensor) -> list[Tensor]:
    """Expand tensors to their common broadcast shape."""
    shape = broadcast_shapes(*(t._data.shape for t in tensors))
    return [expand(t, shape) for t in tensors]


# ------------------------------------------------------------------ copies
class Contiguous(Function):
    """A C-contiguous copy (or the input when already contiguous)."""

    def forward(self, x):
        return np.array(x, order="C", copy=True)

    def meta(self, x):
        return x.shape, x.dtype

    def backward(self, g):
        return g


def contiguous(input: Tensor, memory_format=None) -> Tensor:
    """The tensor with C-contiguous memory (itself when it already is)."""
    if input.is_contiguous():
        return input
    return Contiguous.apply(input)


class Clone(Function):
    """A copy with its own memory."""

    def forward(self, x):
        return x.copy()

    def meta(self, x):
        return x.shape, x.dtype

    def backward(self, g):
        return g


def clone(input: Tensor, memory_format=None) -> Tensor:
    """A copy of input with its own memory (gradients flow through)."""
    return Clone.apply(input)


# ------------------------------------------------------------------ indexing views
def _view(input: Tensor, idx: tuple) -> Tensor:
    return Index.apply(input, idx=idx, basic=True)


def _at(dim: int, s) -> tuple:
    return (slice(None),) * dim + (s,)


def narrow(input: Tensor, dim: int, start, length: int) -> Tensor:
    """The slice start:start+length along dim; a view."""
    nd = input._data.ndim
    if nd == 0:
        raise ShapeError("narrow() cannot be applied to a 0-dim tensor")
    d = wrap_dim(dim, nd)
    n = input._data.shape[d]
    start, length = operator.index(start), operator.index(length)
    if not -n <= start <= n:
        raise IndexError(
            f"narrow(): start ({start}) out of range (expected to be in range of [{-n}, {n}])"
        )
    if start < 0:
        start += n
    if length < 0:
        raise ShapeError("narrow(): length must be non-negative")
    if start + length > n:
        raise ShapeError(
            f"narrow(): start ({start}) + length ({length}) exceeds dimension size ({n})"
        )
    return _view(input, _at(d, slice(start, start + length)))


def select(input: Tensor, dim: int, index) -> Tensor:
    """The sub-tensor at index along dim (that dim removed); a view."""
    nd = input._data.ndim
    if nd == 0:
        raise IndexError("select() cannot be applied to a 0-dim tensor")
    d = wrap_dim(dim, nd)
    n = input._data.shape[d]
    i = operator.index(index)
    if not -n <= i < n:
        raise IndexError(
            f"select(): index {i} out of range for tensor of size {list(input.shape)} "
            f"at dimension {d}"
        )
    return _view(input, _at(d, i % n))


def split(tensor: Tensor, split_size_or_sections, dim: int = 0) -> tuple:
    """Views of consecutive pieces along dim, of one size (an int) or of given sizes (a list)."""
    nd = tensor._data.ndim
    if nd == 0:
        raise ShapeError("split expects at least a 1-dimensional tensor")
    d = wrap_dim(dim, nd)
    n = tensor._data.shape[d]
    if isinstance(split_size_or_sections, (int, np.integer)):
        size = int(split_size_or_sections)
        if size < 0 or (size == 0 and n != 0):
            raise ShapeError(
                f"split: split_size must be positive (or 0 for an empty dim), got {size} "
                f"for size {n}"
            )
        sizes = [size] * (n // size) + ([n % size] if n % size else []) if size else [0]
    else:
        sizes = [operator.index(s) for s in split_size_or_sections]
        if sum(sizes) != n or any(s < 0 for s in sizes):
            raise ShapeError(
                f"split_with_sizes expects split_sizes to sum exactly to {n} "
                f"(input's size at dimension {d}), "
                f"but got split_sizes={sizes}"
            )
    out, start = [], 0
    for s in sizes:
        out.append(_view(tensor, _at(d, slice(start, start + s))))
        start += s
    return tuple(out)


def tensor_split(input: Tensor, indices_or_sections, dim: int = 0) -> tuple:
    """Split into n nearly equal views (an int) or at the given indices (a list)."""
    d = wrap_dim(dim, input._data.ndim)
    n = input._data.shape[d]
    if isinstance(indices_or_sections, (int, np.integer)):
        k = int(indices_or_sections)
        if k <= 0:
            raise ShapeError(f"tensor_split: number of sections must be positive, got {k}")
        q, r = divmod(n, k)
        bounds = np.cumsum([0] + [q + 1] * r + [q] * (k - r)).tolist()
    else:
        idx = [operator.index(i) for i in indices_or_sections]
        bounds = [0] + idx + [n]
    return tuple(
        _view(input, _at(d, slice(min(a, n), max(min(b, n), min(a, n)))))
        for a, b in zip(bounds[:-1], bounds[1:])
    )


def chunk(input: Tensor, chunks: int, dim: int = 0) -> tuple:
    """Split into at most `chunks` views of size ceil(n / chunks) along dim."""
    if chunks <= 0:
        raise ShapeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    nd = input._data.ndim
    if nd == 0:
        raise ShapeError("chunk expects at least a 1-dimensional tensor")
    n = input._data.shape[wrap_dim(dim, nd)]
    if n == 0:
        return split(input, [0] * chunks, dim)
    return split(input, -(-n // chunks), dim)


def unbind(input: Tensor, dim: int = 0) -> tuple:
    """All slices along dim (that dim removed), as a tuple of views."""
    if input._data.ndim == 0:
        raise IndexError("unbind: dimension specified as 0 but tensor has no dimensions")
    d = wrap_dim(dim, input._data.ndim)
    return tuple(_view(input, _at(d, i)) for i in range(input._data.shape[d]))


class Diagonal(Function):
    """A (writable) strided view of a diagonal; the diagonal dim goes last."""

    def forward(self, x, offset, d1, d2):
        self.shape, self.args = x.shape, (offset, d1, d2)
        return diag_view(x, offset, d1, d2)

    def backward(self, g):
        gx = np.zeros(self.shape, g.dtype)
        diag_view(gx, *self.args)[...] = g
        return gx


def diagonal(input: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The diagonal over dims dim1, dim2 (appended as the last dim); a view."""
    nd = input._data.ndim
    d1, d2 = wrap_dim(dim1, nd), wrap_dim(dim2, nd)
    if d1 == d2:
        raise ShapeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    return Diagonal.apply(input, offset=operator.index(offset), d1=d1, d2=d2)


__all__ = [
    "reshape", "view", "view_as", "reshape_as", "flatten", "ravel", "unflatten", "squeeze",
    "unsqueeze", "permute", "transpose", "swapaxes", "swapdims", "t", "movedim", "moveaxis",
    "expand", "expand_as", "broadcast_to", "broadcast_shapes", "broadcast_tensors", "contiguous",
    "clone", "narrow", "select", "split", "tensor_split", "chunk", "unbind", "diagonal",
    *_rearrange.__all__, *_join.__all__,
]  # fmt: skip
