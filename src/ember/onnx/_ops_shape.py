"""ONNX shape, movement, indexing and constant-making operators."""

from __future__ import annotations

import math

import numpy as np

import ember
from ember.errors import ShapeError
from ember.onnx._proto import np_dtype
from ember.onnx._registry import Attrs, axis_of, const, ints, npdt, op, scalar, unsupported
from ember.tensor import Tensor

MAX_MADE = 1 << 31  # elements a shape-making op (ConstantOfShape, Expand, Tile, Range) may create


def _check_size(a: Attrs, shape) -> None:
    n = 1
    for d in shape:
        if d < 0:
            raise ShapeError(f"ONNX {a.where()}: negative dim in shape {list(shape)}")
        n *= d
    if n > MAX_MADE:
        raise ShapeError(f"ONNX {a.where()}: shape {list(shape)} is too large ({n} elements)")


@op("Constant")
def _constant(a: Attrs):
    from ember.onnx._graph import to_tensor

    if "value" in a:
        return to_tensor(a.get("value"), a.where())
    for key, dt in (("value_float", np.float32), ("value_int", np.int64)):
        if key in a:
            return const(a.get(key), dt)
    for key, dt in (("value_floats", np.float32), ("value_ints", np.int64)):
        if key in a:
            return const(a.get(key), dt)
    unsupported(a, "this kind of constant value")


@op("Shape")
def _shape(a: Attrs, x):
    dims = list(x.shape)
    r = len(dims)
    start = a.get("start", 0)
    end = a.get("end", r)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return const(dims[start:end], np.int64)


@op("Size")
def _size(a: Attrs, x):
    return const(x.numel(), np.int64)


@op("Reshape")
def _reshape(a: Attrs, x, shape=None):
    s = list(a.get("shape", [])) if a.opset < 5 else ints(shape)
    allow0 = a.get("allowzero", 0)
    out = []
    for i, d in enumerate(s):
        if d == 0 and not allow0:
            if i >= x.ndim:
                raise ShapeError(f"ONNX {a.where()}: shape {s} copies dim {i} of {list(x.shape)}")
            out.append(x.shape[i])
        else:
            out.append(d)
    if out.count(-1) > 1:
        raise ShapeError(f"ONNX {a.where()}: shape {s} has more than one -1")
    return x.reshape(tuple(out))


@op("Flatten")
def _flatten(a: Attrs, x):
    ax = a.get("axis", 1)
    r = x.ndim
    ax = ax + r if ax < 0 else ax
    if not 0 <= ax <= r:
        raise ShapeError(f"ONNX {a.where()}: axis {a.get('axis')} for rank {r}")
    lead = math.prod(x.shape[:ax])
    return x.reshape(lead, math.prod(x.shape[ax:]))


@op("Squeeze")
def _squeeze(a: Attrs, x, axes=None):
    ax = list(a.get("axes", [])) if a.opset < 13 else ints(axes)
    if not ax:
        ax = [i for i, n in enumerate(x.shape) if n == 1]
    dims = sorted({axis_of(v, x.ndim, a.where()) for v in ax})
    for d in dims:
        if x.shape[d] != 1:
            raise ShapeError(f"ONNX {a.where()}: dim {d} of {list(x.shape)} is not 1")
    shape = [n for i, n in enumerate(x.shape) if i not in dims]
    return x.reshape(tuple(shape))


@op("Unsqueeze")
def _unsqueeze(a: Attrs, x, axes=None):
    ax = list(a.get("axes", [])) if a.opset < 13 else ints(axes)
    r = x.ndim + len(ax)
    dims = sorted({axis_of(v, r, a.where()) for v in ax})
    if len(dims) != len(ax):
        raise ShapeError(f"ONNX {a.where()}: repeated axes {ax}")
    shape = list(x.shape)
    for d in dims:
        shape.insert(d, 1)
    return x.reshape(tuple(shape))


@op("Transpose")
def _transpose(a: Attrs, x):
    perm = a.get("perm", None)
    if perm is None:
        perm = list(range(x.ndim))[::-1]
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"ONNX {a.where()}: perm {perm} for rank {x.ndim}")
    return x.permute(*perm) if x.ndim else x


