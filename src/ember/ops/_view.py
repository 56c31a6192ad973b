"""The core views every movement op builds on: reshape, view, squeeze/unsqueeze, permute,
transpose, expand, and Index (x[idx] for a prepared numpy index).

They share memory with their input as in PyTorch (numpy views underneath). ember.ops.movement
re-exports them with the rest of the movement ops; _join, _rearrange and _gather use them from
here, below movement.
"""

from __future__ import annotations

import operator

import numpy as np

from ember import dtypes as _dt
from ember.autograd import Function, meta_array, unbroadcast
from ember.device import META
from ember.errors import ShapeError
from ember.ops._util import acc_dtype, shape_arg, wrap_dim
from ember.tensor import Tensor


def _dims_arg(dims) -> tuple:
    """Accept f(x, 0, 1), f(x, (0, 1)) and f(x, 0) alike."""
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = dims[0]
    return tuple(operator.index(d) for d in dims)


# ------------------------------------------------------------------ reshape / view
class Reshape(Function):
    """Reshape (a view when the strides allow it, else a copy)."""

    view = True  # the output may be a view of the input (ember.nn.graph skips those)

    def forward(self, x, shape):
        self.shape = x.shape
        return x.reshape(shape)

    def backward(self, g):
        return g.reshape(self.shape)


class View(Reshape):
    """Reshape that refuses to copy (as torch.Tensor.view)."""

    def forward(self, x, shape):
        self.shape = x.shape
        try:
            return np.reshape(x, shape, copy=False)
        except ValueError:
            raise ShapeError(
                f"view: size {list(shape)} is not compatible with the input's size and stride "
                f"(shape {list(x.shape)}); use reshape (or .contiguous().view)"
            ) from None


