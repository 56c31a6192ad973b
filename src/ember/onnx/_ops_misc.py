"""ONNX Resize/Upsample, TopK and NonMaxSuppression."""

from __future__ import annotations

import math

import numpy as np

import ember
from ember.errors import ShapeError
from ember.onnx._registry import Attrs, axis_of, const, ints, npdt, op, scalar, unsupported
from ember.tensor import Tensor

# ---- Resize ------------------------------------------------------------------------------


def _coords(mode: str, n_in: int, n_out: int, scale: float, roi) -> np.ndarray:
    x = np.arange(n_out, dtype=np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adj = n_out / (scale * n_in)
        center = n_in / 2
        return center * (1 - adj) + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if n_out > 1 else np.zeros(n_out)
    if mode == "align_corners":
        return x * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros(n_out)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    if mode == "tf_crop_and_resize":
        s, e = roi
        if n_out > 1:
            return s * (n_in - 1) + x * (e - s) * (n_in - 1) / (n_out - 1)
        return np.full(n_out, 0.5 * (s + e) * (n_in - 1))
    raise ShapeError(f"Resize: unknown coordinate_transformation_mode {mode!r}")


def _nearest(c: np.ndarray, how: str, n_in: int) -> np.ndarray:
    if how == "round_prefer_floor":
        i = np.ceil(c - 0.5)
    elif how == "round_prefer_ceil":
        i = np.floor(c + 0.5)
    elif how == "floor":
        i = np.floor(c)
    elif how == "ceil":
        i = np.ceil(c)
    else:
        raise ShapeError(f"Resize: unknown nearest_mode {how!r}")
    return np.clip(i, 0, n_in - 1).astype(np.int64)


def _cubic(t: np.ndarray, A: float) -> np.ndarray:
    t = np.abs(t)
    return np.where(t <= 1, ((A + 2) * t - (A + 3)) * t * t + 1,
                    np.where(t < 2, ((A * t - 5 * A) * t + 8 * A) * t - 4 * A, 0.0))  # fmt: skip


def _matrix(c: np.ndarray, n_in: int, mode: str, A: float, excl: bool, aa: bool, scale: float):
    """Interpolation weights (n_out, n_in) for linear or cubic sampling at coordinates c."""
    n_out = c.size
    m = np.zeros((n_out, n_in))
    support = (1.0 if mode == "linear" else 2.0) * (1.0 / scale if aa and scale < 1 else 1.0)
    ks = scale if aa and scale < 1 else 1.0
    lin = mode == "linear"
    for o in range(n_out):
        x = c[o]
        if lin and not aa:
            x = min(max(x, 0.0), n_in - 1.0)
        lo = int(math.floor(x - support)) + 1 if aa else int(math.floor(x)) - (0 if lin else 1)
        hi = int(math.ceil(x + support)) - 1 if aa else lo + (1 if lin else 3)
        for j in range(lo, hi + 1):
            t = (j - x) * ks
            wgt = max(0.0, 1.0 - abs(t)) if lin else float(_cubic(np.array(t), A))
            if 0 <= j < n_in:
                m[o, j] += wgt
            elif not excl and not aa:
                m[o, min(max(j, 0), n_in - 1)] += wgt
        if excl or aa:
            s = m[o].sum()
            if s:
                m[o] /= s
    return m


def _apply_axis(x: Tensor, ax: int, m: np.ndarray) -> Tensor:
    xt = x.movedim(ax, -1)
    y = ember.matmul(xt, const(m.T, npdt(x) if npdt(x).kind == "f" else np.float32))
    return y.movedim(-1, ax)


def _nearest_nhwc(x: Tensor, shape, out, sc, ctm: str, nm: str) -> tuple | None:
    """The (rows, columns) source indices of a nearest Resize of the spatial dims of
    channels-last float32 (N, C, H, W) data (a fused conv's result), which runs as one NHWC
    gather (kernels.cpu.nhwc) with a channels-last result; None for any other input.

    index_select per axis made odd-strided copies that the Add or Concat after them (PP-OCRv4
    det's FPN) read slowly: 96x80x80 -> 160x160 took 0.74 ms, its Add 1.1 (ad-hoc per-node
    timings, 2 threads)."""
    d = x._data
    if d.ndim != 4 or d.dtype != np.float32 or out[:2] != shape[:2] or sc[0] != 1 or sc[1] != 1:
        return None
    if not d.transpose(0, 2, 3, 1).flags.c_contiguous:
        return None
    idx = []
    for k in (2, 3):
        if out[k] == shape[k] and sc[k] == 1.0:
            idx.append(np.arange(shape[k], dtype=np.int64))
        else:
            idx.append(_nearest(_coords(ctm, shape[k], out[k], sc[k], None), nm, shape[k]))
    return tuple(idx)


def _resize(a: Attrs, x: Tensor, scales, sizes, roi, opset_mode: bool, index_only=False):
    """The Resize (or, index_only: _nearest_nhwc's indices or None, computing nothing)."""
    r = x.ndim
    axes = [axis_of(v, r, a.where()) for v in a.get("axes", list(range(r)))]
    shape = list(x.shape)
    sc = [1.0] * r
    out = list(shape)
    if sizes:
        if len(sizes) != len(axes):
            raise ShapeError(f"ONNX {a.where()}: sizes {sizes} for axes {axes}")
        pol = a.get("keep_aspect_ratio_policy", "stretch")
        if pol == "stretch":
            for d, s in zip(axes, sizes):
                out[d], sc[d] = s, s / shape[d]
        else:
            ratios = [s / shape[d] for d, s in zip(axes, sizes)]
            k = min(ratios) if pol == "not_larger" else max(ratios)
            for d in axes:
                out[d] = int(math.floor(shape[d] * k + 0.5))
                sc[d] = k
    elif scales:
        if len(scales) != len(axes):
            raise ShapeError(f"ONNX {a.where()}: scales {scales} for axes {axes}")
        for d, s in zip(axes, scales):
            if s <= 0:
                raise ShapeError(f"ONNX {a.where()}: scale {s} must be positive")
            sc[d], out[d] = s, int(math.floor(shape[d] * s))
    else:
        raise ShapeError(f"ONNX {a.where()}: Resize needs scales or sizes")
    if math.prod(out) > (1 << 31):
        raise ShapeError(f"ONNX {a.where()}: output {out} is too large")
    mode = a.get("mode", "nearest")
    ctm = "asymmetric" if opset_mode else a.get("coordinate_transformation_mode", "half_pixel")
    nm = "floor" if opset_mode else a.get("nearest_mode", "round_prefer_floor")
    A = a.get("cubic_coeff_a", -0.75)
    excl = bool(a.get("exclude_outside", 0))
    aa = bool(a.get("antialias", 0))
    extrap = a.get("extrapolation_value", 0.0)
    roi_v = list(roi) if roi else []
    idx = None
    if mode == "nearest" and ctm != "tf_crop_and_resize":
        idx = _nearest_nhwc(x, shape, out, sc, ctm, nm)
    if index_only or idx is not None:
        if index_only:
            return idx
        from ember.kernels.cpu import nhwc

        return Tensor._wrap(nhwc.resize_nearest(x._data.transpose(0, 2, 3, 1), *idx)
                            .transpose(0, 3, 1, 2))  # fmt: skip
    y = x
    outside = None
    for d in range(r):
        if out[d] == shape[d] and sc[d] == 1.0 and ctm != "tf_crop_and_resize":
            continue
        rr = None
        if ctm == "tf_crop_and_resize":
            k = axes.index(d) if d in axes else None
            if k is None:
                continue
            rr = (roi_v[k], roi_v[k + len(axes)])
        c = _coords(ctm, shape[d], out[d], sc[d], rr)
        if ctm == "tf_crop_and_resize":
            bad = (c < 0) | (c > shape[d] - 1)
            if bad.any():
                view = [1] * r
                view[d] = out[d]
                bt = const(bad.reshape(view), np.bool_)
                outside = bt if outside is None else ember.logical_or(outside, bt)
        if mode == "nearest":
            y = ember.index_select(y, d, const(_nearest(c, nm, shape[d]), np.int64))
        elif mode in ("linear", "cubic"):
            y = _apply_axis(y, d, _matrix(c, shape[d], mode, A, excl, aa, sc[d]))
        else:
            unsupported(a, f"mode {mode!r}")
    if outside is not None:
        y = ember.where(outside, const(extrap, npdt(y)), y)
    return y.to(x.dtype) if y.dtype != x.dtype else y


@op("Resize")
def _resize_op(a: Attrs, x, roi=None, scales=None, sizes=None, index_only=False):
    if a.opset < 11:
        sc = [float(v) for v in np.asarray(roi.numpy()).reshape(-1)]  # opset 10: (X, scales)
        return _resize(a, x, sc, None, None, True, index_only)
    sc = [float(v) for v in np.asarray(scales.numpy()).reshape(-1)] if scales is not None else []
    sz = ints(sizes) if sizes is not None else []
    rv = [float(v) for v in np.asarray(roi.numpy()).reshape(-1)] if roi is not None else []
    return _resize(a, x, sc, sz, rv, False, index_only)


def nearest_nhwc_index(a: Attrs, x, *args) -> tuple | None:
    """A Resize node's (rows, columns) source indices when it is a nearest resize of the spatial
    dims of channels-last float32 data (kernels.cpu.nhwc gathers), else None; a fused node that
    reads the resized map in place of its copy computes them here."""
    return _resize_op(a, x, *args, index_only=True)


@op("Upsample")
def _upsample(a: Attrs, x, scales=None):
    sc = (
        list(a.get("scales"))
        if scales is None
        else [float(v) for v in np.asarray(scales.numpy()).reshape(-1)]
    )
    mode = a.get("mode", "nearest")
    vals = dict(a.values)
    vals["mode"] = "linear" if mode in ("linear", "bilinear") else mode
    from ember.onnx._registry import Attrs as _A

    b = _A(vals, a.opset, a.n_out, a.op, a.name)
    return _resize(b, x, sc, None, None, True)


# ---- TopK --------------------------------------------------------------------------------


@op("TopK")
def _topk(a: Attrs, x, k=None):
    kk = int(a.get("k")) if a.opset < 10 else int(scalar(k))
    ax = axis_of(a.get("axis", -1), x.ndim, a.where())
    n = x.shape[ax]
    if not 0 <= kk <= n:
        raise ShapeError(f"ONNX {a.where()}: k={kk} for a dim of {n}")
    largest = a.get("largest", 1)
    key = ember.neg(x) if largest and npdt(x).kind == "f" else x
    if largest and npdt(x).kind != "f":
        key = ember.neg(x.to(ember.int64)) if npdt(x).kind in "iu" else ember.neg(x)
    _, idx = ember.sort(key, dim=ax, stable=True)
    idx = idx.narrow(ax, 0, kk)
    return ember.gather(x, ax, idx), idx


# ---- NonMaxSuppression -------------------------------------------------------------------


@op("NonMaxSuppression")
def _nms(a: Attrs, boxes, scores, max_out=None, iou_th=None, score_th=None):
    mo = int(scalar(max_out, 0))
    it = float(scalar(iou_th, 0.0))
    st = scalar(score_th, None)
    b = boxes.to(ember.float32)
    if a.get("center_point_box", 0):
        xc, yc, w, h = (b[..., i] for i in range(4))
        y1, x1, y2, x2 = yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2
    else:
        ya, xa, yb, xb = (b[..., i] for i in range(4))
        y1, y2 = ember.minimum(ya, yb), ember.maximum(ya, yb)
        x1, x2 = ember.minimum(xa, xb), ember.maximum(xa, xb)
    area = (y2 - y1) * (x2 - x1)
    iy1 = ember.maximum(y1.unsqueeze(-1), y1.unsqueeze(-2))
    ix1 = ember.maximum(x1.unsqueeze(-1), x1.unsqueeze(-2))
    iy2 = ember.minimum(y2.unsqueeze(-1), y2.unsqueeze(-2))
    ix2 = ember.minimum(x2.unsqueeze(-1), x2.unsqueeze(-2))
    inter = ember.clamp(iy2 - iy1, min=0) * ember.clamp(ix2 - ix1, min=0)
    union = area.unsqueeze(-1) + area.unsqueeze(-2) - inter
    iou = np.asarray((inter / ember.where(union > 0, union, ember.ones_like(union))).numpy())
    iou = np.where(np.asarray(union.numpy()) > 0, iou, 0.0)
    sc = np.asarray(scores.to(ember.float32).numpy())
    out = []
    nb, nc, nbox = sc.shape
    if mo <= 0:
        return const(np.zeros((0, 3), np.int64), np.int64)
    for bi in range(nb):
        for ci in range(nc):
            s = sc[bi, ci]
            order = np.argsort(-s, kind="stable")
            keep: list[int] = []
            for j in order:
                if st is not None and not s[j] > st:
                    break
                if len(keep) >= mo:
                    break
                if all(iou[bi, j, q] <= it for q in keep):
                    keep.append(int(j))
            out += [[bi, ci, j] for j in keep]
    return const(np.asarray(out, np.int64).reshape(-1, 3), np.int64)
