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
import weakref
from dataclasses import dataclass, field, fields

import numpy as np

import ember
from ember import nn
from ember.errors import UnsupportedError
from ember.models.llama import causal_mask, positions, token_ids
from ember.nn import functional as F
from ember.ops.rope import apply_rotary, rope_inv_freq, rope_tables


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
        if self.num_attention_heads % self.num_key_value_heads:
            raise ember.errors.ShapeError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
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
        if isinstance(d.get("rope_parameters"), dict):  # transformers >= 5 nests rope settings
            rp = d["rope_parameters"]
            d.setdefault("rope_theta", rp.get("rope_theta", 10000.0))
            if "partial_rotary_factor" in rp:
                d.setdefault("partial_rotary_factor", rp["partial_rotary_factor"])
            if rp.get("rope_type", rp.get("type", "default")) != "default":
                d.setdefault("rope_scaling", rp)
        if d.get("partial_rotary_factor") is None:
            d.pop("partial_rotary_factor", None)
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in d.items() if k in names}
        known["extra"] = {k: v for k, v in d.items() if k not in names}
        return cls(**known)


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


class Phi3Attention(nn.Module):
    """Grouped-query attention from one fused q/k/v projection, with (partial) rotary positions."""

    def __init__(self, cfg: Phi3Config, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = hd = cfg.head_dim
        self.q_size, self.kv_size = self.num_heads * hd, self.num_kv_heads * hd
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask, cache=None):
        b, t, _ = x.shape
        qkv = self.qkv_proj(x)
        qs, ks = self.q_size, self.kv_size
        q = qkv[..., :qs].reshape(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = qkv[..., qs : qs + ks].reshape(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = qkv[..., qs + ks :].reshape(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, qs))


class Phi3MLP(nn.Module):
    """SwiGLU from one fused projection: down(up * silu(gate)), [gate | up] = gate_up(x)."""

    def __init__(self, cfg: Phi3Config) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_up_proj = nn.Linear(h, 2 * i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(up * F.silu(gate))


class Phi3DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: Phi3Config, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Phi3Attention(cfg, layer_idx)
        self.mlp = Phi3MLP(cfg)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Phi3Model(nn.Module):
    """Embeddings, the decoder stack and the final norm."""

    def __init__(self, cfg: Phi3Config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            [Phi3DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers)]
        )
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class Phi3ForCausalLM(nn.Module):
    """A Phi-3 decoder with its language-model head."""

    config_class = Phi3Config

    def __init__(self, config: Phi3Config) -> None:
        super().__init__()
        self.config = config
        self._long_inv_freq = None  # rope tables first: a bad config fails before any allocation
        self._attn_factor = 1.0
        if config.rope_type == "longrope":
            self._inv_freq, self._long_inv_freq, self._attn_factor = longrope_tables(config)
            self._ids_fed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        else:
            self._inv_freq = rope_inv_freq(
                config.head_dim, config.rope_theta, config.rope_scaling, config.rotary_dim
            )
        self.model = Phi3Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self, input_ids, attention_mask=None, position_ids=None, cache=None, logits_to_keep: int = 0
    ):
        """Logits (batch, seq, vocab); with logits_to_keep=n only for the last n positions."""
        ids = token_ids(input_ids)
        b, t = ids.shape
        past = cache.pos if cache is not None else 0
        if cache is not None and self._long_inv_freq is not None:
            ids = self._longrope_ids(ids, cache)
            if ids.shape[1] != t:  # crossing into the long factors: recompute from position 0
                cache.reset()
                past, t, position_ids = 0, ids.shape[1], None
        pad, pos = positions(ids, past, attention_mask, position_ids)
        inv = self._inv_freq
        if (
            self._long_inv_freq is not None
            and pos.max() + 1 > self.config.original_max_position_embeddings
        ):
            inv = self._long_inv_freq
        cos, sin = rope_tables(inv, pos[:, None, :], np.float32, self._attn_factor, ids._device)
        mask = causal_mask(t, past, pad, self.config.sliding_window, ids._device)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, cache)
        if cache is not None:
            cache.advance(t)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return self.lm_head(self.model.norm(x))

    def _longrope_ids(self, ids, cache):
        """The ids to run: the new ones, or all of them at the first step past the short factors."""
        past, t = cache.pos, ids.shape[1]
        fed = self._ids_fed.get(cache)
        new = ids.numpy()
        seq = new if past == 0 else None
        if past:
            if fed is None or fed.shape[1] < past or fed.shape[0] != new.shape[0]:
                raise UnsupportedError(
                    "Phi-3 longrope: this KV cache was filled outside this model's forward, so the "
                    "sequence cannot be recomputed when it crosses original_max_position_embeddings"
                )
            seq = np.concatenate([fed[:, :past], new], axis=1)
        self._ids_fed[cache] = seq
        orig = self.config.original_max_position_embeddings
        if 0 < past <= orig < past + t:
            return ember.from_numpy(seq)
        return ids

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads per layer (the KV cache's second dim)."""
        return self.config.num_key_value_heads