@op("Concat")
def _concat(a: Attrs, *xs):
    xs = [x for x in xs if x is not None]
    ax = axis_of(a.get("axis", 0), xs[0].ndim, a.where())
    if ax == 1 and len(xs) > 1:
        fast = _concat_nhwc(xs)
        if fast is not None:
            return fast
    return ember.cat(xs, dim=ax)


def _concat_nhwc(xs: list) -> Tensor | None:
    """A channel Concat of channels-last float32 (N, C, H, W) data (fused convs' results) as one
    NHWC copy (kernels.cpu.nhwc), channels-last out, which the next fused conv reads in place;
    None for any other input. ember.cat's result had to be copied back to NHWC by that conv:
    PP-OCRv4 det's 4 x 24 -> 96 channels at 160x160 took 1.4 ms (ad-hoc per-node timing)."""
    ts = []
    for x in xs:
        d = x._data
        if d.ndim != 4 or d.dtype != np.float32 or d.shape[0] != xs[0].shape[0] or \
                d.shape[2:] != xs[0].shape[2:]:  # fmt: skip
            return None
        t = d.transpose(0, 2, 3, 1)
        if not t.flags.c_contiguous:
            return None
        ts.append(t)
    from ember.kernels.cpu import nhwc

    return Tensor._wrap(nhwc.concat_channels(ts).transpose(0, 3, 1, 2))


