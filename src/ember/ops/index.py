"""Indexing: x[idx] and x[idx] = v with PyTorch semantics, index_put, masked_*, nonzero.

getitem applies basic indices (ints, slices, None, ...) first as a view, then advanced ones
(integer/bool tensors, lists, arrays) as a gather, as torch does: an int never turns into an
advanced index (so x[0, :, [1, 2]] has shape (n1, 2), not numpy's (2, n1)). setitem writes in
place; when grad is involved it records a node and rebinds the tensor (see Tensor._assign).
Re-exported here: ember.ops._gather (gather, scatter*, index_*, take*, put, one_hot,
embedding) and ember.ops._search (sort, topk, unique, searchsorted, multinomial, ...).
"""

from __future__ import annotations

import operator

import numpy as np

from ember import autograd
from ember.autograd import Function, unbroadcast
from ember.device import META
from ember.errors import DeviceError, DTypeError, ShapeError, UnsupportedError
from ember.ops import _gather, _search
from ember.ops._gather import *  # noqa: F403  (re-exported)
from ember.ops._gather import (
    _bounds,
    _int_index,
    embedding,  # noqa: F401  (F.embedding; not ember.embedding)
)
from ember.ops._search import *  # noqa: F403  (re-exported)
from ember.ops._util import as_tensor_like, cast
from ember.ops._view import Index, expand, reshape
from ember.tensor import Tensor

_INTS = (int, np.integer)
_ALL = slice(None)
_ELL = type(Ellipsis)
_BAD_INDEX = (
    "only integers, slices (`:`), ellipsis (`...`), None and long or byte tensors are valid "
    "indices (got {})"
)


# ------------------------------------------------------------------ index parsing
def _index_array(obj, dev) -> np.ndarray:
    """A tensor / array / (nested) list used as an index, as a numpy array."""
    if isinstance(obj, Tensor):
        if obj._device is not dev and obj._device is META:
            raise DeviceError(f"indexing a {dev} tensor with a meta index tensor")
        if obj._device is META and obj._data.dtype == np.bool_:
            raise UnsupportedError(
                "boolean mask indexing on the meta device: the result shape depends on data"
            )
        return obj._data
    if isinstance(obj, np.ndarray):
        return obj
    if isinstance(obj, range):
        return np.arange(obj.start, obj.stop, obj.step)
    if any(isinstance(o, Tensor) for o in obj):
        obj = [o._data if isinstance(o, Tensor) else o for o in obj]
    try:
        arr = np.asarray(obj)
    except ValueError:
        raise IndexError(
            f"could not turn the sequence {obj!r} into an index tensor (ragged?)"
        ) from None
    if arr.size == 0 and arr.dtype.kind == "f":
        return arr.astype(np.int64)
    return arr


def _check_bounds(arr: np.ndarray, n: int, dim: int) -> None:
    if arr.size and (arr.min() < -n or arr.max() >= n):
        bad = arr[(arr < -n) | (arr >= n)].flat[0]
        raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size {n}")


