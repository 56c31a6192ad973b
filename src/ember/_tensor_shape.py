"""Tensor methods that reshape, view, move and index data, with their in-place forms.

Each method is one call into the op function of the same name (ember.ops.movement,
ember.ops.index); the function's docstring holds the details.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember._later import later

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from ember.tensor import Number, Tensor

_M = later(globals(), "_M", "ember.ops.movement")
_RA = later(globals(), "_RA", "ember.ops._rearrange")
_I = later(globals(), "_I", "ember.ops.index")
_U = later(globals(), "_U", "ember.ops._util")


class ShapeMethods:
    """Views, movement and indexing as Tensor methods (mixed into ember.Tensor)."""

    __slots__ = ()

    def reshape(self, *shape: int | Sequence[int]) -> Tensor:
        """The same elements in a new shape (one dim may be -1); a view when possible."""
        return _M.reshape(self, *shape)

    def view(self, *shape: int | Sequence[int]) -> Tensor:
        """Reshape without copying (ShapeError when strides forbid it); view(dtype) reinterprets."""
        return _M.view(self, *shape)

    def view_as(self, other: Tensor) -> Tensor:
        """View input with other's shape."""
        return _M.view_as(self, other)

    def reshape_as(self, other: Tensor) -> Tensor:
        """Reshape input to other's shape."""
        return _M.reshape_as(self, other)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """Merge dims start_dim..end_dim into one."""
        return _M.flatten(self, start_dim, end_dim)

    def ravel(self) -> Tensor:
        """The elements as a 1-d tensor (a view when possible)."""
        return _M.ravel(self)

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
        """Split dim into sizes (one may be -1)."""
        return _M.unflatten(self, dim, sizes)

    def squeeze(self, dim: int | Sequence[int] | None = None) -> Tensor:
        """Remove size-1 dimensions (all, or those in dim); a view."""
        return _M.squeeze(self, dim)

    def unsqueeze(self, dim: int) -> Tensor:
        """Insert a size-1 dimension at dim; a view."""
        return _M.unsqueeze(self, dim)

    def permute(self, *dims: int | Sequence[int]) -> Tensor:
        """Reorder dimensions; a view."""
        return _M.permute(self, *dims)

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        """Swap two dimensions; a view."""
        return _M.transpose(self, dim0, dim1)

    def swapaxes(self, dim0: int, dim1: int) -> Tensor:
        """Alias of transpose()."""
        return _M.transpose(self, dim0, dim1)

    def swapdims(self, dim0: int, dim1: int) -> Tensor:
        """Alias of transpose()."""
        return _M.transpose(self, dim0, dim1)

    def t(self) -> Tensor:
        """Transpose a matrix (0-d and 1-d tensors are returned as is)."""
        return _M.t(self)

    def movedim(self, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:
        """Move dimension(s) to new positions; a view."""
        return _M.movedim(self, source, destination)

    def moveaxis(self, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:
        """Alias of movedim()."""
        return _M.movedim(self, source, destination)

    def expand(self, *sizes: int | Sequence[int]) -> Tensor:
        """Broadcast singleton dims to sizes (-1 keeps a dim); a view."""
        return _M.expand(self, *sizes)

    def expand_as(self, other: Tensor) -> Tensor:
        """Expand to other's shape."""
        return _M.expand_as(self, other)

    def broadcast_to(self, shape: Sequence[int]) -> Tensor:
        """Expand to shape (torch.broadcast_to)."""
        return _M.broadcast_to(self, shape)

    def contiguous(self, memory_format: object = None) -> Tensor:
        """The tensor with C-contiguous memory (itself when it already is)."""
        return _M.contiguous(self, memory_format)

    def clone(self, memory_format: object = None) -> Tensor:
        """A copy of input with its own memory (gradients flow through)."""
        return _M.clone(self, memory_format)

    def narrow(self, dim: int, start: int | Tensor, length: int) -> Tensor:
        """The slice start:start+length along dim; a view."""
        return _M.narrow(self, dim, start, length)

    def select(self, dim: int, index: int) -> Tensor:
        """The sub-tensor at index along dim (that dim removed); a view."""
        return _M.select(self, dim, index)

    def split(
        self, split_size_or_sections: int | Sequence[int], dim: int = 0
    ) -> tuple[Tensor, ...]:
        """Views of consecutive pieces along dim, of one size (an int) or of given sizes (a list)."""
        return _M.split(self, split_size_or_sections, dim)

    def tensor_split(
        self, indices_or_sections: int | Sequence[int] | Tensor, dim: int = 0
    ) -> tuple[Tensor, ...]:
        """Split into n nearly equal views (an int) or at the given indices (a list)."""
        return _M.tensor_split(self, indices_or_sections, dim)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        """Split into at most `chunks` views of size ceil(n / chunks) along dim."""
        return _M.chunk(self, chunks, dim)

    def unbind(self, dim: int = 0) -> tuple[Tensor, ...]:
        """All slices along dim (that dim removed), as a tuple of views."""
        return _M.unbind(self, dim)

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        """The diagonal over dims dim1, dim2 (appended as the last dim); a view."""
        return _M.diagonal(self, offset, dim1, dim2)

    def flip(self, dims: int | Sequence[int]) -> Tensor:
        """Reverse the order of elements along dims; a copy."""
        return _M.flip(self, dims)

    def fliplr(self) -> Tensor:
        """Flip left/right (dim 1); needs >= 2 dims."""
        return _M.fliplr(self)

    def flipud(self) -> Tensor:
        """Flip up/down (dim 0); needs >= 1 dim."""
        return _M.flipud(self)

    def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
        """Shift elements cyclically by shifts along dims (the flattened tensor when dims is None)."""
        return _M.roll(self, shifts, dims)

    def rot90(self, k: int = 1, dims: Sequence[int] = (0, 1)) -> Tensor:
        """Rotate by 90 degrees k times in the plane of dims (from the first towards the second)."""
        return _M.rot90(self, k, dims)

    def repeat(self, *sizes: int | Sequence[int]) -> Tensor:
        """Tile the tensor: each dim repeated sizes[i] times (len(sizes) >= ndim)."""
        return _RA.repeat(self, *sizes)

    def tile(self, dims: int | Sequence[int]) -> Tensor:
        """Like repeat, but dims shorter than ndim are padded with leading ones (torch.tile)."""
        return _M.tile(self, dims)

    def repeat_interleave(
        self,
        repeats: int | Tensor | None = None,
        dim: int | None = None,
        *,
        output_size: int | None = None,
    ) -> Tensor:
        """Repeat each element `repeats` times (an int or one count each) along dim (None: flat)."""
        return _M.repeat_interleave(self, repeats, dim, output_size=output_size)

    def tril(self, diagonal: int = 0) -> Tensor:
        """Zero the elements above the diagonal of the last two dims."""
        return _M.tril(self, diagonal)

    def triu(self, diagonal: int = 0) -> Tensor:
        """Zero the elements below the diagonal of the last two dims."""
        return _M.triu(self, diagonal)

    def diag(self, diagonal: int = 0) -> Tensor:
        """A 1-d tensor -> a square matrix with it on a diagonal; a matrix -> a copy of its diagonal."""
        return _M.diag(self, diagonal)

    def diag_embed(self, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
        """Matrices (over dim1, dim2) whose offset diagonal holds the last dim of input."""
        return _M.diag_embed(self, offset, dim1, dim2)

    def index_put(
        self, indices: tuple[Tensor | None, ...], values: Tensor | Number, accumulate: bool = False
    ) -> Tensor:
        """A copy of input with input[indices] = values (+= with accumulate; repeats then add up)."""
        return _I.index_put(self, indices, values, accumulate)

    def index_put_(
        self, indices: tuple[Tensor | None, ...], values: Tensor | Number, accumulate: bool = False
    ) -> Tensor:
        """In-place index_put."""
        return _I.index_put_(self, indices, values, accumulate)

    def masked_fill(self, mask: Tensor, value: Tensor | Number) -> Tensor:
        """A copy of input with value where mask is True (mask broadcasts)."""
        return _I.masked_fill(self, mask, value)

    def masked_select(self, mask: Tensor) -> Tensor:
        """The elements of input where mask is True, as a 1-d tensor (input and mask broadcast)."""
        return _I.masked_select(self, mask)

    def masked_scatter(self, mask: Tensor, source: Tensor) -> Tensor:
        """A copy of input with source's elements written, in order, where mask is True."""
        return _I.masked_scatter(self, mask, source)

    def nonzero(self, *, as_tuple: bool = False) -> Any:
        """Indices of the non-zero elements: an (n, ndim) int64 tensor, or a tuple of 1-d tensors."""
        return _I.nonzero(self, as_tuple=as_tuple)

    def argwhere(self) -> Tensor:
        """Indices of the non-zero elements as an (n, ndim) tensor."""
        return _I.argwhere(self)

    def gather(self, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
        """out[i][j][k] = input[index[i][j][k]][j][k] (for dim 0): values picked along dim."""
        return _I.gather(self, dim, index, sparse_grad=sparse_grad)

    def scatter(
        self,
        dim: int,
        index: Tensor,
        src: Tensor | None = None,
        value: Number | None = None,
        *,
        reduce: str | None = None,
    ) -> Tensor:
        """Write src (a tensor) or value (a number) into a copy of input at index along dim."""
        return _I.scatter(self, dim, index, src, value, reduce=reduce)

    def scatter_add(self, dim: int, index: Tensor, src: Tensor) -> Tensor:
        """A copy of input with src added at index along dim (repeated indices add up)."""
        return _I.scatter_add(self, dim, index, src)

    def scatter_reduce(
        self, dim: int, index: Tensor, src: Tensor, reduce: str, *, include_self: bool = True
    ) -> Tensor:
        """Reduce src into a copy of input at index along dim; reduce: sum, prod, mean, amax, amin."""
        return _I.scatter_reduce(self, dim, index, src, reduce, include_self=include_self)

    def index_select(self, dim: int, index: Tensor) -> Tensor:
        """The slices of input at the (1-d) index along dim."""
        return _I.index_select(self, dim, index)

    def index_add(self, dim: int, index: Tensor, source: Tensor, *, alpha: Number = 1) -> Tensor:
        """A copy of input with alpha * source added at index along dim (repeats add up)."""
        return _I.index_add(self, dim, index, source, alpha=alpha)

    def index_copy(self, dim: int, index: Tensor, source: Tensor) -> Tensor:
        """A copy of input with source's slices copied to index along dim."""
        return _I.index_copy(self, dim, index, source)

    def index_fill(self, dim: int, index: Tensor, value: Tensor | Number) -> Tensor:
        """A copy of input with the slices at index along dim set to value (a number or 0-d tensor)."""
        return _I.index_fill(self, dim, index, value)

    def take(self, index: Tensor) -> Tensor:
        """input viewed as 1-d, picked at index (the result has index's shape)."""
        return _I.take(self, index)

    def take_along_dim(self, indices: Tensor, dim: int | None = None) -> Tensor:
        """Gather along dim, input and indices broadcast over the other dims (None: flattened)."""
        return _I.take_along_dim(self, indices, dim)

    def put(self, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
        """A copy of input (viewed as 1-d) with source written (or added) at index."""
        return _I.put(self, index, source, accumulate)

    def tril_(self, diagonal: int = 0) -> Tensor:
        """In-place tril()."""
        return _U.assign(self, _M.tril(self, diagonal))

    def triu_(self, diagonal: int = 0) -> Tensor:
        """In-place triu()."""
        return _U.assign(self, _M.triu(self, diagonal))

    def masked_fill_(self, mask: Tensor, value: Tensor | Number) -> Tensor:
        """In-place masked_fill()."""
        return _U.assign(self, _I.masked_fill(self, mask, value))

    def masked_scatter_(self, mask: Tensor, source: Tensor) -> Tensor:
        """In-place masked_scatter()."""
        return _U.assign(self, _I.masked_scatter(self, mask, source))

    def scatter_(
        self,
        dim: int,
        index: Tensor,
        src: Tensor | None = None,
        value: Number | None = None,
        *,
        reduce: str | None = None,
    ) -> Tensor:
        """In-place scatter()."""
        return _U.assign(self, _I.scatter(self, dim, index, src, value, reduce=reduce))

    def scatter_add_(self, dim: int, index: Tensor, src: Tensor) -> Tensor:
        """In-place scatter_add()."""
        return _U.assign(self, _I.scatter_add(self, dim, index, src))

    def scatter_reduce_(
        self, dim: int, index: Tensor, src: Tensor, reduce: str, *, include_self: bool = True
    ) -> Tensor:
        """In-place scatter_reduce()."""
        return _U.assign(
            self, _I.scatter_reduce(self, dim, index, src, reduce, include_self=include_self)
        )

    def index_fill_(self, dim: int, index: Tensor, value: Tensor | Number) -> Tensor:
        """In-place index_fill()."""
        return _U.assign(self, _I.index_fill(self, dim, index, value))

    def index_add_(self, dim: int, index: Tensor, source: Tensor, *, alpha: Number = 1) -> Tensor:
        """In-place index_add()."""
        return _U.assign(self, _I.index_add(self, dim, index, source, alpha=alpha))

    def index_copy_(self, dim: int, index: Tensor, source: Tensor) -> Tensor:
        """In-place index_copy()."""
        return _U.assign(self, _I.index_copy(self, dim, index, source))

    def put_(self, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
        """In-place put()."""
        return _U.assign(self, _I.put(self, index, source, accumulate))

    def t_(self) -> Tensor:
        """In-place t() (self becomes the view)."""
        return _U.assign_view(self, _M.t(self))

    def transpose_(self, dim0: int, dim1: int) -> Tensor:
        """In-place transpose() (self becomes the view)."""
        return _U.assign_view(self, _M.transpose(self, dim0, dim1))

    def swapaxes_(self, dim0: int, dim1: int) -> Tensor:
        """In-place swapaxes() (self becomes the view)."""
        return _U.assign_view(self, _M.transpose(self, dim0, dim1))

    def swapdims_(self, dim0: int, dim1: int) -> Tensor:
        """In-place swapdims() (self becomes the view)."""
        return _U.assign_view(self, _M.transpose(self, dim0, dim1))

    def squeeze_(self, dim: int | Sequence[int] | None = None) -> Tensor:
        """In-place squeeze() (self becomes the view)."""
        return _U.assign_view(self, _M.squeeze(self, dim))

    def unsqueeze_(self, dim: int) -> Tensor:
        """In-place unsqueeze() (self becomes the view)."""
        return _U.assign_view(self, _M.unsqueeze(self, dim))

    # ---------------------------------------------------------------- writes
    def zero_(self) -> Tensor:
        """Fill with zeros in place."""
        return _U.zero_(self)

    def fill_(self, value: Tensor | Number) -> Tensor:
        """Fill with a value in place."""
        return _U.fill_(self, value)

    def copy_(self, src: Tensor | Any, non_blocking: bool = False) -> Tensor:
        """Copy src's values (broadcast and cast to self's dtype and device) into self."""
        return _U.copy_(self, src, non_blocking)
