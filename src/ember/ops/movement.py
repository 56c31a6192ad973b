"""Movement ops: reshape, view, permute, transpose, expand, squeeze, cat, stack, ...

Views share memory with their input as in PyTorch (numpy views underneath).
"""

from __future__ import annotations

import numpy as np

from ember.autograd import Function
from ember.errors import ShapeError
from ember.ops._util import coerce, shape_arg, wrap_dim
from ember.tensor import Tensor


class Reshape(Function):
    """Reshape (a view when the strides allow it, else a copy)."""

    def forward(self, x, shape):
        self.shape = x.shape
        return x.reshape(shape)

    def backward(self, g):
        return g.reshape(self.shape)


class View(Reshape):
    """Reshape that refuses to copy (as torch.Tensor.view)."""

    def forward(self, x, shape):
        self.shape = x.shape
        y = x.view()
        try:
            y.shape = shape
        except AttributeError:
            raise ShapeError(
                f"view: size {shape} is not compatible with input's size and stride {x.shape}; "
                "use reshape (or .contiguous().view)"
            ) from None
        return y


def _infer(shape: tuple, numel: int, op: str, src: tuple) -> tuple:
    if shape.count(-1) > 1:
        raise ShapeError(f"{op}: only one dimension can be inferred, got {shape}")
    if -1 in shape:
        rest = 1
        for s in shape:
            if s != -1:
                rest *= s
        if rest == 0 or numel % rest:
            raise ShapeError(f"{op}: shape {list(shape)} is invalid for input of size {numel} (shape {list(src)})")
        shape = tuple(numel // rest if s == -1 else s for s in shape)
    n = 1
    for s in shape:
        if s < 0:
            raise ShapeError(f"{op}: invalid shape dimension {s} in {list(shape)}")
        n *= s
    if n != numel:
        raise ShapeError(f"{op}: shape {list(shape)} is invalid for input of size {numel} (shape {list(src)})")
    return shape


def reshape(input: Tensor, *shape) -> Tensor:
    """The same elements in a new shape (one dim may be -1)."""
    shape = _infer(shape_arg(shape), input._data.size, "reshape", input._data.shape)
    if shape == input._data.shape:
        return input
    return Reshape.apply(input, shape=shape)


def view(input: Tensor, *shape) -> Tensor:
    """Reshape without copying; ShapeError when the strides do not allow it. view(dtype) reinterprets."""
    if len(shape) == 1 and not isinstance(shape[0], (tuple, list, int)):
        from ember import dtypes as _dt

        dt = _dt.get_dtype(shape[0])
        return Tensor._wrap(input._data.view(dt.np), input._device)
    shape = _infer(shape_arg(shape), input._data.size, "view", input._data.shape)
    return View.apply(input, shape=shape)


def view_as(input: Tensor, other: Tensor) -> Tensor:
    """View input with other's shape."""
    return view(input, other.shape)


def reshape_as(input: Tensor, other: Tensor) -> Tensor:
    """Reshape input to other's shape."""
    return reshape(input, other.shape)


class Permute(Function):
    """Reorder dimensions (a view)."""

    def forward(self, x, dims):
        self.inv = tuple(np.argsort(dims))
        return x.transpose(dims)

    def backward(self, g):
        return g.transpose(self.inv)


def permute(input: Tensor, *dims) -> Tensor:
    """Reorder dimensions; a view."""
    nd = input._data.ndim
    dims = tuple(wrap_dim(d, nd) for d in shape_arg(dims))
    if sorted(dims) != list(range(nd)):
        raise ShapeError(f"permute: dims {dims} are not a permutation of the {nd} dimensions of {tuple(input.shape)}")
    return Permute.apply(input, dims=dims)


def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:
    """Swap two dimensions; a view."""
    nd = input._data.ndim
    if nd == 0:
        return input
    d0, d1 = wrap_dim(dim0, nd), wrap_dim(dim1, nd)
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
    dst = [wrap_dim(d, nd) for d in ((destination,) if isinstance(destination, int) else destination)]
    order = [n for n in range(nd) if n not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return Permute.apply(input, dims=tuple(order))


moveaxis = movedim


class Expand(Function):
    """Broadcast to a larger shape (a read-only view with zero strides)."""

    def forward(self, x, shape):
        self.shape = x.shape
        return np.broadcast_to(x, shape)

    def backward(self, g):
        from ember.autograd import unbroadcast

        return unbroadcast(g, self.shape)


def expand(input: Tensor, *sizes) -> Tensor:
    """Broadcast singleton dims to sizes (-1 keeps a dim); a view."""
    sizes = shape_arg(sizes)
    src = input._data.shape
    if len(sizes) < len(src):
        raise ShapeError(f"expand: the number of sizes {len(sizes)} must be >= the tensor's dims {len(src)}")
    off = len(sizes) - len(src)
    shape = []
    for i, s in enumerate(sizes):
        cur = src[i - off] if i >= off else None
        if s == -1:
            if cur is None:
                raise ShapeError("expand: -1 is not allowed in a new leading dimension")
            s = cur
        if cur is not None and cur != 1 and cur != s:
            raise ShapeError(f"expand: size {cur} at dim {i - off} can't expand to {s} (shape {list(src)} -> {list(sizes)})")
        shape.append(s)
    shape = tuple(shape)
    if shape == src:
        return input
    return Expand.apply(input, shape=shape)


def expand_as(input: Tensor, other: Tensor) -> Tensor:
    """Expand to other's shape."""
    return expand(input, other.shape)


def broadcast_to(input: Tensor, shape) -> Tensor:
    """Expand to shape (torch.broadcast_to)."""
    return expand(input, tuple(shape))


def broadcast_tensors(*tensors: Tensor) -> list[Tensor]:
    """Expand tensors to their common broadcast shape."""
    try:
        shape = np.broadcast_shapes(*(t._data.shape for t in tensors))
    except ValueError:
        raise ShapeError(f"broadcast_tensors: shapes {[tuple(t.shape) for t in tensors]} do not broadcast") from None
    return [expand(t, shape) for t in tensors]


def squeeze(input: Tensor, dim=None) -> Tensor:
    """Remove size-1 dimensions (all, or those in dim); a view."""
    shape = input._data.shape
    if dim is None:
        new = tuple(s for s in shape if s != 1)
    else:
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        drop = {wrap_dim(d, len(shape)) for d in dims} if shape else set()
        new = tuple(s for i, s in enumerate(shape) if not (i in drop and s == 1))
    if new == shape:
        return input
    return Reshape.apply(input, shape=new)


def unsqueeze(input: Tensor, dim: int) -> Tensor:
    """Insert a size-1 dimension at dim; a view."""
    nd = input._data.ndim
    if not -nd - 1 <= dim <= nd:
        raise IndexError(f"unsqueeze: dimension out of range (expected to be in range of [{-nd - 1}, {nd}], but got {dim})")
    d = dim % (nd + 1)
    shape = input._data.shape
    return Reshape.apply(input, shape=shape[:d] + (1,) + shape[d:])


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dims start_dim..end_dim into one."""
    shape = input._data.shape
    if not shape:
        return reshape(input, 1)
    s, e = wrap_dim(start_dim, len(shape)), wrap_dim(end_dim, len(shape))
    if s > e:
        raise ShapeError("flatten: start_dim cannot come after end_dim")
    n = 1
    for v in shape[s : e + 1]:
        n *= v
    return reshape(input, shape[:s] + (n,) + shape[e + 1 :])


def unflatten(input: Tensor, dim: int, sizes) -> Tensor:
    """Split dim into sizes (one may be -1)."""
    shape = input._data.shape
    d = wrap_dim(dim, len(shape))
    sizes = _infer(tuple(sizes), shape[d], "unflatten", shape)
    return reshape(input, shape[:d] + sizes + shape[d + 1 :])


class Contiguous(Function):
    """A C-contiguous copy (or the input when already contiguous)."""

    def forward(self, x):
        return np.array(x, order="C", copy=True)

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

    def backward(self, g):
        return g


def clone(input: Tensor, memory_format=None) -> Tensor:
    """A copy of input with its own memory (gradients flow through)."""
    return Clone.apply(input)


class Cat(Function):
    """Concatenate along a dim."""

    def forward(self, *xs, dim):
        self.dim = dim
        self.sizes = [x.shape[dim] for x in xs]
        return np.concatenate(xs, axis=dim)

    def backward(self, g):
        idx = np.cumsum(self.sizes)[:-1]
        return tuple(np.split(g, idx, axis=self.dim))


def _common(tensors, op: str) -> list:
    if len(tensors) == 0:
        raise ShapeError(f"{op}: expected a non-empty list of tensors")
    tensors = list(tensors)
    first = tensors[0]
    for i in range(1, len(tensors)):
        if tensors[i]._data.dtype != first._data.dtype:
            a, b = coerce(first, tensors[i])
            tensors = [t if t._data.dtype == a._data.dtype else coerce(t, a)[0] for t in tensors]
            first = tensors[0]
    return tensors


def cat(tensors, dim: int = 0) -> Tensor:
    """Concatenate tensors along an existing dim."""
    tensors = _common(tensors, "cat")
    tensors = [t for t in tensors if not (t._data.ndim == 1 and t._data.shape[0] == 0)] or tensors[:1]
    nd = tensors[0]._data.ndim
    if nd == 0:
        raise ShapeError("cat: zero-dimensional tensors cannot be concatenated")
    d = wrap_dim(dim, nd)
    ref = tensors[0]._data.shape
    for t in tensors[1:]:
        s = t._data.shape
        if len(s) != nd or s[:d] + s[d + 1 :] != ref[:d] + ref[d + 1 :]:
            raise ShapeError(f"cat: sizes of tensors must match except in dim {d}: got {list(ref)} and {list(s)}")
    if len(tensors) == 1:
        return clone(tensors[0])
    return Cat.apply(*tensors, dim=d)


concat = concatenate = cat


def stack(tensors, dim: int = 0) -> Tensor:
    """Stack same-shape tensors along a new dim."""
    tensors = _common(tensors, "stack")
    ref = tensors[0]._data.shape
    for t in tensors[1:]:
        if t._data.shape != ref:
            raise ShapeError(f"stack expects each tensor to be equal size, got {list(ref)} and {list(t.shape)}")
    nd = len(ref) + 1
    if not -nd <= dim < nd:
        raise IndexError(f"stack: dimension out of range (expected [{-nd}, {nd - 1}], got {dim})")
    d = dim % nd
    return cat([unsqueeze(t, d) for t in tensors], d)


__all__ = [
    "reshape", "view", "view_as", "reshape_as", "permute", "transpose", "swapaxes", "swapdims", "t",
    "movedim", "moveaxis", "expand", "expand_as", "broadcast_to", "broadcast_tensors", "squeeze",
    "unsqueeze", "flatten", "unflatten", "contiguous", "clone", "cat", "concat", "concatenate", "stack",
]  # fmt: skip

METHODS = {
    n: globals()[n]
    for n in ["reshape", "view", "view_as", "reshape_as", "permute", "transpose", "swapaxes", "swapdims",
              "t", "movedim", "moveaxis", "expand", "expand_as", "broadcast_to", "squeeze", "unsqueeze",
              "flatten", "unflatten", "contiguous", "clone"]
}  # fmt: skip