def _parse(x: Tensor, index) -> tuple:
    """Split a torch index into (basic numpy index, advanced numpy index or None, unique flag)."""
    shape = x._data.shape
    nd = len(shape)
    if not isinstance(index, tuple):
        if isinstance(index, list) and any(
            isinstance(i, (slice, _ELL)) or i is None for i in index
        ):
            index = tuple(index)
        else:
            index = (index,)
    items, used, ell = [], 0, False
    for it in index:
        if it is None:
            items.append((0, None))
        elif it is Ellipsis:
            if ell:
                raise IndexError("an index can only have a single ellipsis ('...')")
            ell = True
            items.append((1, None))
        elif isinstance(it, (bool, np.bool_)):
            items.append((2, bool(it)))
        elif isinstance(it, _INTS):
            items.append((3, int(it)))
            used += 1
        elif isinstance(it, slice):
            items.append((4, it))
            used += 1
        elif isinstance(it, (Tensor, np.ndarray, list, tuple, range)):
            arr = _index_array(it, x._device)
            k = arr.dtype.kind
            if k == "b" or arr.dtype == np.uint8:
                if arr.ndim == 0:
                    items.append((2, bool(arr)))
                else:
                    items.append((5, arr.astype(bool, copy=False)))
                    used += arr.ndim
            elif k in "iu":
                if arr.ndim == 0 and not isinstance(it, (list, tuple)):
                    items.append((3, int(arr)))
                else:
                    items.append((6, arr))
                used += 1
            else:
                raise IndexError(
                    "tensors used as indices must be long, int, byte or bool tensors, "
                    f"got {arr.dtype}"
                )
        else:
            raise IndexError(_BAD_INDEX.format(type(it).__name__))
    if used > nd:
        raise IndexError(f"too many indices for tensor of dimension {nd}")
    meta = x._device is META
    basic, adv, masks = [], [], 0
    dim = rdim = 0
    for kind, p in items:
        if kind == 0:
            basic.append(None)
            rdim += 1
        elif kind == 1:
            k = nd - used
            basic += [slice(None)] * k
            dim += k
            rdim += k
        elif kind == 2:
            basic.append(None)
            if not p:
                adv.append((rdim, np.zeros(0, np.intp)))
            rdim += 1
        elif kind == 3:
            n = shape[dim]
            if not -n <= p < n:
                raise IndexError(f"index {p} is out of bounds for dimension {dim} with size {n}")
            basic.append(p + n if p < 0 else p)
            dim += 1
        elif kind == 4:
            basic.append(_slice(p))
            dim += 1
            rdim += 1
        elif kind == 5:
            k = p.ndim
            if p.shape != shape[dim : dim + k]:
                raise IndexError(
                    f"The shape of the mask {list(p.shape)} at index {dim} does not match "
                    "the shape of the "
                    f"indexed tensor {list(shape)} at index {dim}"
                )
            basic += [slice(None)] * k
            for j, a in enumerate(np.nonzero(p)):
                adv.append((rdim + j, a))
            masks += 1
            dim += k
            rdim += k
        else:
            if not meta:
                _check_bounds(p, shape[dim], dim)
            basic.append(slice(None))
            adv.append((rdim, p))
            dim += 1
            rdim += 1
    if not adv:
        return tuple(basic) or (Ellipsis,), None, False
    try:
        if len(adv) > 1:
            np.broadcast_shapes(*(a.shape for _, a in adv))
    except ValueError:
        shapes = " ".join(str(list(a.shape)) for _, a in adv)
        raise IndexError(
            f"shape mismatch: indexing tensors could not be broadcast together with shapes {shapes}"
        ) from None
    idx = [slice(None)] * (adv[-1][0] + 1)
    for r, a in adv:
        idx[r] = a
    unique = masks == 1 and all(kind != 6 for kind, _ in items)
    return tuple(basic) or (Ellipsis,), tuple(idx), unique


def _slice(s: slice) -> slice:
    step = None if s.step is None else operator.index(s.step)
    if step is not None and step <= 0:
        if step == 0:
            raise ValueError("slice step cannot be zero")
        raise ValueError(
            f"negative slice steps are not supported (got step {step}), as in torch; use flip()"
        )
    start = None if s.start is None else operator.index(s.start)
    stop = None if s.stop is None else operator.index(s.stop)
    return slice(start, stop, step)


def adv_shape(shape: tuple, idx: tuple) -> tuple:
    """The result shape of x[idx] for an index of full slices and integer arrays (numpy rules)."""
    pos = [i for i, it in enumerate(idx) if not isinstance(it, slice)]
    b = np.broadcast_shapes(*(idx[i].shape for i in pos))
    if pos == list(range(pos[0], pos[-1] + 1)):
        return tuple(shape[: pos[0]]) + b + tuple(shape[pos[-1] + 1 :])
    return b + tuple(s for i, s in enumerate(shape) if i not in pos)


