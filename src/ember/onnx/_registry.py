"""The table of ONNX operators ember implements, and the helpers every op module uses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import ember
from ember.errors import ShapeError, UnsupportedError
from ember.tensor import Tensor

OPS: dict[str, Callable[..., Any]] = {}


class Attrs:
    """A node's attributes (parsed once at load), its opset and how many outputs it has."""

    __slots__ = ("values", "opset", "n_out", "op", "name")

    def __init__(self, values: dict, opset: int, n_out: int, op: str, name: str) -> None:
        self.values, self.opset, self.n_out, self.op, self.name = values, opset, n_out, op, name

    def get(self, key: str, default: Any = None) -> Any:
        """The attribute's value, or default when the node does not set it."""
        return self.values.get(key, default)

    def __contains__(self, key: str) -> bool:
        return key in self.values

    def where(self) -> str:
        """'Op node-name', for messages."""
        return f"{self.op} {self.name!r}" if self.name else self.op


def op(*names: str):
    """Register the decorated function as the implementation of the named ONNX operators."""

    def deco(fn):
        for n in names:
            OPS[n] = fn
        return fn

    return deco


def ints(t: Tensor | None) -> list[int]:
    """A 1-D integer tensor (shape, axes, pads) as a list of Python ints."""
    if t is None:
        return []
    return [int(v) for v in np.asarray(t.numpy()).reshape(-1)]


def scalar(t: Tensor | None, default=None):
    """A 0-d or 1-element tensor as a Python number."""
    if t is None:
        return default
    a = np.asarray(t.numpy()).reshape(-1)
    if a.size != 1:
        raise ShapeError(f"expected a scalar, got shape {tuple(t.shape)}")
    return a[0].item()


def const(values, dtype) -> Tensor:
    """An ember tensor from Python values or an array, in the given numpy or ember dtype."""
    if isinstance(dtype, ember.dtype):
        dtype = dtype.np
    return ember.from_numpy(np.array(values, dtype=dtype, order="C"))


def npdt(t: Tensor) -> np.dtype:
    """The numpy dtype of an ember tensor."""
    return np.dtype(t.dtype.np)


def axis_of(axis: int, rank: int, where: str) -> int:
    """A possibly negative axis as 0..rank-1, or a ShapeError."""
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"{where}: axis {axis} out of range for rank {rank}")
    return axis % max(rank, 1)


def unsupported(a: Attrs, what: str):
    """Raise UnsupportedError naming the node."""
    raise UnsupportedError(f"ONNX {a.where()}: {what} is not supported")
