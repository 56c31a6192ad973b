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
from dataclasses import dataclass, field, fields

import numpy as np

import ember
from ember import nn
from ember.errors import UnsupportedError
from ember.models.llama import causal_mask, positions, token_ids
from ember.nn import functional as F
from ember.ops.rope import apply_rotary, rope_inv_freq, rope_tables

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
        if self.num_attention_heads % self.num_key_value_heads:
            raise ember.errors.ShapeError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
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
        if isinstance(d.get("rope_parameters"), dict):  # transformers >= 5 nests rope settings
            rp = d["rope_parameters"]
            d.setdefault("rope_theta", rp.get("rope_theta", 10000.0))
            if rp.get("rope_type", "default") != "default":
                d.setdefault("rope_scaling", rp)
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in d.items() if k in names}
        known["extra"] = {k: v for k, v in d.items() if k not in names}
        return cls(**known)


class GemmaRMSNorm(nn.Module):
    """RMSNorm whose weight is stored as an offset from one: x / rms(x) * (1 + weight)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(ember.zeros(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), None, self.eps) * (1.0 + self.weight)

    def extra_repr(self) -> str:
        """Shape and eps."""
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


def softcapped_attention(q, k, v, mask, scale: float, softcap: float):
    """softmax(cap * tanh(q k^T * scale / cap) + mask) v, with key/value heads shared by groups."""
    if k.dtype != q.dtype:  # the KV cache may hold another dtype than the weights
        k, v = k.to(q.dtype), v.to(q.dtype)
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = ember.tanh((q @ k.transpose(-1, -2)) * (scale / softcap)) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    return F.softmax(scores, dim=-1) @ v


class GemmaAttention(nn.Module):
    """Grouped-query attention with rotary positions, optional window and logit soft-capping."""

    def __init__(self, cfg: GemmaConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = hd = cfg.head_dim
        self.scaling = cfg.query_pre_attn_scalar**-0.5
        self.softcap = cfg.attn_logit_softcapping
        self.sliding = cfg.layer_types[layer_idx] == "sliding_attention"
        h, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(h, self.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * hd, h, bias=bias)

    def forward(self, x, cos, sin, mask, cache=None):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)
        if self.softcap is None:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=self.scaling, enable_gqa=True
            )
        else:
            out = softcapped_attention(q, k, v, mask, self.scaling, self.softcap)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))


class GemmaMLP(nn.Module):
    """GeGLU feed-forward: down(gelu(gate(x)) * up(x))."""

    def __init__(self, cfg: GemmaConfig) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.approximate = "tanh" if cfg.activation in _TANH_GELU else "none"

    def forward(self, x):
        g = F.gelu(self.gate_proj(x), approximate=self.approximate)
        return self.down_proj(g * self.up_proj(x))


class GemmaDecoderLayer(nn.Module):
    """Pre-norm block; Gemma 2 also normalises each sub-block's output before the residual add."""

    def __init__(self, cfg: GemmaConfig, layer_idx: int) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = GemmaAttention(cfg, layer_idx)
        self.mlp = GemmaMLP(cfg)
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.sandwich = cfg.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
            self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(self, x, cos, sin, mask, cache=None):
        a = self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        if not self.sandwich:  # Gemma: x + attn(norm(x)), then x + mlp(norm(x))
            x = x + a
            return x + self.mlp(self.post_attention_layernorm(x))
        x = x + self.post_attention_layernorm(a)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class GemmaModel(nn.Module):
    """Embeddings, the decoder stack and the final norm."""

    def __init__(self, cfg: GemmaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            [GemmaDecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers)]
        )
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class GemmaForCausalLM(nn.Module):
    """A Gemma or Gemma 2 decoder with its (usually tied) language-model head."""

    config_class = GemmaConfig

    def __init__(self, config: GemmaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = GemmaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        self._embed_scale = math.sqrt(config.hidden_size)

    def forward(
        self, input_ids, attention_mask=None, position_ids=None, cache=None, logits_to_keep: int = 0
    ):
        """Logits (batch, seq, vocab); with logits_to_keep=n only for the last n positions."""
        ids = token_ids(input_ids)
        b, t = ids.shape
        past = cache.pos if cache is not None else 0
        pad, pos = positions(ids, past, attention_mask, position_ids)
        cos, sin = rope_tables(self._inv_freq, pos[:, None, :], np.float32, device=ids._device)
        full = causal_mask(t, past, pad, None, ids._device)
        window = self.config.sliding_window
        local = (
            causal_mask(t, past, pad, window, ids._device)
            if "sliding_attention" in self.config.layer_types
            else None
        )
        x = self.model.embed_tokens(ids)
        # the scale is rounded to the embedding dtype first, as transformers does (bf16: 55.5)
        x = x * ember.tensor(self._embed_scale, dtype=x.dtype, device=x.device)
        for layer in self.model.layers:
            x = layer(x, cos, sin, local if layer.self_attn.sliding else full, cache)
        if cache is not None:
            cache.advance(t)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        logits = self.lm_head(self.model.norm(x))
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = ember.tanh(logits / cap) * cap
        return logits

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads per layer (the KV cache's second dim)."""
        return self.config.num_key_value_heads
