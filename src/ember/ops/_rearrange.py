"""Copying rearrangements: flip, roll, rot90, repeat, tile, repeat_interleave, pad, tril/triu, diag.

Unlike the views in ember.ops.movement these return new memory, as in PyTorch. This module is
re-exported by ember.ops.movement; the views it builds on come from _view, below both.
"""

from __future__ import annotations

import operator

import numpy as np

from ember import dtypes as _dt
from ember.autograd import Function
from ember.device import META
from ember.errors import ShapeError, UnsupportedError
from ember.ops._util import acc_dtype, wrap_dim  # noqa: F401  (acc_dtype: re-exported)
from ember.ops._view import Index, reshape, transpose
from ember.tensor import Tensor

_LOW = _dt.HALF_FLOATS  # float16, bfloat16 (ml_dtypes not imported to ask)


def diag_view(x: np.ndarray, offset: int, d1: int, d2: int) -> np.ndarray:
    """A strided (writable when x is) view of the offset diagonal over d1, d2, appended last."""
    n1, n2 = x.shape[d1], x.shape[d2]
    n = max(0, min(n1, n2 - offset)) if offset >= 0 else max(0, min(n1 + offset, n2))
    start = ((0, offset) if offset >= 0 else (-offset, 0)) if n else (0, 0)
    idx = [slice(None)] * x.ndim
    idx[d1], idx[d2] = slice(start[0], start[0] + n), slice(start[1], start[1] + n)
    base = x[tuple(idx)]
    keep = [i for i in range(x.ndim) if i not in (d1, d2)]
    shape = tuple(base.shape[i] for i in keep) + (n,)
    strides = tuple(base.strides[i] for i in keep) + (base.strides[d1] + base.strides[d2],)
    return np.lib.stride_tricks.as_strided(base, shape, strides, writeable=base.flags.writeable)


def _dims(dims, nd: int, op: str) -> tuple:
    if isinstance(dims, (int, np.integer)):
        dims = (dims,)
    out = tuple(wrap_dim(operator.index(d), nd) for d in dims)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: dims {list(dims)} contain a dim more than once")
    return out


# ------------------------------------------------------------------ flip / roll / rot90
class Flip(Function):
    """Reverse the order of elements along dims (a copy, as torch.flip)."""

    def forward(self, x, dims):
        self.dims = dims
        return np.ascontiguousarray(np.flip(x, dims))

    def meta(self, x, dims):
        return x.shape, x.dtype

    def backward(self, g):
        return np.flip(g, self.dims)


def flip(input: Tensor, dims) -> Tensor:
    """Reverse the order of elements along dims; a copy."""
    nd = input._data.ndim
    d = _dims(dims, nd, "flip")
    return Flip.apply(input, dims=d) if nd else input.clone()


def fliplr(input: Tensor) -> Tensor:
    """Flip left/right (dim 1); needs >= 2 dims."""
    if input._data.ndim < 2:
        raise ShapeError(f"fliplr: input must be >= 2-d, got {input._data.ndim}-d")
    return flip(input, (1,))


def flipud(input: Tensor) -> Tensor:
    """Flip up/down (dim 0); needs >= 1 dim."""
    if input._data.ndim < 1:
        raise ShapeError("flipud: input must be >= 1-d")
    return flip(input, (0,))


class Roll(Function):
    """Cyclic shift along dims (None: over the flattened tensor)."""

    def forward(self, x, shifts, dims):
        self.shifts, self.dims = shifts, dims
        if dims is None:
            return np.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
        return np.roll(x, shifts, dims)

    def meta(self, x, shifts, dims):
        return x.shape, x.dtype

    def backward(self, g):
        neg = tuple(-s for s in self.shifts)
        if self.dims is None:
            return np.roll(g.reshape(-1), neg[0]).reshape(g.shape)
        return np.roll(g, neg, self.dims)


def roll(input: Tensor, shifts, dims=None) -> Tensor:
    """Shift elements cyclically by shifts along dims (the flattened tensor when dims is None)."""
    shifts = (shifts,) if isinstance(shifts, (int, np.integer)) else tuple(shifts)
    shifts = tuple(operator.index(s) for s in shifts)
    if dims is None:
        if len(shifts) != 1:
            raise ShapeError(f"roll: shifts {list(shifts)} need dims when more than one is given")
        return Roll.apply(input, shifts=shifts, dims=None)
    d = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    if len(d) != len(shifts):
        raise ShapeError(
            f"roll: shifts and dimensions must align, got shifts {list(shifts)} and dims {list(d)}"
        )
    d = tuple(wrap_dim(operator.index(i), input._data.ndim) for i in d)
    return Roll.apply(input, shifts=shifts, dims=d)


