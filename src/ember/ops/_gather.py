"""Gather and scatter by index tensors: gather, scatter, scatter_add, scatter_reduce,
index_select/add/copy/fill, take, take_along_dim, one_hot and embedding.

Re-exported by ember.ops.index. Index values are checked (IndexOutOfRangeError, an IndexError,
with the bad value; negative ones only where torch takes them: index_fill, take, take_along_dim,
put) and must be integer tensors (DTypeError otherwise). Gathers use Index from ember.ops._view, whose
backward accumulates repeated indices.
"""

from __future__ import annotations

import numpy as np

from ember import dtypes as _dt
from ember.autograd import Function, meta_array
from ember.device import META
from ember.errors import DeviceError, DTypeError, ShapeError, UnsupportedError
from ember.ops._util import IndexOutOfRangeError, acc_dtype, as_tensor_like, cast, wrap_dim
from ember.ops._view import Index, expand, reshape
from ember.tensor import Tensor


# ------------------------------------------------------------------ gather / scatter
def _int_index(index, op: str, like: Tensor) -> np.ndarray:
    if not isinstance(index, Tensor):
        index = as_tensor_like(index, like)
    if index._device is not like._device:
        raise DeviceError(f"{op}: index on {index._device}, input on {like._device}")
    arr = index._data
    if arr.dtype.kind not in "iu" or arr.dtype == np.uint8:
        raise DTypeError(
            f"{op}: expected an integer (int64 or int32) index tensor, got {index.dtype}"
        )
    return arr


def _bounds(
    arr: np.ndarray, n: int, dim: int, op: str, like: Tensor, negative: bool = False
) -> None:
    """Index values must lie in [0, n), or in [-n, n) where the op wraps negatives (as torch)."""
    lo = -n if negative else 0
    if like._device is not META and arr.size and (arr.min() < lo or arr.max() >= n):
        bad = arr[(arr < lo) | (arr >= n)].flat[0]
        raise IndexOutOfRangeError(
            f"{op}: index {bad} is out of bounds for dimension {dim} with size {n}"
            + ("" if negative or bad >= 0 else f" ({op} takes no negative indices, as in torch)")
        )


def _along(idx: np.ndarray, dim: int) -> tuple:
    """A full advanced index that picks idx[..., i, ...] along dim and the identity elsewhere."""
    nd = idx.ndim
    out = []
    for d in range(nd):
        if d == dim:
            out.append(idx)
        else:
            s = [1] * nd
            s[d] = idx.shape[d]
            out.append(np.arange(idx.shape[d]).reshape(s))
    return tuple(out)


def _scatter_prep(input: Tensor, dim: int, index, op: str, src=None):
    nd = input._data.ndim
    x = input
    if nd == 0:
        x = reshape(input, 1)
    d = wrap_dim(dim, max(nd, 1))
    idx = _int_index(index, op, input)
    if idx.ndim == 0:
        idx = idx.reshape(1)
    if idx.ndim != x._data.ndim:
        raise ShapeError(f"{op}: index ({idx.ndim}-d) must have as many dims as the input ({nd}-d)")
    for i, (a, b) in enumerate(zip(idx.shape, x._data.shape)):
        if i != d and a > b:
            raise ShapeError(
                f"{op}: size does not match at dimension {i}: expected index "
                f"{list(idx.shape)} to be no "
                f"larger than input {list(x._data.shape)} apart from dimension {d}"
            )
        if src is not None and a > src._data.shape[i]:
            raise ShapeError(
                f"{op}: expected index {list(idx.shape)} to be no larger than src {list(src.shape)}"
            )
    _bounds(idx, x._data.shape[d], d, op, input)
    return x, d, idx, nd == 0


