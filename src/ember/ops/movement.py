"""Movement ops: reshape, view, permute, expand, squeeze, narrow, select, split, diagonal, ...

Views share memory with their input as in PyTorch (numpy views underneath). Ops that copy in
PyTorch live beside this module and are re-exported here: _rearrange (flip, roll, repeat, pad,
tril, diag, ...) and _join (cat, stack, hstack, ...).
"""

from __future__ import annotations

import operator
import weakref

import numpy as np

from ember import autograd
from ember import dtypes as _dt
from ember.autograd import Function, meta_array, unbroadcast
from ember.device import META
from ember.errors import AutogradError, ShapeError
from ember.ops import _join, _rearrange
from ember.ops._join import *  # noqa: F403  (re-exported)
from ember.ops._rearrange import *  # noqa: F403  (re-exported)
from ember.ops._rearrange import acc_dtype, diag_view
from ember.ops._util import shape_arg, wrap_dim
from ember.tensor import Tensor


def _dims_arg(dims) -> tuple:
    """Accept f(x, 0, 1), f(x, (0, 1)) and f(x, 0) alike."""
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = dims[0]
    return tuple(operator.index(d) for d in dims)


# ------------------------------------------------------------------ reshape / view
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
class Index(Function):
    """x[idx] for a prepared numpy index: a view for basic indices, a gather for advanced ones.

    The backward writes the gradient into zeros (basic, or advanced without repeats) or
    accumulates it with np.add.at (advanced indices may repeat).
    """

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


# ------------------------------------------------------------------ in-place forms
def inplace(fn):
    """The in-place method of an out-of-place op: values are written into self (views see it);
    with grad, self is rebound to the new node (see Tensor._assign)."""

    def method(self, *args, **kwargs):
        return self._assign(fn(self, *args, **kwargs))

    method.__name__ = fn.__name__ + "_"
    method.__doc__ = f"In-place {fn.__name__}."
    return method


def inplace_view(fn):
    """The in-place method of a view op (t_, transpose_, squeeze_, ...): self takes the new view."""

    def method(self, *args, **kwargs):
        if self.requires_grad and self._ctx is None and autograd.is_grad_enabled():
            raise AutogradError("a leaf tensor that requires grad is used in an in-place operation")
        out = fn(self, *args, **kwargs)
        self._data = out._data
        if out._ctx is not None:
            self._ctx = out._ctx
            self._ctx._out_ref = weakref.ref(self)
        return self

    method.__name__ = fn.__name__ + "_"
    method.__doc__ = f"In-place {fn.__name__} (self becomes the view)."
    return method


__all__ = [
    "reshape", "view", "view_as", "reshape_as", "flatten", "ravel", "unflatten", "squeeze",
    "unsqueeze", "permute", "transpose", "swapaxes", "swapdims", "t", "movedim", "moveaxis",
    "expand", "expand_as", "broadcast_to", "broadcast_shapes", "broadcast_tensors", "contiguous",
    "clone", "narrow", "select", "split", "tensor_split", "chunk", "unbind", "diagonal",
    *_rearrange.__all__, *_join.__all__,
]  # fmt: skip

METHODS = {
    n: globals()[n]
    for n in ["reshape", "view", "view_as", "reshape_as", "flatten", "ravel", "unflatten",
              "squeeze", "unsqueeze", "permute", "transpose", "swapaxes", "swapdims", "t",
              "movedim", "moveaxis", "expand", "expand_as", "broadcast_to", "contiguous", "clone",
              "narrow", "select", "split", "tensor_split", "chunk", "unbind", "diagonal"]
}  # fmt: skip
METHODS.update(_rearrange.METHODS)
METHODS.update({n + "_": inplace_view(globals()[n]) for n in
                ["t", "transpose", "swapaxes", "swapdims", "squeeze", "unsqueeze"]})  # fmt: skip
METHODS.update({n + "_": inplace(globals()[n]) for n in ["tril", "triu"]})
