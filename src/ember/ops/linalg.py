"""Linear algebra: matmul and its family, einsum, tensordot, linear, and a few np.linalg ops.

Products go to BLAS through numpy. float16/bfloat16 compute in float32 and round back (torch's
opmath). ``ember.linalg`` is this module: ``ember.linalg.det/inv/solve/cholesky/qr`` as in torch.
"""

from __future__ import annotations

import numpy as np

from ember import dtypes as _dt
from ember.autograd import Function, unbroadcast
from ember.errors import AutogradError, DTypeError, ShapeError
from ember.ops._einsum import einsum, tensordot
from ember.ops._util import coerce, wrap_dim
from ember.tensor import Tensor

_LOW = _dt.HALF_FLOATS  # float16, bfloat16 (ml_dtypes not imported to ask)
_F32 = np.dtype(np.float32)


def _up(a: np.ndarray) -> np.ndarray:
    """float16/bfloat16 -> float32 (opmath); other dtypes pass through."""
    return a.astype(_F32) if a.dtype in _LOW else a


def _same_dtype(op: str, *ts) -> None:
    dt = ts[0]._data.dtype
    for t in ts[1:]:
        if t._data.dtype != dt:
            raise DTypeError(
                f"{op}: expected operands of one dtype, got {ts[0].dtype} and {t.dtype}"
            )
    if dt == np.bool_:
        raise DTypeError(f"{op}: not implemented for bool tensors")


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# ------------------------------------------------------------------ matmul
def _matmul_shape(sa: tuple, sb: tuple, op: str = "matmul") -> tuple:
    """The output shape of torch.matmul for operand shapes sa and sb (ShapeError on mismatch)."""
    if not sa or not sb:
        raise ShapeError(f"{op}: both arguments need to be at least 1-D, got shapes {sa} and {sb}")
    ka = sa[-1]
    kb = sb[0] if len(sb) == 1 else sb[-2]
    if ka != kb:
        raise ShapeError(f"{op}: shapes {sa} and {sb} cannot be multiplied ({ka} != {kb})")
    m = sa[-2:-1] if len(sa) >= 2 else ()
    n = sb[-1:] if len(sb) >= 2 else ()
    try:
        batch = np.broadcast_shapes(sa[:-2], sb[:-2])
    except ValueError:
        raise ShapeError(
            f"{op}: batch dimensions of shapes {sa} and {sb} do not broadcast"
        ) from None
    return tuple(batch) + m + n


def _mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.matmul with a single BLAS call for (..., K) @ (K, N) and opmath for low precision."""
    lo = a.dtype if a.dtype in _LOW else None
    if lo is not None:
        a, b = a.astype(_F32), b.astype(_F32)
    if b.ndim == 2 and a.ndim > 2:
        lead = a.shape[:-1]
        out = np.matmul(a.reshape(_prod(lead), a.shape[-1]), b).reshape(lead + (b.shape[1],))
    else:
        out = np.matmul(a, b)
    out = np.asarray(out)
    return out.astype(lo) if lo is not None else out


class Matmul(Function):
    """torch.matmul: 1-D promotion/removal and broadcasting batch dims."""

    def forward(self, a, b):
        self.a, self.b = a, b
        return _mm(a, b)

    def meta(self, a, b):
        return _matmul_shape(a.shape, b.shape), a.dtype

    def backward(self, g):
        a, b, g = _up(self.a), _up(self.b), _up(g)
        a2 = a if a.ndim >= 2 else a.reshape(1, -1)
        b2 = b if b.ndim >= 2 else b.reshape(-1, 1)
        batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        g2 = g.reshape(batch + (a2.shape[-2], b2.shape[-1]))
        ga = gb = None
        if self.needs_input_grad[0]:
            if b2.ndim == 2:
                ga = _mm(g2, b2.T)
            else:
                ga = unbroadcast(np.matmul(g2, np.swapaxes(b2, -1, -2)), a2.shape)
            ga = ga.reshape(a.shape)
        if self.needs_input_grad[1]:
            if b2.ndim == 2 and a2.ndim > 2:
                k, n = a2.shape[-1], b2.shape[-1]
                gb = np.broadcast_to(a2, batch + a2.shape[-2:]).reshape(-1, k).T @ g2.reshape(-1, n)
            else:
                gb = unbroadcast(np.matmul(np.swapaxes(a2, -1, -2), g2), b2.shape)
            gb = gb.reshape(b.shape)
        return ga, gb


def matmul(input: Tensor, other: Tensor) -> Tensor:
    """Matrix product with torch.matmul's rules (1-D operands, broadcast batch dims)."""
    if not isinstance(other, Tensor) or not isinstance(input, Tensor):
        raise DTypeError(
            f"matmul: expected two tensors, got {type(input).__name__} and {type(other).__name__}"
        )
    _same_dtype("matmul", input, other)
    _matmul_shape(input._data.shape, other._data.shape)
    return Matmul.apply(input, other)


