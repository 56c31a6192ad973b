"""Sorting, searching and sampling by index: sort, argsort, topk, kthvalue, unique, searchsorted,
bucketize and multinomial. Re-exported by ember.ops.index.

Value outputs are differentiable (the gradient goes back to where each value came from); index
outputs are int64 (int32 with out_int32) and have no gradient.
"""

from __future__ import annotations

import collections

import numpy as np

from ember import dtypes as _dt
from ember.autograd import Function, meta_array
from ember.device import META
from ember.errors import DTypeError, ShapeError, UnsupportedError
from ember.ops._util import wrap_dim
from ember.tensor import Tensor

_LOW = _dt.HALF_FLOATS  # float16, bfloat16 (ml_dtypes not imported to ask)

sort_result = collections.namedtuple("sort", ["values", "indices"])
topk_result = collections.namedtuple("topk", ["values", "indices"])
kthvalue_result = collections.namedtuple("kthvalue", ["values", "indices"])


def _keys(a: np.ndarray) -> np.ndarray:
    """An array with the same order that numpy sorts well (bool -> uint8, f16/bf16 -> f32)."""
    if a.dtype == np.bool_:
        return a.view(np.uint8)
    if a.dtype in _LOW:
        return a.astype(np.float32)
    return a


def _argsort(a: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    """Stable argsort; descending keeps equal elements in their original order, NaN first."""
    k = _keys(a)
    if not descending:
        return np.argsort(k, axis=axis, kind="stable")
    n = a.shape[axis]
    r = np.argsort(np.flip(k, axis), axis=axis, kind="stable")
    return np.flip(n - 1 - r, axis)


class TakeAlong(Function):
    """take_along_axis(x, idx, dim) for indices that never repeat along dim (sort, topk, ...)."""

    def forward(self, x, idx, dim):
        self.shape, self.idx, self.dim = x.shape, idx, dim
        return np.take_along_axis(x, idx, dim)

    def backward(self, g):
        gx = np.zeros(self.shape, g.dtype)
        np.put_along_axis(gx, self.idx, g, self.dim)
        return gx


def _wrap_i(idx: np.ndarray, like: Tensor) -> Tensor:
    return Tensor._wrap(idx.astype(np.int64, copy=False), like._device)


def _meta_pair(shape: tuple, x: Tensor, cls):
    return cls(
        Tensor._wrap(meta_array(shape, x._data.dtype), META),
        Tensor._wrap(meta_array(shape, np.int64), META),
    )


def sort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False):
    """(values, indices) sorted along dim; ties keep their original order."""
    nd = input._data.ndim
    d = wrap_dim(dim, nd)
    if input._device is META:
        return _meta_pair(input._data.shape, input, sort_result)
    if nd == 0:
        return sort_result(input.clone(), Tensor._wrap(np.zeros((), np.int64), input._device))
    idx = _argsort(input._data, d, descending)
    return sort_result(TakeAlong.apply(input, idx=idx, dim=d), _wrap_i(idx, input))


def argsort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """The indices that sort input along dim."""
    return sort(input, dim, descending, stable).indices


def msort(input: Tensor) -> Tensor:
    """Values sorted along dim 0."""
    return sort(input, 0).values


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    """(values, indices) of the k largest (or smallest) elements along dim, in sorted order."""
    nd = input._data.ndim
    d = wrap_dim(dim, nd)
    n = input._data.shape[d] if nd else 1
    k = int(k)
    if not 0 <= k <= n:
        raise IndexError(f"topk: k ({k}) out of range for dimension {d} of size {n}")
    if input._device is META:
        shape = list(input._data.shape)
        if nd:
            shape[d] = k
        return _meta_pair(tuple(shape), input, topk_result)
    x = input if nd else input.reshape(1)
    a = x._data
    keys = _keys(a)
    if (
        0 < k < n // 4
        and keys.dtype.kind in "iuf"
        and not (keys.dtype.kind == "f" and np.isnan(keys).any())
    ):
        part = np.argpartition(keys, n - k if largest else k - 1, axis=d)
        part = np.take(part, np.arange(n - k, n) if largest else np.arange(k), axis=d)
        sub = np.take_along_axis(keys, part, d)
        order = _argsort(sub, d, largest)
        idx = np.take_along_axis(part, order, d)
    else:
        idx = np.take(_argsort(a, d, largest), np.arange(k), axis=d)
    vals = TakeAlong.apply(x, idx=idx, dim=d)
    if not nd:
        return topk_result(vals.reshape(()), _wrap_i(idx.reshape(()), input))
    return topk_result(vals, _wrap_i(idx, input))


