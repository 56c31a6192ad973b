"""Gemma and Gemma 2: LLaMA-shaped decoders with Google's twists.

Both scale the token embeddings by sqrt(hidden_size), store RMSNorm weights as an offset from one
(the norm multiplies by ``1 + weight``), use a GeGLU feed-forward (gelu, tanh approximation) and
take ``head_dim`` from the config (it need not be hidden_size / heads). Gemma 2 adds:

- a norm after attention and a pair around the feed-forward ("sandwich" norms),
- queries scaled by ``query_pre_attn_scalar ** -0.5`` instead of ``head_dim ** -0.5``,
- attention logits soft-capped, ``cap * tanh(scores / cap)``, before the softmax,
- final logits soft-capped the same way,
- layers that alternate between a sliding window (``layer_types``: ``sliding_attention``) and
  global attention (``full_attention``).

The KV cache keeps every position for every layer; sliding layers mask what falls out of their
window, which gives the same numbers as a rolling window cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import ember
from ember.errors import UnsupportedError
from ember.models.llama import (
    DecoderForCausalLM,
    DecoderSpec,
    OffsetRMSNorm,
    check_heads,
    config_from_dict,
    nested_rope,
)
from ember.ops.rope import rope_inv_freq

_TANH_GELU = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")


@dataclass
class GemmaConfig:
    """Hyper-parameters of Gemma / Gemma 2, with Hugging Face's field names."""

    vocab_size: int = 256000
    hidden_size: int = 3072
    intermediate_size: int = 24576
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str | None = "gelu_pytorch_tanh"
    hidden_activation: str | None = None
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    attention_bias: bool = False
    tie_word_embeddings: bool = True
    query_pre_attn_scalar: float | None = None
    sliding_window: int | None = None
    layer_types: list | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    pad_token_id: int | None = None
    model_type: str = "gemma"
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.query_pre_attn_scalar is None:
            self.query_pre_attn_scalar = self.head_dim
        if self.layer_types is None:
            sliding = self.model_type == "gemma2" and self.sliding_window is not None
            self.layer_types = [
                "sliding_attention" if sliding and i % 2 == 0 else "full_attention"
                for i in range(self.num_hidden_layers)
            ]
        if len(self.layer_types) != self.num_hidden_layers:
            raise ember.errors.ShapeError(
                f"layer_types lists {len(self.layer_types)} layers, the model has "
                f"{self.num_hidden_layers}"
            )
        unknown = set(self.layer_types) - {"sliding_attention", "full_attention"}
        if unknown:
            raise UnsupportedError(f"Gemma layer_types {sorted(unknown)} are not supported")
        check_heads(self.num_attention_heads, self.num_key_value_heads)
        act = self.activation
        if act not in _TANH_GELU and act != "gelu":
            raise UnsupportedError(f"Gemma activation {act!r} is not supported ({_TANH_GELU})")

    @property
    def activation(self) -> str:
        """The feed-forward activation; Gemma 1's legacy "gelu" means the tanh approximation."""
        act = self.hidden_activation or self.hidden_act or "gelu_pytorch_tanh"
        if self.model_type == "gemma" and act == "gelu":
            return "gelu_pytorch_tanh"  # as transformers: released configs say gelu, mean tanh
        return act

    @property
    def sandwich_norms(self) -> bool:
        """Gemma 2 normalises attention and feed-forward outputs too."""
        return self.model_type == "gemma2"

    @classmethod
    def from_dict(cls, d: dict) -> GemmaConfig:
        """Build from a config.json dict; model_type gemma2 gets Gemma 2's defaults."""
        d = dict(d)
        mt = d.get("model_type", "gemma")
        if mt not in ("gemma", "gemma2"):
            raise UnsupportedError(f"GemmaConfig: model_type {mt!r} (gemma, gemma2 are)")
        if d.get("use_bidirectional_attention"):
            raise UnsupportedError("Gemma with use_bidirectional_attention=True is not a causal LM")
        if mt == "gemma2":  # transformers' class defaults, for config.json files that omit them
            d.setdefault("query_pre_attn_scalar", 256)
            d.setdefault("sliding_window", 4096)
            d.setdefault("attn_logit_softcapping", 50.0)
            d.setdefault("final_logit_softcapping", 30.0)
        else:
            d["sliding_window"] = None  # Gemma 1 attends globally everywhere
        nested_rope(d)
        return config_from_dict(cls, d)

    def decoder_spec(self) -> DecoderSpec:
        """The decoder's flags: offset RMSNorm, GeGLU, scaled embeddings, Gemma 2's extras."""
        return DecoderSpec(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_layers=self.num_hidden_layers,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            norm_eps=self.rms_norm_eps,
            norm_offset=True,
            sandwich_norms=self.sandwich_norms,
            activation="gelu_tanh" if self.activation in _TANH_GELU else "gelu",
            qkv_bias=self.attention_bias,
            o_bias=self.attention_bias,
            query_scale=self.query_pre_attn_scalar**-0.5,
            attn_softcap=self.attn_logit_softcapping,
            sliding_window=self.sliding_window,
            sliding_layers=tuple(lt == "sliding_attention" for lt in self.layer_types),
            rope_inv_freq=rope_inv_freq(self.head_dim, self.rope_theta, self.rope_scaling),
            embed_scale=math.sqrt(self.hidden_size),
            final_softcap=self.final_logit_softcapping,
            tie_word_embeddings=self.tie_word_embeddings,
        )


GemmaRMSNorm = OffsetRMSNorm  # x / rms(x) * (1 + weight)


class GemmaForCausalLM(DecoderForCausalLM):
    """A Gemma or Gemma 2 decoder with its (usually tied) language-model head."""

    config_class = GemmaConfig
