"""safetensors files of ember Tensors: save_file / load_file (zero-copy), save / load (torch's
habit), plus module helpers.

    ember.save_file(model.state_dict(), "model.safetensors", metadata={"format": "pt"})
    model.load_state_dict(ember.load_file("model.safetensors"))
    ember.save({"model": model.state_dict(), "epoch": 3}, "ckpt.safetensors")
    ckpt = ember.load("ckpt.safetensors")          # or a torch.save file, read without torch

Files are the standard format: they open in the ``safetensors`` package and in torch, and files
written by them open here. Loading maps the file: tensors are read-only views of the map until
copied (``load_state_dict`` copies into the parameters).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import IO, Any

import numpy as np

from ember.autograd import meta_array
from ember.device import META, as_device
from ember.errors import DeviceError, FormatError, UnsupportedError
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


# --------------------------------------------------------------------------- save / load

# ember.save of anything but a flat name -> tensor dict keeps the object's shape in the metadata:
# its skeleton as JSON, each tensor replaced by {"__tensor__": its name in the file}.
_KIND, _TREE = "ember.save", "ember.save.tree"
_Leaf = (bool, int, float, str, type(None))


def _flatten(obj: Any, path: str, out: dict[str, Any]) -> Any:
    """The JSON skeleton of obj; its tensors go to out under dotted names (torch's key style)."""
    if isinstance(obj, (Tensor, np.ndarray)):
        key = path or "tensor"
        while key in out:
            key += "_"
        out[key] = _array(key, obj)
        return {"__tensor__": key}
    if isinstance(obj, _Leaf):
        return obj
    dot = path + "." if path else ""
    if isinstance(obj, Mapping):
        items = [(k, _flatten(v, f"{dot}{k}", out)) for k, v in obj.items()]
        if all(isinstance(k, str) and not k.startswith("__") for k, _ in items):
            return dict(items)
        if not all(isinstance(k, _Leaf) for k, _ in items):
            bad = next(k for k, _ in items if not isinstance(k, _Leaf))
            raise UnsupportedError(f"save: dict key {bad!r} is not a str, number, bool or None")
        return {"__items__": [[k, v] for k, v in items]}  # int keys (optimizer state)
    if isinstance(obj, (list, tuple)):
        seq = [_flatten(v, f"{dot}{i}", out) for i, v in enumerate(obj)]
        return {"__tuple__": seq} if isinstance(obj, tuple) else seq
    raise UnsupportedError(
        f"save: cannot store a {type(obj).__name__} at {path or 'the top level'!r}; ember.save "
        "writes tensors and dicts, lists and tuples of them, numbers, strings and None "
        "(safetensors, never a pickle)"
    )


def _unflatten(node: Any, tensors: Mapping[str, Any]) -> Any:
    if isinstance(node, list):
        return [_unflatten(v, tensors) for v in node]
    if not isinstance(node, dict):
        return node
    if "__tensor__" in node:
        key = node["__tensor__"]
        if not isinstance(key, str) or key not in tensors:
            raise FormatError(f"load: the saved structure names a tensor {key!r} the file lacks")
        return tensors[key]
    if "__tuple__" in node:
        return tuple(_unflatten(v, tensors) for v in node["__tuple__"])
    if "__items__" in node:
        return {k: _unflatten(v, tensors) for k, v in node["__items__"]}
    return {k: _unflatten(v, tensors) for k, v in node.items()}


def save(
    obj: Any, f: str | os.PathLike | IO[bytes], metadata: dict[str, str] | None = None
) -> None:
    """torch.save's habit, as safetensors: a tensor, a state dict or a nested checkpoint dict.

    A flat name -> tensor dict is written as a plain safetensors file (it opens anywhere); other
    objects (one tensor, nested dicts, lists, tuples, numbers, strings) keep their structure in
    the file's metadata and come back as saved from ``ember.load``. f is a path or a binary file.
    """
    if isinstance(obj, Mapping) and all(
        isinstance(k, str) and isinstance(v, (Tensor, np.ndarray)) for k, v in obj.items()
    ):
        tensors, meta = {k: _array(k, v) for k, v in obj.items()}, dict(metadata or {})
    else:
        tensors = {}
        tree = _flatten(obj, "", tensors)
        kind = "tensor" if isinstance(obj, (Tensor, np.ndarray)) else "tree"
        meta = {**(metadata or {}), _KIND: kind, _TREE: json.dumps(tree)}
    if isinstance(f, (str, os.PathLike)):
        save_safetensors(tensors, f, meta or None)
        return
    if not hasattr(f, "write"):
        raise TypeError(f"save: f must be a path or a binary file, got {type(f).__name__}")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "obj.safetensors")
        save_safetensors(tensors, path, meta or None)
        with open(path, "rb") as src:
            shutil.copyfileobj(src, f)


