"""Helpers for layer constructors: parameter allocation on a device/dtype, tuple arguments."""

from __future__ import annotations

from ember.nn.parameter import Parameter


def empty_param(shape: tuple, device=None, dtype=None, requires_grad: bool = True) -> Parameter:
    """An uninitialised Parameter (the layer's reset_parameters fills it)."""
    from ember.ops.creation import empty

    return Parameter(empty(tuple(shape), dtype=dtype, device=device), requires_grad)


def ntuple(x, n: int) -> tuple:
    """An int or a sequence as an n-tuple (torch's _single/_pair/_triple)."""
    if isinstance(x, (tuple, list)):
        return tuple(x)
    return (x,) * n
