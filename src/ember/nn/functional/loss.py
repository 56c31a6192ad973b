"""Losses with torch.nn.functional semantics; cross_entropy and nll_loss are fused Functions."""

from __future__ import annotations

import numpy as np

from ember.autograd import Function
from ember.errors import DTypeError, ShapeError
from ember.nn.functional._util import check_reduction, legacy_reduction, reduce_loss, up
from ember.ops import elementwise as _E
from ember.ops._util import ValueRangeError
from ember.tensor import Tensor


def _class_last(a: np.ndarray) -> np.ndarray:
    """(N, C, d1, ...) -> (N, d1, ..., C); (C,) stays."""
    return np.moveaxis(a, 1, -1) if a.ndim >= 2 else a


def _class_back(a: np.ndarray) -> np.ndarray:
    return np.moveaxis(a, -1, 1) if a.ndim >= 2 else a


def _reduce_arr(loss: np.ndarray, reduction: str, denom: float) -> np.ndarray:
    if reduction == "none":
        return loss
    s = loss.sum()
    if reduction == "sum":
        return np.asarray(s, loss.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(s / denom, loss.dtype)


def _grad_scale(g: np.ndarray, reduction: str, denom: float, shape: tuple) -> np.ndarray:
    if reduction == "none":
        return g
    with np.errstate(invalid="ignore", divide="ignore"):
        s = g / denom if reduction == "mean" else g
    return np.broadcast_to(s, shape)


def _picked_weights(t: np.ndarray, weight, ignore_index: int, C: int) -> tuple:
    """(valid mask, safe targets, per-sample class weights) for class-index targets."""
    valid = t != ignore_index
    tc = np.where(valid, t, 0)
    if tc.size and (tc.min() < 0 or tc.max() >= C):
        bad = tc[(tc < 0) | (tc >= C)].flat[0]
        raise IndexError(f"Target {bad} is out of bounds for {C} classes.")
    wt = weight[tc] if weight is not None else np.ones(tc.shape)
    return valid, tc, np.where(valid, wt, 0.0)


# rows of logits one chunk of the index-target cross-entropy covers: about this many elements
# (at least one row), so its temporaries (about 20 bytes an element: the float32 softmax, the
# float64 scaled gradient) stay near 1 MiB whatever the vocabulary (a 49152-class LM head)
CE_CHUNK_ELEMENTS = 1 << 16


def _row_chunks(z: np.ndarray) -> list:
    """Slices of z's first axis holding about CE_CHUNK_ELEMENTS elements each."""
    n = z.shape[0] if z.ndim >= 2 else 1
    per_row = z.size // n if n else 0
    step = max(1, CE_CHUNK_ELEMENTS // max(per_row, 1))
    return [slice(i, min(n, i + step)) for i in range(0, n, step)]


class _CERows:
    """The index-target cross-entropy of logits rows (class last), a chunk of rows at a time.

    ``forward(z)`` gives the per-row losses and keeps each row's max and log-sum-exp;
    ``grad(z, gl, out)`` recomputes the softmax from them and writes the gradient into out
    (which may be z itself: a chunk is read before it is written). ``z`` may be a block of rows
    of the whole (``start``): the fused linear + cross-entropy feeds one block at a time.
    """

    def __init__(self, valid, tc, wt, w, smoothing: float, C: int, ct) -> None:
        self.valid, self.tc, self.wt, self.w, self.eps, self.C = valid, tc, wt, w, smoothing, C
        self.m = np.empty(tc.shape + (1,), ct)
        self.logs = np.empty(tc.shape + (1,), ct)
        self.loss = np.empty(tc.shape, np.result_type(ct, wt.dtype))
        self.denom = float(wt.sum()) if w is not None else float(valid.sum())

    def _chunks(self, z: np.ndarray, start: int) -> list:
        if not z.size:
            return []
        if z.ndim < 2:
            return [(Ellipsis, Ellipsis)]
        return [(sl, slice(start + sl.start, start + sl.stop)) for sl in _row_chunks(z)]

    def _kernel(self, op: str, z: np.ndarray, *arrays):
        """The registered kernel of ``ce_lse`` / ``ce_grad`` for 2-d z without smoothing."""
        if self.eps > 0 or z.ndim != 2 or type(z) is not np.ndarray:
            return None
        from ember.kernels import registry

        return registry.pick(op, "cpu", (z, *arrays), {})

    def forward(self, z: np.ndarray, start: int = 0) -> np.ndarray:
        """Per-row losses of z's rows (kept for all rows in ``self.loss``)."""
        eps, C, w = self.eps, self.C, self.w
        kern = self._kernel("ce_lse", z) if z.size else None
        if kern is not None:  # each row's max and log-sum-exp in one pass (kernels.cpu)
            rows = slice(start, start + z.shape[0])
            m, logs = kern.fn(z)
            self.m[rows, 0], self.logs[rows, 0] = m, logs
            picked = (z[np.arange(z.shape[0]), self.tc[rows]] - m) - logs
            self.loss[rows] = -self.wt[rows] * picked
            return self.loss
        for local, rows in self._chunks(z, start):
            zc = up(z[local])
            m = zc.max(axis=-1, keepdims=True)
            logp = zc - m
            logs = np.log(np.exp(logp).sum(axis=-1, keepdims=True))
            logp -= logs
            self.m[rows], self.logs[rows] = m, logs
            picked = np.take_along_axis(logp, self.tc[rows][..., None], axis=-1)[..., 0]
            lc = -self.wt[rows] * picked
            if eps > 0:
                smooth = -(logp * w).sum(-1) if w is not None else -logp.sum(-1)
                lc = (1 - eps) * lc + (eps / C) * np.where(self.valid[rows], smooth, 0.0)
            self.loss[rows] = lc
        if not z.size and start == 0:
            self.loss = -self.wt * np.zeros(self.tc.shape, self.m.dtype)
        return self.loss

    def grad(self, z: np.ndarray, gl: np.ndarray, out: np.ndarray, start: int = 0) -> None:
        """d(loss)/d(z) for z's rows into out; gl: the per-row output gradient (..., 1)."""
        eps, C, w = self.eps, self.C, self.w
        if z.size and out.ndim == 2:
            rows = slice(start, start + z.shape[0])
            s = self.wt[rows].astype(np.float64)
            args = (self.m[rows, 0], self.logs[rows, 0], s, s,
                    np.broadcast_to(gl[rows, 0], s.shape), self.tc[rows], self.valid[rows])  # fmt: skip
            kern = self._kernel("ce_grad", z, *args, out)
            if kern is not None:  # softmax - onehot, scaled, in one pass (kernels.cpu)
                kern.fn(z, *args, out)
                return
        for local, rows in self._chunks(z, start):
            p = up(z[local]) - self.m[rows]
            p -= self.logs[rows]
            np.exp(p, out=p)  # this chunk's softmax
            s = self.wt[rows] * (1 - eps)
            if eps > 0:
                tot = w.sum() if w is not None else C
                s = s + self.valid[rows] * (eps / C) * tot
            dz = p * s[..., None]
            if eps > 0:
                dz -= (eps / C) * (w if w is not None else 1.0) * self.valid[rows][..., None]
            tcc = self.tc[rows][..., None]
            np.put_along_axis(
                dz,
                tcc,
                np.take_along_axis(dz, tcc, -1) - ((1 - eps) * self.wt[rows])[..., None],
                -1,
            )
            with np.errstate(invalid="ignore"):  # 0 * nan where nothing counted: zeroed below
                np.multiply(dz, gl[rows], out=out[local], casting="unsafe")
            ignored = ~self.valid[rows]
            if ignored.any():
                # ignored positions get no gradient, even where nothing counted and the mean
                # is 0/0 (torch's rule; 0 * nan would poison an optimizer step)
                out[local][ignored] = 0


class _CrossEntropy(Function):
    """log_softmax over the class dim + weighted NLL, label smoothing; backward softmax - target.

    With class-index targets (a language model's next tokens) it runs a chunk of rows at a time
    and keeps only each row's max and log-sum-exp for backward, which recomputes the
    probabilities chunk by chunk into the one gradient array: no float32 copy of the logits,
    of their softmax or of a scaled intermediate is ever whole (each was as large as the logits,
    seq x vocab). The float operations are the unchunked ones, so loss and gradients are the
    same bits.
    """

    def meta(self, x, *t, target, weight, ignore_index, smoothing, reduction):
        shape = x.shape[:1] + x.shape[2:] if x.ndim >= 2 else ()
        return (shape if reduction == "none" else ()), x.dtype

    def forward(self, x, *t, target, weight, ignore_index, smoothing, reduction):
        if target is not None:
            return self._forward_indices(x, target, weight, ignore_index, smoothing, reduction)
        dt = x.dtype
        z = _class_last(up(x))
        C = z.shape[-1]
        m = z.max(axis=-1, keepdims=True) if z.size else np.zeros(z.shape[:-1] + (1,), z.dtype)
        logp = z - m
        logp -= np.log(np.exp(logp).sum(axis=-1, keepdims=True))
        w = None if weight is None else weight.astype(logp.dtype)
        self.C, self.reduction, self.smoothing, self.w = C, reduction, smoothing, w
        tp = _class_last(up(t[0])).astype(logp.dtype)
        if smoothing > 0:
            tp = tp * (1 - smoothing) + smoothing / C
        a = tp * w if w is not None else tp
        loss = -(logp * a).sum(-1)
        denom = float(loss.size)
        self.a = a
        self.logp = logp
        self.p = np.exp(logp)
        self.denom, self.lshape, self.target = denom, loss.shape, target
        return _reduce_arr(loss, reduction, denom).astype(dt, copy=False)

    def _forward_indices(self, x, target, weight, ignore_index, smoothing, reduction):
        z = _class_last(x)  # a view; each chunk goes to float32 (opmath) on its own
        C = z.shape[-1]
        ct = up(z[:0]).dtype
        w = None if weight is None else weight.astype(ct)
        valid, tc, wt = _picked_weights(target, w, ignore_index, C)
        rows = _CERows(valid, tc, wt, w, smoothing, C, ct)
        loss = rows.forward(z)
        self.C, self.reduction, self.smoothing, self.w = C, reduction, smoothing, w
        self.x, self.rows = x, rows
        self.denom, self.lshape, self.target = rows.denom, loss.shape, target
        return _reduce_arr(loss, reduction, rows.denom).astype(x.dtype, copy=False)

    def backward(self, g):
        gl = _grad_scale(up(g), self.reduction, self.denom, self.lshape)[..., None]
        if self.target is not None:
            return self._backward_indices(gl)
        eps, w = self.smoothing, self.w
        gx = gt = None
        if self.needs_input_grad[0]:
            gx = _class_back((self.p * self.a.sum(-1, keepdims=True) - self.a) * gl)
        if self.needs_input_grad[1]:
            d = -self.logp * (w if w is not None else 1.0) * (1 - eps)
            gt = _class_back(d * gl)
        return gx, gt

    def _backward_indices(self, gl):
        z = _class_last(self.x)
        out = np.empty(z.shape, self.x.dtype)  # the gradient, in the logits' dtype
        self.rows.grad(z, gl, out)
        return _class_back(out)


def _check_ce_shapes(input: Tensor, target: Tensor, name: str) -> bool:
    """Validate shapes; True for class-index targets, False for class probabilities."""
    if input.ndim == 0:
        raise ShapeError(
            f"{name}: input must have at least 1 dim (C) or 2 dims (N, C), got a 0-d tensor"
        )
    probs = target.is_floating_point()
    want = (
        tuple(input.shape)
        if probs
        else tuple(input.shape[:1] + input.shape[2:])
        if input.ndim >= 2
        else ()
    )
    if tuple(target.shape) != want:
        kind = "class probabilities" if probs else "class indices"
        raise ShapeError(
            f"{name}: target of shape {tuple(target.shape)} does not fit input of shape "
            f"{tuple(input.shape)} "
            f"(expected {want} for {kind})"
        )
    return not probs


def _weight_arr(weight, C: int, name: str):
    if weight is None:
        return None
    w = np.asarray(up(weight._data if isinstance(weight, Tensor) else np.asarray(weight)))
    if w.shape != (C,):
        raise ShapeError(f"{name}: weight of shape {w.shape} must be a 1-D tensor of size C={C}")
    return w


def cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    size_average=None,
    ignore_index: int = -100,
    reduce=None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Softmax cross-entropy of logits (C,), (N, C) or (N, C, d1, ...) against class indices or
    class probabilities; with class weights, ignore_index and label smoothing, as torch."""
    reduction = check_reduction(legacy_reduction(size_average, reduce, reduction))
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    if not input.is_floating_point():
        raise DTypeError(f"cross_entropy: expected float logits, got {input.dtype}")
    indices = _check_ce_shapes(input, target, "cross_entropy")
    C = input.shape[1] if input.ndim >= 2 else input.shape[0]
    w = _weight_arr(weight, C, "cross_entropy")
    kw = dict(weight=w, ignore_index=ignore_index, smoothing=label_smoothing, reduction=reduction)
    if indices:
        t = target._data if target._device.type != "meta" else np.zeros(target.shape, np.int64)
        return _CrossEntropy.apply(input, target=np.asarray(t).astype(np.int64, copy=False), **kw)
    if target.dtype != input.dtype:
        target = target.to(input.dtype)
    return _CrossEntropy.apply(input, target, target=None, **kw)


# logits one block of the fused linear + cross-entropy computes at once (8 MiB of float32):
# rows enough for one BLAS product per block, far fewer than a long sequence's
LINEAR_CE_BLOCK_ELEMENTS = 1 << 21


class _LinearCrossEntropy(Function):
    """cross_entropy(linear(h, W, b), target) a block of rows at a time; W dense or quantized.

    Forward keeps each row's max and log-sum-exp (``_CERows``), not the logits; backward
    computes each block's logits again, turns them into their gradient in place and takes it
    back through the same ``linear`` (the quantized transposed product for a QTensor, BLAS for
    a dense W), so neither the (N, C) logits nor their gradient ever exists whole.
    """

    def forward(self, h, *params, qweight, has_bias, target, ignore_index, smoothing, reduction):
        self.h, self.params, self.qweight, self.has_bias = h, params, qweight, has_bias
        C = int(qweight.shape[0]) if qweight is not None else params[0].shape[0]
        ct = up(h[:0]).dtype
        valid, tc, wt = _picked_weights(target, None, ignore_index, C)
        self.rows = rows = _CERows(valid, tc, wt, None, smoothing, C, ct)
        for r0, r1 in self._blocks(h.shape[0], C):
            # recorded as backward records it (then dropped): the same dispatch, the same logits
            rows.forward(self._logits(h[r0:r1], (0,))[0]._data, r0)
        if not h.shape[0]:
            rows.forward(np.zeros((0, C), ct))
        self.reduction, self.denom, self.lshape = reduction, rows.denom, tc.shape
        return _reduce_arr(rows.loss, reduction, rows.denom).astype(h.dtype, copy=False)

    @staticmethod
    def _blocks(n: int, C: int) -> list:
        step = max(1, LINEAR_CE_BLOCK_ELEMENTS // max(C, 1))
        return [(r0, min(n, r0 + step)) for r0 in range(0, n, step)]

    def _logits(self, hc: np.ndarray, need: tuple) -> tuple:
        """(logits tensor, leaves): one block's linear, recorded for the leaves ``need`` names
        (0: h, 1: a dense W, 2: b) so backward can take the gradient through it."""
        from ember.autograd import enable_grad
        from ember.device import CPU
        from ember.ops.linalg import linear

        def leaf(a, i):
            t = Tensor._wrap(a, CPU)
            return t.requires_grad_() if i in need else t

        ht = leaf(hc, 0)
        w = self.qweight if self.qweight is not None else leaf(self.params[0], 1)
        b = leaf(self.params[-1], 2) if self.has_bias else None
        with enable_grad():
            z = linear(ht, w, b)
        leaves = [t for t, i in ((ht, 0), (w, 1), (b, 2)) if i in need]
        return z, leaves

    def backward(self, g):
        from ember.autograd import grad as autograd_grad

        gl = _grad_scale(up(g), self.reduction, self.denom, self.lshape)[..., None]
        h, rows, dense = self.h, self.rows, self.qweight is None
        slots = [0] + ([1] if dense else []) + ([2] if self.has_bias else [])
        need = tuple(s for s, n in zip(slots, self.needs_input_grad) if n)
        acc = {s: None for s in need}
        for r0, r1 in self._blocks(h.shape[0], rows.C):
            z, leaves = self._logits(h[r0:r1], need)
            rows.grad(z._data, gl, z._data, r0)  # the logits become their gradient, in place
            got = autograd_grad(z, leaves, grad_outputs=z._data, allow_unused=True)
            for s, gs in zip(need, got):
                if gs is None:
                    continue
                if s == 0:
                    if acc[0] is None:
                        acc[0] = np.empty(h.shape, gs._data.dtype)
                    acc[0][r0:r1] = gs._data
                elif acc[s] is None:
                    acc[s] = gs._data
                else:
                    acc[s] += gs._data
            del z, leaves, got  # before the next block's logits, not after
        out = []
        for s in slots:
            a = acc.get(s)
            if a is None and s in need:  # no rows: a zero gradient
                a = np.zeros_like(h if s == 0 else self.params[0 if s == 1 else -1])
            out.append(a)
        return tuple(out)


def linear_cross_entropy(
    input: Tensor,
    weight,
    target: Tensor,
    bias: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """``cross_entropy(linear(input, weight, bias), target)`` without the logits: a language
    model's loss straight from its last hidden states (..., H) and head weight (C, H).

    Runs a block of rows at a time in forward and backward (which computes each block's logits
    once more), so the (tokens, vocab) float32 logits and their gradient are never whole: the
    extra memory is one block (``LINEAR_CE_BLOCK_ELEMENTS``). ``weight`` may be a QTensor (its
    quantized kernels run, and it gets no gradient) or a float32/float64 Tensor (it gets one);
    other dtypes run the plain composition.
    """
    from ember.ops.linalg import linear

    reduction = check_reduction(reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    if not input.is_floating_point():
        raise DTypeError(f"linear_cross_entropy: expected a float input, got {input.dtype}")
    if target.is_floating_point():
        raise DTypeError(
            f"linear_cross_entropy: expected class indices (an integer target), got {target.dtype}"
        )
    if input.ndim == 0 or tuple(target.shape) != tuple(input.shape[:-1]):
        raise ShapeError(
            f"linear_cross_entropy: target of shape {tuple(target.shape)} does not fit input of "
            f"shape {tuple(input.shape)} (expected {tuple(input.shape[:-1])})"
        )
    quantized = type(weight) is not Tensor and hasattr(weight, "matmul_t")
    wshape = tuple(int(d) for d in weight.shape)
    if len(wshape) != 2 or wshape[1] != input.shape[-1]:
        raise ShapeError(
            f"linear_cross_entropy: input of shape {tuple(input.shape)} does not fit a weight "
            f"{wshape} (expected input[..., {wshape[-1] if wshape else '?'}])"
        )
    kw = dict(ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)
    f64 = (np.dtype(np.float32), np.dtype(np.float64))
    lean = (
        input._device.type == "cpu"
        and input._data.dtype in f64
        and (quantized or weight._data.dtype == input._data.dtype)
        and (bias is None or bias._data.dtype == input._data.dtype)
    )
    if not lean:
        logits = linear(input, weight, bias)
        out = cross_entropy(logits.reshape(-1, wshape[0]), target.reshape(-1), **kw)
        return out.reshape(tuple(target.shape)) if reduction == "none" else out
    h = input.reshape(-1, wshape[1])
    t = np.asarray(target._data).reshape(-1).astype(np.int64, copy=False)
    tensors = [h] + ([] if quantized else [weight]) + ([bias] if bias is not None else [])
    out = _LinearCrossEntropy.apply(
        *tensors, qweight=weight if quantized else None, has_bias=bias is not None, target=t,
        ignore_index=ignore_index, smoothing=label_smoothing, reduction=reduction,
    )  # fmt: skip
    return out.reshape(tuple(target.shape)) if reduction == "none" else out


class _NLL(Function):
    """-w[y] * input[y] per sample (input holds log-probabilities); scatter in backward."""

    def meta(self, x, target, weight, ignore_index, reduction):
        shape = x.shape[:1] + x.shape[2:] if x.ndim >= 2 else ()
        return (shape if reduction == "none" else ()), x.dtype

    def forward(self, x, target, weight, ignore_index, reduction):
        xl = _class_last(up(x))
        C = xl.shape[-1]
        w = None if weight is None else weight.astype(xl.dtype)
        valid, tc, wt = _picked_weights(target, w, ignore_index, C)
        loss = -wt * np.take_along_axis(xl, tc[..., None], axis=-1)[..., 0]
        denom = float(wt.sum())
        self.tc, self.wt, self.xshape, self.reduction, self.denom, self.lshape = (
            tc,
            wt,
            xl.shape,
            reduction,
            denom,
            loss.shape,
        )
        return _reduce_arr(loss, reduction, denom).astype(x.dtype, copy=False)

    def backward(self, g):
        gl = _grad_scale(up(g), self.reduction, self.denom, self.lshape)
        dz = np.zeros(self.xshape, gl.dtype)
        np.put_along_axis(dz, self.tc[..., None], (-self.wt * gl)[..., None], -1)
        return _class_back(dz)


def nll_loss(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    size_average=None,
    ignore_index: int = -100,
    reduce=None,
    reduction: str = "mean",
) -> Tensor:
    """Negative log-likelihood of log-probabilities (C,), (N, C), (N, C, d1, ...) at targets."""
    reduction = check_reduction(legacy_reduction(size_average, reduce, reduction))
    if target.is_floating_point():
        raise DTypeError(
            f"nll_loss: expected class indices (an integer target), got {target.dtype}"
        )
    _check_ce_shapes(input, target, "nll_loss")
    C = input.shape[1] if input.ndim >= 2 else input.shape[0]
    w = _weight_arr(weight, C, "nll_loss")
    t = target._data if target._device.type != "meta" else np.zeros(target.shape, np.int64)
    return _NLL.apply(
        input,
        target=np.asarray(t).astype(np.int64, copy=False),
        weight=w,
        ignore_index=ignore_index,
        reduction=reduction,
    )


def _pair(input: Tensor, target, name: str) -> tuple:
    if not isinstance(target, Tensor):
        target = Tensor._wrap(np.asarray(target, input._data.dtype), input.device)
    if tuple(input.shape) != tuple(target.shape):
        try:
            np.broadcast_shapes(tuple(input.shape), tuple(target.shape))
        except ValueError:
            raise ShapeError(
                f"{name}: input of shape {tuple(input.shape)} and target of shape "
                f"{tuple(target.shape)} "
                "do not broadcast"
            ) from None
    return input, target


def mse_loss(
    input: Tensor,
    target: Tensor,
    size_average=None,
    reduce=None,
    reduction: str = "mean",
    weight=None,
) -> Tensor:
    """(input - target)**2, reduced."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    input, target = _pair(input, target, "mse_loss")
    d = input - target
    loss = d * d
    if weight is not None:
        loss = loss * weight
    return reduce_loss(loss, reduction)


def l1_loss(
    input: Tensor,
    target: Tensor,
    size_average=None,
    reduce=None,
    reduction: str = "mean",
    weight=None,
) -> Tensor:
    """|input - target|, reduced."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    input, target = _pair(input, target, "l1_loss")
    loss = _E.abs(input - target)
    if weight is not None:
        loss = loss * weight
    return reduce_loss(loss, reduction)


def smooth_l1_loss(
    input: Tensor,
    target: Tensor,
    size_average=None,
    reduce=None,
    reduction: str = "mean",
    beta: float = 1.0,
) -> Tensor:
    """0.5 d**2 / beta where |d| < beta, else |d| - 0.5 beta (d = input - target)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    if beta < 0:
        raise ValueError("smooth_l1_loss does not support negative values for beta.")
    input, target = _pair(input, target, "smooth_l1_loss")
    if beta == 0.0:
        return l1_loss(input, target, reduction=reduction)
    d = input - target
    ad = _E.abs(d)
    loss = _E.where(ad < beta, d * d * (0.5 / beta), ad - 0.5 * beta)
    return reduce_loss(loss, reduction)


def huber_loss(
    input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0, weight=None
) -> Tensor:
    """0.5 d**2 where |d| < delta, else delta (|d| - 0.5 delta)."""
    input, target = _pair(input, target, "huber_loss")
    d = input - target
    ad = _E.abs(d)
    loss = _E.where(ad < delta, d * d * 0.5, (ad - 0.5 * delta) * delta)
    if weight is not None:
        loss = loss * weight
    return reduce_loss(loss, reduction)


def _in_unit_interval(t: Tensor, what: str) -> None:
    """ValueRangeError unless every element of t is in [0, 1] (NaN is not), as torch checks."""
    if t.device.type == "meta" or not t.numel():
        return
    a = t._data
    if a.dtype.name == "bfloat16":
        a = a.astype(np.float32)
    if not ((a >= 0) & (a <= 1)).all():
        raise ValueRangeError(
            f"binary_cross_entropy: all elements of {what} should be between 0 and 1"
        )


def binary_cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    size_average=None,
    reduce=None,
    reduction: str = "mean",
) -> Tensor:
    """-(t log(x) + (1 - t) log(1 - x)) of probabilities x (logs clamped at -100, as torch)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ShapeError(
            f"binary_cross_entropy: target size {tuple(target.shape)} must be the same "
            "as input size "
            f"{tuple(input.shape)}"
        )
    _in_unit_interval(input, "input")
    _in_unit_interval(target, "target")
    lx = _E.clamp(_E.log(input), min=-100)
    l1x = _E.clamp(_E.log(1 - input), min=-100)
    loss = -(target * lx + (1 - target) * l1x)
    if weight is not None:
        loss = loss * weight
    return reduce_loss(loss, reduction)


def binary_cross_entropy_with_logits(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    size_average=None,
    reduce=None,
    reduction: str = "mean",
    pos_weight: Tensor | None = None,
) -> Tensor:
    """Sigmoid + binary cross-entropy in one stable expression; pos_weight weighs positives."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ShapeError(
            f"binary_cross_entropy_with_logits: target size {tuple(target.shape)} must "
            "be the same as "
            f"input size {tuple(input.shape)}"
        )
    sp = _E.softplus(-input)
    if pos_weight is not None:
        lw = (pos_weight - 1) * target + 1
        loss = (1 - target) * input + lw * sp
    else:
        loss = (1 - target) * input + sp
    if weight is not None:
        loss = loss * weight
    return reduce_loss(loss, reduction)