@op("Split")
def _split(a: Attrs, x, split=None):
    ax = axis_of(a.get("axis", 0), x.ndim, a.where())
    sizes = list(a.get("split", [])) if a.opset < 13 else ints(split)
    n = x.shape[ax]
    if not sizes:
        k = a.get("num_outputs", a.n_out)
        if a.opset >= 18 and "num_outputs" in a:
            step = -(-n // k)
            sizes = [min(step, n - i * step) for i in range(k)]
        else:
            if n % k:
                raise ShapeError(f"ONNX {a.where()}: dim {n} does not split into {k} equal parts")
            sizes = [n // k] * k
    if sum(sizes) != n or any(s < 0 for s in sizes):
        raise ShapeError(f"ONNX {a.where()}: split {sizes} does not cover dim {n}")
    out, start = [], 0
    for s in sizes:
        out.append(x.narrow(ax, start, s))
        start += s
    return tuple(out)


def _slice_axis(x: Tensor, ax: int, start: int, end: int, step: int) -> Tensor:
    n = x.shape[ax]
    if step == 0:
        raise ShapeError("Slice: step 0")
    if start < 0:
        start += n
    if end < 0:
        end += n
    if step > 0:
        start, end = min(max(start, 0), n), min(max(end, 0), n)
        idx = [slice(None)] * x.ndim
        idx[ax] = slice(start, max(end, start), step)
        return x[tuple(idx)]
    start, end = min(max(start, -1), n - 1), min(max(end, -1), n - 1)
    # walk backwards: flip, then slice forwards from the mirrored start
    f = ember.flip(x, [ax])
    fs, fe = n - 1 - start, n - 1 - end
    idx = [slice(None)] * x.ndim
    idx[ax] = slice(fs, max(fe, fs), -step)
    return f[tuple(idx)]


@op("Slice")
def _slice(a: Attrs, x, starts=None, ends=None, axes=None, steps=None):
    if a.opset < 10:
        st, en, ax, sp = list(a.get("starts")), list(a.get("ends")), a.get("axes"), None
    else:
        st, en = ints(starts), ints(ends)
        ax = ints(axes) if axes is not None else None
        sp = ints(steps) if steps is not None else None
    ax = list(range(len(st))) if ax is None else list(ax)
    sp = [1] * len(st) if sp is None else sp
    if not len(st) == len(en) == len(ax) == len(sp):
        raise ShapeError(f"ONNX {a.where()}: starts/ends/axes/steps of different lengths")
    big = 1 << 62
    for s, e, d, k in zip(st, en, ax, sp):
        d = axis_of(d, x.ndim, a.where())
        s, e = max(min(s, big), -big), max(min(e, big), -big)
        x = _slice_axis(x, d, s, e, k)
    return x


@op("Expand")
def _expand(a: Attrs, x, shape):
    s = ints(shape)
    r = max(len(s), x.ndim)
    xs = [1] * (r - x.ndim) + list(x.shape)
    ss = [1] * (r - len(s)) + s
    out = []
    for p, q in zip(xs, ss):
        if p != q and p != 1 and q != 1:
            raise ShapeError(f"ONNX {a.where()}: cannot expand {list(x.shape)} to {s}")
        out.append(p if q == 1 else q)
    _check_size(a, out)
    return ember.broadcast_to(x.reshape(tuple(xs)), tuple(out)).contiguous()


@op("Tile")
def _tile(a: Attrs, x, reps):
    r = ints(reps)
    if len(r) != x.ndim:
        raise ShapeError(f"ONNX {a.where()}: repeats {r} for rank {x.ndim}")
    _check_size(a, [n * k for n, k in zip(x.shape, r)])
    return ember.tile(x, tuple(r))


@op("Pad")
def _pad(a: Attrs, x, pads=None, value=None, axes=None):
    if a.opset < 11:
        p, v = list(a.get("pads", a.get("paddings", []))), a.get("value", 0.0)
    else:
        p, v = ints(pads), scalar(value, 0)
    r = x.ndim
    ax = list(range(r)) if axes is None else [axis_of(i, r, a.where()) for i in ints(axes)]
    if len(p) != 2 * len(ax):
        raise ShapeError(f"ONNX {a.where()}: pads {p} for axes {ax}")
    full = [(0, 0)] * r
    for i, d in enumerate(ax):
        full[d] = (p[i], p[i + len(ax)])
    _check_size(a, [n + lo + hi for n, (lo, hi) in zip(x.shape, full)])
    mode = a.get("mode", "constant")
    tmode = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}
    if mode not in tmode:
        unsupported(a, f"mode {mode!r}")
    flat = []
    for lo, hi in reversed(full):
        flat += [lo, hi]
    if mode == "constant":
        return ember.pad(x, flat, value=v)
    return ember.pad(x, flat, mode=tmode[mode])


def _norm_index(idx: Tensor, n: int, where: str) -> Tensor:
    i = idx.to(ember.int64) if idx.dtype != ember.int64 else idx
    if i.numel():
        lo, hi = int(ember.amin(i).item()), int(ember.amax(i).item())
        if lo < -n or hi >= n:
            raise ShapeError(f"{where}: index out of range [{-n}, {n}) (got {lo}..{hi})")
        if lo < 0:
            i = ember.where(i < 0, i + n, i)
    return i


@op("Gather")
def _gather(a: Attrs, x, idx):
    ax = axis_of(a.get("axis", 0), x.ndim, a.where())
    d, di = x._data, idx._data
    if (
        type(d) is np.ndarray
        and di.dtype.kind in "iu"
        and not (ember.is_grad_enabled() and x.requires_grad)
    ):
        try:  # np.take wraps negative indices as ONNX does: one call, no index checks and
            # copies in ember ops (MiniLM's word embedding rows: 98 -> ~10 us)
            return Tensor._wrap(np.take(d, di, axis=ax))
        except IndexError:
            pass  # out of range: the ops below raise the graph's error
    i = _norm_index(idx, x.shape[ax], f"ONNX {a.where()}")
    flat = ember.index_select(x, ax, i.reshape(-1))
    shape = list(x.shape[:ax]) + list(idx.shape) + list(x.shape[ax + 1 :])
    return flat.reshape(tuple(shape))


@op("GatherElements")
def _gather_el(a: Attrs, x, idx):
    ax = axis_of(a.get("axis", 0), x.ndim, a.where())
    return ember.gather(x, ax, _norm_index(idx, x.shape[ax], f"ONNX {a.where()}"))


@op("GatherND")
def _gather_nd(a: Attrs, x, idx):
    b = a.get("batch_dims", 0)
    ish = list(idx.shape)
    m = ish[-1]
    bshape = list(x.shape[:b])
    nb = math.prod(bshape)
    xb = x.reshape((nb,) + tuple(x.shape[b:]))
    ib = _nd_index(idx, x.shape[b : b + m], a).reshape(nb, -1, m)
    rest = list(x.shape[b + m :])
    rows = []
    for j in range(nb):
        sel = xb[j].reshape((math.prod(x.shape[b : b + m]),) + tuple(rest))
        lin = _linear_index(ib[j], x.shape[b : b + m])
        rows.append(ember.index_select(sel, 0, lin))
    out = ember.stack(rows) if rows else ember.zeros((0,), dtype=x.dtype)
    return out.reshape(tuple(ish[:-1] + rest))


def _nd_index(idx: Tensor, dims, a: Attrs) -> Tensor:
    i = idx.to(ember.int64)
    n = const(list(dims), np.int64)
    if i.numel():
        bad = ember.logical_or(i < -n, i >= n)
        if bool(ember.any(bad).item()):
            raise ShapeError(f"ONNX {a.where()}: index out of range for dims {list(dims)}")
    return ember.where(i < 0, i + n, i)


def _linear_index(i2: Tensor, dims) -> Tensor:
    strides = [math.prod(dims[k + 1 :]) for k in range(len(dims))]
    return (
        ember.sum(i2 * const(strides, np.int64), dim=-1)
        if dims
        else ember.zeros(i2.shape[0], dtype=ember.int64)
    )


_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


@op("ScatterElements", "Scatter")
def _scatter_el(a: Attrs, x, idx, upd):
    ax = axis_of(a.get("axis", 0), x.ndim, a.where())
    i = _norm_index(idx, x.shape[ax], f"ONNX {a.where()}")
    red = a.get("reduction", "none")
    if red == "none":
        return ember.scatter(x, ax, i, upd)
    return ember.scatter_reduce(x, ax, i, upd, _REDUCE[red], include_self=True)


@op("ScatterND")
def _scatter_nd(a: Attrs, x, idx, upd):
    m = idx.shape[-1]
    dims = x.shape[:m]
    i = _nd_index(idx, dims, a).reshape(-1, m)
    rest = tuple(x.shape[m:])
    flat = x.reshape((math.prod(dims),) + rest)
    lin = _linear_index(i, dims)
    u = upd.reshape((lin.shape[0],) + rest)
    red = a.get("reduction", "none")
    if red == "none":
        out = ember.index_copy(flat, 0, lin, u)
    else:
        ix = lin.reshape((-1,) + (1,) * len(rest)).expand(u.shape).contiguous()
        out = ember.scatter_reduce(flat, 0, ix, u, _REDUCE[red], include_self=True)
    return out.reshape(tuple(x.shape))


@op("Range")
def _range(a: Attrs, start, limit, delta):
    s, e, d = scalar(start), scalar(limit), scalar(delta)
    if d == 0:
        raise ShapeError(f"ONNX {a.where()}: delta 0")
    n = max(int(math.ceil((e - s) / d)), 0)
    _check_size(a, [n])
    dt = npdt(start)
    return const(s + np.arange(n, dtype=np.float64 if dt.kind == "f" else np.int64) * d, dt)


@op("ConstantOfShape")
def _const_of_shape(a: Attrs, shape):
    s = ints(shape)
    _check_size(a, s)
    v = a.get("value", None)
    if v is None:
        return ember.zeros(tuple(s), dtype=ember.float32)
    return ember.from_numpy(np.full(tuple(s), np.asarray(v).reshape(-1)[0], dtype=v.dtype))


@op("OneHot")
def _one_hot(a: Attrs, idx, depth, values):
    d = int(scalar(depth))
    ax = a.get("axis", -1)
    r = idx.ndim + 1
    ax = axis_of(ax, r, a.where())
    i = idx.to(ember.int64)
    i = ember.where(i < 0, i + d, i)
    ar = const(np.arange(d), np.int64).reshape((d,) + (1,) * (r - 1 - ax))
    hot = ember.unsqueeze(i, ax) == ar
    off, on = values[0], values[1]
    return ember.where(hot, on, off)


@op("Trilu")
def _trilu(a: Attrs, x, k=None):
    kk = int(scalar(k, 0))
    if a.get("upper", 1):
        return ember.triu(x, kk)
    return ember.tril(x, kk)


@op("Compress")
def _compress(a: Attrs, x, cond):
    c = np.asarray(cond.numpy()).reshape(-1).astype(bool)
    ax = a.get("axis", None)
    if ax is None:
        x, ax = x.reshape(-1), 0
    ax = axis_of(ax, x.ndim, a.where())
    if c.size > x.shape[ax]:
        raise ShapeError(f"ONNX {a.where()}: condition longer than dim {x.shape[ax]}")
    keep = np.nonzero(c)[0]
    return ember.index_select(x, ax, const(keep, np.int64))


@op("NonZero")
def _nonzero(a: Attrs, x):
    if x.ndim == 0:
        return const(np.zeros((0, int(bool(x.item()))), np.int64), np.int64)
    return ember.nonzero(x).mT.contiguous()


@op("ReverseSequence")
def _reverse_seq(a: Attrs, x, lens):
    bax, tax = a.get("batch_axis", 1), a.get("time_axis", 0)
    parts = []
    for b, n in enumerate(ints(lens)):
        row = x.narrow(bax, b, 1)
        head = ember.flip(row.narrow(tax, 0, n), [tax])
        tail = row.narrow(tax, n, x.shape[tax] - n)
        parts.append(ember.cat([head, tail], dim=tax))
    return ember.cat(parts, dim=bax)


@op("EyeLike")
def _eye_like(a: Attrs, x):
    dt = np_dtype(a.get("dtype"), a.where()) if "dtype" in a else npdt(x)
    n, m = x.shape
    return const(np.eye(n, m, a.get("k", 0)), dt)


@op("DepthToSpace")
def _d2s(a: Attrs, x):
    b = a.get("blocksize")
    n, c, h, w = x.shape
    if a.get("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@op("SpaceToDepth")
def _s2d(a: Attrs, x):
    b = a.get("blocksize")
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


@op("Unique")
def _unique(a: Attrs, x):
    arr = np.asarray(x.numpy())
    ax = a.get("axis", None)
    srt = a.get("sorted", 1)
    if ax is None:
        vals, first, inv, cnt = np.unique(
            arr.reshape(-1), return_index=True, return_inverse=True, return_counts=True
        )
    else:
        ax = axis_of(ax, arr.ndim, a.where())
        vals, first, inv, cnt = np.unique(
            arr, axis=ax, return_index=True, return_inverse=True, return_counts=True
        )
    inv = inv.reshape(-1)
    if not srt:
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        vals = np.take(vals, order, axis=0 if ax is None else ax)
        first, cnt, inv = first[order], cnt[order], rank[inv]
    return (const(vals, arr.dtype), const(first, np.int64), const(inv, np.int64),
            const(cnt, np.int64))  # fmt: skip


@op("CenterCropPad")
def _ccp(a: Attrs, x, shape):
    s = ints(shape)
    r = x.ndim
    ax = [axis_of(i, r, a.where()) for i in a.get("axes", list(range(r)))]
    for d, want in zip(ax, s):
        n = x.shape[d]
        if want < n:
            x = x.narrow(d, (n - want) // 2, want)
        elif want > n:
            lo = (want - n) // 2
            flat = [0, 0] * (r - 1 - d) + [lo, want - n - lo]
            x = ember.pad(x, flat)
    return x


@op("Dropout")
def _dropout(a: Attrs, x, ratio=None, training=None):
    if training is not None and bool(scalar(training)) and scalar(ratio, 0.5) > 0:
        unsupported(a, "training-mode dropout")
    if a.n_out > 1:
        return x, ember.ones(tuple(x.shape), dtype=ember.bool_)
    return x
