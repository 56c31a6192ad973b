"""Saved adapters put on a loaded model for inference: ``load_adapter(model, path, scale)``.

One entry point for the two files a LoRA comes in: llama.cpp's LoRA GGUF (``general.type =
adapter``, ``adapter.type = lora``) and peft's adapter folder (``adapter_config.json`` +
``adapter_model.safetensors``). Several adapters add up, each at its own scale, as llama.cpp's
``--lora`` / ``--lora-scaled`` do; ``ember generate|chat|serve --lora FILE[:SCALE]`` call this.

The adapters stay beside the base weights, unmerged, as llama.cpp keeps them: a quantized base
(Q4_1 for the bundled SmolLM2) keeps its own blocks and each adapted linear adds
``scale * B(A(x)) * alpha / r`` in float32, exactly. Merging would mean requantizing every
adapted weight, which rounds the update to the block's step (or, for a block type ember cannot
write, turns the weight into float32): on the bundled Q4_1 model a random r=8 adapter merged
that way moved the logits about as far from the exact adapted model as the adapter itself moved
them from the base (bench/lora_merge.py, docs/finetuning.md). The price of staying unmerged is
two low-rank products per adapted linear and token; ``merge_and_unload()`` on the returned
PeftModel folds the adapters in where that trade is wanted (a float32 base merges exactly).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from ember.errors import FormatError, UnsupportedError
from ember.peft.config import CONFIG_NAME, WEIGHTS_NAME, LoraConfig, PeftConfigError

_NOT_ADAPTER = (
    "expected a llama.cpp LoRA GGUF (general.type = adapter) or a peft adapter folder "
    f"({CONFIG_NAME} + {WEIGHTS_NAME})"
)


def locate_adapter(path: str | os.PathLike) -> tuple[str, Path]:
    """('gguf' | 'peft', the file or folder to read) for an adapter path, or a clear error.

    A peft adapter is named by its folder (or a file in it: adapter_config.json or the
    safetensors); a GGUF must say ``general.type = adapter`` and ``adapter.type = lora``.
    Only headers are read.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(2, "no such adapter file or folder", str(path))
    if p.is_dir():
        if (p / CONFIG_NAME).is_file():
            return "peft", p
        raise FormatError(
            f"{path}: a folder without {CONFIG_NAME} is not an adapter; {_NOT_ADAPTER}"
        )
    if p.name == CONFIG_NAME or (p.suffix == ".safetensors" and (p.parent / CONFIG_NAME).is_file()):
        return "peft", p.parent
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise FormatError(f"{path}: not an adapter; {_NOT_ADAPTER}")
    from ember.io import open_gguf

    with open_gguf(p) as g:
        meta = g.metadata
        kind, atype = meta.get("general.type"), meta.get("adapter.type")
    if kind != "adapter":
        if kind in (None, "model"):
            raise FormatError(f"{path}: a model GGUF (general.type = {kind!r}), not an adapter")
        raise FormatError(f"{path}: general.type = {kind!r}, not an adapter; {_NOT_ADAPTER}")
    if atype != "lora":
        raise UnsupportedError(f"{path}: a {atype!r} adapter GGUF; only LoRA adapters are read")
    return "gguf", p


def _scaled_config(directory: Path, scale: float) -> LoraConfig:
    cfg = LoraConfig.from_pretrained(directory)
    if scale != 1.0:
        carried = [
            what
            for what, has in (
                ("modules_to_save", bool(cfg.modules_to_save)),
                (f"trained biases (bias={cfg.bias!r})", cfg.bias != "none"),
            )
            if has
        ]
        if carried:
            raise UnsupportedError(
                f"{directory}: a scale other than 1 weighs LoRA pairs only, and this adapter "
                f"also carries {' and '.join(carried)}; apply it at scale 1"
            )
        cfg.lora_alpha = cfg.lora_alpha * scale
        cfg.alpha_pattern = {k: v * scale for k, v in cfg.alpha_pattern.items()}
    cfg.inference_mode = True
    return cfg