def _index_meta(self, x, idx, basic=True, unique=False):
    if basic:
        return x[idx].shape, x.dtype
    return adv_shape(x.shape, idx), x.dtype


Index.meta = _index_meta


def getitem(self: Tensor, index) -> Tensor:
    """x[index] with torch semantics: basic indices give views, advanced ones gather (a copy)."""
    basic, adv, unique = _parse(self, index)
    if adv is None:
        return Index.apply(self, idx=basic, basic=True)
    out = self
    if any(b != _ALL for b in basic):  # the basic step is not the identity
        out = Index.apply(self, idx=basic, basic=True)
    return Index.apply(out, idx=adv, basic=False, unique=unique)


# ------------------------------------------------------------------ setitem / index_put
def _target_shape(arr: np.ndarray, basic: tuple, adv) -> tuple:
    v = arr[basic]
    return v.shape if adv is None else adv_shape(v.shape, adv)


def _write(out: np.ndarray, basic: tuple, adv, val, accumulate: bool = False) -> None:
    if adv is None:
        if accumulate:
            out[basic] += val
        else:
            out[basic] = val
    elif accumulate:
        np.add.at(out[basic], adv, val)
    else:
        out[basic][adv] = val


class SetItem(Function):
    """out = x with x[basic][adv] = v (or += v when accumulating); gradients to x and v."""

    def forward(self, x, *v, basic, adv, value=None, accumulate=False):
        self.basic, self.adv, self.acc = basic, adv, accumulate
        self.vshape = v[0].shape if v else None
        out = x.copy()
        _write(out, basic, adv, v[0] if v else value, accumulate)
        return out

    def meta(self, x, *v, basic, adv, value=None, accumulate=False):
        t = _target_shape(x, basic, adv)
        if v:
            _value_fits(v[0].shape, t)
        return x.shape, x.dtype

    def backward(self, g):
        gx = gv = None
        g = np.asarray(g)
        if self.needs_input_grad[0]:
            gx = g
            if not self.acc:
                gx = g.copy()
                _write(gx, self.basic, self.adv, 0)
        if self.vshape is not None and self.needs_input_grad[1]:
            sel = g[self.basic]
            if self.adv is not None:
                sel = sel[self.adv]
            gv = _reduce_to(sel, self.vshape)
        return (gx, gv) if self.vshape is not None else gx


def _reduce_to(g: np.ndarray, vshape: tuple) -> np.ndarray:
    """Sum g (the indexed shape) down to the value's shape (which may have extra leading 1s)."""
    k = len(vshape) - g.ndim
    return unbroadcast(g, vshape[k:] if k > 0 else vshape).reshape(vshape)


def _value_fits(vshape: tuple, tshape: tuple) -> None:
    core = vshape
    while len(core) > len(tshape) and core[0] == 1:
        core = core[1:]
    try:
        ok = np.broadcast_shapes(core, tshape) == tuple(tshape)
    except ValueError:
        ok = False
    if not ok:
        raise ShapeError(
            f"shape mismatch: value tensor of shape {list(vshape)} cannot be broadcast to "
            f"indexing result of shape {list(tshape)}"
        )


def _put(self: Tensor, basic: tuple, adv, value, accumulate: bool) -> Tensor:
    if isinstance(value, Tensor):
        v = value if value._data.dtype == self._data.dtype else cast(value, self.dtype)
        if v._device is not self._device:
            raise DeviceError(f"setitem: value on {v._device} for a tensor on {self._device}")
        varr = v._data
    else:
        v = None
        varr = np.asarray(value)
        if varr.dtype.kind not in "biuf" and varr.dtype.name != "bfloat16":
            raise DTypeError(f"can't assign a {type(value).__name__} to a tensor")
        varr = varr.astype(self._data.dtype)
    if autograd.is_grad_enabled() and (self.requires_grad or (v is not None and v.requires_grad)):
        old = self
        if v is not None:
            out = SetItem.apply(old, v, basic=basic, adv=adv, accumulate=accumulate)
        else:
            out = SetItem.apply(old, basic=basic, adv=adv, value=varr, accumulate=accumulate)
        return self._assign(out)
    if self._device is META:
        _value_fits(varr.shape, _target_shape(self._data, basic, adv))
        return self
    if not self._data.flags.writeable:
        raise UnsupportedError(
            "setitem on a read-only tensor (an expand()ed view or a read-only buffer); "
            "clone() it first"
        )
    try:
        _write(self._data, basic, adv, varr, accumulate)
    except ValueError:
        _value_fits(varr.shape, _target_shape(self._data, basic, adv))
        raise
    return self


