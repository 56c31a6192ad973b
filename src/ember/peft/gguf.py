"""llama.cpp's LoRA adapter GGUF: write one from an ember or peft adapter, apply one to a model.

The layout is the one llama.cpp's ``convert_lora_to_gguf.py`` writes and ``llama-cli --lora``
reads: ``general.type = "adapter"``, ``adapter.type = "lora"``, ``adapter.lora.alpha`` (float32),
``general.architecture`` of the base, and for each adapted weight ``<gguf name>.lora_a`` (torch
shape (r, in)) and ``<gguf name>.lora_b`` ((out, r)) under llama.cpp's tensor names
(``blk.3.attn_q.weight.lora_a``). llama.cpp scales each pair by ``alpha / r`` with r read from
the tensor, so per-module scalings that differ from that (rank/alpha patterns, rsLoRA) are folded
into lora_b. For the architectures whose GGUF q/k rows are permuted for interleaved RoPE
(llama), lora_b of q and k is permuted the same way.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ember.errors import FormatError, ShapeError, UnsupportedError

_ARCH_OF_MODEL_TYPE = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


@dataclass(frozen=True)
class _Base:
    arch: str
    heads: int
    kv_heads: int
    interleaved_rows: bool  # the model's own q/k rows are in GGUF (interleaved) order


def _gguf_permutes(arch: str) -> bool:
    from ember.models.auto import _INTERLEAVED_ROPE

    return arch in _INTERLEAVED_ROPE


def _base_of_model(model) -> _Base:
    spec = getattr(model, "spec", None)
    if spec is None:
        raise UnsupportedError(
            f"GGUF adapters are for ember's decoder models, not a {type(model).__name__}"
        )
    meta = getattr(model, "gguf_metadata", None) or {}
    arch = meta.get("general.architecture") or _ARCH_OF_MODEL_TYPE.get(model.config.model_type)
    if arch is None:
        raise UnsupportedError(
            f"no llama.cpp architecture known for model_type {model.config.model_type!r} "
            f"(known: {sorted(_ARCH_OF_MODEL_TYPE)})"
        )
    return _Base(arch, spec.num_heads, spec.num_kv_heads, bool(spec.rope_interleaved))


def _base_of(base) -> _Base:
    if base is None:
        raise ValueError("save_gguf_adapter: an adapter directory needs base= (model or config)")
    if isinstance(base, (str, os.PathLike)):
        p = Path(base)
        if p.is_file() and p.suffix == ".gguf":
            from ember.io import open_gguf

            with open_gguf(p) as f:
                meta = f.metadata
            arch = meta.get("general.architecture")
            heads = int(meta[f"{arch}.attention.head_count"])
            kv = int(meta.get(f"{arch}.attention.head_count_kv", heads))
            return _Base(arch, heads, kv, False)
        cfg_path = p / "config.json" if p.is_dir() else p
        if not cfg_path.is_file():
            raise FileNotFoundError(f"{base}: expected a .gguf file, config.json or its folder")
        base = json.loads(cfg_path.read_text())
    if isinstance(base, dict):
        mt = base.get("model_type")
        arch = _ARCH_OF_MODEL_TYPE.get(mt)
        if arch is None:
            raise UnsupportedError(f"no llama.cpp architecture known for model_type {mt!r}")
        heads = int(base["num_attention_heads"])
        return _Base(arch, heads, int(base.get("num_key_value_heads") or heads), False)
    return _base_of_model(base)


def hf_to_gguf_name(path: str) -> str:
    """'model.layers.3.self_attn.q_proj' -> 'blk.3.attn_q.weight' (llama.cpp's names)."""
    from ember.models.auto import _GGUF_BLOCK, _GGUF_TOP

    parts = path.split(".")
    if len(parts) >= 4 and parts[0] == "model" and parts[1] == "layers":
        inv = {v: k for k, v in _GGUF_BLOCK.items()}
        tail = ".".join(parts[3:])
        if tail in inv:
            return f"blk.{parts[2]}.{inv[tail]}.weight"
    inv_top = {v: k for k, v in _GGUF_TOP.items()}
    if path in inv_top:
        return f"{inv_top[path]}.weight"
    raise UnsupportedError(f"module {path!r} has no llama.cpp tensor name")


def _pairs_from_model(peft_model, adapter_name: str):
    lm = peft_model.base_model
    cfg = lm.peft_config[adapter_name]
    _refuse_extras(cfg)
    for path, layer in lm.lora_layers():
        if adapter_name in layer.lora_A:
            a = layer.lora_A[adapter_name].weight.detach().numpy()
            b = layer.lora_B[adapter_name].weight.detach().numpy()
            yield path, a, b, layer.scaling[adapter_name]


def _pairs_from_dir(directory):
    from ember.peft.config import LoraConfig
    from ember.peft.files import PREFIX, _adapter_tensors

    cfg = LoraConfig.from_pretrained(directory)
    _refuse_extras(cfg)
    tensors = _adapter_tensors(directory)
    for key in tensors:
        if key.endswith(".lora_A.weight"):
            path = key[len(PREFIX) : -len(".lora_A.weight")]
            bkey = f"{PREFIX}{path}.lora_B.weight"
            if bkey not in tensors:
                raise FormatError(f"{directory}: {key} has no {bkey}")
            a, b = np.asarray(tensors[key]), np.asarray(tensors[bkey])
            r, alpha = cfg.rank_and_alpha(path)
            yield path, a, b, cfg.scaling_for(a.shape[0], alpha)
        elif not key.endswith(".lora_B.weight"):
            raise UnsupportedError(
                f"{directory}: {key} is not a LoRA pair; llama.cpp adapters hold lora_a/lora_b only"
            )


def _refuse_extras(cfg) -> None:
    if cfg.modules_to_save:
        raise UnsupportedError(
            "llama.cpp LoRA adapters cannot carry modules_to_save (whole trained modules); "
            "merge the adapter instead (merge_and_unload) and convert the model"
        )
    if cfg.bias != "none":
        raise UnsupportedError("llama.cpp LoRA adapters cannot carry trained biases (bias='none')")


def save_gguf_adapter(
    source, path: str | os.PathLike, *, base=None, adapter_name: str = "default"
) -> int:
    """Write a llama.cpp LoRA GGUF from a PeftModel or a peft adapter directory; returns tensors.

    With a directory, ``base`` says the base model's architecture and heads: an ember model, a
    config.json dict, or the path of its folder, config.json or .gguf.
    """
    from ember.io import save_gguf
    from ember.peft.files import hf_to_interleaved, interleaved_to_hf
    from ember.peft.model import PeftModel

    if isinstance(source, PeftModel):
        info = _base_of_model(source.base_model.model) if base is None else _base_of(base)
        pairs = list(_pairs_from_model(source, adapter_name))
        cfg = source.base_model.peft_config[adapter_name]
        rows_interleaved = info.interleaved_rows
    else:
        info = _base_of(base)
        pairs = list(_pairs_from_dir(source))
        from ember.peft.config import LoraConfig

        cfg = LoraConfig.from_pretrained(source)
        rows_interleaved = False
    if not pairs:
        raise FormatError("the adapter has no LoRA tensors")
    alpha = float(cfg.lora_alpha * np.sqrt(cfg.r) if cfg.use_rslora else cfg.lora_alpha)
    want_interleaved = _gguf_permutes(info.arch)
    tensors: dict[str, np.ndarray] = {}
    for mpath, a, b, scaling in pairs:
        name = hf_to_gguf_name(mpath)
        r = a.shape[0]
        b = b.astype(np.float32)
        factor = scaling / (alpha / r)
        if abs(factor - 1.0) > 1e-12:
            b = b * np.float32(factor)
        leaf = mpath.rsplit(".", 1)[-1]
        heads = {"q_proj": info.heads, "k_proj": info.kv_heads}.get(leaf)
        if heads and rows_interleaved != want_interleaved:
            b = hf_to_interleaved(b, heads) if want_interleaved else interleaved_to_hf(b, heads)
        tensors[name + ".lora_a"] = np.ascontiguousarray(a, np.float32)
        tensors[name + ".lora_b"] = np.ascontiguousarray(b, np.float32)
    meta = {
        "general.architecture": info.arch,
        "general.type": "adapter",
        "adapter.type": "lora",
        "adapter.lora.alpha": alpha,
    }
    save_gguf(path, meta, tensors, metadata_types={"adapter.lora.alpha": "FLOAT32"})
    return len(tensors)


def load_gguf_adapter(
    model, path: str | os.PathLike, scale: float = 1.0, adapter_name: str = "default"
):
    """Put a llama.cpp LoRA GGUF on a model (``--lora FILE:SCALE``); returns the PeftModel.

    The adapter runs beside the (possibly quantized) base weights, scaled by
    ``scale * alpha / r`` as llama.cpp does; ``merge_and_unload()`` folds it in.
    """
    import re
    from collections import Counter

    from ember.io import open_gguf
    from ember.models.auto import gguf_to_hf_name
    from ember.peft.config import LoraConfig
    from ember.peft.files import hf_to_interleaved, interleaved_to_hf
    from ember.peft.model import PeftModel

    peft_model = model if isinstance(model, PeftModel) else None
    inner = peft_model.base_model.model if peft_model is not None else model
    info = _base_of_model(inner)
    with open_gguf(path) as f:
        meta = dict(f.metadata)
        if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
            raise FormatError(
                f"{path}: not a LoRA adapter GGUF (general.type={meta.get('general.type')!r}, "
                f"adapter.type={meta.get('adapter.type')!r})"
            )
        arch = meta.get("general.architecture")
        if arch != info.arch:
            raise FormatError(
                f"{path}: an adapter for architecture {arch!r}, the model is {info.arch!r}"
            )
        alpha = meta.get("adapter.lora.alpha", 0.0)
        if type(alpha) not in (int, float) or not np.isfinite(alpha):
            raise FormatError(f"{path}: adapter.lora.alpha must be a number, found {alpha!r:.40}")
        arrays = {name: _float32(t) for name, t in f.tensors.items()}
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for name, arr in arrays.items():
        stem, dot, kind = name.rpartition(".")
        if not dot or kind not in ("lora_a", "lora_b") or not stem.endswith(".weight"):
            raise UnsupportedError(f"{path}: tensor {name!r} is not a lora_a/lora_b tensor")
        mpath = gguf_to_hf_name(stem)[: -len(".weight")]
        pairs.setdefault(mpath, {})[kind] = arr
    if not pairs:
        raise FormatError(f"{path}: the adapter holds no tensors")
    modules = dict(inner.named_modules())
    ranks = {}
    for mpath, ab in pairs.items():
        if set(ab) != {"lora_a", "lora_b"}:
            raise FormatError(f"{path}: {hf_to_gguf_name(mpath)} has only {sorted(ab)}")
        mod = modules.get(mpath)
        if mod is None:
            raise ShapeError(
                f"{path}: the adapter adapts {mpath!r}, which this model does not have"
            )
        base = getattr(mod, "base_layer", mod)
        a, b = ab["lora_a"], ab["lora_b"]
        r = a.shape[0]
        fits = (
            a.ndim == 2 and b.ndim == 2 and b.shape[1] == r
            and a.shape[1] == base.in_features and b.shape[0] == base.out_features
        )  # fmt: skip
        if not fits:
            raise ShapeError(
                f"{path}: the adapter of module {mpath!r} has lora_a {a.shape} and lora_b "
                f"{b.shape}; the module needs (r, {base.in_features}) and "
                f"({base.out_features}, r)"
            )
        ranks[mpath] = r
    r0 = Counter(ranks.values()).most_common(1)[0][0]
    alpha_pattern = {} if alpha else {re.escape(m): scale * r for m, r in ranks.items()}
    cfg = LoraConfig(
        r=r0,
        lora_alpha=scale * alpha if alpha else scale * r0,
        target_modules=sorted(pairs),
        rank_pattern={re.escape(m): r for m, r in ranks.items() if r != r0},
        alpha_pattern=alpha_pattern,
        init_lora_weights=False,
        inference_mode=True,
    )
    if peft_model is None:
        peft_model = PeftModel(inner, cfg, adapter_name)
    else:
        peft_model.base_model.inject_adapter(cfg, adapter_name)
        peft_model.set_adapter(adapter_name)
    gguf_rows = _gguf_permutes(info.arch)
    for mpath, ab in pairs.items():
        layer = inner.get_submodule(mpath)
        b = ab["lora_b"]
        leaf = mpath.rsplit(".", 1)[-1]
        heads = {"q_proj": info.heads, "k_proj": info.kv_heads}.get(leaf)
        if heads and gguf_rows != info.interleaved_rows:
            b = interleaved_to_hf(b, heads) if gguf_rows else hf_to_interleaved(b, heads)
        for part, arr in (("lora_A", ab["lora_a"]), ("lora_B", b)):
            w = getattr(layer, part)[adapter_name].weight
            w._data = np.array(arr, dtype=w._data.dtype)
    peft_model.eval()
    return peft_model


def _float32(info) -> np.ndarray:
    """A GGUF tensor as float32 (F32/F16/BF16 or quantized blocks)."""
    if info.is_quantized:
        from ember.quant import QTensor

        return QTensor(info.data, info.qtype, info.shape).dequantize()
    return np.array(info.data, dtype=np.float32).reshape(info.shape)  # a copy: the map closes
