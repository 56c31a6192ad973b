"""Tensor methods for reductions, scans, sorting, linear algebra and random fills.

Each method is one call into the op function of the same name (ember.ops.reduce,
ember.ops.index, ember.ops.linalg, ember.ops.random); the function's docstring holds the
details.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, overload

from ember._later import later

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from ember.ops.random import Generator
    from ember.tensor import DTypeLike, MinMax, Number, Tensor, ValuesIndices

_R = later(globals(), "_R", "ember.ops.reduce")
_I = later(globals(), "_I", "ember.ops.index")
_L = later(globals(), "_L", "ember.ops.linalg")
_X = later(globals(), "_X", "ember.ops.random")


class ReduceMethods:
    """Reductions, sorting and linear algebra as Tensor methods (mixed into ember.Tensor)."""

    __slots__ = ()

    def sum(
        self,
        dim: int | Sequence[int] | None = None,
        keepdim: bool = False,
        *,
        dtype: DTypeLike | None = None,
    ) -> Tensor:
        """Sum of elements over dim (an int, a tuple, or None for all); ints and bools sum as int64."""
        return _R.sum(self, dim, keepdim, dtype=dtype)

    def mean(
        self,
        dim: int | Sequence[int] | None = None,
        keepdim: bool = False,
        *,
        dtype: DTypeLike | None = None,
    ) -> Tensor:
        """Mean over dim; float input only (integer input needs dtype=), as torch."""
        return _R.mean(self, dim, keepdim, dtype=dtype)

    def nansum(
        self,
        dim: int | Sequence[int] | None = None,
        keepdim: bool = False,
        *,
        dtype: DTypeLike | None = None,
    ) -> Tensor:
        """Sum over dim treating NaN as zero."""
        return _R.nansum(self, dim, keepdim, dtype=dtype)

    def nanmean(
        self,
        dim: int | Sequence[int] | None = None,
        keepdim: bool = False,
        *,
        dtype: DTypeLike | None = None,
    ) -> Tensor:
        """Mean over dim of the non-NaN elements (NaN where there are none)."""
        return _R.nanmean(self, dim, keepdim, dtype=dtype)

    def prod(
        self,
        dim: int | Sequence[int] | None = None,
        keepdim: bool = False,
        *,
        dtype: DTypeLike | None = None,
    ) -> Tensor:
        """Product over dim (None for all); ints and bools multiply as int64."""
        return _R.prod(self, dim, keepdim, dtype=dtype)

    @overload
    def max(self) -> Tensor: ...
    @overload
    def max(self, dim: int, keepdim: bool = False) -> ValuesIndices: ...
    @overload
    def max(self, dim: Tensor) -> Tensor: ...
    def max(self, dim: int | Tensor | None = None, keepdim: bool = False) -> Any:
        """The largest element (0-d); with dim, (values, indices); with a tensor, maximum()."""
        return _R.max(self, dim, keepdim)

    @overload
    def min(self) -> Tensor: ...
    @overload
    def min(self, dim: int, keepdim: bool = False) -> ValuesIndices: ...
    @overload
    def min(self, dim: Tensor) -> Tensor: ...
    def min(self, dim: int | Tensor | None = None, keepdim: bool = False) -> Any:
        """The smallest element (0-d); with dim, (values, indices); with a tensor, minimum()."""
        return _R.min(self, dim, keepdim)

    def amax(self, dim: int | Sequence[int] = (), keepdim: bool = False) -> Tensor:
        """Largest values over dim (all by default); ties share the gradient evenly."""
        return _R.amax(self, dim, keepdim)

    def amin(self, dim: int | Sequence[int] = (), keepdim: bool = False) -> Tensor:
        """Smallest values over dim (all by default); ties share the gradient evenly."""
        return _R.amin(self, dim, keepdim)

    def aminmax(self, *, dim: int | None = None, keepdim: bool = False) -> MinMax:
        """(min, max) over one dim or all."""
        return _R.aminmax(self, dim=dim, keepdim=keepdim)

    def argmax(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        """Index of the largest value (over the flattened tensor when dim is None); int64."""
        return _R.argmax(self, dim, keepdim)

    def argmin(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        """Index of the smallest value (over the flattened tensor when dim is None); int64."""
        return _R.argmin(self, dim, keepdim)

    @overload
    def median(self) -> Tensor: ...
    @overload
    def median(self, dim: int, keepdim: bool = False) -> ValuesIndices: ...
    def median(self, dim: int | None = None, keepdim: bool = False) -> Any:
        """The lower median (0-d, NaN if empty); with dim, (values, indices)."""
        return _R.median(self, dim, keepdim)

    @overload
    def nanmedian(self) -> Tensor: ...
    @overload
    def nanmedian(self, dim: int, keepdim: bool = False) -> ValuesIndices: ...
    def nanmedian(self, dim: int | None = None, keepdim: bool = False) -> Any:
        """median() ignoring NaN values."""
        return _R.nanmedian(self, dim, keepdim)

    def mode(self, dim: int = -1, keepdim: bool = False) -> ValuesIndices:
        """The most frequent value along dim (the smallest on ties) and its last index."""
        return _R.mode(self, dim, keepdim)

    def var(
        self,
        dim: int | Sequence[int] | None = None,
        unbiased: bool | None = None,
        keepdim: bool = False,
        *,
        correction: float | None = None,
    ) -> Tensor:
        """Variance over dim with correction (default 1) or the older unbiased flag."""
        return _R.var(self, dim, unbiased, keepdim, correction=correction)

    def std(
        self,
        dim: int | Sequence[int] | None = None,
        unbiased: bool | None = None,
        keepdim: bool = False,
        *,
        correction: float | None = None,
    ) -> Tensor:
        """Standard deviation over dim with correction (default 1) or the older unbiased flag."""
        return _R.std(self, dim, unbiased, keepdim, correction=correction)

    def logsumexp(self, dim: int | Sequence[int], keepdim: bool = False) -> Tensor:
        """log(sum(exp(input), dim)), stable for large values; integer input gives float."""
        return _R.logsumexp(self, dim, keepdim)

    def norm(
        self,
        p: float | str = "fro",
        dim: int | Sequence[int] | None = None,
        keepdim: bool = False,
        dtype: DTypeLike | None = None,
    ) -> Tensor:
        """Vector p-norm over dim (all by default): p = 'fro' (2), any number, inf or -inf."""
        return _R.norm(self, p, dim, keepdim, dtype)

    def all(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        """Whether every element over dim is nonzero (bool; uint8 for uint8 input, as torch)."""
        return _R.all(self, dim, keepdim)

    def any(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        """Whether any element over dim is nonzero (bool; uint8 for uint8 input, as torch)."""
        return _R.any(self, dim, keepdim)

    def count_nonzero(self, dim: int | Sequence[int] | None = None) -> Tensor:
        """The number of nonzero elements over dim (int64)."""
        return _R.count_nonzero(self, dim)

    def softmax(self, dim: int, dtype: DTypeLike | None = None) -> Tensor:
        """exp(x) / sum(exp(x)) along dim, computed stably (the max is subtracted first)."""
        return _R.softmax(self, dim, dtype)

    def log_softmax(self, dim: int, dtype: DTypeLike | None = None) -> Tensor:
        """x - logsumexp(x) along dim, computed stably."""
        return _R.log_softmax(self, dim, dtype)

    def cumsum(self, dim: int, *, dtype: DTypeLike | None = None) -> Tensor:
        """Running sum along dim; ints and bools accumulate as int64."""
        return _R.cumsum(self, dim, dtype=dtype)

    def cumprod(self, dim: int, *, dtype: DTypeLike | None = None) -> Tensor:
        """Running product along dim; ints and bools accumulate as int64."""
        return _R.cumprod(self, dim, dtype=dtype)

    def sort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> ValuesIndices:
        """(values, indices) sorted along dim; ties keep their original order."""
        return _I.sort(self, dim, descending, stable)

    def argsort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
        """The indices that sort input along dim."""
        return _I.argsort(self, dim, descending, stable)

    def msort(self) -> Tensor:
        """Values sorted along dim 0."""
        return _I.msort(self)

    def topk(
        self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
    ) -> ValuesIndices:
        """(values, indices) of the k largest (or smallest) elements along dim, in sorted order."""
        return _I.topk(self, k, dim, largest, sorted)

    def kthvalue(self, k: int, dim: int = -1, keepdim: bool = False) -> ValuesIndices:
        """(values, indices) of the k-th smallest element (1-based) along dim."""
        return _I.kthvalue(self, k, dim, keepdim)

    def unique(
        self,
        sorted: bool = True,
        return_inverse: bool = False,
        return_counts: bool = False,
        dim: int | None = None,
    ) -> Any:
        """The distinct values (sorted), optionally with the inverse mapping and the counts."""
        return _I.unique(self, sorted, return_inverse, return_counts, dim)

    def unique_consecutive(
        self, return_inverse: bool = False, return_counts: bool = False, dim: int | None = None
    ) -> Any:
        """Collapse runs of equal consecutive values (along dim, or the flattened tensor)."""
        return _I.unique_consecutive(self, return_inverse, return_counts, dim)

    def multinomial(
        self, num_samples: int, replacement: bool = False, *, generator: Generator | None = None
    ) -> Tensor:
        """Sample category indices from rows of non-negative weights (1-d or 2-d input), int64."""
        return _I.multinomial(self, num_samples, replacement, generator=generator)

    def matmul(self, other: Tensor) -> Tensor:
        """Matrix product with torch.matmul's rules (1-D operands, broadcast batch dims)."""
        return _L.matmul(self, other)

    def mm(self, mat2: Tensor) -> Tensor:
        """Product of two 2-D matrices."""
        return _L.mm(self, mat2)

    def bmm(self, mat2: Tensor) -> Tensor:
        """Batched product of (b, n, m) and (b, m, p) tensors (no broadcasting)."""
        return _L.bmm(self, mat2)

    def mv(self, vec: Tensor) -> Tensor:
        """Matrix-vector product of a 2-D and a 1-D tensor."""
        return _L.mv(self, vec)

    def dot(self, tensor: Tensor) -> Tensor:
        """Inner product of two 1-D tensors of the same length."""
        return _L.dot(self, tensor)

    def vdot(self, tensor: Tensor) -> Tensor:
        """Alias of dot()."""
        return _L.dot(self, tensor)

    def outer(self, vec2: Tensor) -> Tensor:
        """Outer product of two 1-D tensors: out[i, j] = input[i] * vec2[j]."""
        return _L.outer(self, vec2)

    def ger(self, vec2: Tensor) -> Tensor:
        """Alias of outer()."""
        return _L.outer(self, vec2)

    def addmm(self, mat1: Tensor, mat2: Tensor, *, beta: Number = 1, alpha: Number = 1) -> Tensor:
        """beta * input + alpha * (mat1 @ mat2)."""
        return _L.addmm(self, mat1, mat2, beta=beta, alpha=alpha)

    def addmv(self, mat: Tensor, vec: Tensor, *, beta: Number = 1, alpha: Number = 1) -> Tensor:
        """beta * input + alpha * (mat @ vec)."""
        return _L.addmv(self, mat, vec, beta=beta, alpha=alpha)

    def baddbmm(
        self, batch1: Tensor, batch2: Tensor, *, beta: Number = 1, alpha: Number = 1
    ) -> Tensor:
        """beta * input + alpha * bmm(batch1, batch2)."""
        return _L.baddbmm(self, batch1, batch2, beta=beta, alpha=alpha)

    def addbmm(
        self, batch1: Tensor, batch2: Tensor, *, beta: Number = 1, alpha: Number = 1
    ) -> Tensor:
        """beta * input + alpha * sum_b(batch1[b] @ batch2[b])."""
        return _L.addbmm(self, batch1, batch2, beta=beta, alpha=alpha)

    def cross(self, other: Tensor, dim: int | None = None) -> Tensor:
        """Cross product along dim (default: the first dim of size 3, as torch.cross)."""
        return _L.cross(self, other, dim)

    def det(self) -> Tensor:
        """Determinant of a (batch of) square matrices."""
        return _L.det(self)

    def inverse(self) -> Tensor:
        """Alias of inv()."""
        return _L.inv(self)

    def slogdet(self) -> tuple[Tensor, Tensor]:
        """(sign, log|det|) of square matrices; the gradient flows through logabsdet."""
        return _L.slogdet(self)

    # ---------------------------------------------------------------- random fills
    def normal_(
        self, mean: float = 0.0, std: float = 1.0, *, generator: Generator | None = None
    ) -> Tensor:
        """Fill in place with normal samples."""
        return _X.normal_(self, mean, std, generator=generator)

    def uniform_(
        self, a: float = 0.0, b: float = 1.0, *, generator: Generator | None = None
    ) -> Tensor:
        """Fill in place with uniform samples in [a, b)."""
        return _X.uniform_(self, a, b, generator=generator)

    def bernoulli_(self, p: float = 0.5, *, generator: Generator | None = None) -> Tensor:
        """Fill in place with 0/1 samples."""
        return _X.bernoulli_(self, p, generator=generator)

    def exponential_(self, lambd: float = 1.0, *, generator: Generator | None = None) -> Tensor:
        """Fill in place with exponential samples."""
        return _X.exponential_(self, lambd, generator=generator)

    def random_(
        self, low: int = 0, high: int | None = None, *, generator: Generator | None = None
    ) -> Tensor:
        """Fill in place with integers in [low, high)."""
        return _X.random_(self, low, high, generator=generator)

    def bernoulli(self, p: float | None = None, *, generator: Generator | None = None) -> Tensor:
        """0/1 samples with probability input (or p)."""
        return _X.bernoulli(self, p, generator=generator)