def rot90(input: Tensor, k: int = 1, dims=(0, 1)) -> Tensor:
    """Rotate by 90 degrees k times in the plane of dims (from the first towards the second)."""
    if len(dims) != 2:
        raise ShapeError(f"rot90: expected 2 dims, got {len(dims)}")
    nd = input._data.ndim
    d0, d1 = wrap_dim(dims[0], nd), wrap_dim(dims[1], nd)
    if d0 == d1:
        raise ShapeError(f"rot90: dims must differ, got {list(dims)}")
    k %= 4
    if k == 1:
        return transpose(flip(input, (d1,)), d0, d1)
    if k == 2:
        return flip(input, (d0, d1))
    if k == 3:
        return transpose(flip(input, (d0,)), d0, d1)
    return input.clone()


# ------------------------------------------------------------------ repeat, tile, repeat_interleave
class Repeat(Function):
    """Tile the whole tensor sizes[i] times along each dim."""

    def forward(self, x, sizes):
        self.shape_in = x.shape
        x = x.reshape((1,) * (len(sizes) - x.ndim) + x.shape)
        self.src = x.shape
        return np.tile(x, sizes)

    def meta(self, x, sizes):
        src = (1,) * (len(sizes) - x.ndim) + x.shape
        return tuple(a * b for a, b in zip(src, sizes)), x.dtype

    def backward(self, g):
        if g.size == 0:
            return np.zeros(self.shape_in, g.dtype)
        shape, axes = [], []
        for i, s in enumerate(self.src):
            shape += [g.shape[i] // s, s]
            axes.append(2 * i)
        return g.reshape(shape).sum(axis=tuple(axes)).reshape(self.shape_in)


def repeat(input: Tensor, *sizes) -> Tensor:
    """Tile the tensor: each dim repeated sizes[i] times (len(sizes) >= ndim)."""
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = sizes[0]
    sizes = tuple(operator.index(s) for s in sizes)
    if len(sizes) < input._data.ndim:
        raise ShapeError(
            f"repeat: number of repeat dims ({len(sizes)}) can not be smaller than the "
            f"tensor's dims ({input._data.ndim})"
        )
    if any(s < 0 for s in sizes):
        raise ShapeError(f"repeat: repeats can not be negative, got {list(sizes)}")
    return Repeat.apply(input, sizes=sizes)


def tile(input: Tensor, dims) -> Tensor:
    """Like repeat, but dims shorter than ndim are padded with leading ones (torch.tile)."""
    dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    dims = (1,) * (input._data.ndim - len(dims)) + dims
    return repeat(input, dims)


def repeat_interleave(
    input: Tensor, repeats=None, dim: int | None = None, *, output_size=None
) -> Tensor:
    """Repeat each element `repeats` times (an int or one count each) along dim (None: flat).

    repeat_interleave(counts) alone gives arange(len(counts)) repeated by counts.
    """
    if repeats is None:
        r = input._data
        if r.ndim > 1 or r.dtype.kind not in "iu":
            raise ShapeError("repeat_interleave: repeats must be a 0-d or 1-d integer tensor")
        r = r.reshape(-1)
        if (r < 0).any():
            raise ShapeError("repeat_interleave: repeats can not be negative")
        return Tensor._wrap(np.repeat(np.arange(r.size, dtype=np.int64), r), input._device)
    x = input
    if dim is None:
        x = reshape(x, -1)
        d = 0
    else:
        d = wrap_dim(dim, x._data.ndim)
        if x._data.ndim == 0:
            x = reshape(x, 1)
    n = x._data.shape[d]
    if isinstance(repeats, Tensor) and repeats._device is META and repeats._data.size > 1:
        raise UnsupportedError("repeat_interleave with meta repeats: the size depends on data")
    r = repeats._data if isinstance(repeats, Tensor) else np.asarray(repeats)
    if r.dtype.kind not in "iu" or r.ndim > 1:
        raise ShapeError("repeat_interleave: repeats must be an int or a 0-d/1-d integer tensor")
    r = r.reshape(-1)
    if r.size not in (1, n):
        raise ShapeError(
            f"repeat_interleave: repeats must have the same size as input along dim ({n}), "
            f"got {r.size}"
        )
    if (r < 0).any():
        raise ShapeError("repeat_interleave: repeats can not be negative")
    idx = np.repeat(np.arange(n, dtype=np.intp), np.broadcast_to(r, (n,)))
    if output_size is not None and idx.size != output_size:
        raise ShapeError(f"repeat_interleave: output_size {output_size} does not match {idx.size}")
    return Index.apply(x, idx=(slice(None),) * d + (idx,), basic=False, unique=bool((r <= 1).all()))


# ------------------------------------------------------------------ pad
class Pad(Function):
    """Pad (or crop, for negative pads) each dim; per-dim (before, after) in pads."""

    def forward(self, x, pads, mode, value):
        self.shape, self.pads, self.mode = x.shape, pads, mode
        if mode == "constant":
            out = np.full(_pad_shape(x.shape, pads), value, x.dtype)
            self.src, self.dst = _pad_slices(x.shape, pads)
            out[self.dst] = x[self.src]
            return out
        self.maps = []
        for d, (lo, hi) in enumerate(pads):
            if lo or hi:
                m = _pad_map(x.shape[d], lo, hi, mode)
                self.maps.append((d, m, x.shape[d]))
                x = np.take(x, m, axis=d)
        return x

    def meta(self, x, pads, mode, value):
        return _pad_shape(x.shape, pads), x.dtype

    def backward(self, g):
        if self.mode == "constant":
            gx = np.zeros(self.shape, g.dtype)
            gx[self.src] = g[self.dst]
            return gx
        dt = g.dtype
        for d, m, n in reversed(self.maps):
            shape = g.shape[:d] + (n,) + g.shape[d + 1 :]
            gi = np.zeros(shape, acc_dtype(dt))
            np.add.at(gi, (slice(None),) * d + (m,), g)
            g = gi
        return g.astype(dt, copy=False)


def _pad_shape(shape, pads) -> tuple:
    return tuple(n + lo + hi for n, (lo, hi) in zip(shape, pads))


def _pad_slices(shape, pads) -> tuple:
    src, dst = [], []
    for n, (lo, hi) in zip(shape, pads):
        a, b = max(0, -lo), n - max(0, -hi)
        b = max(a, b)
        src.append(slice(a, b))
        dst.append(slice(max(0, lo), max(0, lo) + b - a))
    return tuple(src), tuple(dst)


def _pad_map(n: int, lo: int, hi: int, mode: str) -> np.ndarray:
    """Source index of each output position; negative pads crop first (as torch)."""
    start = max(0, -lo)
    n = n - start - max(0, -hi)
    p = np.arange(-max(lo, 0), n + max(hi, 0), dtype=np.intp)
    if mode == "replicate":
        p = np.clip(p, 0, n - 1)
    elif mode == "circular":
        p = p % n
    elif n == 1:
        p = np.zeros_like(p)
    else:
        period = 2 * (n - 1)
        p = np.abs(p) % period
        p = np.where(p >= n, period - p, p)
    return p + start


def pad(input: Tensor, pad, mode: str = "constant", value=None) -> Tensor:
    """torch.nn.functional.pad: pad = (last_lo, last_hi, prev_lo, prev_hi, ...); negative pads crop.

    Modes: 'constant' (value, default 0), 'reflect' (mirror without the edge), 'replicate'
    (repeat the edge), 'circular' (wrap around).
    """
    pad = tuple(operator.index(p) for p in pad)
    nd = input._data.ndim
    if len(pad) % 2:
        raise ShapeError(f"pad: padding length must be divisible by 2, got {len(pad)}")
    if len(pad) // 2 > nd:
        raise ShapeError(
            f"pad: padding length {len(pad)} is more than two times the input's {nd} dims"
        )
    if mode not in ("constant", "reflect", "replicate", "circular"):
        raise ValueError(
            f"pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}"
        )
    pads = [(0, 0)] * nd
    for i in range(len(pad) // 2):
        pads[nd - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    shape = input._data.shape
    for d, (lo, hi) in enumerate(pads):
        n = shape[d]
        if n + lo + hi < 0 or (mode != "constant" and n + min(lo, 0) + min(hi, 0) < 0):
            raise ShapeError(
                f"pad: input size {n} at dim {d} plus padding ({lo}, {hi}) gives a negative size"
            )
        if mode == "constant" or not (lo or hi):
            continue
        n += min(lo, 0) + min(hi, 0)
        if n == 0:
            raise ShapeError(f"pad: {mode} padding of an empty dim {d} (shape {list(shape)})")
        if mode == "reflect" and (lo >= n or hi >= n):
            raise ShapeError(
                f"pad: reflect padding ({lo}, {hi}) must be less than the size {n} of dim {d}"
            )
        if mode == "circular" and (lo > n or hi > n):
            raise ShapeError(
                f"pad: circular padding ({lo}, {hi}) must be at most the size {n} of dim {d}"
            )
    if mode != "constant" and value is not None and value != 0:
        raise ValueError(f"pad: mode {mode!r} does not take a value")
    v = 0 if value is None else value
    if isinstance(v, Tensor):
        v = v.item()
    return Pad.apply(input, pads=tuple(pads), mode=mode, value=v)


# ------------------------------------------------------------------ triangles and diagonals
class Tri(Function):
    """Keep the lower (tril) or upper (triu) triangle of the last two dims."""

    def forward(self, x, k, lower):
        self.k, self.f = k, np.tril if lower else np.triu
        return self.f(x, k)

    def meta(self, x, k, lower):
        return x.shape, x.dtype

    def backward(self, g):
        return self.f(g, self.k)


def tril(input: Tensor, diagonal: int = 0) -> Tensor:
    """Zero the elements above the diagonal of the last two dims."""
    if input._data.ndim < 2:
        raise ShapeError(f"tril: input must have at least 2 dims, got {input._data.ndim}")
    return Tri.apply(input, k=operator.index(diagonal), lower=True)


def triu(input: Tensor, diagonal: int = 0) -> Tensor:
    """Zero the elements below the diagonal of the last two dims."""
    if input._data.ndim < 2:
        raise ShapeError(f"triu: input must have at least 2 dims, got {input._data.ndim}")
    return Tri.apply(input, k=operator.index(diagonal), lower=False)


class DiagEmbed(Function):
    """Place the last dim of x on a diagonal of a new (d1, d2) plane."""

    def forward(self, x, offset, d1, d2):
        self.args = (offset, d1, d2)
        out = np.zeros(self._shape(x, offset, d1, d2), x.dtype)
        diag_view(out, offset, d1, d2)[...] = x
        return out

    @staticmethod
    def _shape(x, offset, d1, d2):
        n = (x.shape[-1] if x.ndim else 1) + abs(offset)
        rest = list(x.shape[:-1])
        for d in sorted((d1, d2)):
            rest.insert(d, n)
        return tuple(rest)

    def meta(self, x, offset, d1, d2):
        return self._shape(x, offset, d1, d2), x.dtype

    def backward(self, g):
        return diag_view(g, *self.args).copy()


def diag_embed(input: Tensor, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """Matrices (over dim1, dim2) whose offset diagonal holds the last dim of input."""
    nd = input._data.ndim + 1
    d1, d2 = wrap_dim(dim1, nd), wrap_dim(dim2, nd)
    if d1 == d2:
        raise ShapeError(f"diag_embed: diagonal dimensions cannot be identical {dim1}, {dim2}")
    if input._data.ndim == 0:
        raise ShapeError("diag_embed: input must have at least 1 dim")
    return DiagEmbed.apply(input, offset=operator.index(offset), d1=d1, d2=d2)


class DiagOf(Function):
    """A copy of the offset diagonal of a matrix."""

    def forward(self, x, offset):
        self.shape, self.offset = x.shape, offset
        return diag_view(x, offset, 0, 1).copy()

    def backward(self, g):
        gx = np.zeros(self.shape, g.dtype)
        diag_view(gx, self.offset, 0, 1)[...] = g
        return gx


def diag(input: Tensor, diagonal: int = 0) -> Tensor:
    """A 1-d tensor -> a square matrix with it on a diagonal; a matrix -> a copy of its diagonal."""
    nd = input._data.ndim
    k = operator.index(diagonal)
    if nd == 1:
        return DiagEmbed.apply(input, offset=k, d1=0, d2=1)
    if nd == 2:
        return DiagOf.apply(input, offset=k)
    raise ShapeError(f"diag: expected a 1-d or 2-d tensor, got {nd}-d")


__all__ = [
    "flip", "fliplr", "flipud", "roll", "rot90", "repeat_interleave", "tile", "pad", "tril", "triu",
    "diag", "diag_embed",
]  # fmt: skip
