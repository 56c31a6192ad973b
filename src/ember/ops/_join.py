"""Joining tensors: cat, stack, hstack, vstack, dstack, column_stack (copies, as in PyTorch),
and the views that prepare them: atleast_1d/2d/3d and meshgrid.

Re-exported by ember.ops.movement; the views it needs (reshape, expand, unsqueeze) come from
_view, below both.
"""

from __future__ import annotations

import numpy as np

from ember import dtypes as _dt
from ember.autograd import Function
from ember.errors import ShapeError
from ember.ops._util import cast, wrap_dim
from ember.ops._view import expand, reshape, unsqueeze
from ember.tensor import Tensor


class Cat(Function):
    """Concatenate along a dim; inputs flagged in `skip` (legacy 1-d empties) take no part."""

    def forward(self, *xs, dim, skip=()):
        self.dim, self.skip = dim, skip
        self.sizes = [x.shape[dim] for i, x in enumerate(xs) if i not in skip]
        return np.concatenate([x for i, x in enumerate(xs) if i not in skip], axis=dim)

    def meta(self, *xs, dim, skip=()):
        xs = [x for i, x in enumerate(xs) if i not in skip]
        s = xs[0].shape
        return s[:dim] + (sum(x.shape[dim] for x in xs),) + s[dim + 1 :], xs[0].dtype

    def backward(self, g):
        parts = iter(np.split(g, np.cumsum(self.sizes)[:-1], axis=self.dim))
        n = len(self.sizes) + len(self.skip)
        return tuple(np.zeros(0, g.dtype) if i in self.skip else next(parts) for i in range(n))


class _Copy(Function):
    def forward(self, x):
        return x.copy()

    def meta(self, x):
        return x.shape, x.dtype

    def backward(self, g):
        return g


def _common(tensors, op: str) -> list:
    """The tensors as a list, promoted to one dtype (torch.result_type over all of them)."""
    if isinstance(tensors, Tensor):
        raise ShapeError(f"{op}: expected a sequence of tensors, got a single Tensor")
    tensors = list(tensors)
    if len(tensors) == 0:
        raise ShapeError(f"{op}: expected a non-empty list of tensors")
    dt = tensors[0].dtype
    for x in tensors[1:]:
        if x.dtype is not dt:
            dt = _dt.promote_types(dt, x.dtype)
    return [cast(x, dt) for x in tensors]


def cat(tensors, dim: int = 0) -> Tensor:
    """Concatenate tensors along an existing dim (1-d empty tensors are skipped, as in torch)."""
    tensors = _common(tensors, "cat")
    skip = tuple(i for i, x in enumerate(tensors) if x._data.shape == (0,))
    if len(skip) == len(tensors):
        skip = skip[1:]
    kept = [x for i, x in enumerate(tensors) if i not in skip]
    nd = kept[0]._data.ndim
    if nd == 0:
        raise ShapeError("cat: zero-dimensional tensor cannot be concatenated")
    d = wrap_dim(dim, nd)
    ref = kept[0]._data.shape
    for i, x in enumerate(kept[1:], 1):
        s = x._data.shape
        if len(s) != nd:
            raise ShapeError(
                f"cat: tensors must have the same number of dims: got {nd} and {len(s)}"
            )
        if s[:d] + s[d + 1 :] != ref[:d] + ref[d + 1 :]:
            raise ShapeError(
                f"cat: sizes of tensors must match except in dimension {d}: "
                f"got {list(ref)} and {list(s)} (tensor {i})"
            )
    if len(tensors) == 1:
        return _Copy.apply(tensors[0])
    return Cat.apply(*tensors, dim=d, skip=skip)


concat = concatenate = cat


