"""The decoder every causal LM runs on, and the LLaMA family's config (Llama 1/2/3, Mistral,
Qwen2/2.5, Qwen3, SmolLM, TinyLlama).

One pre-norm decoder: embeddings, blocks of ``x + attn(norm(x))`` and ``x + mlp(norm(x))``, a
final norm and the language-model head. Families differ by the flags of ``DecoderSpec``, which
each family's config builds (``config.decoder_spec()``): Gemma / Gemma 2 (gemma.py), Phi-3
(phi3.py) and GPT-2 (gpt2.py) are config adapters onto this file.

- norms: RMSNorm or LayerNorm (with bias); Gemma's weight stored as an offset from one;
  Gemma 2's "sandwich" norms around both sub-blocks
- feed-forward: gated (SwiGLU / GeGLU: ``F.swiglu``, ``F.geglu``) or not (GPT-2), the
  activation, biases, one fused gate/up projection (Phi-3)
- attention: grouped key/value heads, q/k/v and o biases, one fused q/k/v projection (Phi-3,
  GPT-2), per-head q/k RMSNorm (Qwen3), the query scale, tanh soft-capping of the scores,
  sliding windows on all or some layers
- positions: rotary (half-split or interleaved rows, partial rotary, llama3 / linear /
  longrope scaling) or a learned table (GPT-2)
- embeddings scaled by sqrt(hidden) (Gemma), final logits soft-capped, the head tied or not

Activations are token-major, (batch, tokens, heads, head_dim), as the projections produce them;
attention reads and writes the KV cache in place (``F.cached_attention``). The model calls only
``ember.nn``, ``ember.nn.functional`` and tensor ops: fast paths are kernels registered behind
those ops, and the q/k/v and gate/up products are stacked by ``ember.inference.stack_linears``.
Module and parameter names follow each family's Hugging Face checkpoints (``DecoderNames``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, fields

import numpy as np

import ember
from ember import nn
from ember.errors import ShapeError, UnsupportedError
from ember.nn import functional as F
from ember.nn.generation import GenerationMixin
from ember.ops.rope import apply_rotary_qk, rope_inv_freq, rope_tables


@dataclass
class LlamaConfig:
    """Hyper-parameters, with Hugging Face's field names."""

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    attention_bias: bool = False
    o_proj_bias: bool | None = None
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    rope_interleaved: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    model_type: str = "llama"
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.o_proj_bias is None:
            self.o_proj_bias = self.attention_bias and self.model_type not in ("qwen2",)
        check_heads(self.num_attention_heads, self.num_key_value_heads)

    @classmethod
    def from_dict(cls, d: dict) -> LlamaConfig:
        """Build from a config.json dict; model_type picks the family's defaults."""
        d = dict(d)
        mt = d.get("model_type", "llama")
        if mt == "qwen2":
            d.setdefault("attention_bias", True)
        if mt == "qwen3":
            d.setdefault("qk_norm", True)
        if mt in ("qwen2", "qwen3") and not d.get("use_sliding_window", False):
            d["sliding_window"] = None
        nested_rope(d)
        return config_from_dict(cls, d)

    def decoder_spec(self) -> DecoderSpec:
        """The decoder's flags for this config."""
        return DecoderSpec(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_layers=self.num_hidden_layers,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            norm_eps=self.rms_norm_eps,
            activation=ACTIVATIONS.get(self.hidden_act, self.hidden_act),
            mlp_bias=self.mlp_bias,
            qkv_bias=self.attention_bias,
            o_bias=self.o_proj_bias,
            qk_norm=self.qk_norm,
            sliding_window=self.sliding_window,
            rope_inv_freq=rope_inv_freq(self.head_dim, self.rope_theta, self.rope_scaling),
            rope_interleaved=self.rope_interleaved,
            tie_word_embeddings=self.tie_word_embeddings,
        )


# --- config helpers the family adapters share --------------------------------------------------

# Hugging Face activation names -> the decoder's
ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}