def gather(input: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    """out[i][j][k] = input[index[i][j][k]][j][k] (for dim 0): values picked along dim."""
    x, d, idx, zd = _scatter_prep(input, dim, index, "gather")
    out = Index.apply(x, idx=_along(idx, d), basic=False)
    return reshape(out, ()) if zd and index.ndim == 0 else out


class Scatter(Function):
    """x with src (a tensor) or value written (or reduced) at index along dim."""

    def forward(self, x, *src, idx, value=None, reduce=None):
        self.idx, self.reduce, self.sshape = idx, reduce, src[0].shape if src else None
        val = src[0][tuple(slice(0, s) for s in _idx_shape(idx))] if src else value
        out = x.copy()
        if reduce is None:
            out[idx] = val
        elif reduce == "add":
            np.add.at(out, idx, np.broadcast_to(val, _idx_shape(idx)))
        else:
            np.multiply.at(out, idx, np.broadcast_to(val, _idx_shape(idx)))
        return out

    def meta(self, x, *src, idx, value=None, reduce=None):
        return x.shape, x.dtype

    def backward(self, g):
        if self.reduce == "multiply":
            raise UnsupportedError(
                "scatter(reduce='multiply') has no gradient; use scatter_reduce('prod')"
            )
        gx = gs = None
        if self.needs_input_grad[0]:
            gx = g
            if self.reduce is None:
                gx = g.copy()
                gx[self.idx] = 0
        if self.sshape is not None and self.needs_input_grad[1]:
            gs = np.zeros(self.sshape, g.dtype)
            gs[tuple(slice(0, s) for s in _idx_shape(self.idx))] = g[self.idx]
        return (gx, gs) if self.sshape is not None else gx


def _idx_shape(idx: tuple) -> tuple:
    return np.broadcast_shapes(*(a.shape for a in idx))


def scatter(
    input: Tensor, dim: int, index: Tensor, src=None, value=None, *, reduce: str | None = None
) -> Tensor:
    """Write src (a tensor) or value (a number) into a copy of input at index along dim.

    reduce='add' or 'multiply' combines with the existing values instead of overwriting.
    """
    if src is not None and not isinstance(src, Tensor):
        src, value = None, src
    if src is None and value is None:
        raise ShapeError("scatter: expected src (a tensor) or value (a number)")
    if reduce not in (None, "add", "multiply"):
        raise ValueError(f"scatter: reduce must be 'add' or 'multiply', got {reduce!r}")
    if isinstance(value, Tensor):
        value = value.item()
    if src is not None and src._data.dtype != input._data.dtype:
        src = cast(src, input.dtype)
    x, d, idx, zd = _scatter_prep(
        input, dim, index, "scatter", src if src is None else _atleast1(src)
    )
    full = _along(idx, d)
    if src is not None:
        s = _atleast1(src)
        out = Scatter.apply(x, s, idx=full, reduce=reduce)
    else:
        out = Scatter.apply(
            x, idx=full, value=np.asarray(value).astype(x._data.dtype), reduce=reduce
        )
    return reshape(out, ()) if zd else out


def _atleast1(t: Tensor) -> Tensor:
    return reshape(t, 1) if t._data.ndim == 0 else t


def scatter_add(input: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """A copy of input with src added at index along dim (repeated indices add up)."""
    return scatter(input, dim, index, src, reduce="add")


class ScatterReduce(Function):
    """Reduce src into a copy of x at index along dim: sum, prod, mean, amax or amin."""

    def forward(self, x, s, idx, reduce, include_self):
        shp = _idx_shape(idx)
        self.sshape_full = s.shape
        s = s[tuple(slice(0, k) for k in shp)]
        self.idx, self.reduce, self.incl, self.sshape, self.shp = (
            idx,
            reduce,
            include_self,
            None,
            shp,
        )
        lo = x.dtype in _dt.HALF_FLOATS
        xa, sa = (x.astype(np.float32), s.astype(np.float32)) if lo else (x, s)
        out = xa.copy()
        touched = np.zeros(x.shape, bool)
        touched[idx] = True
        if not include_self:
            init = {"sum": 0, "mean": 0, "prod": 1}.get(reduce)
            if init is None:
                init = _extreme(xa.dtype, reduce == "amax")
            out[touched] = init
        if reduce in ("sum", "mean"):
            np.add.at(out, idx, sa)
        elif reduce == "prod":
            np.multiply.at(out, idx, sa)
        else:
            (np.maximum if reduce == "amax" else np.minimum).at(out, idx, sa)
        count = None
        if reduce == "mean":
            count = np.zeros(x.shape, np.int64)
            np.add.at(count, idx, 1)
            count = count + (1 if include_self else 0)
            count = np.maximum(count, 1)
            if out.dtype.kind in "iu":
                out = np.floor_divide(out, count).astype(out.dtype)
            else:
                out = (out / count).astype(out.dtype)
        self.xa, self.sa, self.out, self.count, self.touched = xa, sa, out, count, touched
        return out.astype(x.dtype, copy=False)

    def meta(self, x, s, idx, reduce, include_self):
        return x.shape, x.dtype

    def backward(self, g):
        dt, idx, r = g.dtype, self.idx, self.reduce
        g = g.astype(acc_dtype(dt), copy=False)
        keep = np.ones(g.shape, g.dtype) if self.incl else (~self.touched).astype(g.dtype)
        if r == "sum":
            gx, gs = g * np.where(self.touched, keep, 1), g[idx]
        elif r == "mean":
            gc = g / self.count
            gx, gs = np.where(self.touched, gc * keep, g), gc[idx]
        elif r in ("amax", "amin"):
            out = self.out
            hit_x = (self.xa == out) & self.touched & bool(self.incl)
            hit_s = self.sa == out[idx]
            n = hit_x.astype(g.dtype)
            np.add.at(n, idx, hit_s.astype(g.dtype))
            gn = g / np.maximum(n, 1)
            gx = np.where(self.touched, gn * hit_x, g)
            gs = gn[idx] * hit_s
        else:
            gx, gs = self._prod_grad(g)
        full = np.zeros(self.sshape_full, g.dtype)
        full[tuple(slice(0, k) for k in self.shp)] = gs
        return gx.astype(dt, copy=False), full.astype(dt, copy=False)

    def _prod_grad(self, g):
        xa, sa, idx = self.xa, self.sa, self.idx
        # product of the non-zero factors and the number of zero factors at each output position
        xin = xa if self.incl else np.ones_like(xa)
        nzp = np.where(xin == 0, 1, xin).astype(g.dtype)
        zc = (xin == 0).astype(np.int64)
        np.multiply.at(nzp, idx, np.where(sa == 0, 1, sa))
        np.add.at(zc, idx, (sa == 0).astype(np.int64))

        def grad_for(v, nzp_v, zc_v):
            with np.errstate(divide="ignore", invalid="ignore"):
                others = np.where(
                    v == 0, np.where(zc_v == 1, nzp_v, 0), np.where(zc_v == 0, nzp_v / v, 0)
                )
            return others

        gx = g * grad_for(xin, nzp, zc)
        if not self.incl:
            gx = np.where(self.touched, 0, g)
        else:
            gx = np.where(self.touched, gx, g)
        gs = g[idx] * grad_for(sa, nzp[idx], zc[idx])
        return gx, gs


def _extreme(dt: np.dtype, low: bool):
    if dt.kind == "f":
        return -np.inf if low else np.inf
    info = np.iinfo(dt)
    return info.min if low else info.max


def scatter_reduce(
    input: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *, include_self: bool = True
) -> Tensor:
    """Reduce src into a copy of input at index along dim; reduce: sum, prod, mean, amax, amin."""
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
        raise ValueError(
            f"scatter_reduce: reduce must be sum, prod, mean, amax or amin, got {reduce!r}"
        )
    if src._data.dtype != input._data.dtype:
        src = cast(src, input.dtype)
    x, d, idx, zd = _scatter_prep(input, dim, index, "scatter_reduce", _atleast1(src))
    s = _atleast1(src)
    out = ScatterReduce.apply(x, s, idx=_along(idx, d), reduce=reduce, include_self=include_self)
    return reshape(out, ()) if zd else out


# ------------------------------------------------------------------ index_* along one dim
def _dim_index(input: Tensor, dim: int, index, op: str, negative: bool = False):
    nd = input._data.ndim
    d = wrap_dim(dim, max(nd, 1))
    idx = _int_index(index, op, input)
    if idx.ndim > 1:
        raise IndexError(f"{op}(): index is supposed to be a vector, got shape {list(idx.shape)}")
    idx = idx.reshape(-1)
    n = input._data.shape[d] if nd else 1
    _bounds(idx, n, d, op, input, negative)
    return d, idx


def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor:
    """The slices of input at the (1-d) index along dim."""
    d, idx = _dim_index(input, dim, index, "index_select")
    if input._data.ndim == 0:
        if idx.size != 1:
            raise IndexError(
                f"index_select(): index to a 0-d tensor can have only 1 value, got {idx.size}"
            )
        return Index.apply(input, idx=(Ellipsis,), basic=True)
    return Index.apply(input, idx=(slice(None),) * d + (idx,), basic=False)


class IndexAlong(Function):
    """index_add / index_copy / index_fill: write or add source slices at index along a dim."""

    def forward(self, x, *src, d, idx, mode, alpha=1, value=None):
        self.at, self.mode, self.alpha = (slice(None),) * d + (idx,), mode, alpha
        self.has_src = bool(src)
        out = x.copy()
        if mode == "add":
            np.add.at(out, self.at, src[0] * alpha if alpha != 1 else src[0])
        elif mode == "copy":
            out[self.at] = src[0]
        else:
            out[self.at] = src[0] if src else value
        return out

    def meta(self, x, *src, **kw):
        return x.shape, x.dtype

    def backward(self, g):
        gx = gs = None
        if self.needs_input_grad[0]:
            gx = g
            if self.mode != "add":
                gx = g.copy()
                gx[self.at] = 0
        if self.has_src and self.needs_input_grad[1]:
            if self.mode == "fill":
                gs = np.asarray(g[self.at].sum(), g.dtype)
            else:
                gs = g[self.at] * self.alpha if self.alpha != 1 else g[self.at]
        return (gx, gs) if self.has_src else gx


def _src_check(input: Tensor, d: int, idx: np.ndarray, source: Tensor, op: str) -> Tensor:
    want = input._data.shape[:d] + (idx.size,) + input._data.shape[d + 1 :]
    if source._data.shape != want and source._data.size == idx.size and input._data.ndim <= 1:
        source = reshape(source, want)
    if source._data.shape != want:
        raise ShapeError(
            f"{op}: source shape {list(source.shape)} does not match the expected {list(want)}"
        )
    return source if source._data.dtype == input._data.dtype else cast(source, input.dtype)


def index_add(input: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha=1) -> Tensor:
    """A copy of input with alpha * source added at index along dim (repeats add up)."""
    d, idx = _dim_index(input, dim, index, "index_add")
    x = _atleast1(input)
    source = _src_check(x, d, idx, source, "index_add")
    out = IndexAlong.apply(x, source, d=d, idx=idx, mode="add", alpha=alpha)
    return reshape(out, ()) if input._data.ndim == 0 else out


def index_copy(input: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    """A copy of input with source's slices copied to index along dim."""
    d, idx = _dim_index(input, dim, index, "index_copy")
    x = _atleast1(input)
    source = _src_check(x, d, idx, source, "index_copy")
    out = IndexAlong.apply(x, source, d=d, idx=idx, mode="copy")
    return reshape(out, ()) if input._data.ndim == 0 else out


def index_fill(input: Tensor, dim: int, index: Tensor, value) -> Tensor:
    """A copy of input with the slices at index along dim set to value (a number or 0-d tensor)."""
    d, idx = _dim_index(input, dim, index, "index_fill", negative=True)  # torch wraps here
    x = _atleast1(input)
    if isinstance(value, Tensor):
        if value._data.ndim:
            raise ShapeError(
                f"index_fill: value must be a 0-d tensor, got shape {list(value.shape)}"
            )
        v = value if value._data.dtype == x._data.dtype else cast(value, x.dtype)
        out = IndexAlong.apply(x, v, d=d, idx=idx, mode="fill")
    else:
        out = IndexAlong.apply(
            x, d=d, idx=idx, mode="fill", value=np.asarray(value).astype(x._data.dtype)
        )
    return reshape(out, ()) if input._data.ndim == 0 else out


# ------------------------------------------------------------------ flat take / put
def take(input: Tensor, index: Tensor) -> Tensor:
    """input viewed as 1-d, picked at index (the result has index's shape)."""
    idx = _int_index(index, "take", input)
    n = input._data.size
    if input._device is not META and idx.size and (idx.min() < -n or idx.max() >= n):
        bad = idx[(idx < -n) | (idx >= n)].flat[0]
        raise IndexOutOfRangeError(
            f"take: out of range: tried to access index {bad} on a tensor of {n} elements"
        )
    return Index.apply(reshape(input, -1), idx=(idx,), basic=False)


def take_along_dim(input: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
    """Gather along dim, input and indices broadcast over the other dims (None: flattened)."""
    if dim is None:
        return take(reshape(input, -1), reshape(indices, -1))
    nd = input._data.ndim
    d = wrap_dim(dim, nd)
    if indices._data.ndim != nd:
        raise ShapeError(
            f"take_along_dim: input ({nd}-d) and indices ({indices._data.ndim}-d) "
            "need the same number of dims"
        )
    xs, ishape = list(input._data.shape), list(indices._data.shape)
    xs[d] = ishape[d] = 1
    try:
        b = list(np.broadcast_shapes(tuple(xs), tuple(ishape)))
    except ValueError:
        raise ShapeError(
            f"take_along_dim: shapes {list(input.shape)} and {list(indices.shape)} "
            f"do not broadcast apart from dim {d}"
        ) from None
    bx, bi = list(b), list(b)
    bx[d], bi[d] = input._data.shape[d], indices._data.shape[d]
    # torch wraps negative indices here (not in gather): check [-n, n), then make them positive
    n, idx = input._data.shape[d], _int_index(indices, "take_along_dim", input)
    _bounds(idx, n, d, "take_along_dim", input, negative=True)
    if input._device is not META and idx.size and idx.min() < 0:
        indices = Tensor._wrap(np.where(idx < 0, idx + n, idx), indices._device)
    return gather(expand(input, tuple(bx)), d, expand(indices, tuple(bi)))


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """int64 one-hot encoding: shape (*tensor.shape, num_classes); num_classes=-1 infers max + 1."""
    a = tensor._data
    if a.dtype.kind not in "iu":
        raise DTypeError(f"one_hot is only applicable to integer index tensors, got {tensor.dtype}")
    if tensor._device is META:
        if num_classes < 0:
            raise UnsupportedError(
                "one_hot(num_classes=-1) on the meta device: the size depends on data"
            )
        return Tensor._wrap(meta_array(a.shape + (num_classes,), np.int64), META)
    if num_classes < 0:
        if a.size == 0:
            raise ShapeError("one_hot: can not infer the number of classes from an empty tensor")
        num_classes = int(a.max()) + 1
    if a.size and a.min() < 0:
        raise ShapeError("one_hot: class values must be non-negative")
    if a.size and a.max() >= num_classes:
        raise ShapeError(
            f"one_hot: class values must be smaller than num_classes ({num_classes}), "
            f"got {int(a.max())}"
        )
    out = (a[..., None] == np.arange(num_classes)).astype(np.int64)
    return Tensor._wrap(out, tensor._device)


class Embedding(Function):
    """weight[idx] (rows), with a sort-and-reduce backward; padding_idx rows get no gradient."""

    def forward(self, w, idx, padding_idx, scale):
        self.idx, self.shape, self.pad, self.scale = idx, w.shape, padding_idx, scale
        return np.take(w, idx, axis=0)

    def meta(self, w, idx, padding_idx, scale):
        return idx.shape + w.shape[1:], w.dtype

    def backward(self, g):
        flat = self.idx.reshape(-1)
        gw = np.zeros(self.shape, acc_dtype(g.dtype))
        if flat.size:
            rows = g.reshape(flat.size, -1)
            order = np.argsort(flat, kind="stable")
            s = flat[order]
            uniq, start = np.unique(s, return_index=True)
            sums = np.add.reduceat(rows[order].astype(gw.dtype, copy=False), start, axis=0)
            if self.scale:
                counts = np.diff(np.append(start, s.size))
                sums = sums / counts[:, None]
            gw.reshape(self.shape[0], -1)[uniq] = sums
            if self.pad is not None:
                gw[self.pad] = 0
        return gw.astype(g.dtype, copy=False)


def embedding(
    input: Tensor,
    weight: Tensor,
    padding_idx: int | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Tensor:
    """torch.nn.functional.embedding: rows of weight picked by the integer tensor input."""
    if weight._data.ndim != 2:
        raise ShapeError(
            f"embedding: weight must be 2-d (num_embeddings, dim), got shape {list(weight.shape)}"
        )
    idx = _int_index(input, "embedding", weight)
    n = weight._data.shape[0]
    if weight._device is not META and idx.size and (idx.min() < 0 or idx.max() >= n):
        bad = idx[(idx < 0) | (idx >= n)].flat[0]
        raise IndexError(f"embedding: index {bad} is out of range for {n} embeddings")
    if padding_idx is not None:
        if not -n <= padding_idx < n:
            raise IndexError(
                f"embedding: padding_idx {padding_idx} must be within num_embeddings ({n})"
            )
        padding_idx %= n
    if max_norm is not None and weight._device is not META and idx.size:
        rows = np.unique(idx)
        w = weight._data
        norms = np.linalg.norm(w[rows].astype(np.float64), ord=norm_type, axis=1)
        big = norms > max_norm
        w[rows[big]] = (w[rows[big]] * (max_norm / (norms[big] + 1e-7))[:, None]).astype(w.dtype)
    return Embedding.apply(weight, idx=idx, padding_idx=padding_idx, scale=scale_grad_by_freq)


__all__ = [
    "gather", "scatter", "scatter_add", "scatter_reduce", "index_select", "index_add",
    "index_copy", "index_fill", "take", "take_along_dim", "one_hot",
]  # fmt: skip