def setitem(self: Tensor, index, value) -> None:
    """x[index] = value, in place (views see it); with grad, the node flows to both x and value."""
    basic, adv, _ = _parse(self, index)
    _put(self, basic, adv, value, False)


def index_put(input: Tensor, indices, values, accumulate: bool = False) -> Tensor:
    """A copy of input with input[indices] = values (+= with accumulate; repeats then add up)."""
    out = input.clone()
    basic, adv, _ = _parse(out, tuple(indices))
    return _put(out, basic, adv, values, accumulate)


def index_put_(input: Tensor, indices, values, accumulate: bool = False) -> Tensor:
    """In-place index_put."""
    basic, adv, _ = _parse(input, tuple(indices))
    return _put(input, basic, adv, values, accumulate)


# ------------------------------------------------------------------ masked ops
def _mask(mask, op: str, like: Tensor) -> Tensor:
    if not isinstance(mask, Tensor):
        mask = as_tensor_like(np.asarray(mask), like)
    if mask._data.dtype != np.bool_:
        raise DTypeError(f"{op} only supports boolean masks, but got mask with dtype {mask.dtype}")
    if mask._device is not like._device:
        raise DeviceError(f"{op}: mask on {mask._device}, input on {like._device}")
    return mask


class MaskedFill(Function):
    """where(mask, value, x) with broadcasting; value a number or a 0-d tensor."""

    def forward(self, x, *v, mask, value=None):
        self.mask, self.xshape, self.has_v = mask, x.shape, bool(v)
        val = v[0] if v else value
        return np.where(mask, val, x).astype(x.dtype, copy=False)

    def meta(self, x, *v, mask, value=None):
        return np.broadcast_shapes(x.shape, mask.shape), x.dtype

    def backward(self, g):
        gx = gv = None
        if self.needs_input_grad[0]:
            gx = unbroadcast(np.where(self.mask, 0, g).astype(g.dtype), self.xshape)
        if self.has_v and self.needs_input_grad[1]:
            gv = np.asarray(np.where(self.mask, g, 0).sum(), g.dtype)
        return (gx, gv) if self.has_v else gx


def masked_fill(input: Tensor, mask: Tensor, value) -> Tensor:
    """A copy of input with value where mask is True (mask broadcasts)."""
    mask = _mask(mask, "masked_fill", input)
    try:
        np.broadcast_shapes(input._data.shape, mask._data.shape)
    except ValueError:
        raise ShapeError(
            f"masked_fill: mask of shape {list(mask.shape)} does not broadcast with input "
            f"{list(input.shape)}"
        ) from None
    m = mask._data
    if isinstance(value, Tensor):
        if value._data.ndim:
            raise ShapeError(
                "masked_fill only supports a 0-dimensional value tensor, "
                f"got shape {list(value.shape)}"
            )
        v = value if value._data.dtype == input._data.dtype else cast(value, input.dtype)
        return MaskedFill.apply(input, v, mask=m)
    return MaskedFill.apply(input, mask=m, value=np.asarray(value).astype(input._data.dtype))