def _xlogy(t: Tensor) -> Tensor:
    pos = t > 0
    safe = _E.where(pos, t, t * 0 + 1)
    return _E.where(pos, t * _E.log(safe), t * 0)


def kl_div(
    input: Tensor,
    target: Tensor,
    size_average=None,
    reduce=None,
    reduction: str = "mean",
    log_target: bool = False,
) -> Tensor:
    """Pointwise KL(target || exp(input)) of log-probabilities; 'batchmean' divides by N."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    if log_target:
        loss = _E.exp(target) * (target - input)
    else:
        loss = _xlogy(target) - target * input
    if reduction == "batchmean":
        return loss.sum() / (input.shape[0] if input.ndim else 1)
    return reduce_loss(loss, reduction)


def poisson_nll_loss(
    input: Tensor,
    target: Tensor,
    log_input: bool = True,
    full: bool = False,
    size_average=None,
    eps: float = 1e-8,
    reduce=None,
    reduction: str = "mean",
) -> Tensor:
    """Poisson negative log-likelihood."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    if log_input:
        loss = _E.exp(input) - target * input
    else:
        loss = input - target * _E.log(input + eps)
    if full:
        st = target * _E.log(_E.where(target > 1, target, target * 0 + 1)) - target
        st = st + 0.5 * _E.log(2 * np.pi * _E.where(target > 1, target, target * 0 + 1))
        loss = loss + _E.where(target > 1, st, st * 0)
    return reduce_loss(loss, reduction)


