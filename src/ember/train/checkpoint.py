"""Training checkpoints as one .safetensors file: tensors for weights and optimizer state,
JSON metadata for everything else (epoch, optimizer options, scheduler, RNG states, history).

Tensor names: ``model.<state_dict key>`` and ``optimizer.state.<param index>.<key>``.
Metadata: ``{"format": "ember-checkpoint", "ember.checkpoint": <json>}``. The model part is a
plain state dict, so ``load_model_state(path)`` feeds ``model.load_state_dict`` directly.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import numpy as np

from ember.errors import FormatError
from ember.serialization import load_file, load_metadata, save_file
from ember.tensor import Tensor

FORMAT = "ember-checkpoint"
VERSION = 1


# ---------------------------------------------------------------------------- JSON codec
def encode(obj: Any) -> Any:
    """Python state (tuples, int-keyed dicts, numpy scalars) -> JSON-safe, reversible."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, float)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v) for v in obj]}
    if isinstance(obj, list):
        return [encode(v) for v in obj]
    if isinstance(obj, dict):
        plain = all(isinstance(k, str) and not k.startswith("__") for k in obj)
        if plain and not isinstance(obj, Counter):
            return {k: encode(v) for k, v in obj.items()}
        return {
            "__items__": [[encode(k), encode(v)] for k, v in obj.items()],
            "__type__": "Counter" if isinstance(obj, Counter) else "dict",
        }
    if isinstance(obj, np.ndarray):
        return {"__array__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, Tensor):
        return encode(obj._data)
    raise TypeError(f"checkpoint: cannot store a {type(obj).__name__} in the JSON metadata")


def decode(obj: Any) -> Any:
    """Inverse of encode."""
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, dict):
        if "__tuple__" in obj:
            return tuple(decode(v) for v in obj["__tuple__"])
        if "__items__" in obj:
            d = {_key(decode(k)): decode(v) for k, v in obj["__items__"]}
            return Counter(d) if obj.get("__type__") == "Counter" else d
        if "__array__" in obj:
            return np.asarray(obj["__array__"], dtype=obj["dtype"])
        return {k: decode(v) for k, v in obj.items()}
    return obj


def _key(k: Any) -> Any:
    return tuple(k) if isinstance(k, list) else k


# ---------------------------------------------------------------------------- RNG
def generator_states(generators: dict[str, Any]) -> dict[str, Any]:
    """name -> state of each ember.Generator (and 'ember' for the global one)."""
    from ember.ops.random import default_generator

    out = {"ember": default_generator.get_state()}
    for name, g in generators.items():
        out[name] = g.get_state()
    return out


def restore_generators(states: dict[str, Any], generators: dict[str, Any]) -> None:
    """Put the saved states back into the global generator and the named ones."""
    from ember.ops.random import default_generator

    if "ember" in states:
        default_generator.set_state(states["ember"])
    for name, g in generators.items():
        if name in states:
            g.set_state(states[name])


# ---------------------------------------------------------------------------- save / load
def save_checkpoint(
    path: str | os.PathLike,
    model: Any,
    optimizer: Any = None,
    scheduler: Any = None,
    epoch: int = 0,
    generators: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write model + optimizer + scheduler + epoch + RNG states (+ extra JSON state) to one file."""
    tensors: dict[str, Any] = {}
    for k, v in model.state_dict().items():
        if isinstance(v, Tensor):
            tensors[f"model.{k}"] = v
    meta: dict[str, Any] = {"version": VERSION, "epoch": epoch}
    if optimizer is not None:
        sd = optimizer.state_dict()
        state_json: dict[str, dict[str, Any]] = {}
        for idx, st in sd["state"].items():
            entry = {}
            for key, val in st.items():
                if isinstance(val, Tensor):
                    name = f"optimizer.state.{idx}.{key}"
                    tensors[name] = val
                    entry[key] = {"__tensor__": name}
                else:
                    entry[key] = encode(val)
            state_json[str(idx)] = entry
        meta["optimizer"] = {
            "type": type(optimizer).__name__,
            "param_groups": encode(sd["param_groups"]),
            "state": state_json,
        }
    if scheduler is not None:
        meta["scheduler"] = {
            "type": type(scheduler).__name__,
            "state": encode(scheduler.state_dict()),
        }
    meta["rng"] = encode(generator_states(generators or {}))
    if extra:
        meta["extra"] = encode(extra)
    blob = json.dumps(meta, allow_nan=True)
    save_file(tensors, path, metadata={"format": FORMAT, "ember.checkpoint": blob})


def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The tensors (memory-mapped) and the decoded metadata of a checkpoint file."""
    md = load_metadata(path)
    if md.get("format") != FORMAT or "ember.checkpoint" not in md:
        raise FormatError(f"{os.fspath(path)}: not an ember training checkpoint")
    return load_file(path), json.loads(md["ember.checkpoint"])


def load_model_state(path: str | os.PathLike) -> dict[str, Tensor]:
    """Only the model's state dict from a checkpoint (for model.load_state_dict)."""
    tensors, _ = read_checkpoint(path)
    return {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}


def load_checkpoint(
    path: str | os.PathLike,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    generators: dict[str, Any] | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Restore what is given from a checkpoint; returns the metadata (epoch, extra, ...)."""
    tensors, meta = read_checkpoint(path)
    if model is not None:
        model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    if optimizer is not None:
        if "optimizer" not in meta:
            raise FormatError(f"{os.fspath(path)}: the checkpoint holds no optimizer state")
        om = meta["optimizer"]
        state = {}
        for idx, entry in om["state"].items():
            state[int(idx)] = {
                key: tensors[val["__tensor__"]]
                if isinstance(val, dict) and "__tensor__" in val
                else decode(val)
                for key, val in entry.items()
            }
        optimizer.load_state_dict({"state": state, "param_groups": decode(om["param_groups"])})
    if scheduler is not None:
        if "scheduler" not in meta:
            raise FormatError(f"{os.fspath(path)}: the checkpoint holds no scheduler state")
        scheduler.load_state_dict(decode(meta["scheduler"]["state"]))
    if restore_rng and "rng" in meta:
        restore_generators(decode(meta["rng"]), generators or {})
    meta["extra"] = decode(meta.get("extra", {}))
    return meta


__all__ = [
    "save_checkpoint", "load_checkpoint", "read_checkpoint", "load_model_state", "encode", "decode",
]  # fmt: skip