def masked_select(input: Tensor, mask: Tensor) -> Tensor:
    """The elements of input where mask is True, as a 1-d tensor (input and mask broadcast)."""
    mask = _mask(mask, "masked_select", input)
    if input._device is META:
        raise UnsupportedError("masked_select on the meta device: the result shape depends on data")
    try:
        shape = np.broadcast_shapes(input._data.shape, mask._data.shape)
    except ValueError:
        raise ShapeError(
            f"masked_select: mask {list(mask.shape)} does not broadcast with input "
            f"{list(input.shape)}"
        ) from None
    x = expand(input, shape)
    m = np.broadcast_to(mask._data, shape)
    if not shape:
        return Index.apply(
            reshape(x, 1), idx=(m.reshape(1).nonzero()[0],), basic=False, unique=True
        )
    return Index.apply(x, idx=np.nonzero(m), basic=False, unique=True)


class MaskedScatter(Function):
    """Copy source's leading elements, in order, into x where mask is True."""

    def forward(self, x, s, mask):
        self.mask, self.sshape = mask, s.shape
        out = x.copy()
        n = int(mask.sum())
        out[mask] = s.reshape(-1)[:n]
        self.n = n
        return out

    def meta(self, x, s, mask):
        return x.shape, x.dtype

    def backward(self, g):
        gx = np.where(self.mask, 0, g).astype(g.dtype)
        gs = np.zeros(int(np.prod(self.sshape)), g.dtype)
        gs[: self.n] = g[self.mask]
        return gx, gs.reshape(self.sshape)


def masked_scatter(input: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    """A copy of input with source's elements written, in order, where mask is True."""
    mask = _mask(mask, "masked_scatter", input)
    try:
        shape = np.broadcast_shapes(input._data.shape, mask._data.shape)
    except ValueError:
        raise ShapeError(
            f"masked_scatter: mask {list(mask.shape)} does not broadcast with input "
            f"{list(input.shape)}"
        ) from None
    x = expand(input, shape) if shape != input._data.shape else input
    if x is not input:
        x = x.clone()
    m = np.broadcast_to(mask._data, shape)
    if input._device is not META and int(m.sum()) > source._data.size:
        raise ShapeError(
            f"masked_scatter: source has {source._data.size} elements, fewer than the "
            f"{int(m.sum())} ones in mask"
        )
    s = source if source._data.dtype == input._data.dtype else cast(source, input.dtype)
    return MaskedScatter.apply(x, s, mask=np.ascontiguousarray(m))


# ------------------------------------------------------------------ nonzero and friends
def nonzero(input: Tensor, *, as_tuple: bool = False):
    """Indices of the non-zero elements: an (n, ndim) int64 tensor, or a tuple of 1-d tensors."""
    if input._device is META:
        raise UnsupportedError("nonzero on the meta device: the result shape depends on data")
    a = input._data
    if a.ndim == 0:
        hit = bool(a)
        if as_tuple:
            return (Tensor._wrap(np.zeros(int(hit), np.int64), input._device),)
        return Tensor._wrap(np.zeros((int(hit), 0), np.int64), input._device)
    nz = np.nonzero(a)
    if as_tuple:
        return tuple(Tensor._wrap(i.astype(np.int64, copy=False), input._device) for i in nz)
    return Tensor._wrap(np.stack(nz, axis=1).astype(np.int64, copy=False), input._device)


def argwhere(input: Tensor) -> Tensor:
    """Indices of the non-zero elements as an (n, ndim) tensor."""
    return nonzero(input)


def put(input: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
    """A copy of input (viewed as 1-d) with source written (or added) at index."""
    idx = _int_index(index, "put", input)
    if idx.size != source._data.size:
        raise ShapeError(
            f"put: index ({idx.size} elements) and source ({source._data.size}) "
            "must have the same size"
        )
    flat = reshape(input.clone(), -1)
    n = flat._data.shape[0]
    _bounds(idx.reshape(-1), n, 0, "put", input, negative=True)  # torch wraps them here
    at = (Tensor._wrap(idx.reshape(-1), input._device),)
    out = index_put(flat, at, reshape(source, -1), accumulate)
    return reshape(out, input.shape)


__all__ = [
    "index_put", "masked_fill", "masked_select", "masked_scatter", "nonzero", "argwhere", "put",
    *_gather.__all__, *_search.__all__,
]  # fmt: skip
