"""safetensors files of ember Tensors: save_file / load_file (zero-copy), plus module helpers.

    ember.save_file(model.state_dict(), "model.safetensors", metadata={"format": "pt"})
    model.load_state_dict(ember.load_file("model.safetensors"))

Files are the standard format: they open in the ``safetensors`` package and in torch, and files
written by them open here. Loading maps the file: tensors are read-only views of the map until
copied (``load_state_dict`` copies into the parameters).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ember.autograd import meta_array
from ember.device import META, as_device
from ember.errors import DeviceError
from ember.io.safetensors import load_safetensors, open_safetensors, save_safetensors
from ember.tensor import Tensor


def _array(name: str, value: Any) -> np.ndarray:
    if isinstance(value, Tensor):
        if value.device is META:
            raise DeviceError(f"save_file: tensor {name!r} is on the meta device and has no data")
        return value._data
    if isinstance(value, np.ndarray):
        return value
    raise TypeError(f"save_file: {name!r} is a {type(value).__name__}, expected an ember Tensor")


def save_file(
    tensors: Mapping[str, Tensor],
    filename: str | os.PathLike,
    metadata: dict[str, str] | None = None,
) -> None:
    """Write a name -> Tensor dict (numpy arrays accepted too) to a .safetensors file."""
    if not isinstance(tensors, Mapping):
        raise TypeError(f"save_file expects a dict of tensors, got {type(tensors).__name__}")
    save_safetensors({k: _array(k, v) for k, v in tensors.items()}, filename, metadata)


def load_file(filename: str | os.PathLike, device: Any = "cpu") -> dict[str, Tensor]:
    """Read a .safetensors file as name -> Tensor, memory-mapped (no copy, read-only views)."""
    dev = as_device(device)
    arrays = load_safetensors(filename)
    if dev is META:
        return {k: Tensor._wrap(meta_array(a.shape, a.dtype), META) for k, a in arrays.items()}
    return {k: Tensor._wrap(a, dev) for k, a in arrays.items()}


def load_metadata(filename: str | os.PathLike) -> dict[str, str]:
    """The file's ``__metadata__`` string map ({} when it has none); reads only the header."""
    with open_safetensors(filename) as f:
        return dict(f.metadata or {})


def save(tensors: Mapping[str, Tensor], filename: str | os.PathLike, metadata: Any = None) -> None:
    """Alias of save_file (ember saves safetensors, never pickles)."""
    save_file(tensors, filename, metadata)


def save_module(
    module: Any, filename: str | os.PathLike, metadata: dict[str, str] | None = None
) -> None:
    """Write ``module.state_dict()`` to a .safetensors file (tied weights are stored per name)."""
    state = {k: v for k, v in module.state_dict().items() if isinstance(v, Tensor)}
    save_file(state, filename, metadata)


def load_module(
    module: Any, filename: str | os.PathLike, strict: bool = True, assign: bool = False
) -> Any:
    """``module.load_state_dict(load_file(filename), strict, assign)``; returns its result.

    ``assign=True`` adopts the mapped tensors instead of copying them (fast, read-only weights,
    for inference); the default copies into the existing parameters.
    """
    return module.load_state_dict(load_file(filename), strict=strict, assign=assign)


__all__ = ["save_file", "load_file", "load_metadata", "save_module", "load_module"]
