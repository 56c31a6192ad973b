"""peft's adapter files: adapter_config.json + adapter_model.safetensors, peft's tensor names.

Saved names are peft's: ``base_model.model.<module path>.lora_A.weight`` (the adapter name left
out), ``base_model.model.<path>.weight`` for a ``modules_to_save`` copy, and biases under their
own paths when ``bias`` is not "none". Rows are in Hugging Face order: a llama-family model
loaded from GGUF keeps its q/k rows permuted for interleaved RoPE, so the B of q_proj / k_proj is
unpermuted on save and permuted again on load.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ember.errors import FormatError, ShapeError
from ember.peft.config import WEIGHTS_NAME
from ember.peft.layer import LoraLinear, ModulesToSaveWrapper

PREFIX = "base_model.model."


def hf_to_interleaved(rows: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row permutation (half-split RoPE rows -> adjacent pairs), per head."""
    n = rows.shape[0]
    return (
        rows.reshape(n_head, 2, n // n_head // 2, *rows.shape[1:])
        .swapaxes(1, 2)
        .reshape(rows.shape)
    )


def interleaved_to_hf(rows: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of hf_to_interleaved."""
    n = rows.shape[0]
    return (
        rows.reshape(n_head, n // n_head // 2, 2, *rows.shape[1:])
        .swapaxes(1, 2)
        .reshape(rows.shape)
    )


def qk_heads(model, path: str) -> int | None:
    """Heads to permute B's rows by if this module is q/k of a model in interleaved row order."""
    spec = getattr(model, "spec", None)
    if spec is None or not getattr(spec, "rope_interleaved", False):
        return None
    leaf = path.rsplit(".", 1)[-1]
    if leaf == spec.names.q:
        return spec.num_heads
    if leaf == spec.names.k:
        return spec.num_kv_heads
    return None


def get_peft_model_state_dict(peft_model, adapter_name: str = "default") -> dict[str, np.ndarray]:
    """The adapter's tensors under peft's saved names, in Hugging Face row order."""
    lm = peft_model.base_model
    model = lm.model
    cfg = lm.peft_config[adapter_name]
    out: dict[str, np.ndarray] = {}
    for path, layer in lm.lora_layers():
        if adapter_name not in layer.lora_A:
            continue
        a = layer.lora_A[adapter_name].weight.detach().numpy()
        b = layer.lora_B[adapter_name].weight.detach().numpy()
        heads = qk_heads(model, path)
        if heads:
            b = interleaved_to_hf(b, heads)
        out[f"{PREFIX}{path}.lora_A.weight"] = np.ascontiguousarray(a)
        out[f"{PREFIX}{path}.lora_B.weight"] = np.ascontiguousarray(b)
        if cfg.bias == "lora_only" and layer.base_layer.bias is not None:
            out[f"{PREFIX}{path}.base_layer.bias"] = layer.base_layer.bias.detach().numpy()
    if cfg.bias == "all":
        for k, p in model.named_parameters():
            if k.endswith("bias") and ".lora_" not in k and ".modules_to_save." not in k:
                out[PREFIX + k.replace(".original_module", "")] = p.detach().numpy()
    for path, w in lm.saved_modules():
        if adapter_name in w.modules_to_save:
            for k, p in w.modules_to_save[adapter_name].named_parameters():
                out[f"{PREFIX}{path}.{k}"] = p.detach().numpy()
    return out


def save_adapter(peft_model, directory: str | os.PathLike, adapter_name: str = "default") -> None:
    """Write one adapter's adapter_config.json and adapter_model.safetensors into directory."""
    from ember.io import save_safetensors

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    cfg = peft_model.base_model.peft_config[adapter_name]
    if cfg.base_model_name_or_path is None:
        src = getattr(peft_model.base_model.model, "source", None)
        if src is not None:
            cfg.base_model_name_or_path = str(src)
    cfg.save_pretrained(d)
    tensors = get_peft_model_state_dict(peft_model, adapter_name)
    save_safetensors(tensors, d / WEIGHTS_NAME, metadata={"format": "pt"})


def _adapter_tensors(directory: str | os.PathLike) -> dict[str, np.ndarray]:
    from ember.io import load_safetensors

    p = Path(directory) / WEIGHTS_NAME
    if not p.is_file():
        if (Path(directory) / "adapter_model.bin").is_file():
            raise FormatError(
                f"{directory}: adapter_model.bin (a pickle) is not read; save the adapter with "
                "safe_serialization=True (adapter_model.safetensors)"
            )
        raise FileNotFoundError(f"no {WEIGHTS_NAME} in {directory}")
    return load_safetensors(p)


def set_peft_model_state_dict(
    peft_model,
    tensors: dict[str, np.ndarray],
    adapter_name: str = "default",
    where: str = "adapter",
) -> None:
    """Put saved adapter tensors (peft's names, HF row order) into the model's adapter."""
    lm = peft_model.base_model
    model = lm.model
    mods = dict(model.named_modules())
    want = set()
    for path, layer in lm.lora_layers():
        if adapter_name in layer.lora_A:
            want |= {f"{PREFIX}{path}.lora_A.weight", f"{PREFIX}{path}.lora_B.weight"}
    unexpected = []
    for key, arr in tensors.items():
        if not key.startswith(PREFIX):
            unexpected.append(key)
            continue
        rest = key[len(PREFIX) :]
        for part in ("lora_A", "lora_B"):
            suffix = f".{part}.weight"
            if rest.endswith(suffix):
                path = rest[: -len(suffix)]
                layer = mods.get(path)
                if not isinstance(layer, LoraLinear) or adapter_name not in layer.lora_A:
                    unexpected.append(key)
                    break
                target = getattr(layer, part)[adapter_name].weight
                arr = np.asarray(arr)
                heads = qk_heads(model, path) if part == "lora_B" else None
                if tuple(arr.shape) != tuple(target.shape):
                    base = layer.base_layer
                    raise ShapeError(
                        f"{where}: {key} has shape {tuple(arr.shape)} but module {path!r} "
                        f"(in={base.in_features}, out={base.out_features}, r={layer.r[adapter_name]}) "
                        f"needs {tuple(target.shape)}"
                    )
                if heads:
                    arr = hf_to_interleaved(arr, heads)
                _assign(target, arr)
                want.discard(key)
                break
        else:
            _load_other(model, mods, rest, arr, adapter_name, key, where, unexpected)
    if unexpected:
        raise FormatError(f"{where}: tensors that fit no adapted module: {sorted(unexpected)[:8]}")
    if want:
        raise FormatError(f"{where}: missing tensors {sorted(want)[:8]}")


def _load_other(model, mods, rest, arr, adapter_name, key, where, unexpected) -> None:
    """A modules_to_save copy's tensor or a bias."""
    path, _, pname = rest.rpartition(".")
    # modules_to_save: the wrapper sits at some prefix of the path
    probe = path
    while probe:
        m = mods.get(probe)
        if isinstance(m, ModulesToSaveWrapper) and adapter_name in m.modules_to_save:
            sub = path[len(probe) + 1 :]
            copy = m.modules_to_save[adapter_name]
            target = copy.get_parameter(f"{sub}.{pname}" if sub else pname)
            break
        probe = probe.rpartition(".")[0]
    else:
        try:
            target = model.get_parameter(rest)
        except AttributeError:
            unexpected.append(key)
            return
    arr = np.asarray(arr)
    if tuple(arr.shape) != tuple(target.shape):
        raise ShapeError(
            f"{where}: {key} has shape {tuple(arr.shape)} but the model's tensor is "
            f"{tuple(target.shape)}"
        )
    _assign(target, arr)


def _assign(param, arr: np.ndarray) -> None:
    """Copy arr into a parameter's storage (its dtype kept)."""
    param._data = np.array(arr, dtype=param._data.dtype)
    param.grad = None


def load_adapter_weights(peft_model, directory: str | os.PathLike, adapter_name: str) -> None:
    """Read directory/adapter_model.safetensors into the adapter adapter_name."""
    set_peft_model_state_dict(
        peft_model, _adapter_tensors(directory), adapter_name, str(Path(directory) / WEIGHTS_NAME)
    )


__all__ = [
    "get_peft_model_state_dict",
    "hf_to_interleaved",
    "interleaved_to_hf",
    "load_adapter_weights",
    "save_adapter",
    "set_peft_model_state_dict",
]
