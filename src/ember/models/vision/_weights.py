"""Reading vision checkpoints (torch .pth/.pt/.bin, safetensors, folders, dicts) into a model."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from ember.errors import FormatError
from ember.tensor import Tensor

_TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".tar")
_FOLDER_FILES = ("model.safetensors", "pytorch_model.bin", "model.pth", "model.pt")


def _as_array(name: str, value) -> np.ndarray:
    if isinstance(value, Tensor):
        return value.detach().numpy()
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor a caller passed in
        return value.detach().cpu().numpy()
    if hasattr(value, "__array__"):
        return np.asarray(value)
    raise FormatError(f"checkpoint entry {name!r} is a {type(value).__name__}, not a tensor")


def _unwrap(obj, where: str) -> Mapping:
    """The state_dict inside a checkpoint: plain, or under 'state_dict'/'model' (training saves)."""
    for key in ("state_dict", "model_state_dict", "model", "module"):
        if isinstance(obj, Mapping) and key in obj and isinstance(obj[key], Mapping):
            return obj[key]
    if not isinstance(obj, Mapping):
        raise FormatError(
            f"{where}: expected a state_dict (a name -> tensor map), found {type(obj)}"
        )
    return obj


def checkpoint_from(src) -> dict[str, np.ndarray]:
    """name -> array from a path (torch file, .safetensors, a folder holding one) or a mapping."""
    if isinstance(src, Mapping):
        sd, where = _unwrap(src, "state_dict"), "state_dict"
    else:
        p = Path(os.fspath(src)).expanduser()
        if p.is_dir():
            found = [p / f for f in _FOLDER_FILES if (p / f).is_file()]
            if not found:
                raise FormatError(f"{p}: no {' / '.join(_FOLDER_FILES)} in this folder")
            p = found[0]
        if not p.is_file():
            raise FormatError(f"{p}: no such checkpoint file (ember never downloads weights)")
        where = str(p)
        if p.suffix == ".safetensors":
            from ember.io.safetensors import load_safetensors

            sd = load_safetensors(p)
        elif p.suffix in _TORCH_SUFFIXES:
            from ember.io.torch_pickle import load_torch

            sd = _unwrap(load_torch(p), where)
        else:
            raise FormatError(
                f"{p}: unknown checkpoint suffix (want .safetensors or .pth/.pt/.bin)"
            )
    out = {}
    for k, v in sd.items():
        k = k[7:] if k.startswith("module.") else k  # DataParallel saves
        out[k] = _as_array(k, v)
    if not out:
        raise FormatError(f"{where}: the checkpoint holds no tensors")
    return out


def build_checked(
    make: Callable[[], object], sd: Mapping, rename: Callable[[str], str] | None = None
):
    """`make()` once on the meta device to check sd against it, then for real.

    Dimensions read from a checkpoint (a class count, a config's sizes) are trusted only once
    every tensor the model would hold has a checkpoint tensor of the same shape: a file that
    claims 2**30 classes on a zero-size weight fails here, before anything is allocated.
    """
    import ember

    with ember.device("meta"):
        ghost = make()
    own = {k: tuple(v.shape) for k, v in ghost.state_dict().items()}
    given = {(rename(k) if rename else k): tuple(np.shape(v)) for k, v in sd.items()}
    bad = [
        f"{k}: checkpoint {given[k]} vs model {shape}"
        for k, shape in own.items()
        if k in given and given[k] != shape
    ]
    missing = [k for k in own if k not in given and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in given if k not in own]
    if bad or missing or unexpected:
        parts = []
        if bad:
            parts.append(f"{len(bad)} shapes differ ({'; '.join(bad[:3])})")
        if missing:
            parts.append(f"{len(missing)} tensors missing ({', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected ({', '.join(unexpected[:3])})")
        raise FormatError(f"checkpoint does not fit {type(ghost).__name__}: {'; '.join(parts)}")
    return make()


def class_count(sd: Mapping, key: str, in_features: int) -> int:
    """Rows of a classifier weight, checked to be (classes, in_features) with data behind it."""
    if key not in sd:
        raise FormatError(f"checkpoint has no {key!r} (the classifier)")
    shape = tuple(np.shape(sd[key]))
    if len(shape) != 2 or shape[1] != in_features or shape[0] < 1:
        raise FormatError(f"{key}: expected shape (classes >= 1, {in_features}), found {shape}")
    return shape[0]


def apply_weights(model, sd: Mapping, rename: Callable[[str], str] | None = None) -> None:
    """Load sd into model (strict: every key must match; float arrays cast to the param dtype)."""
    own = model.state_dict()
    fixed = {}
    for k, v in sd.items():
        k = rename(k) if rename else k
        arr = np.asarray(v)
        target = own.get(k)
        if target is not None and arr.dtype != target.dtype.np and arr.dtype.kind == "f":
            arr = arr.astype(target.dtype.np)
        fixed[k] = arr
    # torch checkpoints older than BatchNorm's num_batches_tracked lack it: not an error
    for k in own:
        if k.endswith("num_batches_tracked") and k not in fixed:
            fixed[k] = np.zeros((), np.int64)
    model.load_state_dict(fixed, strict=True)