def kthvalue(input: Tensor, k: int, dim: int = -1, keepdim: bool = False):
    """(values, indices) of the k-th smallest element (1-based) along dim."""
    nd = input._data.ndim
    d = wrap_dim(dim, nd)
    n = input._data.shape[d] if nd else 1
    if not 1 <= k <= n:
        raise IndexError(f"kthvalue: k ({k}) out of range for dimension {d} of size {n}")
    if input._device is META:
        shape = list(input._data.shape)
        if nd:
            shape[d] = 1
        if nd and not keepdim:
            del shape[d]
        return _meta_pair(tuple(shape), input, kthvalue_result)
    x = input if nd else input.reshape(1)
    idx = np.take(_argsort(x._data, d, False), [k - 1], axis=d)
    vals = TakeAlong.apply(x, idx=idx, dim=d)
    if not nd:
        return kthvalue_result(vals.reshape(()), _wrap_i(idx.reshape(()), input))
    if not keepdim:
        return kthvalue_result(vals.squeeze(d), _wrap_i(np.squeeze(idx, d), input))
    return kthvalue_result(vals, _wrap_i(idx, input))


def unique(
    input: Tensor,
    sorted: bool = True,
    return_inverse: bool = False,
    return_counts: bool = False,
    dim: int | None = None,
):
    """The distinct values (sorted), optionally with the inverse mapping and the counts."""
    if input._device is META:
        raise UnsupportedError("unique on the meta device: the result shape depends on data")
    a = input._data
    lo = a.dtype in _LOW
    b = a.astype(np.float32) if lo else a
    if dim is None:
        vals, inv, cnt = np.unique(b.reshape(-1), return_inverse=True, return_counts=True)
        inv = inv.reshape(a.shape)
    else:
        d = wrap_dim(dim, a.ndim)
        vals, inv, cnt = np.unique(b, return_inverse=True, return_counts=True, axis=d)
        inv = inv.reshape(-1)
    if lo:
        vals = vals.astype(a.dtype)
    out = Tensor._wrap(np.ascontiguousarray(vals), input._device)
    if not (return_inverse or return_counts):
        return out
    res = [out]
    if return_inverse:
        res.append(_wrap_i(inv, input))
    if return_counts:
        res.append(_wrap_i(cnt, input))
    return tuple(res)


def unique_consecutive(
    input: Tensor, return_inverse: bool = False, return_counts: bool = False, dim: int | None = None
):
    """Collapse runs of equal consecutive values (along dim, or the flattened tensor)."""
    if input._device is META:
        raise UnsupportedError(
            "unique_consecutive on the meta device: the result shape depends on data"
        )
    a = input._data
    if dim is None:
        a = a.reshape(-1)
        d = 0
    else:
        d = wrap_dim(dim, a.ndim)
    n = a.shape[d]
    if n == 0:
        change = np.zeros(0, bool)
    else:
        x = np.moveaxis(a, d, 0).reshape(n, -1)
        change = np.concatenate([[True], (x[1:] != x[:-1]).any(axis=1)])
    starts = np.flatnonzero(change)
    vals = np.take(a, starts, axis=d)
    res = [Tensor._wrap(vals, input._device)]
    if return_inverse:
        inv = np.cumsum(change) - 1
        res.append(_wrap_i(inv.reshape(input._data.shape) if dim is None else inv, input))
    if return_counts:
        res.append(_wrap_i(np.diff(np.append(starts, n)), input))
    return res[0] if len(res) == 1 else tuple(res)


# ------------------------------------------------------------------ searching
def _side(right: bool, side: str | None) -> str:
    if side is None:
        return "right" if right else "left"
    if side not in ("left", "right"):
        raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
    if right and side == "left":
        raise ValueError("searchsorted: side='left' conflicts with right=True")
    return side


