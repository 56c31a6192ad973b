"""Phi-3 (and Phi-3.5 / Phi-4-mini, which share ``model_type: phi3``).

A LLaMA-shaped decoder whose checkpoints fuse projections: ``qkv_proj`` holds the query, key and
value rows one after the other, ``gate_up_proj`` the gate and up rows of the SwiGLU. Rotary
positions may cover only the first ``partial_rotary_factor`` of each head (Phi-4-mini: 0.75).

Long-context checkpoints (Phi-3-*-128k) use "longrope" scaling: two sets of per-frequency factors,
``short_factor`` while the sequence fits the pre-training length
(``original_max_position_embeddings``) and ``long_factor`` beyond it, with cos/sin scaled by
``sqrt(1 + ln(factor) / ln(original_max))``. As in transformers, a forward picks the set from the
largest position it sees, and the step that first crosses the boundary recomputes the keys and
values of the whole sequence with the long factors (the model keeps the token ids it has fed into
each cache for that).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ember.errors import UnsupportedError
from ember.models.llama import (
    DecoderForCausalLM,
    DecoderSpec,
    check_heads,
    config_from_dict,
    nested_rope,
)
from ember.ops.rope import rope_inv_freq


@dataclass
class Phi3Config:
    """Hyper-parameters, with Hugging Face's field names."""

    vocab_size: int = 32064
    hidden_size: int = 3072
    intermediate_size: int = 8192
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 4096
    original_max_position_embeddings: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    partial_rotary_factor: float = 1.0
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    pad_token_id: int | None = None
    model_type: str = "phi3"
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.original_max_position_embeddings is None:
            self.original_max_position_embeddings = self.max_position_embeddings
        check_heads(self.num_attention_heads, self.num_key_value_heads)
        if self.hidden_act != "silu":
            raise UnsupportedError(f"Phi-3 hidden_act {self.hidden_act!r} is not supported (silu)")

    @property
    def rotary_dim(self) -> int:
        """Leading features of each head that rotate; the rest pass through."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def rope_type(self) -> str:
        """'default', 'longrope', or another type rope_inv_freq knows (linear, llama3)."""
        kind = (self.rope_scaling or {}).get("rope_type", (self.rope_scaling or {}).get("type"))
        kind = kind or "default"
        return "longrope" if kind in ("su", "yarn") else kind  # transformers' Phi-3 aliases

    @classmethod
    def from_dict(cls, d: dict) -> Phi3Config:
        """Build from a config.json dict (transformers 4 or 5 layout)."""
        d = dict(d)
        nested_rope(d)
        if d.get("partial_rotary_factor") is None:
            d.pop("partial_rotary_factor", None)
        return config_from_dict(cls, d)

    def decoder_spec(self) -> DecoderSpec:
        """The decoder's flags: fused q/k/v and gate/up projections, (partial) rotary, longrope."""
        spec = DecoderSpec(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_layers=self.num_hidden_layers,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            norm_eps=self.rms_norm_eps,
            fused_qkv=True,
            fused_gate_up=True,
            sliding_window=self.sliding_window,
            tie_word_embeddings=self.tie_word_embeddings,
        )
        if self.rope_type == "longrope":
            short, long, factor = longrope_tables(self)
            spec.rope_inv_freq, spec.rope_long_inv_freq = short, long
            spec.rope_long_after = self.original_max_position_embeddings
            spec.rope_attention_factor = factor
        else:
            spec.rope_inv_freq = rope_inv_freq(
                self.head_dim, self.rope_theta, self.rope_scaling, self.rotary_dim
            )
        return spec


def longrope_tables(cfg: Phi3Config) -> tuple[np.ndarray, np.ndarray, float]:
    """(short inv_freq, long inv_freq, cos/sin factor) of longrope scaling."""
    rs, rd = cfg.rope_scaling, cfg.rotary_dim
    for key in ("short_factor", "long_factor"):
        if len(rs.get(key) or ()) != rd // 2:
            raise UnsupportedError(
                f"longrope {key} must list {rd // 2} factors (rotary dim {rd} / 2), "
                f"got {len(rs.get(key) or ())}"
            )
    base = cfg.rope_theta ** (np.arange(0, rd, 2, dtype=np.float64) / rd)
    short = 1.0 / (np.asarray(rs["short_factor"], np.float64) * base)
    long = 1.0 / (np.asarray(rs["long_factor"], np.float64) * base)
    orig = cfg.original_max_position_embeddings
    factor = rs.get("factor") or cfg.max_position_embeddings / orig
    attn = rs.get("attention_factor")
    if attn is None:
        attn = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    return short, long, float(attn)


class Phi3ForCausalLM(DecoderForCausalLM):
    """A Phi-3 decoder with its language-model head."""

    config_class = Phi3Config
