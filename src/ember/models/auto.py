"""Load a causal language model from a GGUF file or a Hugging Face directory (config.json + safetensors)."""

from __future__ import annotations

import json
import math
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


_REQUIRED = object()
_GGUF_MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}


def config_from_gguf(meta: dict, tensor_names) -> dict:
    """A config.json-style dict from GGUF metadata, every field checked as llama.cpp does.

    Counts and sizes must be positive integers, and `block_count` cannot exceed the tensors
    the file holds (each block has several), so a bad file fails here, before a model is built.
    """
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise FormatError("GGUF file has no general.architecture string")
    names = set(tensor_names)

    def g(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    def integer(key, default=_REQUIRED, minimum=1):
        v = g(key, default)
        if v is _REQUIRED:
            raise FormatError(f"GGUF metadata has no {arch}.{key} (required for a {arch} model)")
        if type(v) is not int:
            raise FormatError(
                f"GGUF metadata {arch}.{key} must be an integer, found {type(v).__name__} {v!r:.60}"
            )
        if v < minimum:
            raise FormatError(f"GGUF metadata {arch}.{key} is {v}; it must be at least {minimum}")
        return v

    def number(key, default):
        v = g(key, default)
        if type(v) not in (int, float) or not math.isfinite(v) or v <= 0:
            raise FormatError(
                f"GGUF metadata {arch}.{key} must be a positive number, found {v!r:.60}"
            )
        return float(v)

    heads = integer("attention.head_count")
    kv_heads = integer("attention.head_count_kv", heads)
    if heads % kv_heads:
        raise FormatError(
            f"GGUF metadata {arch}.attention.head_count {heads} is not a multiple of "
            f"attention.head_count_kv {kv_heads}"
        )
    hidden = integer("embedding_length")
    layers = integer("block_count")
    if layers > len(names):  # every block holds several tensors
        raise FormatError(
            f"GGUF metadata {arch}.block_count is {layers} but the file holds only "
            f"{len(names)} tensors"
        )
    if g("vocab_size") is not None:
        vocab = integer("vocab_size")
    else:
        tokens = meta.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens:
            raise FormatError(f"GGUF file has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
        vocab = len(tokens)
    if g("attention.key_length") is not None:
        head_dim = integer("attention.key_length")
    elif g("rope.dimension_count") is not None:
        head_dim = integer("rope.dimension_count")
    elif hidden % heads:
        raise FormatError(
            f"GGUF metadata {arch}.embedding_length {hidden} is not a multiple of "
            f"attention.head_count {heads}, and no attention.key_length says the head size"
        )
    else:
        head_dim = hidden // heads
    cfg = {
        "model_type": _GGUF_MODEL_TYPES.get(arch, arch),
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": integer("feed_forward_length"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": integer("context_length", 2048),
        "rms_norm_eps": number("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": number("rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "qk_norm": "blk.0.attn_q_norm.weight" in names,
        "rope_interleaved": arch in _INTERLEAVED_ROPE,
        "bos_token_id": _token_id(meta, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _token_id(meta, "tokenizer.ggml.eos_token_id"),
    }
    if g("attention.sliding_window"):
        cfg["sliding_window"] = integer("attention.sliding_window")
    scaling = g("rope.scaling.type")
    if scaling == "linear":
        if g("rope.scaling.factor") is None:
            raise FormatError(
                f"GGUF metadata {arch}.rope.scaling.type is 'linear' but there is no "
                f"{arch}.rope.scaling.factor"
            )
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": number("rope.scaling.factor", None)}
    return cfg


def _token_id(meta: dict, key: str) -> int | None:
    v = meta.get(key)
    if v is not None and (type(v) is not int or v < 0):
        raise FormatError(f"GGUF metadata {key} must be a token id, found {v!r:.60}")
    return v


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


def hf_to_gguf_name(name: str) -> str:
    """'model.layers.3.self_attn.q_proj.weight' -> 'blk.3.attn_q.weight' (for messages)."""
    parts = name.split(".")
    if parts[:2] == ["model", "layers"] and len(parts) >= 4:
        rest = ".".join(parts[3:])
        for gguf, hf in _GGUF_BLOCK.items():
            if rest.startswith(hf + "."):
                return f"blk.{parts[2]}.{gguf}{rest[len(hf) :]}"
    for gguf, hf in _GGUF_TOP.items():
        if name.startswith(hf + "."):
            return gguf + name[len(hf) :]
    return name


def _from_gguf(path: Path, dtype):
    from ember.io import open_gguf
    from ember.quant import QTensor

    f = open_gguf(path)
    from ember.models.llama import LlamaForCausalLM

    # GGUF tensor names and conventions are mapped for the llama family only (asked first, so
    # an unsupported architecture says so rather than which of its keys we cannot read)
    arch = f.metadata.get("general.architecture")
    if isinstance(arch, str) and arch:
        model_type = _GGUF_MODEL_TYPES.get(arch, arch)
        if _model_class(model_type) is not LlamaForCausalLM:
            raise UnsupportedError(
                f"{path.name}: GGUF files of architecture {model_type!r} are not supported yet "
                "(llama-family ones are); load the model's Hugging Face folder instead"
            )
    cfg = config_from_gguf(f.metadata, set(f.tensors))
    model = _build(cfg)
    expected = dict(model.named_parameters(remove_duplicate=False))
    tied = cfg["tie_word_embeddings"]
    weights = {}
    for name, info in f.tensors.items():
        try:
            hf = gguf_to_hf_name(name)
        except UnsupportedError:
            hf = None
        if hf not in expected:
            raise FormatError(
                f"{path}: tensor {name!r} has no place in a {cfg['model_type']} model of "
                f"{cfg['num_hidden_layers']} blocks (llama.cpp refuses extra tensors too)"
            )
        weights[hf] = QTensor(info.data, info.qtype, info.shape) if info.is_quantized else info.data
    missing = [n for n in expected if n not in weights and not (tied and n == "lm_head.weight")]
    if missing:
        shown = ", ".join(repr(hf_to_gguf_name(n)) for n in missing[:5])
        raise FormatError(
            f"{path}: the file has no tensor {shown}"
            + (f" ({len(missing)} missing in all)" if len(missing) > 5 else "")
        )
    assign_weights(model, weights, dtype, optional=("lm_head.weight",) if tied else ())
    if tied:
        model.tie_weights()
    model.source = str(path)
    model.gguf_metadata = f.metadata
    return model


def _from_hf_dir(path: Path, dtype):
    from ember.io import load_safetensors, load_safetensors_dir

    try:
        cfg = json.loads((path / "config.json").read_text())
    except (ValueError, RecursionError) as e:  # bad JSON or UTF-8
        raise FormatError(f"{path / 'config.json'}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise FormatError(f"{path / 'config.json'}: expected a JSON object")
    if (path / "model.safetensors.index.json").is_file() or not (
        path / "model.safetensors"
    ).is_file():
        weights = load_safetensors_dir(path)
    else:
        weights = load_safetensors(path / "model.safetensors")
    layers = cfg.get("num_hidden_layers")
    if type(layers) is int and layers > len(weights):  # checked before building that many
        raise FormatError(
            f"{path / 'config.json'}: num_hidden_layers is {layers} but the checkpoint holds "
            f"only {len(weights)} tensors"
        )
    model = _build(cfg)
    if hasattr(model, "checkpoint_weights"):  # a family whose files name tensors differently
        weights = model.checkpoint_weights(weights)
    tied = model.config.tie_word_embeddings and "lm_head.weight" not in weights
    assign_weights(model, weights, dtype, optional=("lm_head.weight",) if tied else ())
    if tied:  # the family knows where its embeddings live
        model.tie_weights()
    model.source = str(path)
    return model
