"""Parameter (a Tensor a Module trains) and Buffer (a Tensor a Module keeps in its state)."""

from __future__ import annotations

import numpy as np

from ember.autograd import meta_array
from ember.device import CPU, META
from ember.tensor import Tensor


def _array_of(data) -> tuple:
    """(array, device) of a Tensor, a numpy array or None (an empty float32 vector)."""
    if data is None:
        return np.empty((0,), np.float32), CPU
    if isinstance(data, Tensor):
        return data._data, data._device
    from ember.ops.creation import tensor

    t = tensor(data)
    return t._data, t._device


class Parameter(Tensor):
    """A Tensor that is a module's trainable state: requires_grad=True unless told otherwise.

    Assigning a Parameter to a Module attribute registers it in ``parameters()``. It shares the
    memory of the tensor it wraps, as torch.nn.Parameter does.
    """

    __slots__ = ()

    def __init__(self, data=None, requires_grad: bool = True) -> None:
        self._init(*_array_of(data), requires_grad)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    def __deepcopy__(self, memo: dict) -> Parameter:
        if id(self) in memo:
            return memo[id(self)]
        arr = self._data if self._device is META else self._data.copy()
        out = Parameter(Tensor._wrap(arr, self._device), self.requires_grad)
        if self.grad is not None:
            out.grad = Tensor._wrap(self.grad._data.copy(), self.grad._device)
        memo[id(self)] = out
        return out

    def __reduce_ex__(self, protocol):
        arr = self._data if self._device is META else np.ascontiguousarray(self._data)
        return (_rebuild_parameter, (arr, self._device.type, self.requires_grad))


def _rebuild_parameter(arr: np.ndarray, device: str, requires_grad: bool) -> Parameter:
    """Unpickle a Parameter."""
    if device == "meta":
        return Parameter(Tensor._wrap(meta_array(arr.shape, arr.dtype), META), requires_grad)
    return Parameter(Tensor._wrap(np.array(arr), CPU), requires_grad)


class Buffer(Tensor):
    """A Tensor that, assigned to a Module attribute, is registered as a buffer (torch.nn.Buffer).

    ``persistent=False`` keeps it out of ``state_dict``. The module stores a plain Tensor.
    """

    __slots__ = ("persistent",)

    def __init__(self, data=None, *, persistent: bool = True) -> None:
        self._init(*_array_of(data), False)
        self.persistent = persistent


def is_parameter(x) -> bool:
    """Whether x is a Parameter."""
    return isinstance(x, Parameter)