def _load_peft_dir(model, peft_model, directory: Path, scale: float, name: str):
    from ember.peft.files import load_adapter_weights
    from ember.peft.model import PeftModel

    cfg = _scaled_config(directory, scale)
    if peft_model is None:
        pm = PeftModel(model, cfg, name)  # checks every target before wrapping any
        try:
            load_adapter_weights(pm, directory, name)
        except Exception:
            pm.unload()  # the model as it came
            raise
        return pm
    peft_model.base_model.inject_adapter(cfg, name)
    try:
        load_adapter_weights(peft_model, directory, name)
    except Exception:
        peft_model.delete_adapter(name)
        raise
    return peft_model


def active_adapters(peft_model) -> list[str]:
    """The adapters an adapted model's forward adds (in the order they were loaded)."""
    if peft_model is None:
        return []
    for _, layer in peft_model.base_model.lora_layers():
        return list(layer.active_adapters)
    return [peft_model.active_adapter]


def _activate(peft_model, names: list[str]) -> None:
    """Every named adapter active at once (LoraLinear sums them; a module copy must be one's)."""
    lm = peft_model.base_model
    for path, w in lm.saved_modules():
        have = [n for n in names if n in w.modules_to_save]
        if len(have) > 1:
            raise UnsupportedError(
                f"adapters {have} each replace module {path!r} (modules_to_save): only one of "
                "them can be applied"
            )
    for _, layer in lm.lora_layers():
        if layer.merged:
            layer.unmerge()
        layer.active_adapters = list(names)
    for _, w in lm.saved_modules():
        w.active_adapters = list(names)


def _pack(peft_model, name: str) -> None:
    """The adapter's A and B as packed-GEMM weights (same values): each row of a batch is then
    computed as it is alone, as the quantized kernels compute the base, so a batched decode step
    (ember serve) gives every sequence the numbers it gets by itself. (numpy's BLAS sums a
    1-row product in another order than an 8-row one, and a quantized base's int8 activations
    turn that last-bit difference into different tokens.) No-op without the microkernels."""
    from ember.inference.pack import pack_weights

    for _, layer in peft_model.base_model.lora_layers():
        if name in layer.lora_A:
            pack_weights(layer.lora_A[name])
            pack_weights(layer.lora_B[name])


def load_adapter(
    model, path: str | os.PathLike, scale: float = 1.0, adapter_name: str | None = None
):
    """Add the LoRA at path (llama.cpp GGUF or peft folder) at scale; returns the PeftModel.

    ``model`` is a plain model or a PeftModel from an earlier call: the adapters already active
    stay active and the new one adds to them. Scale multiplies the adapter's update ``B @ A``
    (0: the base model; negative values subtract it). The base weights are left as they are.
    A file that is no adapter is a FormatError, one whose tensors do not fit the model a
    ShapeError naming the module; the model is unchanged when loading fails. The adapter's
    weights are packed for ember's GEMM (inference: batched rows compute as they do alone).
    """
    from ember.peft.gguf import load_gguf_adapter
    from ember.peft.model import PeftModel

    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise PeftConfigError(f"load_adapter: scale must be a finite number, got {scale!r}")
    kind, where = locate_adapter(path)
    peft_model = model if isinstance(model, PeftModel) else None
    before = active_adapters(peft_model)
    taken = set(peft_model.peft_config) if peft_model is not None else set()
    if adapter_name is None:
        adapter_name = "default"
        k = 1
        while adapter_name in taken:
            adapter_name, k = f"adapter{k}", k + 1
    elif adapter_name in taken:
        raise PeftConfigError(f"an adapter named {adapter_name!r} already exists")
    if kind == "gguf":
        pm = load_gguf_adapter(model, where, float(scale), adapter_name)
    else:
        pm = _load_peft_dir(model, peft_model, where, float(scale), adapter_name)
    try:
        _activate(pm, [*before, adapter_name])
    except Exception:
        if before:
            pm.delete_adapter(adapter_name)
            _activate(pm, before)
        else:
            pm.unload()
        raise
    _pack(pm, adapter_name)
    pm.eval()
    return pm


__all__ = ["active_adapters", "load_adapter", "locate_adapter"]