def check_heads(heads: int, kv_heads: int) -> None:
    """Query heads must be a multiple of key/value heads."""
    if heads % kv_heads:
        raise ShapeError(
            f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
        )


def nested_rope(d: dict) -> None:
    """transformers >= 5 nests rope settings in rope_parameters: lift them to the v4 names."""
    rp = d.get("rope_parameters")
    if isinstance(rp, dict):
        d.setdefault("rope_theta", rp.get("rope_theta", 10000.0))
        if "partial_rotary_factor" in rp:
            d.setdefault("partial_rotary_factor", rp["partial_rotary_factor"])
        if rp.get("rope_type", rp.get("type", "default")) != "default":
            d.setdefault("rope_scaling", rp)


def config_from_dict(cls, d: dict):
    """cls(**known fields of d), the other fields kept in ``extra``."""
    names = {f.name for f in fields(cls)}
    known = {k: v for k, v in d.items() if k in names}
    known["extra"] = {k: v for k, v in d.items() if k not in names}
    return cls(**known)


# --- the decoder's flags -----------------------------------------------------------------------


@dataclass(frozen=True)
class DecoderNames:
    """Module names, as a family's checkpoints spell them (defaults: LLaMA's)."""

    model: str = "model"
    embed: str = "embed_tokens"
    pos_embed: str = "wpe"
    layers: str = "layers"
    final_norm: str = "norm"
    attn: str = "self_attn"
    mlp: str = "mlp"
    attn_norm: str = "input_layernorm"  # before attention
    mlp_norm: str = "post_attention_layernorm"  # before the feed-forward
    attn_out_norm: str = "post_attention_layernorm"  # sandwich norms: after attention
    mlp_in_norm: str = "pre_feedforward_layernorm"  # sandwich norms: before the feed-forward
    mlp_out_norm: str = "post_feedforward_layernorm"  # sandwich norms: after it
    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    qkv: str = "qkv_proj"
    o: str = "o_proj"
    gate: str = "gate_proj"
    up: str = "up_proj"
    gate_up: str = "gate_up_proj"
    down: str = "down_proj"


@dataclass
class DecoderSpec:
    """Everything the decoder needs to know about a family (see the module docstring)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    norm_eps: float = 1e-6
    norm: str = "rms"  # "rms" | "layer" (LayerNorm with bias)
    norm_offset: bool = False  # the norm scales by 1 + weight (Gemma)
    sandwich_norms: bool = False  # norms after attention and around the feed-forward (Gemma 2)
    activation: str = "silu"  # silu | gelu_tanh | gelu | relu
    gated: bool = True  # down(act(gate(x)) * up(x)); False: down(act(up(x)))
    mlp_bias: bool = False
    fused_gate_up: bool = False  # one gate_up projection, [gate | up] (Phi-3)
    qkv_bias: bool = False
    o_bias: bool = False
    fused_qkv: bool = False  # one q/k/v projection, [q | k | v] (Phi-3, GPT-2)
    qk_norm: bool = False  # RMSNorm over each head's queries and keys (Qwen3)
    query_scale: float | None = None  # None: head_dim ** -0.5
    scale_by_inverse_layer: bool = False  # query scale / (layer + 1) (GPT-2 option)
    attn_softcap: float | None = None  # cap * tanh(scores / cap) (Gemma 2)
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] | None = None  # which layers use the window (None: all)
    positions: str = "rope"  # "rope" | "learned" (a position table, GPT-2)
    max_positions: int | None = None  # the learned table's length
    rope_inv_freq: np.ndarray | None = None
    rope_interleaved: bool = False  # GGUF llama rows: adjacent pairs rotate
    rope_long_inv_freq: np.ndarray | None = None  # longrope: the factors past rope_long_after
    rope_long_after: int | None = None
    rope_attention_factor: float = 1.0
    embed_scale: float | None = None  # x = embed(ids) * scale (Gemma: sqrt(hidden))
    final_softcap: float | None = None
    tie_word_embeddings: bool = False
    linear: type = nn.Linear  # the projections' class (GPT-2: Conv1D, its weights transposed)
    names: DecoderNames = field(default_factory=DecoderNames)


# --- blocks ------------------------------------------------------------------------------------


class OffsetRMSNorm(nn.Module):
    """RMSNorm whose weight is stored as an offset from one: x / rms(x) * (1 + weight)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(ember.zeros(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), 1.0 + self.weight, self.eps)

    def extra_repr(self) -> str:
        """Shape and eps."""
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