def load(
    f: str | os.PathLike | IO[bytes],
    map_location: Any = None,
    weights_only: bool | None = None,
    *,
    mmap: bool = False,
) -> Any:
    """torch.load's habit: what ember.save wrote, any safetensors file, or a torch.save file.

    torch.save files (zip or legacy) are read by ember's restricted unpickler, never executed,
    whatever ``weights_only`` says. Tensors are writable copies, as torch.load gives; ``mmap=True``
    keeps them as read-only views of the mapped file. map_location: None, "cpu" or "meta".
    """
    if (
        map_location is not None
        and not isinstance(map_location, str)
        and not hasattr(map_location, "type")
    ):
        raise UnsupportedError(
            f"load: map_location {map_location!r}: ember takes None, 'cpu' or 'meta' "
            "(a dict or a function is not supported)"
        )
    dev = as_device("cpu" if map_location is None else map_location)
    if isinstance(f, (str, os.PathLike)):
        return _load_path(os.fspath(f), dev, mmap)
    if not hasattr(f, "read"):
        raise TypeError(f"load: f must be a path or a binary file, got {type(f).__name__}")
    data = f.read()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("load: f must be opened in binary mode ('rb')")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "obj")
        with open(path, "wb") as out:
            out.write(data)
        return _load_path(path, dev, False)  # copies: the temporary file goes away


def _load_path(path: str, dev: Any, keep_map: bool) -> Any:
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head == b"PK\x03\x04" or head[:1] == b"\x80":
        from ember.io.torch_pickle import load_torch

        return _tensors_in(load_torch(path, copy=not keep_map), dev)

    def wrap(a: np.ndarray) -> Tensor:
        if dev is META:
            return Tensor._wrap(meta_array(a.shape, a.dtype), META)
        return Tensor._wrap(a if keep_map else np.array(a), dev)

    with open_safetensors(path) as sf:
        meta = dict(sf.metadata or {})
        tensors = {name: wrap(sf.get(name)) for name in sf.keys()}
    if meta.get(_KIND) not in ("tensor", "tree"):
        return tensors
    try:
        tree = json.loads(meta[_TREE])
    except (KeyError, ValueError) as e:
        raise FormatError(f"{path}: the {_TREE!r} metadata is missing or not JSON ({e})") from None
    try:
        return _unflatten(tree, tensors)
    except (TypeError, ValueError, AttributeError, RecursionError) as e:
        kind = type(e).__name__
        raise FormatError(
            f"{path}: the {_TREE!r} metadata is not a saved structure ({kind})"
        ) from None


def _tensors_in(obj: Any, dev: Any) -> Any:
    """The object torch.load would give: numpy arrays from the reader become Tensors."""
    if isinstance(obj, np.ndarray):
        if dev is META:
            return Tensor._wrap(meta_array(obj.shape, obj.dtype), META)
        return Tensor._wrap(obj, dev)
    if isinstance(obj, dict):
        out = type(obj)() if type(obj) is not dict else {}
        for k, v in obj.items():
            out[k] = _tensors_in(v, dev)
        return out
    if isinstance(obj, list):
        return [_tensors_in(v, dev) for v in obj]
    if isinstance(obj, tuple) and type(obj) is tuple:
        return tuple(_tensors_in(v, dev) for v in obj)
    return obj


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


__all__ = ["save", "load", "save_file", "load_file", "load_metadata", "save_module", "load_module"]