def gaussian_nll_loss(
    input: Tensor,
    target: Tensor,
    var,
    full: bool = False,
    eps: float = 1e-6,
    reduction: str = "mean",
) -> Tensor:
    """Gaussian negative log-likelihood with predicted variance var."""
    if not isinstance(var, Tensor):
        var = Tensor._wrap(np.asarray(var, input._data.dtype), input.device)
    v = _E.clamp(var, min=eps)
    loss = 0.5 * (_E.log(v) + (input - target) ** 2 / v)
    if full:
        loss = loss + 0.5 * float(np.log(2 * np.pi))
    return reduce_loss(loss, reduction)


def margin_ranking_loss(
    input1: Tensor,
    input2: Tensor,
    target: Tensor,
    margin: float = 0.0,
    reduction: str = "mean",
    **legacy,
) -> Tensor:
    """max(0, -target * (input1 - input2) + margin)."""
    return reduce_loss(_E.relu(-target * (input1 - input2) + margin), reduction)


def hinge_embedding_loss(
    input: Tensor, target: Tensor, margin: float = 1.0, reduction: str = "mean", **legacy
) -> Tensor:
    """x where target == 1, max(0, margin - x) where target == -1."""
    pos = _E.where(target == 1, input, input * 0)
    neg = _E.where(target == -1, _E.relu(margin - input), input * 0)
    return reduce_loss(pos + neg, reduction)


