"""A Hugging Face folder (or a safetensors file) -> a GGUF file that llama.cpp and ember load.

The GGUF gets what llama.cpp's own converter writes for the llama family: the architecture's
hyper-parameters under `<arch>.*`, llama.cpp's tensor names, q/k rows permuted to adjacent pairs
where the architecture's graph expects them, and the vocabulary (see `ember.convert.vocab`).
`--quantize` follows llama.cpp's rules: 1-D tensors (norms, biases) stay F32, and a matrix whose
rows do not split into whole blocks stays float; the report names each one and why.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ember.convert.layout import family_of_model_type, hf_to_gguf_name, is_qk, to_adjacent_pairs
from ember.errors import FormatError, UnsupportedError

GGUF_META_KEY = "gguf.metadata"  # safetensors metadata entry carrying GGUF metadata as JSON
FLOAT_TYPES = ("F32", "F16", "BF16")
# llama.cpp's general.file_type (llama_ftype) for a file whose matrices are all of one type
_FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9,
              "Q4_K": 14, "Q6_K": 18, "BF16": 32}  # fmt: skip
_NP_FLOAT = {"F32": np.float32, "F16": np.float16}
# the tensors every llama-family block has in llama.cpp's graph
_BLOCK_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                  "ffn_gate", "ffn_up", "ffn_down")  # fmt: skip


@dataclass
class QuantizeReport:
    """Which tensors got which GGUF type, and why the ones left in float were."""

    qtype: str | None
    types: dict[str, str] = field(default_factory=dict)  # name -> ggml type written
    kept: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # why -> names
    skipped: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # why -> names

    def lines(self) -> list[str]:
        """Human-readable summary: counts per type, then each kept-in-float group with its reason."""
        counts: dict[str, int] = defaultdict(int)
        for t in self.types.values():
            counts[t] += 1
        out = ["tensor types: " + ", ".join(f"{t} x{n}" for t, n in sorted(counts.items()))]
        if self.qtype and self.qtype not in FLOAT_TYPES:
            for why, names in self.kept.items():
                out.append(f"kept in float, {why} ({len(names)}): {_collapse(names)}")
        for why, names in self.skipped.items():
            out.append(f"not written, {why} ({len(names)}): {_collapse(names)}")
        return out


def _collapse(names: list[str]) -> str:
    """'blk.0.attn_norm.weight', 'blk.1.attn_norm.weight' -> 'blk.*.attn_norm.weight'."""
    groups: dict[str, int] = {}
    for n in names:
        key = re.sub(r"(^|\.)(\d+)(\.|$)", r"\1*\3", n)
        groups[key] = groups.get(key, 0) + 1
    return ", ".join(k if c == 1 or "*" not in k else f"{k} ({c})" for k, c in groups.items())


def parse_qtype(quantize: str | None) -> str | None:
    """'q4_k' -> 'Q4_K'; UnsupportedError listing the types when it is not one."""
    from ember.quant import QUANTIZE_TYPES

    if quantize is None:
        return None
    qt = quantize.upper()
    if qt not in QUANTIZE_TYPES:
        raise UnsupportedError(
            f"--quantize {quantize}: supported types are {', '.join(QUANTIZE_TYPES).lower()}"
        )
    return qt


def encode_tensor(
    name: str, a: np.ndarray, qtype: str | None, float_type: str | None, report: QuantizeReport
) -> Any:
    """One tensor as save_gguf takes it, following llama.cpp's rules on what stays float."""
    from ember.quant import block_format, quantize_array

    if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
        report.types[name] = str(a.dtype)
        if qtype:
            report.kept[f"{a.dtype} values are not quantized"].append(name)
        return np.ascontiguousarray(a)
    if a.ndim < 2:
        report.types[name] = "F32"
        if qtype:
            report.kept["1-D (norms, biases): kept F32, as llama.cpp does"].append(name)
        return np.ascontiguousarray(a, dtype=np.float32)
    target = qtype or float_type
    if target is None:  # keep f32/f16; bf16 is widened (every reader has f32)
        target = "F16" if a.dtype == np.float16 else "F32"
    if target not in FLOAT_TYPES:
        block = block_format(target).block_size
        if a.shape[-1] % block:
            report.kept[
                f"rows of {a.shape[-1]} values do not split into {target} blocks of {block}"
            ].append(name)
            target = "F32"
        else:
            report.types[name] = target
            return (quantize_array(np.asarray(a, np.float32), target), target, a.shape)
    report.types[name] = target
    if target == "BF16":
        return (quantize_array(np.asarray(a, np.float32), "BF16"), "BF16", a.shape)
    return np.ascontiguousarray(a, dtype=_NP_FLOAT[target])


