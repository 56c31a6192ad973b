"""Load a causal language model from a GGUF file or a Hugging Face directory (config.json + safetensors)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import ember
from ember.errors import FormatError, UnsupportedError
from ember.models._weights import assign_weights

# GGUF tensor names -> Hugging Face names (llama.cpp's naming, llama-family blocks)
_GGUF_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# architectures whose GGUF q/k rows are permuted for adjacent-pair ("normal") RoPE
_INTERLEAVED_ROPE = {"llama", "mistral", "granite"}


def gguf_to_hf_name(name: str) -> str:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'."""
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) >= 4:
        base = _GGUF_BLOCK.get(parts[2])
        if base is None:
            raise UnsupportedError(f"GGUF tensor {name!r}: unknown block tensor {parts[2]!r}")
        return f"model.layers.{parts[1]}.{base}.{'.'.join(parts[3:])}"
    base = _GGUF_TOP.get(parts[0])
    if base is None:
        raise UnsupportedError(f"GGUF tensor {name!r} is not part of a llama-family model")
    return f"{base}.{'.'.join(parts[1:])}"


def config_from_gguf(meta: dict, tensor_names) -> dict:
    """A config.json-style dict from GGUF metadata."""
    arch = meta.get("general.architecture")
    if arch is None:
        raise FormatError("GGUF file has no general.architecture")

    def g(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    heads = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    vocab = g("vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))
    cfg = {
        "model_type": {
            "llama": "llama",
            "mistral": "mistral",
            "qwen2": "qwen2",
            "qwen3": "qwen3",
        }.get(arch, arch),
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(g("attention.head_count_kv", heads)),
        "head_dim": int(g("attention.key_length", g("rope.dimension_count", hidden // heads))),
        "max_position_embeddings": int(g("context_length", 2048)),
        "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "qk_norm": "blk.0.attn_q_norm.weight" in tensor_names,
        "rope_interleaved": arch in _INTERLEAVED_ROPE,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    if g("attention.sliding_window"):
        cfg["sliding_window"] = int(g("attention.sliding_window"))
    scaling = g("rope.scaling.type")
    if scaling == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(g("rope.scaling.factor"))}
    return cfg


def _model_class(model_type: str):
    from ember.models import registry

    cls = registry.CAUSAL_LM.get(model_type)
    if cls is None:
        raise UnsupportedError(
            f"model_type {model_type!r} is not supported; known: {', '.join(sorted(registry.CAUSAL_LM))}"
        )
    return cls


def _build(config_dict: dict):
    cls = _model_class(config_dict.get("model_type", "llama"))
    config = cls.config_class.from_dict(config_dict)
    with ember.device("meta"):
        model = cls(config)
    return model.eval()


class AutoModelForCausalLM:
    """Pick the architecture from the file and load it (torch/transformers-style entry point)."""

    @staticmethod
    def from_pretrained(
        path: str | os.PathLike, dtype=None, quantize: str | None = None, stack: bool = True
    ):
        """Load from a .gguf file or a directory holding config.json and (sharded) safetensors.

        quantize: a block type for the float linears (e.g. "q8_0"). stack: run q/k/v and
        gate/up as one product each (``ember.inference.stack_linears``; same numbers, parameters
        and state_dict).
        """
        p = Path(path)
        if p.is_file() and p.suffix == ".gguf":
            model = _from_gguf(p, dtype)
        elif p.is_dir() and (p / "config.json").is_file():
            model = _from_hf_dir(p, dtype)
        elif p.is_dir() and list(p.glob("*.gguf")):
            model = _from_gguf(sorted(p.glob("*.gguf"))[0], dtype)
        else:
            raise FormatError(f"{path}: expected a .gguf file or a directory with config.json")
        if quantize:
            from ember.quant import quantize as quantize_model

            quantize_model(model, quantize)
        if stack:
            from ember.inference.stack import stack_linears

            stack_linears(model)
        return model


def _from_gguf(path: Path, dtype):
    from ember.io import open_gguf
    from ember.quant import QTensor

    f = open_gguf(path)
    cfg = config_from_gguf(f.metadata, set(f.tensors))
    from ember.models.llama import LlamaForCausalLM

    # GGUF tensor names and conventions are mapped for the llama family only
    if _model_class(cfg["model_type"]) is not LlamaForCausalLM:
        raise UnsupportedError(
            f"{path.name}: GGUF files of architecture {cfg['model_type']!r} are not supported yet "
            "(llama-family ones are); load the model's Hugging Face folder instead"
        )
    model = _build(cfg)
    weights = {}
    for name, info in f.tensors.items():
        hf = gguf_to_hf_name(name)
        weights[hf] = QTensor(info.data, info.qtype, info.shape) if info.is_quantized else info.data
    assign_weights(model, weights, dtype, strict=not cfg["tie_word_embeddings"])
    if cfg["tie_word_embeddings"]:
        model.tie_weights()
    model.source = str(path)
    model.gguf_metadata = f.metadata
    return model


def _from_hf_dir(path: Path, dtype):
    from ember.io import load_safetensors, load_safetensors_dir

    cfg = json.loads((path / "config.json").read_text())
    model = _build(cfg)
    if (path / "model.safetensors.index.json").is_file() or not (
        path / "model.safetensors"
    ).is_file():
        weights = load_safetensors_dir(path)
    else:
        weights = load_safetensors(path / "model.safetensors")
    if hasattr(model, "checkpoint_weights"):  # a family whose files name tensors differently
        weights = model.checkpoint_weights(weights)
    tied = model.config.tie_word_embeddings and "lm_head.weight" not in weights
    assign_weights(model, weights, dtype, strict=not tied)
    if tied:  # the family knows where its embeddings live
        model.tie_weights()
    model.source = str(path)
    return model