def soft_margin_loss(input: Tensor, target: Tensor, reduction: str = "mean", **legacy) -> Tensor:
    """log(1 + exp(-target * input))."""
    return reduce_loss(_E.softplus(-target * input), reduction)


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """Cosine of the angle between x1 and x2 along dim (each norm clamped at eps)."""
    n1 = x1.norm(2, dim, keepdim=True)
    n2 = x2.norm(2, dim, keepdim=True)
    from ember.autograd import no_grad

    with no_grad():
        c1 = n1.clamp_min(eps) - n1
        c2 = n2.clamp_min(eps) - n2
    return ((x1 / (n1 + c1)) * (x2 / (n2 + c2))).sum(dim)


def pairwise_distance(
    x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False
) -> Tensor:
    """||x1 - x2 + eps||_p along the last dim."""
    return (x1 - x2 + eps).norm(p, -1, keepdim=keepdim)


def cosine_embedding_loss(
    input1: Tensor,
    input2: Tensor,
    target: Tensor,
    margin: float = 0.0,
    reduction: str = "mean",
    **legacy,
) -> Tensor:
    """1 - cos(x1, x2) where target == 1, max(0, cos(x1, x2) - margin) where target == -1."""
    cos = cosine_similarity(input1, input2, dim=-1, eps=1e-12)
    loss = _E.where(target == 1, 1 - cos, _E.where(target == -1, _E.relu(cos - margin), cos * 0))
    return reduce_loss(loss, reduction)


