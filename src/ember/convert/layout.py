"""What differs between a GGUF file and a Hugging Face folder of the same llama-family model.

Tensor names (llama.cpp's `blk.N.attn_q` vs `model.layers.N.self_attn.q_proj`), the row order of
the query and key projections, and the architecture names. llama.cpp's converter permutes the
rows of each q/k head from Hugging Face's half-split rotary layout (rotate dims i and i + d/2)
to adjacent pairs (rotate 2i and 2i + 1) for the architectures whose GGUF graph uses that
"normal" RoPE; ember's GGUF loader keeps those rows and rotates adjacent pairs
(`rope_interleaved`), so converting either way has to apply or undo that permutation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.errors import ShapeError, UnsupportedError
from ember.models.auto import _GGUF_BLOCK, _GGUF_TOP, _INTERLEAVED_ROPE


@dataclass(frozen=True)
class Family:
    """One supported architecture: its names on both sides and whether q/k are permuted."""

    model_type: str  # config.json model_type
    hf_class: str  # config.json architectures[0]
    gguf_arch: str  # general.architecture
    permuted_qk: bool  # GGUF q/k rows in adjacent-pair order


# config.json model_type -> family; llama.cpp writes Mistral and SmolLM as 'llama'.
FAMILIES = {
    "llama": Family("llama", "LlamaForCausalLM", "llama", True),
    "mistral": Family("mistral", "MistralForCausalLM", "llama", True),
    "smollm": Family("llama", "LlamaForCausalLM", "llama", True),
    "qwen2": Family("qwen2", "Qwen2ForCausalLM", "qwen2", False),
    "qwen3": Family("qwen3", "Qwen3ForCausalLM", "qwen3", False),
}
# general.architecture -> family
GGUF_FAMILIES = {
    "llama": FAMILIES["llama"],
    "mistral": FAMILIES["mistral"],
    "qwen2": FAMILIES["qwen2"],
    "qwen3": FAMILIES["qwen3"],
}
assert all(f.permuted_qk == (a in _INTERLEAVED_ROPE) for a, f in GGUF_FAMILIES.items())

_HF_BLOCK = {hf: gg for gg, hf in _GGUF_BLOCK.items()}
_HF_TOP = {hf: gg for gg, hf in _GGUF_TOP.items()}
# Hugging Face checkpoint entries that are buffers, not weights (llama.cpp's converter drops them)
_HF_SKIP = ("rotary_emb.inv_freq",)


def family_of_model_type(model_type: str | None) -> Family:
    """The family of a config.json model_type, or UnsupportedError naming the ones supported."""
    fam = FAMILIES.get(model_type or "")
    if fam is None:
        raise UnsupportedError(
            f"model_type {model_type!r} cannot be converted to GGUF; supported: "
            f"{', '.join(sorted(FAMILIES))}"
        )
    return fam


def family_of_gguf(arch: str | None) -> Family:
    """The family of a GGUF general.architecture, or UnsupportedError."""
    fam = GGUF_FAMILIES.get(arch or "")
    if fam is None:
        raise UnsupportedError(
            f"GGUF architecture {arch!r} cannot be converted to a Hugging Face folder; "
            f"supported: {', '.join(sorted(GGUF_FAMILIES))}"
        )
    return fam


def hf_to_gguf_name(name: str) -> str | None:
    """'model.layers.3.self_attn.q_proj.weight' -> 'blk.3.attn_q.weight'; None for buffers."""
    if name.endswith(_HF_SKIP):
        return None
    parts = name.split(".")
    if parts[:2] == ["model", "layers"] and len(parts) >= 5 and parts[2].isdigit():
        for hf, gg in _HF_BLOCK.items():
            n = hf.count(".") + 1
            if ".".join(parts[3 : 3 + n]) == hf and len(parts) > 3 + n:
                return f"blk.{parts[2]}.{gg}.{'.'.join(parts[3 + n :])}"
    else:
        for hf, gg in _HF_TOP.items():
            n = hf.count(".") + 1
            if ".".join(parts[:n]) == hf and len(parts) > n:
                return f"{gg}.{'.'.join(parts[n:])}"
    raise UnsupportedError(f"tensor {name!r} has no llama.cpp name (not a llama-family weight)")


def is_qk(gguf_name: str) -> bool:
    """Whether a GGUF tensor is a query or key projection (weight or bias)."""
    parts = gguf_name.split(".")
    return len(parts) == 4 and parts[0] == "blk" and parts[2] in ("attn_q", "attn_k")


def _heads(w: np.ndarray, head_dim: int, name: str) -> int:
    rows = w.shape[0]
    if head_dim <= 0 or head_dim % 2 or rows % head_dim:
        raise ShapeError(
            f"{name}: {rows} rows are not whole heads of head_dim {head_dim} (even, > 0)"
        )
    return rows // head_dim


def to_adjacent_pairs(w: np.ndarray, head_dim: int, name: str = "q/k") -> np.ndarray:
    """Hugging Face q/k rows -> llama.cpp's: in each head, rows (i, i + d/2) become (2i, 2i + 1)."""
    h = _heads(w, head_dim, name)
    return np.ascontiguousarray(
        w.reshape(h, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def to_half_split(w: np.ndarray, head_dim: int, name: str = "q/k") -> np.ndarray:
    """llama.cpp q/k rows -> Hugging Face's (the inverse of `to_adjacent_pairs`)."""
    h = _heads(w, head_dim, name)
    return np.ascontiguousarray(
        w.reshape(h, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )
