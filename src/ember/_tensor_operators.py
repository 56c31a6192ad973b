"""Tensor operators: arithmetic, comparison and bitwise operators, @, [] and the T/mT/H transposes.

Each operator is one call into the op function (ember.ops.elementwise, ember.ops.linalg,
ember.ops.index, ember.ops.movement); in-place operators (+=, ...) write into self.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ember._later import later

if TYPE_CHECKING:
    from typing import Any

    from ember.tensor import Number, Tensor

_E = later(globals(), "_E", "ember.ops.elementwise")
_L = later(globals(), "_L", "ember.ops.linalg")
_I = later(globals(), "_I", "ember.ops.index")
_M = later(globals(), "_M", "ember.ops.movement")
_U = later(globals(), "_U", "ember.ops._util")


class OperatorMethods:
    """Python operators on tensors (mixed into ember.Tensor)."""

    __slots__ = ()

    def __add__(self, other: Tensor | Number) -> Tensor:
        """self + other."""
        return _E.add(self, other)

    def __radd__(self, other: Tensor | Number) -> Tensor:
        """other + self."""
        return _E.add(other, self)

    def __sub__(self, other: Tensor | Number) -> Tensor:
        """self - other."""
        return _E.sub(self, other)

    def __rsub__(self, other: Tensor | Number) -> Tensor:
        """other - self."""
        return _E.sub(other, self)

    def __mul__(self, other: Tensor | Number) -> Tensor:
        """self * other."""
        return _E.mul(self, other)

    def __rmul__(self, other: Tensor | Number) -> Tensor:
        """other * self."""
        return _E.mul(other, self)

    def __truediv__(self, other: Tensor | Number) -> Tensor:
        """self / other."""
        return _E.div(self, other)

    def __rtruediv__(self, other: Tensor | Number) -> Tensor:
        """other / self."""
        return _E.div(other, self)

    def __floordiv__(self, other: Tensor | Number) -> Tensor:
        """self // other."""
        return _E.floor_divide(self, other)

    def __rfloordiv__(self, other: Tensor | Number) -> Tensor:
        """other // self."""
        return _E.floor_divide(other, self)

    def __mod__(self, other: Tensor | Number) -> Tensor:
        """self % other (the sign of other, as torch.remainder)."""
        return _E.remainder(self, other)

    def __rmod__(self, other: Tensor | Number) -> Tensor:
        """other % self."""
        return _E.remainder(other, self)

    def __pow__(self, other: Tensor | Number) -> Tensor:
        """self ** other."""
        return _E.pow(self, other)

    def __rpow__(self, other: Tensor | Number) -> Tensor:
        """other ** self."""
        return _E.pow(other, self)

    def __and__(self, other: Tensor | Number) -> Tensor:
        """self & other (bitwise; logical for bool)."""
        return _E.bitwise_and(self, other)

    def __rand__(self, other: Tensor | Number) -> Tensor:
        """other & self."""
        return _E.bitwise_and(other, self)

    def __or__(self, other: Tensor | Number) -> Tensor:
        """self | other (bitwise; logical for bool)."""
        return _E.bitwise_or(self, other)

    def __ror__(self, other: Tensor | Number) -> Tensor:
        """other | self."""
        return _E.bitwise_or(other, self)

    def __xor__(self, other: Tensor | Number) -> Tensor:
        """self ^ other (bitwise; logical for bool)."""
        return _E.bitwise_xor(self, other)

    def __rxor__(self, other: Tensor | Number) -> Tensor:
        """other ^ self."""
        return _E.bitwise_xor(other, self)

    def __eq__(self, other: object) -> Tensor:  # type: ignore[override]
        """self == other, elementwise (a bool tensor)."""
        return _E.eq(self, other)

    def __ne__(self, other: object) -> Tensor:  # type: ignore[override]
        """self != other, elementwise (a bool tensor)."""
        return _E.ne(self, other)

    def __lt__(self, other: Tensor | Number) -> Tensor:
        """self < other, elementwise."""
        return _E.lt(self, other)

    def __le__(self, other: Tensor | Number) -> Tensor:
        """self <= other, elementwise."""
        return _E.le(self, other)

    def __gt__(self, other: Tensor | Number) -> Tensor:
        """self > other, elementwise."""
        return _E.gt(self, other)

    def __ge__(self, other: Tensor | Number) -> Tensor:
        """self >= other, elementwise."""
        return _E.ge(self, other)

    def __matmul__(self, other: Tensor) -> Tensor:
        """self @ other (matmul)."""
        return _L.matmul(self, other)

    def __rmatmul__(self, other: Tensor) -> Tensor:
        """other @ self."""
        return _L.matmul(other, self)

    def __neg__(self) -> Tensor:
        """-self."""
        return _E.neg(self)

    def __pos__(self) -> Tensor:
        """+self: self itself."""
        return self  # type: ignore[return-value]

    def __abs__(self) -> Tensor:
        """abs(self)."""
        return _E.abs(self)

    def __invert__(self) -> Tensor:
        """~self: logical not for bool tensors, bitwise not for integers."""
        if self._data.dtype == np.bool_:  # type: ignore[attr-defined]
            return _E.logical_not(self)
        return _E.bitwise_not(self)

    def __iadd__(self, other: Tensor | Number) -> Tensor:
        """self += other (in place)."""
        return _U.assign(self, _E.add(self, other))

    def __isub__(self, other: Tensor | Number) -> Tensor:
        """self -= other (in place)."""
        return _U.assign(self, _E.sub(self, other))

    def __imul__(self, other: Tensor | Number) -> Tensor:
        """self *= other (in place)."""
        return _U.assign(self, _E.mul(self, other))

    def __itruediv__(self, other: Tensor | Number) -> Tensor:
        """self /= other (in place)."""
        return _U.assign(self, _E.div(self, other))

    # ---------------------------------------------------------------- indexing
    def __getitem__(self, index: Any) -> Tensor:
        """self[index]: ints, slices, None, ..., bool masks and integer tensors, as in torch."""
        return _I.getitem(self, index)

    def __setitem__(self, index: Any, value: Tensor | Number) -> None:
        """self[index] = value, in place (recorded for autograd when grad is on)."""
        _I.setitem(self, index, value)

    # ---------------------------------------------------------------- transposes
    @property
    def T(self) -> Tensor:  # noqa: N802  (torch's name)
        """All dims reversed."""
        return _M.permute(self, tuple(range(self._data.ndim - 1, -1, -1)))  # type: ignore[attr-defined]

    @property
    def mT(self) -> Tensor:  # noqa: N802
        """The last two dims swapped."""
        return _M.transpose(self, -2, -1)

    @property
    def H(self) -> Tensor:  # noqa: N802
        """The last two dims swapped (the conjugate transpose of a real tensor)."""
        return _M.transpose(self, -2, -1)