def stack(tensors, dim: int = 0) -> Tensor:
    """Stack same-shape tensors along a new dim."""
    tensors = _common(tensors, "stack")
    ref = tensors[0]._data.shape
    for x in tensors[1:]:
        if x._data.shape != ref:
            raise ShapeError(
                f"stack expects equal-size tensors, got {list(ref)} and {list(x.shape)}"
            )
    nd = len(ref) + 1
    if not -nd <= dim < nd:
        raise IndexError(f"stack: dimension out of range (expected [{-nd}, {nd - 1}], got {dim})")
    d = dim % nd
    ts = [unsqueeze(x, d) for x in tensors]
    return _Copy.apply(ts[0]) if len(ts) == 1 else Cat.apply(*ts, dim=d)


def hstack(tensors) -> Tensor:
    """Concatenate along dim 1 (dim 0 for 1-d tensors)."""
    ts = _common(atleast_1d(list(tensors)), "hstack")
    return cat(ts, 0 if ts[0]._data.ndim == 1 else 1)


def vstack(tensors) -> Tensor:
    """Concatenate along dim 0 after viewing each tensor as at least 2-d."""
    return cat(atleast_2d(list(tensors)), 0)


row_stack = vstack


def dstack(tensors) -> Tensor:
    """Concatenate along dim 2 after viewing each tensor as at least 3-d."""
    return cat(atleast_3d(list(tensors)), 2)


def column_stack(tensors) -> Tensor:
    """Stack 0/1-d tensors as columns (n -> (n, 1)) and concatenate along dim 1."""
    return cat([reshape(x, x._data.size, 1) if x._data.ndim <= 1 else x for x in tensors], 1)


# ------------------------------------------------------------------ at-least views, grids (views)
def atleast_1d(*tensors):
    """Each tensor viewed with at least 1 dim (a tuple when given several)."""
    out = [reshape(x, 1) if x._data.ndim == 0 else x for x in _seq(tensors)]
    return out[0] if len(out) == 1 and isinstance(tensors[0], Tensor) else tuple(out)


def atleast_2d(*tensors):
    """Each tensor viewed with at least 2 dims (new dims in front)."""
    out = [
        reshape(x, (1,) * (2 - x._data.ndim) + x._data.shape) if x._data.ndim < 2 else x
        for x in _seq(tensors)
    ]
    return out[0] if len(out) == 1 and isinstance(tensors[0], Tensor) else tuple(out)


def atleast_3d(*tensors):
    """Each tensor viewed with at least 3 dims: (n,) -> (1, n, 1), (m, n) -> (m, n, 1)."""

    def f(x):
        s = x._data.shape
        return (
            reshape(x, {0: (1, 1, 1), 1: (1,) + s + (1,), 2: s + (1,)}[len(s)]) if len(s) < 3 else x
        )

    out = [f(x) for x in _seq(tensors)]
    return out[0] if len(out) == 1 and isinstance(tensors[0], Tensor) else tuple(out)


def _seq(tensors) -> list:
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        return list(tensors[0])
    return list(tensors)


def meshgrid(*tensors, indexing: str = "ij") -> tuple:
    """Coordinate grids (expanded views) of 1-d tensors; indexing 'ij' (matrix) or 'xy' (x, y)."""
    ts = [reshape(x, -1) for x in _seq(tensors)]
    if indexing not in ("ij", "xy"):
        raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    if not ts:
        raise ShapeError("meshgrid expects a non-empty list of tensors")
    n = len(ts)
    swap = indexing == "xy" and n >= 2
    sizes = [x._data.shape[0] for x in ts]
    if swap:
        sizes[0], sizes[1] = sizes[1], sizes[0]
    out = []
    for i, x in enumerate(ts):
        pos = (1 - i if i < 2 else i) if swap else i
        shape = [1] * n
        shape[pos] = x._data.shape[0]
        out.append(expand(reshape(x, tuple(shape)), tuple(sizes)))
    return tuple(out)


__all__ = [
    "cat", "concat", "concatenate", "stack", "hstack", "vstack", "row_stack", "dstack",
    "column_stack", "atleast_1d", "atleast_2d", "atleast_3d", "meshgrid",
]  # fmt: skip
