"""Helpers shared by the functional modules: lazy access to ember ops, reduction strings."""

from __future__ import annotations

import numpy as np

from ember import dtypes as _dt

_LOW = _dt.HALF_FLOATS  # float16, bfloat16 (ml_dtypes not imported until one is seen)
_F32 = np.float32


def up(a: np.ndarray) -> np.ndarray:
    """float16/bfloat16 arrays as float32 (torch's opmath); others unchanged."""
    return a.astype(_F32) if a.dtype in _LOW else a


def legacy_reduction(size_average, reduce, reduction: str) -> str:
    """torch's old size_average/reduce flags -> a reduction string."""
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if size_average and reduce:
        return "mean"
    return "sum" if reduce else "none"


def check_reduction(reduction: str) -> str:
    """Validate a reduction string."""
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    return reduction


def reduce_loss(loss, reduction: str):
    """Apply 'none' | 'mean' | 'sum' to an elementwise loss tensor."""
    if reduction == "none":
        return loss
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    raise ValueError(f"{reduction} is not a valid value for reduction")


def tuple_n(x, n: int) -> tuple:
    """An int or a sequence as an n-tuple (torch's _pair/_single)."""
    if isinstance(x, (tuple, list)):
        return tuple(x)
    return (x,) * n