def triplet_margin_loss(
    anchor: Tensor,
    positive: Tensor,
    negative: Tensor,
    margin: float = 1.0,
    p: float = 2.0,
    eps: float = 1e-6,
    swap: bool = False,
    reduction: str = "mean",
    **legacy,
) -> Tensor:
    """max(d(a, p) - d(a, n) + margin, 0) with pairwise distances."""
    dp = pairwise_distance(anchor, positive, p, eps)
    dn = pairwise_distance(anchor, negative, p, eps)
    if swap:
        dn = _E.minimum(dn, pairwise_distance(positive, negative, p, eps))
    return reduce_loss(_E.relu(dp - dn + margin), reduction)


def multilabel_soft_margin_loss(
    input: Tensor, target: Tensor, weight=None, reduction: str = "mean", **legacy
) -> Tensor:
    """Per-class logistic loss averaged over classes."""
    from ember.nn.functional.activation import logsigmoid

    loss = -(target * logsigmoid(input) + (1 - target) * logsigmoid(-input))
    if weight is not None:
        loss = loss * weight
    loss = loss.mean(-1)
    return reduce_loss(loss, reduction)


__all__ = [
    "cross_entropy",
    "linear_cross_entropy",
    "nll_loss",
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "kl_div",
    "poisson_nll_loss",
    "gaussian_nll_loss",
    "margin_ranking_loss",
    "hinge_embedding_loss",
    "soft_margin_loss",
    "cosine_similarity",
    "pairwise_distance",
    "cosine_embedding_loss",
    "triplet_margin_loss",
    "multilabel_soft_margin_loss",
]
