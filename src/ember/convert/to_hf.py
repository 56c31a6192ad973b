"""GGUF (llama family) -> a Hugging Face folder that transformers and ember load as is."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ember.convert.layout import family_of_gguf, is_qk, to_half_split
from ember.errors import EmberError, UnsupportedError

# ember-only config keys, or ones whose default is what the family already means
_EMBER_ONLY = ("rope_interleaved", "qk_norm")


def hf_config(metadata: dict, tensor_names: set[str]) -> dict:
    """config.json for a GGUF model, with transformers' names and nothing ember-only."""
    from ember.models.auto import config_from_gguf

    fam = family_of_gguf(metadata.get("general.architecture"))
    cfg = config_from_gguf(metadata, tensor_names)
    if cfg.get("qk_norm") and fam.model_type != "qwen3":
        raise UnsupportedError(
            f"{fam.model_type}: q/k norms have no place in a transformers config"
        )
    if cfg.get("attention_bias") and fam.model_type == "qwen2":
        cfg.pop("attention_bias")  # Qwen2 always has q/k/v biases
    for key in _EMBER_ONLY:
        cfg.pop(key, None)
    cfg = {
        "architectures": [fam.hf_class],
        **cfg,
        "model_type": fam.model_type,
        "hidden_act": "silu",
    }
    for key in ("rms_norm_eps", "rope_theta"):  # GGUF holds float32: its shortest decimal
        if key in cfg:
            cfg[key] = float(str(np.float32(cfg[key])))
    return {k: v for k, v in cfg.items() if v is not None}


def gguf_to_hf(src: Path, dst: Path, dtype: str | None = None) -> int:
    """Write config.json, model.safetensors and the tokenizer files; returns the tensor count."""
    from ember.cli._progress import progress
    from ember.convert.vocab import hf_tokenizer_files
    from ember.dtypes import get_dtype
    from ember.io import open_gguf, save_safetensors
    from ember.models.auto import gguf_to_hf_name
    from ember.quant import dequantize

    stale = sorted(p.name for p in dst.glob("*.safetensors*") if p.name != "model.safetensors")
    if stale:
        raise EmberError(
            f"{dst}: already holds other weights ({', '.join(stale[:3])}); "
            "a loader would mix them in, so write to an empty folder"
        )
    f = open_gguf(src)
    fam = family_of_gguf(f.metadata.get("general.architecture"))
    cfg = hf_config(f.metadata, set(f.tensors))
    files = hf_tokenizer_files(f.metadata, cfg.get("max_position_embeddings"))
    out_dt = get_dtype(dtype or "float32").np
    cfg["dtype"] = get_dtype(dtype or "float32").name
    arrays = {}
    for name, info in progress(f.tensors.items(), len(f.tensors), "export", "tensor"):
        a = (
            dequantize(info.data, info.qtype, info.shape)
            if info.is_quantized
            else np.asarray(info.data)
        )
        if fam.permuted_qk and is_qk(name):
            a = to_half_split(a, int(cfg["head_dim"]), name)
        if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
            a = a.astype(out_dt)
        arrays[gguf_to_hf_name(name)] = np.ascontiguousarray(a)
    dst.mkdir(parents=True, exist_ok=True)
    save_safetensors(arrays, dst / "model.safetensors", metadata={"format": "pt"})
    gen = files["generation_config.json"]
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if key in gen:
            cfg.setdefault(key, gen[key])
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (dst / "tokenizer.json").write_text(files["tokenizer.json"], encoding="utf-8")
    for name in ("tokenizer_config.json", "generation_config.json"):
        (dst / name).write_text(json.dumps(files[name], indent=2, ensure_ascii=False) + "\n")
    return len(arrays)