def make_norm(spec: DecoderSpec, dim: int) -> nn.Module:
    """The family's norm over dim features."""
    if spec.norm == "layer":
        return nn.LayerNorm(dim, eps=spec.norm_eps)
    if spec.norm_offset:
        return OffsetRMSNorm(dim, spec.norm_eps)
    return nn.RMSNorm(dim, eps=spec.norm_eps)


def _activation(name: str, x):
    if name == "silu":
        return F.silu(x)
    if name == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu(x)
    return F.relu(x)


class DecoderAttention(nn.Module):
    """Grouped-query attention over the KV cache, with rotary positions when the family has them."""

    def __init__(self, spec: DecoderSpec, layer_idx: int) -> None:
        super().__init__()
        n = spec.names
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = (
            spec.num_heads,
            spec.num_kv_heads,
            spec.head_dim,
        )
        self.interleaved = spec.rope_interleaved
        scale = spec.query_scale if spec.query_scale is not None else spec.head_dim**-0.5
        self.scale = scale / (layer_idx + 1) if spec.scale_by_inverse_layer else scale
        self.softcap = spec.attn_softcap
        h, hd = spec.hidden_size, spec.head_dim
        qs, ks = spec.num_heads * hd, spec.num_kv_heads * hd
        self.q_size, self.kv_size = qs, ks
        lin = spec.linear
        self._fused = spec.fused_qkv
        if spec.fused_qkv:
            self._qkv = n.qkv
            setattr(self, n.qkv, lin(h, qs + 2 * ks, bias=spec.qkv_bias))
        else:
            self._q, self._k, self._v = n.q, n.k, n.v
            setattr(self, n.q, lin(h, qs, bias=spec.qkv_bias))
            setattr(self, n.k, lin(h, ks, bias=spec.qkv_bias))
            setattr(self, n.v, lin(h, ks, bias=spec.qkv_bias))
        self._o = n.o
        setattr(self, n.o, lin(qs, h, bias=spec.o_bias))
        if spec.qk_norm:
            self.q_norm = nn.RMSNorm(hd, eps=spec.norm_eps)
            self.k_norm = nn.RMSNorm(hd, eps=spec.norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x, rope, mask: nn.CausalMask, cache=None):
        b, t, _ = x.shape
        mods = self._modules  # submodules by name: a dict lookup, not Module.__getattr__
        if self._fused:
            qkv = mods[self._qkv](x)
            qs, ks = self.q_size, self.kv_size
            q, k, v = qkv[..., :qs], qkv[..., qs : qs + ks], qkv[..., qs + ks :]
        else:
            q, k, v = mods[self._q](x), mods[self._k](x), mods[self._v](x)
        q = q.reshape(b, t, self.num_heads, self.head_dim)
        k = k.reshape(b, t, self.num_kv_heads, self.head_dim)
        v = v.reshape(b, t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rotary_qk(q, k, rope[0], rope[1], self.interleaved)
        out = F.cached_attention(
            q, k, v, mask, cache, self.layer_idx, scale=self.scale, softcap=self.softcap
        )  # (b, t, heads * head_dim)
        return mods[self._o](out)


class DecoderMLP(nn.Module):
    """Gated feed-forward down(act(gate(x)) * up(x)), or down(act(up(x))) (GPT-2)."""

    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        n = spec.names
        h, i, bias, lin = spec.hidden_size, spec.intermediate_size, spec.mlp_bias, spec.linear
        self.act, self.gated, self.fused = spec.activation, spec.gated, spec.fused_gate_up
        self.inter = i
        self._gate, self._up, self._gate_up, self._down = n.gate, n.up, n.gate_up, n.down
        if not spec.gated:
            setattr(self, n.up, lin(h, i, bias=bias))
        elif spec.fused_gate_up:
            setattr(self, n.gate_up, lin(h, 2 * i, bias=bias))
        else:
            setattr(self, n.gate, lin(h, i, bias=bias))
            setattr(self, n.up, lin(h, i, bias=bias))
        setattr(self, n.down, lin(i, h, bias=bias))

    def forward(self, x):
        mods = self._modules
        down = mods[self._down]
        if not self.gated:
            return down(_activation(self.act, mods[self._up](x)))
        if self.fused:
            gu = mods[self._gate_up](x)
            g, u = gu[..., : self.inter], gu[..., self.inter :]
        else:
            g, u = mods[self._gate](x), mods[self._up](x)
        if self.act == "silu":
            return down(F.swiglu(g, u))
        if self.act in ("gelu_tanh", "gelu"):
            return down(F.geglu(g, u, approximate="tanh" if self.act == "gelu_tanh" else "none"))
        return down(_activation(self.act, g) * u)


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)); sandwich norms also normalise
    each sub-block's output before the residual add."""

    def __init__(self, spec: DecoderSpec, layer_idx: int) -> None:
        super().__init__()
        n = spec.names
        self.sandwich = spec.sandwich_norms
        self._attn, self._mlp, self._attn_norm = n.attn, n.mlp, n.attn_norm
        setattr(self, n.attn_norm, make_norm(spec, spec.hidden_size))
        setattr(self, n.attn, DecoderAttention(spec, layer_idx))
        if self.sandwich:
            self._attn_out, self._mlp_norm, self._mlp_out = (
                n.attn_out_norm,
                n.mlp_in_norm,
                n.mlp_out_norm,
            )
            for name in (n.attn_out_norm, n.mlp_in_norm, n.mlp_out_norm):
                setattr(self, name, make_norm(spec, spec.hidden_size))
        else:
            self._mlp_norm = n.mlp_norm
            setattr(self, n.mlp_norm, make_norm(spec, spec.hidden_size))
        setattr(self, n.mlp, DecoderMLP(spec))

    def forward(self, x, rope, mask: nn.CausalMask, cache=None):
        mods = self._modules
        a = mods[self._attn](mods[self._attn_norm](x), rope, mask, cache)
        if self.sandwich:
            a = mods[self._attn_out](a)
        x = x + a
        m = mods[self._mlp](mods[self._mlp_norm](x))
        if self.sandwich:
            m = mods[self._mlp_out](m)
        return x + m