def mm(input: Tensor, mat2: Tensor) -> Tensor:
    """Product of two 2-D matrices."""
    if input.ndim != 2 or mat2.ndim != 2:
        raise ShapeError(
            f"mm: expected 2-D tensors, got shapes {tuple(input.shape)} and {tuple(mat2.shape)}"
        )
    return matmul(input, mat2)


def bmm(input: Tensor, mat2: Tensor) -> Tensor:
    """Batched product of (b, n, m) and (b, m, p) tensors (no broadcasting)."""
    sa, sb = tuple(input.shape), tuple(mat2.shape)
    if len(sa) != 3 or len(sb) != 3 or sa[0] != sb[0]:
        raise ShapeError(
            f"bmm: expected 3-D tensors with equal batch sizes, got shapes {sa} and {sb}"
        )
    return matmul(input, mat2)


def mv(input: Tensor, vec: Tensor) -> Tensor:
    """Matrix-vector product of a 2-D and a 1-D tensor."""
    if input.ndim != 2 or vec.ndim != 1:
        raise ShapeError(
            f"mv: expected 2-D and 1-D tensors, got {input._data.shape} and {vec._data.shape}"
        )
    return matmul(input, vec)


def dot(input: Tensor, tensor: Tensor) -> Tensor:
    """Inner product of two 1-D tensors of the same length."""
    if input.ndim != 1 or tensor.ndim != 1 or input.shape[0] != tensor.shape[0]:
        raise ShapeError(
            f"dot: expected two 1-D tensors of one size, got shapes {input._data.shape} and "
            f"{tensor._data.shape}"
        )
    return matmul(input, tensor)


vdot = dot


def outer(input: Tensor, vec2: Tensor) -> Tensor:
    """Outer product of two 1-D tensors: out[i, j] = input[i] * vec2[j]."""
    from ember.ops.elementwise import mul
    from ember.ops.movement import reshape

    if input.ndim != 1 or vec2.ndim != 1:
        raise ShapeError(
            f"outer: expected 1-D tensors, got shapes {input._data.shape} and {vec2._data.shape}"
        )
    return mul(reshape(input, (-1, 1)), reshape(vec2, (1, -1)))


ger = outer


def _scaled(x: Tensor, s) -> Tensor:
    from ember.ops.elementwise import mul

    return x if s == 1 else mul(x, s)


def _addprod(input: Tensor, prod: Tensor, beta, alpha, op: str) -> Tensor:
    """beta * input + alpha * prod, with input broadcast to prod's shape (beta=0 ignores input)."""
    from ember.ops.elementwise import add

    try:
        if np.broadcast_shapes(input._data.shape, prod._data.shape) != prod._data.shape:
            raise ValueError
    except ValueError:
        raise ShapeError(
            f"{op}: input of shape {input._data.shape} does not broadcast to the product's shape "
            f"{prod._data.shape}"
        ) from None
    prod = _scaled(prod, alpha)
    if beta == 0:  # input is ignored (its nan/inf do not propagate); its gradient is zero
        if not input.requires_grad:
            return prod
        from ember.ops.creation import zeros
        from ember.ops.elementwise import where

        return where(zeros(prod.shape, dtype=_dt.bool_, device=prod.device), input, prod)
    return add(_scaled(input, beta), prod)