def _read_config(folder: Path) -> dict:
    path = folder / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FormatError(f"{folder}: no config.json (a Hugging Face folder needs one)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise FormatError(f"{path}: expected a JSON object")
    return cfg


def gguf_metadata_of_config(cfg: dict, name: str) -> tuple[dict[str, Any], Any, Any]:
    """(architecture metadata, family, LlamaConfig) of a config.json, or UnsupportedError."""
    from ember.models.llama import LlamaConfig

    fam = family_of_model_type(cfg.get("model_type"))
    try:
        c = LlamaConfig.from_dict(cfg)
    except (TypeError, ValueError, KeyError) as e:
        raise FormatError(f"config.json: {e}") from None
    if c.hidden_act not in ("silu", "swish"):
        raise UnsupportedError(
            f"hidden_act {c.hidden_act!r}: llama.cpp's {fam.gguf_arch} uses silu"
        )
    if c.mlp_bias:
        raise UnsupportedError("mlp_bias: llama.cpp's llama graph has no MLP biases")
    a = fam.gguf_arch
    meta: dict[str, Any] = {
        "general.architecture": a,
        "general.type": "model",
        "general.name": name,
        f"{a}.vocab_size": int(c.vocab_size),
        f"{a}.context_length": int(c.max_position_embeddings),
        f"{a}.embedding_length": int(c.hidden_size),
        f"{a}.block_count": int(c.num_hidden_layers),
        f"{a}.feed_forward_length": int(c.intermediate_size),
        f"{a}.attention.head_count": int(c.num_attention_heads),
        f"{a}.attention.head_count_kv": int(c.num_key_value_heads),
        f"{a}.attention.key_length": int(c.head_dim),
        f"{a}.attention.value_length": int(c.head_dim),
        f"{a}.rope.dimension_count": int(c.head_dim),
        f"{a}.rope.freq_base": float(c.rope_theta),
        f"{a}.attention.layer_norm_rms_epsilon": float(c.rms_norm_eps),
    }
    scaling = c.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        meta[f"{a}.rope.scaling.type"] = "linear"
        meta[f"{a}.rope.scaling.factor"] = float(scaling["factor"])
    elif kind != "default":
        raise UnsupportedError(f"rope scaling {kind!r} is not written to GGUF (linear is)")
    return meta, fam, c


def _open_weights(src: Path):
    from ember.io import open_safetensors, open_safetensors_index
    from ember.io.safetensors import INDEX_NAME

    if src.is_file():
        return open_safetensors(src)
    if (src / INDEX_NAME).is_file():
        return open_safetensors_index(src / INDEX_NAME)
    files = [src / "model.safetensors"] if (src / "model.safetensors").is_file() else []
    files = files or sorted(src.glob("*.safetensors"))
    if len(files) != 1:
        found = ", ".join(f.name for f in files) or "none"
        raise FormatError(
            f"{src}: expected {INDEX_NAME} or exactly one .safetensors file, found {found}"
        )
    return open_safetensors(files[0])


def hf_to_gguf(
    src: Path, dst: Path, quantize: str | None = None, dtype: str | None = None
) -> QuantizeReport:
    """Convert a Hugging Face folder, or a safetensors file, to GGUF; returns what was written.

    A safetensors file written by `ember convert X.gguf Y.safetensors` (GGUF names, GGUF
    metadata kept in its header) goes back unchanged; any other needs config.json and
    tokenizer.json beside it.
    """
    from ember.cli._progress import progress
    from ember.convert.vocab import gguf_tokenizer_metadata
    from ember.io import save_gguf

    qtype = parse_qtype(quantize)
    float_type = _float_type(dtype)
    weights = _open_weights(src)
    report = QuantizeReport(qtype)
    folder = src if src.is_dir() else src.parent
    raw_meta = (getattr(weights, "metadata", None) or {}).get(GGUF_META_KEY)
    tensors: dict[str, Any] = {}
    if raw_meta is not None:  # GGUF names and layout already: copy, (re)quantizing
        blob = json.loads(raw_meta)
        meta, types = blob["metadata"], blob["types"]
        for name in progress(weights.keys(), len(weights.keys()), "convert", "tensor"):
            tensors[name] = encode_tensor(
                name, np.asarray(weights.get(name)), qtype, float_type, report
            )
    else:
        cfg = _read_config(folder)
        meta, fam, c = gguf_metadata_of_config(cfg, folder.name)
        types = {}
        if c.rope_interleaved and not fam.permuted_qk:
            raise UnsupportedError(
                f"{cfg.get('model_type')}: q/k rows in adjacent-pair order (rope_interleaved) "
                f"have no GGUF form for {fam.gguf_arch}"
            )
        permute = fam.permuted_qk and not c.rope_interleaved  # an old ember export: rows as GGUF's
        names = list(weights.keys())
        if "model.embed_tokens.weight" not in names:
            raise FormatError(f"{src}: the checkpoint lacks model.embed_tokens.weight")
        rows = np.shape(weights.get("model.embed_tokens.weight"))[0]
        if rows != c.vocab_size:
            raise FormatError(
                f"{src}: model.embed_tokens.weight has {rows} rows, config.json vocab_size is "
                f"{c.vocab_size}"
            )
        meta.update(gguf_tokenizer_metadata(folder, int(c.vocab_size)))
        for hf in progress(names, len(names), "convert", "tensor"):
            name = hf_to_gguf_name(hf)
            if name is None:
                report.skipped["a buffer, not a weight"].append(hf)
                continue
            if name == "output.weight" and c.tie_word_embeddings:
                report.skipped["tied to the embeddings (llama.cpp reuses token_embd)"].append(hf)
                continue
            a = np.asarray(weights.get(hf))
            if permute and is_qk(name):
                a = to_adjacent_pairs(a, int(c.head_dim), hf)
            tensors[name] = encode_tensor(name, a, qtype, float_type, report)
        _check_complete(set(tensors), int(c.num_hidden_layers), c.tie_word_embeddings, src)
    _set_file_type(meta, types, qtype or float_type)
    save_gguf(dst, meta, tensors, metadata_types=types)
    return report


def requantize_gguf(
    src: Path, dst: Path, quantize: str | None = None, dtype: str | None = None
) -> QuantizeReport:
    """GGUF -> GGUF of another type (llama-quantize's job): metadata kept, tensors re-encoded."""
    from ember.cli._progress import progress
    from ember.io import open_gguf, save_gguf
    from ember.quant import dequantize

    qtype, float_type = parse_qtype(quantize), _float_type(dtype)
    if qtype is None and float_type is None:
        raise UnsupportedError("GGUF -> GGUF re-encodes the tensors: give --quantize or --dtype")
    f = open_gguf(src)
    report = QuantizeReport(qtype)
    tensors: dict[str, Any] = {}
    for name, info in progress(f.tensors.items(), len(f.tensors), "quantize", "tensor"):
        a = (
            dequantize(info.data, info.qtype, info.shape)
            if info.is_quantized
            else np.asarray(info.data)
        )
        tensors[name] = encode_tensor(name, a, qtype, float_type, report)
    meta, types = dict(f.metadata), dict(f.metadata_types)
    _set_file_type(meta, types, qtype or float_type)
    save_gguf(dst, meta, tensors, metadata_types=types)
    return report


def _set_file_type(meta: dict, types: dict, qtype: str | None) -> None:
    """general.file_type (and quantization_version) as llama.cpp writes them."""
    qtype = qtype or "F32"
    meta["general.file_type"] = _FILE_TYPE.get(qtype, 0)
    types["general.file_type"] = "UINT32"
    if qtype not in FLOAT_TYPES:
        meta["general.quantization_version"] = 2
        types["general.quantization_version"] = "UINT32"
    else:
        meta.pop("general.quantization_version", None)


def _float_type(dtype: str | None) -> str | None:
    if dtype is None:
        return None
    from ember.dtypes import get_dtype

    name = get_dtype(dtype).name
    ggml = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}.get(name)
    if ggml is None:
        raise UnsupportedError(f"--dtype {dtype}: a GGUF holds float32, float16 or bfloat16")
    return ggml


def _check_complete(names: set[str], layers: int, tied: bool, src: Path) -> None:
    need = ["token_embd.weight", "output_norm.weight"] + ([] if tied else ["output.weight"])
    need += [f"blk.{i}.{t}.weight" for i in range(layers) for t in _BLOCK_TENSORS]
    missing = [n for n in need if n not in names]
    if missing:
        from ember.models.auto import gguf_to_hf_name

        shown = ", ".join(gguf_to_hf_name(n) for n in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise FormatError(f"{src}: the checkpoint lacks {shown}{more}")