class DecoderModel(nn.Module):
    """Embeddings (token, and position when learned), the decoder stack and the final norm."""

    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        n = spec.names
        setattr(self, n.embed, nn.Embedding(spec.vocab_size, spec.hidden_size))
        if spec.positions == "learned":
            setattr(self, n.pos_embed, nn.Embedding(spec.max_positions, spec.hidden_size))
        setattr(
            self, n.layers, nn.ModuleList([DecoderLayer(spec, i) for i in range(spec.num_layers)])
        )
        setattr(self, n.final_norm, make_norm(spec, spec.hidden_size))


class DecoderForCausalLM(nn.Module, GenerationMixin):
    """The decoder with its language-model head; subclasses name the family's config class."""

    config_class = LlamaConfig

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        spec = self.spec = config.decoder_spec()  # a bad config fails before any allocation
        n = spec.names
        setattr(self, n.model, DecoderModel(spec))
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens_module().weight
        if spec.rope_long_inv_freq is not None:
            self._ids_fed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._embed_scale = spec.embed_scale

    def embed_tokens_module(self) -> nn.Module:
        """The token embedding module (named as the family's checkpoints name it)."""
        n = self.spec.names
        return getattr(getattr(self, n.model), n.embed)

    def forward(
        self,
        input_ids,
        attention_mask=None,
        position_ids=None,
        cache=None,
        logits_to_keep: int | np.ndarray = 0,
    ):
        """Logits (batch, seq, vocab); with logits_to_keep=n only for the last n positions, with
        an array (batch,) only for position logits_to_keep[b] of each row (batch, 1, vocab)."""
        spec = self.spec
        ids = token_ids(input_ids)
        t = ids.shape[1]
        past = cache.pos if cache is not None else 0
        if cache is not None and spec.rope_long_inv_freq is not None:
            if np.ndim(past):
                raise UnsupportedError("longrope models decode one sequence per cache")
            ids = self._longrope_ids(ids, cache)
            if ids.shape[1] != t:  # crossing into the long factors: recompute from position 0
                cache.reset()
                past, t, position_ids = 0, ids.shape[1], None
        pad, pos = positions(ids, past, attention_mask, position_ids)
        x, rope = self.decode_inputs(ids, pos)
        logits = self.decode_body(x, rope, past, pad, cache, logits_to_keep)
        if cache is not None:
            cache.advance(t)
        return logits

    def decode_inputs(self, ids, pos: np.ndarray):
        """(token embeddings (b, t, hidden), rotary tables or None) of ids at positions pos (b, t)."""
        spec, n = self.spec, self.spec.names
        dev = ids.device
        body = getattr(self, n.model)
        x = getattr(body, n.embed)(ids)
        if self._embed_scale is not None:
            # rounded to the embedding dtype first, as transformers does (bf16: 55.5)
            x = x * ember.tensor(self._embed_scale, dtype=x.dtype, device=x.device)
        if spec.positions == "learned":
            if pos.size and pos.max() >= spec.max_positions:
                raise ShapeError(
                    f"{self.config.model_type} position {int(pos.max())} is past its "
                    f"{spec.max_positions} learned positions"
                )
            pos_ids = ember.from_numpy(np.ascontiguousarray(pos, dtype=np.int64)).to(dev)
            return x + getattr(body, n.pos_embed)(pos_ids), None
        inv = spec.rope_inv_freq
        if spec.rope_long_inv_freq is not None and pos.max() + 1 > spec.rope_long_after:
            inv = spec.rope_long_inv_freq
        # (b, t, 1, rotary_dim / 2), on the ids' device (meta: shapes only)
        return x, rope_tables(inv, pos[:, :, None], np.float32, spec.rope_attention_factor, dev)

    def decode_body(self, x, rope, past, pad, cache=None, logits_to_keep: int | np.ndarray = 0):
        """The layers, the final norm and the head on embeddings x (b, t, hidden) at positions
        past.. (an int, or one per row), with padding pad (b, past + t) or None. Logits of the
        last logits_to_keep positions (0: all), or of position logits_to_keep[b] of each row.

        Everything that differs from one step to the next comes in as x, rope and past (an
        array read by the attention op when it runs): a decode step can be captured and
        replayed (``ember.nn.graph.DecodeGraphs``). The caller advances the cache.
        """
        spec, n = self.spec, self.spec.names
        t, dev = x.shape[1], x.device
        body = getattr(self, n.model)
        full = nn.CausalMask(
            t, past, pad, None if spec.sliding_layers else spec.sliding_window, dev
        )
        local = None
        if spec.sliding_layers and any(spec.sliding_layers):
            local = nn.CausalMask(t, past, pad, spec.sliding_window, dev)
        sliding = spec.sliding_layers
        for i, layer in enumerate(getattr(body, n.layers)):
            x = layer(x, rope, local if sliding and sliding[i] else full, cache)
        if isinstance(logits_to_keep, np.ndarray):  # one position per row
            x = x[np.arange(x.shape[0]), logits_to_keep].reshape(x.shape[0], 1, x.shape[2])
        elif logits_to_keep:
            x = x[:, -logits_to_keep:]
        logits = self.lm_head(getattr(body, n.final_norm)(x))
        cap = spec.final_softcap
        if cap is not None:
            logits = ember.tanh(logits / cap) * cap
        return logits

    def can_capture_decode(self) -> bool:
        """Whether one-token steps may run as captured graphs (not with longrope, whose tables
        depend on the whole history)."""
        return self.spec.rope_long_inv_freq is None

    def _longrope_ids(self, ids, cache):
        """The ids to run: the new ones, or all of them at the first step past the short factors
        (as transformers, the step that crosses the boundary recomputes the whole sequence)."""
        past, t = cache.pos, ids.shape[1]
        fed = self._ids_fed.get(cache)
        new = ids.numpy()
        seq = new if past == 0 else None
        if past:
            if fed is None or fed.shape[1] < past or fed.shape[0] != new.shape[0]:
                raise UnsupportedError(
                    "longrope: this KV cache was filled outside this model's forward, so the "
                    "sequence cannot be recomputed when it crosses original_max_position_embeddings"
                )
            seq = np.concatenate([fed[:, :past], new], axis=1)
        self._ids_fed[cache] = seq
        orig = self.spec.rope_long_after
        if 0 < past <= orig < past + t:
            return ember.from_numpy(seq)
        return ids

    def tie_weights(self) -> None:
        """Make lm_head use the token embedding matrix (dense or quantized)."""
        emb = self.embed_tokens_module()
        if isinstance(emb, nn.Embedding):
            self.lm_head.weight = emb.weight
        else:  # a quantized table (QEmbedding): the head multiplies by the same blocks
            from ember.quant.nn import QLinear

            self.lm_head = QLinear(emb.weight)

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads per layer (the KV cache's second dim)."""
        return self.spec.num_kv_heads


class LlamaForCausalLM(DecoderForCausalLM):
    """A LLaMA-family decoder with its language-model head."""

    config_class = LlamaConfig


# kept for code that imported the LLaMA-named blocks
LlamaAttention, LlamaMLP, LlamaDecoderLayer, LlamaModel = (
    DecoderAttention,
    DecoderMLP,
    DecoderLayer,
    DecoderModel,
)


def token_ids(input_ids) -> ember.Tensor:
    """Token ids (a tensor, array or list; (t,) or (batch, t)) as a (batch, t) tensor."""
    ids = input_ids if isinstance(input_ids, ember.Tensor) else ember.tensor(input_ids)
    return ids.unsqueeze(0) if ids.ndim == 1 else ids


def positions(ids: ember.Tensor, past: int, attention_mask=None, position_ids=None):
    """(padding mask (batch, past + t) bool or None, positions (batch, t)) for a decoder step.

    Positions count only real tokens (left padding shifts them, as transformers does) unless
    position_ids gives them.
    """
    b, t = ids.shape
    pad = None if attention_mask is None else np.asarray(attention_mask, bool).reshape(b, -1)
    if np.ndim(past):  # a batched step (BatchKVCache rows): each row at its own position
        if pad is not None or position_ids is not None:
            raise UnsupportedError(
                "a batched step over cache rows takes no attention_mask or position_ids "
                "(each row's positions follow its own length)"
            )
        return None, np.asarray(past).reshape(b, 1) + np.arange(t)
    if position_ids is not None:
        pos = np.asarray(position_ids)
        return pad, np.broadcast_to(pos.reshape(-1, t), (b, t))
    if pad is not None:
        return pad, np.maximum(np.cumsum(pad, axis=1) - 1, 0)[:, past : past + t]
    return pad, np.broadcast_to(np.arange(past, past + t), (b, t))


def causal_mask(t: int, past: int, pad: np.ndarray | None, window: int | None, device=None):
    """Boolean (batch|1, 1, t, past + t) mask of allowed positions, or None when all are allowed."""
    if device is None:
        return nn.CausalMask(t, past, pad, window).dense()
    return nn.CausalMask(t, past, pad, window, device).dense()


__all__ = [
    "LlamaConfig",
    "LlamaForCausalLM",
    "DecoderSpec",
    "DecoderNames",
    "DecoderForCausalLM",
]