def addmm(input: Tensor, mat1: Tensor, mat2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """beta * input + alpha * (mat1 @ mat2)."""
    return _addprod(input, mm(mat1, mat2), beta, alpha, "addmm")


def addmv(input: Tensor, mat: Tensor, vec: Tensor, *, beta=1, alpha=1) -> Tensor:
    """beta * input + alpha * (mat @ vec)."""
    return _addprod(input, mv(mat, vec), beta, alpha, "addmv")


def baddbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """beta * input + alpha * bmm(batch1, batch2)."""
    return _addprod(input, bmm(batch1, batch2), beta, alpha, "baddbmm")


def addbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """beta * input + alpha * sum_b(batch1[b] @ batch2[b])."""
    from ember.ops.reduce import sum as _sum

    return _addprod(input, _sum(bmm(batch1, batch2), 0), beta, alpha, "addbmm")


# ------------------------------------------------------------------ linear
def _gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b for 2-d arrays by the ``gemm`` kernel (kernels.cpu.blas: BLAS on threads ember
    picks) where one applies, else by numpy."""
    from ember.kernels import registry

    kern = registry.pick("gemm", "cpu", (a, b), {}) if type(a) is np.ndarray else None
    return kern.fn(a, b) if kern is not None else a @ b


class Linear(Function):
    """x @ w.T + b on the last dim of x, one BLAS call over all leading dims.

    Kernels (``linear``): the packed GEMM for a gemm.PackedWeight (kernels.cpu.gemm), BLAS on
    ember's threads for other float32 weights (kernels.cpu.blas); they run in training too
    (``saved``), and the backward's products go through the ``gemm`` op.
    """

    kernel_op = "linear"

    def saved(self, x, w, b=None):
        self.x, self.w = x, w

    def forward(self, x, w, b=None):
        self.x, self.w = x, w
        lo = x.dtype if x.dtype in _LOW else None
        if lo is not None:
            x, w = x.astype(_F32), w.astype(_F32)
        if x.ndim == 2:
            out = np.matmul(x, w.T)
        else:
            lead = x.shape[:-1]
            out = np.matmul(x.reshape(_prod(lead), x.shape[-1]), w.T).reshape(lead + (w.shape[0],))
        if b is not None:
            out += _up(b) if lo is not None else b
        return out.astype(lo) if lo is not None else out

    def meta(self, x, w, b=None):
        return x.shape[:-1] + (w.shape[0],), x.dtype

    def backward(self, g):
        x, w = _up(self.x), _up(self.w)
        g2 = _up(g).reshape(-1, w.shape[0])
        gx = gw = gb = None
        if self.needs_input_grad[0]:
            gx = _gemm(g2, w).reshape(x.shape)
        if self.needs_input_grad[1]:
            gw = _gemm(g2.T, x.reshape(-1, x.shape[-1]))
        if len(self.needs_input_grad) > 2 and self.needs_input_grad[2]:
            gb = g2.sum(0)
        return gx, gw, gb


class QLinear(Function):
    """x @ W.T + b where W is a quantized weight (a QTensor); no gradient for W.

    ``forward`` is the reference and the autograd path: it decodes W a block of rows at a time
    (``qweight.dequantize_rows``) and multiplies each with BLAS, so the whole float32 W never
    exists at once; backward does the same for x's gradient. The kernels registered for
    ``linear_q`` (``ember.kernels.cpu.quant``, one per block format) run instead when they
    apply, also while a graph is recorded (``saved``). A weight object that only offers
    ``matmul_t(x)`` (and maybe ``dequantize()``) multiplies itself.
    """

    kernel_op = "linear_q"
    ROW_BLOCK_ELEMENTS = 1 << 20  # forward/backward decode about this many weights at a time

    def saved(self, x, b=None, *, qweight):
        self.qweight = qweight

    def _row_blocks(self, n: int, k: int):
        step = max(1, self.ROW_BLOCK_ELEMENTS // max(k, 1))
        return [(r0, min(n, r0 + step)) for r0 in range(0, n, step)]

    def forward(self, x, b=None, *, qweight):
        self.qweight = qweight
        lead = x.shape[:-1]
        m = _prod(lead)
        k = x.shape[-1]
        x2 = x.reshape(m, k)
        if x2.dtype != _F32:
            x2 = x2.astype(_F32)
        n = int(qweight.shape[0])
        if hasattr(qweight, "dequantize_rows"):
            out = np.zeros((m, n), _F32)
            if m and k:
                for r0, r1 in self._row_blocks(n, k):
                    out[:, r0:r1] = x2 @ qweight.dequantize_rows(r0, r1).T
        else:
            out = np.asarray(qweight.matmul_t(x2), dtype=_F32)
        if b is not None:
            out = out + _up(b)
        return out.astype(x.dtype, copy=False).reshape(lead + (n,))

    def meta(self, x, b=None, *, qweight):
        return x.shape[:-1] + (int(qweight.shape[0]),), x.dtype

    def backward(self, g):
        q = self.qweight
        n, k = (int(s) for s in q.shape)
        g2 = _up(g).reshape(-1, n)
        gx = gb = None
        if self.needs_input_grad[0]:
            from ember.kernels import registry

            kern = (
                registry.pick("linear_q_t", "cpu", (g2,), {"qweight": q})  # g @ W, tiled
                if type(g2) is np.ndarray
                else None
            )
            if kern is not None:
                gx = kern.fn(g2, qweight=q)
            elif hasattr(q, "dequantize_rows"):
                gx = np.zeros((g2.shape[0], k), _F32)
                for r0, r1 in self._row_blocks(n, k):
                    gx += g2[:, r0:r1] @ q.dequantize_rows(r0, r1)
            elif hasattr(q, "dequantize"):
                gx = g2 @ np.asarray(q.dequantize(), dtype=_F32)
            else:
                raise AutogradError(
                    "linear: the input gradient through a quantized weight needs dequantize()"
                )
            gx = gx.reshape(g.shape[:-1] + (k,))
        if len(self.needs_input_grad) > 1 and self.needs_input_grad[1]:
            gb = g2.sum(0)
        return gx, gb


def linear(input: Tensor, weight, bias: Tensor | None = None) -> Tensor:
    """input @ weight.T + bias (torch.nn.functional.linear); weight may be a quantized QTensor."""
    if type(weight) is not Tensor and hasattr(weight, "matmul_t"):
        qshape = tuple(int(s) for s in weight.shape)
        if input.ndim == 0 or input.shape[-1] != qshape[1]:
            raise ShapeError(
                f"linear: input of shape {input._data.shape} does not fit a weight {qshape}"
            )
        if not input.is_floating_point():
            raise DTypeError(f"linear: a quantized weight needs a float input, got {input.dtype}")
        if bias is None:
            return QLinear.apply(input, qweight=weight)
        return QLinear.apply(input, bias, qweight=weight)
    xd, wd = input._data, weight._data
    sx, sw = xd.shape, wd.shape
    if len(sw) != 2 or not sx or sx[-1] != sw[1]:
        raise ShapeError(
            f"linear: input of shape {sx} does not fit a weight of shape {sw} "
            f"(expected input[..., {sw[-1] if sw else '?'}])"
        )
    dt = xd.dtype
    if (wd.dtype is not dt and wd.dtype != dt) or dt.kind == "b":
        _same_dtype("linear", input, weight)
    if bias is None:
        return Linear.apply(input, weight)
    bd = bias._data
    if (bd.dtype is not dt and bd.dtype != dt) or bd.shape != (sw[0],):
        _same_dtype("linear", input, bias)
        if bd.shape not in ((1,), ()):
            raise ShapeError(
                f"linear: bias of shape {bd.shape} does not fit a weight of shape {sw}"
            )
        from ember.ops.movement import expand

        bias = expand(bias, (sw[0],))
    return Linear.apply(input, weight, bias)


def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """out[..., o] = x1 @ weight[o] @ x2 + bias[o] (torch.nn.functional.bilinear)."""
    from ember.ops.elementwise import add

    out = einsum("...i,oij,...j->...o", input1, weight, input2)
    return out if bias is None else add(out, bias)


# ------------------------------------------------------------------ cross
class Cross(Function):
    """Cross product of 3-vectors along an axis."""

    def meta(self, a, b, axis):
        return np.broadcast_shapes(a.shape, b.shape), a.dtype

    def forward(self, a, b, axis):
        self.a, self.b, self.axis = a, b, axis
        return np.cross(a, b, axis=axis)

    def backward(self, g):
        a, b, ax = self.a, self.b, self.axis
        ga = unbroadcast(np.cross(b, g, axis=ax), a.shape) if self.needs_input_grad[0] else None
        gb = unbroadcast(np.cross(g, a, axis=ax), b.shape) if self.needs_input_grad[1] else None
        return ga, gb


def cross(input: Tensor, other: Tensor, dim: int | None = None) -> Tensor:
    """Cross product along dim (default: the first dim of size 3, as torch.cross)."""
    a, b = coerce(input, other)
    try:
        shape = np.broadcast_shapes(a._data.shape, b._data.shape)
    except ValueError:
        raise ShapeError(
            f"cross: shapes {tuple(a.shape)} and {tuple(b.shape)} do not broadcast"
        ) from None
    if dim is None:
        dim = next((i for i, n in enumerate(shape) if n == 3), None)
        if dim is None:
            raise ShapeError(
                f"cross: no dimension of size 3 in shapes {tuple(a.shape)} and {tuple(b.shape)}"
            )
    d = wrap_dim(dim, len(shape))
    if a._data.shape[d - len(shape) + a.ndim] != 3 or b._data.shape[d - len(shape) + b.ndim] != 3:
        raise ShapeError(
            f"cross: dim {dim} must have size 3, got shapes {a._data.shape} and {b._data.shape}"
        )
    return Cross.apply(a, b, axis=d - len(shape))


# ------------------------------------------------------------ np.linalg family (ember.linalg.*)
def _square(op: str, x: Tensor) -> None:
    s = x._data.shape
    if len(s) < 2 or s[-1] != s[-2]:
        raise ShapeError(f"{op}: expected a (batch of) square matrices, got shape {s}")
    if not x.is_floating_point():
        raise DTypeError(f"{op}: expected a float tensor, got {x.dtype}")


class Det(Function):
    """Determinant; gradient det * inv(A)^T."""

    def forward(self, a):
        self.a = a = _up(a)
        self.d = np.linalg.det(a)
        return np.asarray(self.d)

    def meta(self, a):
        return a.shape[:-2], a.dtype

    def backward(self, g):
        inv_t = np.swapaxes(np.linalg.inv(self.a), -1, -2)
        return (g * self.d)[..., None, None] * inv_t


class Inv(Function):
    """Matrix inverse; gradient -inv^T g inv^T."""

    def forward(self, a):
        self.y = np.linalg.inv(_up(a))
        return self.y

    def meta(self, a):
        return a.shape, a.dtype

    def backward(self, g):
        yt = np.swapaxes(self.y, -1, -2)
        return -(yt @ _up(g) @ yt)


class Solve(Function):
    """X with A X = B; gB = solve(A^T, g), gA = -gB X^T."""

    def forward(self, a, b, vec):
        a, b = _up(a), _up(b)
        self.a, self.vec = a, vec
        self.x = np.linalg.solve(a, b[..., None]) if vec else np.linalg.solve(a, b)
        return self.x[..., 0] if vec else self.x

    def meta(self, a, b, vec):
        return np.broadcast_shapes(a.shape[:-2], b.shape[: -1 if vec else -2]) + b.shape[
            -1 - (not vec) :
        ], a.dtype

    def backward(self, g):
        g = _up(g)[..., None] if self.vec else _up(g)
        gb = np.linalg.solve(np.swapaxes(self.a, -1, -2), g)
        ga = -gb @ np.swapaxes(self.x, -1, -2)
        return unbroadcast(ga, self.a.shape), gb[..., 0] if self.vec else gb


class Cholesky(Function):
    """Lower Cholesky factor; symmetric gradient (Murray 2016)."""

    def forward(self, a):
        try:
            self.l = np.linalg.cholesky(_up(a))
        except np.linalg.LinAlgError:
            raise ValueError("cholesky: the input is not positive-definite") from None
        return self.l

    def meta(self, a):
        return a.shape, a.dtype

    def backward(self, g):
        lo = self.l
        p = np.swapaxes(lo, -1, -2) @ _up(g)
        p = np.tril(p) - 0.5 * np.eye(p.shape[-1], dtype=p.dtype) * p
        eye = np.broadcast_to(np.eye(lo.shape[-1], dtype=lo.dtype), lo.shape)
        linv = np.linalg.solve(lo, eye)
        s = np.swapaxes(linv, -1, -2) @ p @ linv
        return 0.5 * (s + np.swapaxes(s, -1, -2))


def det(A: Tensor) -> Tensor:
    """Determinant of a (batch of) square matrices."""
    _square("det", A)
    return Det.apply(A)


def inv(A: Tensor) -> Tensor:
    """Inverse of a (batch of) square matrices."""
    _square("inv", A)
    return Inv.apply(A)


inverse = inv


def solve(A: Tensor, B: Tensor, *, left: bool = True) -> Tensor:
    """X with A @ X = B (B a vector or a batch of matrices), as torch.linalg.solve."""
    if not left:
        raise ShapeError("solve: left=False is not supported; solve A^T X^T = B^T instead")
    _square("solve", A)
    _same_dtype("solve", A, B)
    n = A._data.shape[-1]
    vec = B.ndim == 1 or (B.ndim == A.ndim - 1 and B._data.shape == A._data.shape[:-1])
    if B._data.shape[-1 if vec else -2] != n:
        raise ShapeError(
            f"solve: A of shape {tuple(A.shape)} and B of shape {tuple(B.shape)} do not fit"
        )
    return Solve.apply(A, B, vec=vec)


def cholesky(A: Tensor, upper: bool = False) -> Tensor:
    """The Cholesky factor L of a symmetric positive-definite matrix (A = L L^T)."""
    _square("cholesky", A)
    out = Cholesky.apply(A)
    return out.mT if upper else out


def qr(A: Tensor, mode: str = "reduced") -> tuple:
    """QR decomposition (forward only: no gradient)."""
    from ember.ops.elementwise import nondiff

    if A.ndim < 2 or not A.is_floating_point():
        raise ShapeError(
            f"qr: expected a float tensor with >= 2 dims, got shape {A._data.shape} ({A.dtype})"
        )
    if A.requires_grad:
        raise AutogradError("qr: gradients are not implemented; call it on a detached tensor")
    q = nondiff(lambda a: np.linalg.qr(_up(a), mode=mode)[0].astype(a.dtype), A)
    r = nondiff(lambda a: np.linalg.qr(_up(a), mode=mode)[1].astype(a.dtype), A)
    return q, r


def slogdet(A: Tensor) -> tuple:
    """(sign, log|det|) of square matrices; the gradient flows through logabsdet."""
    from ember.ops.elementwise import abs as _abs
    from ember.ops.elementwise import log, sign

    d = det(A)
    return sign(d).detach(), log(_abs(d))


def vecdot(x: Tensor, y: Tensor, *, dim: int = -1) -> Tensor:
    """Dot product along dim with broadcasting (torch.linalg.vecdot)."""
    from ember.ops.elementwise import mul
    from ember.ops.reduce import sum as _sum

    return _sum(mul(x, y), dim)


__all__ = [
    "matmul", "mm", "bmm", "mv", "dot", "vdot", "outer", "ger", "addmm", "addmv", "baddbmm",
    "addbmm", "linear", "bilinear", "einsum", "tensordot", "cross", "det", "inverse", "slogdet",
]  # fmt: skip