def searchsorted(
    sorted_sequence: Tensor,
    input,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: Tensor | None = None,
) -> Tensor:
    """Where input's values go in sorted_sequence (1-d, or N-d sharing input's leading dims)."""
    sd = _side(right, side)
    seq = sorted_sequence._data
    scalar = not isinstance(input, Tensor)
    vals = np.asarray(input) if scalar else input._data
    odt = np.int32 if out_int32 else np.int64
    dev = sorted_sequence._device
    if seq.ndim == 0:
        raise ShapeError("searchsorted: sorted_sequence must have at least 1 dim")
    if seq.ndim > 1 and (scalar or seq.shape[:-1] != vals.shape[:-1]):
        raise ShapeError(
            f"searchsorted: sorted_sequence {list(seq.shape)} and input {list(vals.shape)} "
            "must share "
            "all dims but the last (or sorted_sequence must be 1-d)"
        )
    if dev is META:
        return Tensor._wrap(meta_array(vals.shape, odt), META)
    if sorter is not None:
        seq = np.take_along_axis(seq, sorter._data.astype(np.intp), -1)
    seq, vals = _keys(seq), _keys(vals)
    if seq.dtype != vals.dtype:
        ct = np.result_type(seq.dtype, vals.dtype)
        seq, vals = seq.astype(ct), vals.astype(ct)
    if seq.ndim == 1:
        out = np.searchsorted(seq, vals, side=sd)
    else:
        s2 = seq.reshape(-1, seq.shape[-1])
        v2 = vals.reshape(s2.shape[0], -1)
        out = np.stack([np.searchsorted(s2[i], v2[i], side=sd) for i in range(s2.shape[0])])
        out = out.reshape(vals.shape)
    return Tensor._wrap(np.asarray(out, odt), dev)


def bucketize(input, boundaries: Tensor, *, out_int32: bool = False, right: bool = False) -> Tensor:
    """The bucket of each value in 1-d sorted boundaries (right=True: b[i-1] <= x < b[i])."""
    if boundaries._data.ndim != 1:
        raise ShapeError(f"bucketize: boundaries must be 1-d, got shape {list(boundaries.shape)}")
    return searchsorted(boundaries, input, out_int32=out_int32, right=right)


# ------------------------------------------------------------------ sampling
def multinomial(
    input: Tensor, num_samples: int, replacement: bool = False, *, generator=None
) -> Tensor:
    """Sample category indices from rows of non-negative weights (1-d or 2-d input), int64."""
    from ember.ops.random import _rng

    a = input._data
    if not input.is_floating_point():
        raise DTypeError(f"multinomial only supports floating-point input, got {input.dtype}")
    if a.ndim not in (1, 2):
        raise ShapeError(f"multinomial: input must be 1-d or 2-d, got {a.ndim}-d")
    n = a.shape[-1]
    k = int(num_samples)
    if k <= 0:
        raise ShapeError(f"multinomial: num_samples must be positive, got {k}")
    if not replacement and k > n:
        raise ShapeError(f"multinomial: cannot sample {k} > {n} categories without replacement")
    shape = a.shape[:-1] + (k,)
    if input._device is META:
        return Tensor._wrap(meta_array(shape, np.int64), META)
    p = a.reshape(-1, n).astype(np.float64)
    if not np.isfinite(p).all() or (p < 0).any():
        raise ValueError("multinomial: probability tensor contains either inf, nan or element < 0")
    tot = p.sum(axis=1, keepdims=True)
    if (tot <= 0).any():
        raise ValueError("multinomial: invalid distribution (sum of probabilities <= 0)")
    rng = _rng(generator)
    if replacement:
        cdf = np.cumsum(p / tot, axis=1)
        cdf[:, -1] = 1.0
        u = rng.random((p.shape[0], k))
        out = np.stack([np.searchsorted(cdf[i], u[i], side="right") for i in range(p.shape[0])])
        out = np.minimum(out, n - 1)
    else:
        if ((p > 0).sum(axis=1) < k).any():
            raise ValueError(
                "multinomial: not enough categories with non-zero probability to sample "
                "without replacement"
            )
        u = rng.random(p.shape)
        with np.errstate(divide="ignore"):
            keys = np.log(u) / p
        if k == 1:
            out = np.argmax(keys, axis=1)[:, None]
        elif k < n // 4:
            part = np.argpartition(-keys, k - 1, axis=1)[:, :k]
            order = np.argsort(-np.take_along_axis(keys, part, 1), axis=1, kind="stable")
            out = np.take_along_axis(part, order, 1)
        else:
            out = np.argsort(-keys, axis=1, kind="stable")[:, :k]
    return Tensor._wrap(out.reshape(shape).astype(np.int64), input._device)


__all__ = [
    "sort", "argsort", "msort", "topk", "kthvalue", "unique", "unique_consecutive", "searchsorted",
    "bucketize", "multinomial",
]  # fmt: skip