def _infer(shape: tuple, numel: int, op: str, src: tuple) -> tuple:
    if shape.count(-1) > 1:
        raise ShapeError(f"{op}: only one dimension can be inferred, got {list(shape)}")
    if -1 in shape:
        rest = 1
        for s in shape:
            if s != -1:
                rest *= s
        if rest == 0 or numel % rest:
            raise ShapeError(
                f"{op}: shape {list(shape)} is invalid for input of size {numel} "
                f"(shape {list(src)})"
            )
        shape = tuple(numel // rest if s == -1 else s for s in shape)
    n = 1
    for s in shape:
        if s < 0:
            raise ShapeError(f"{op}: invalid shape dimension {s} in {list(shape)}")
        n *= s
    if n != numel:
        raise ShapeError(
            f"{op}: shape {list(shape)} is invalid for input of size {numel} (shape {list(src)})"
        )
    return shape


def reshape(input: Tensor, *shape) -> Tensor:
    """The same elements in a new shape (one dim may be -1); a view when possible."""
    shape = _infer(shape_arg(shape), input._data.size, "reshape", input._data.shape)
    if shape == input._data.shape:
        return input
    return Reshape.apply(input, shape=shape)


def view(input: Tensor, *shape) -> Tensor:
    """Reshape without copying (ShapeError when strides forbid it); view(dtype) reinterprets."""
    if len(shape) == 1 and not isinstance(shape[0], (tuple, list, int, np.integer)):
        dt = _dt.get_dtype(shape[0])
        if input._device is META:
            s = input._data.shape
            n = s[-1] * input._data.itemsize // dt.itemsize if s else 0
            return Tensor._wrap(meta_array(s[:-1] + (n,) if s else s, dt.np), META)
        return Tensor._wrap(input._data.view(dt.np), input._device)
    shape = _infer(shape_arg(shape), input._data.size, "view", input._data.shape)
    return View.apply(input, shape=shape)


def view_as(input: Tensor, other: Tensor) -> Tensor:
    """View input with other's shape."""
    return view(input, other.shape)


def reshape_as(input: Tensor, other: Tensor) -> Tensor:
    """Reshape input to other's shape."""
    return reshape(input, other.shape)


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dims start_dim..end_dim into one."""
    shape = input._data.shape
    if not shape:
        return reshape(input, 1)
    s, e = wrap_dim(start_dim, len(shape)), wrap_dim(end_dim, len(shape))
    if s > e:
        raise ShapeError(f"flatten: start_dim ({start_dim}) cannot come after end_dim ({end_dim})")
    n = 1
    for v in shape[s : e + 1]:
        n *= v
    return reshape(input, shape[:s] + (n,) + shape[e + 1 :])


def ravel(input: Tensor) -> Tensor:
    """The elements as a 1-d tensor (a view when possible)."""
    return reshape(input, -1)


def unflatten(input: Tensor, dim: int, sizes) -> Tensor:
    """Split dim into sizes (one may be -1)."""
    shape = input._data.shape
    d = wrap_dim(dim, len(shape))
    sizes = _infer(tuple(sizes), shape[d], "unflatten", shape)
    return reshape(input, shape[:d] + sizes + shape[d + 1 :])


def squeeze(input: Tensor, dim=None) -> Tensor:
    """Remove size-1 dimensions (all, or those in dim); a view."""
    shape = input._data.shape
    if dim is None:
        new = tuple(s for s in shape if s != 1)
    else:
        dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
        drop = {wrap_dim(d, len(shape)) for d in dims}
        new = tuple(s for i, s in enumerate(shape) if not (i in drop and s == 1))
    if new == shape:
        return input
    return Reshape.apply(input, shape=new)


def unsqueeze(input: Tensor, dim: int) -> Tensor:
    """Insert a size-1 dimension at dim; a view."""
    nd = input._data.ndim
    if not -nd - 1 <= dim <= nd:
        raise IndexError(
            f"unsqueeze: dimension out of range (expected to be in range of [{-nd - 1}, {nd}], "
            f"but got {dim})"
        )
    d = dim % (nd + 1)
    shape = input._data.shape
    return Reshape.apply(input, shape=shape[:d] + (1,) + shape[d:])


# ------------------------------------------------------------------ permutations
class Permute(Function):
    """Reorder dimensions (a view)."""

    view = True  # the output may be a view of the input (ember.nn.graph skips those)

    def forward(self, x, dims):
        self.inv = tuple(np.argsort(dims))
        return x.transpose(dims)

    def backward(self, g):
        return g.transpose(self.inv)


def permute(input: Tensor, *dims) -> Tensor:
    """Reorder dimensions; a view."""
    nd = input._data.ndim
    dims = tuple(wrap_dim(d, nd) for d in _dims_arg(dims))
    if sorted(dims) != list(range(nd)):
        raise ShapeError(
            f"permute: dims {list(dims)} are not a permutation of the {nd} dims of shape "
            f"{list(input.shape)}"
        )
    return Permute.apply(input, dims=dims)


def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:
    """Swap two dimensions; a view."""
    nd = input._data.ndim
    d0, d1 = wrap_dim(dim0, nd), wrap_dim(dim1, nd)
    if nd == 0:
        return input
    perm = list(range(nd))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return Permute.apply(input, dims=tuple(perm))


swapaxes = swapdims = transpose


def t(input: Tensor) -> Tensor:
    """Transpose a matrix (0-d and 1-d tensors are returned as is)."""
    if input._data.ndim > 2:
        raise ShapeError(f"t() expects a tensor with <= 2 dimensions, got {input._data.ndim}")
    return transpose(input, 0, 1) if input._data.ndim == 2 else input


def movedim(input: Tensor, source, destination) -> Tensor:
    """Move dimension(s) to new positions; a view."""
    nd = input._data.ndim
    src = [wrap_dim(s, nd) for s in ((source,) if isinstance(source, int) else source)]
    dst = [
        wrap_dim(d, nd) for d in ((destination,) if isinstance(destination, int) else destination)
    ]
    if len(src) != len(dst):
        raise ShapeError(
            f"movedim: source {list(src)} and destination {list(dst)} must have the same length"
        )
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ShapeError(f"movedim: repeated dim in source {list(src)} or destination {list(dst)}")
    order = [n for n in range(nd) if n not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return Permute.apply(input, dims=tuple(order))


moveaxis = movedim


# ------------------------------------------------------------------ broadcasting views
class Expand(Function):
    """Broadcast to a larger shape (a read-only view with zero strides)."""

    view = True  # the output may be a view of the input (ember.nn.graph skips those)

    def forward(self, x, shape):
        self.shape = x.shape
        return np.broadcast_to(x, shape)

    def backward(self, g):
        return unbroadcast(g, self.shape)


def expand(input: Tensor, *sizes) -> Tensor:
    """Broadcast singleton dims to sizes (-1 keeps a dim); a view."""
    sizes = shape_arg(sizes)
    src = input._data.shape
    if len(sizes) < len(src):
        raise ShapeError(
            f"expand: the number of sizes {len(sizes)} must be >= the tensor's dims {len(src)}"
        )
    off = len(sizes) - len(src)
    shape = []
    for i, s in enumerate(sizes):
        cur = src[i - off] if i >= off else None
        if s == -1:
            if cur is None:
                raise ShapeError("expand: -1 is not allowed in a new leading dimension")
            s = cur
        if s < 0:
            raise ShapeError(f"expand: invalid size {s} in {list(sizes)}")
        if cur is not None and cur != 1 and cur != s:
            raise ShapeError(
                f"expand: size {cur} at dim {i - off} can't expand to {s} "
                f"(shape {list(src)} -> {list(sizes)})"
            )
        shape.append(s)
    shape = tuple(shape)
    if shape == src:
        return input
    return Expand.apply(input, shape=shape)


# ------------------------------------------------------------------ indexing views
class Index(Function):
    """x[idx] for a prepared numpy index: a view for basic indices, a gather for advanced ones.

    The backward writes the gradient into zeros (basic, or advanced without repeats) or
    accumulates it with np.add.at (advanced indices may repeat).
    """

    view = True  # the output may be a view of the input (ember.nn.graph skips those)

    def forward(self, x, idx, basic=True, unique=False):
        self.shape, self.dtype, self.idx, self.mode = x.shape, x.dtype, idx, basic or unique
        y = x[idx]
        if type(y) is not np.ndarray:  # all dims taken by ints: numpy copies out a scalar
            y = x[(*idx, Ellipsis)]
        return y

    def backward(self, g):
        if self.mode:
            gx = np.zeros(self.shape, g.dtype)
            gx[self.idx] = g
            return gx
        gx = np.zeros(self.shape, acc_dtype(g.dtype))
        np.add.at(gx, self.idx, g)
        return gx.astype(g.dtype, copy=False)
