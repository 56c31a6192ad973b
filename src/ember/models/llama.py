"""The LLaMA family: Llama 1/2/3, Mistral, Qwen2/2.5, Qwen3, SmolLM, TinyLlama.

One decoder, configured from Hugging Face ``config.json`` names (or GGUF metadata through
``ember.models.auto``). Differences between the members are flags on the config:
``attention_bias`` (Qwen2: q/k/v carry a bias, o_proj does not), ``qk_norm`` (Qwen3: RMSNorm on
each head's queries and keys), ``sliding_window`` (Mistral), ``rope_scaling`` (Llama 3) and
``rope_interleaved`` (weights in GGUF row order rotate adjacent pairs).

Activations are token-major, (batch, tokens, heads, head_dim), as the projections produce them.
For inference the same code runs fused kernels: q/k/v (and gate/up) quantized weights of one
type are multiplied as one stacked matrix, RoPE rotates q and k in one pass, and attention reads
the KV cache in place (``ember.generation.cache.cached_attention``). With a gradient to record,
every step is an ordinary differentiable op.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

import ember
from ember import nn
from ember.autograd import Function
from ember.device import CPU, Device
from ember.generation.cache import CausalMask, cached_attention
from ember.nn import functional as F
from ember.ops.rope import apply_rotary_qk, rope_inv_freq, rope_tables
from ember.quant import QTensor


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
        if self.num_attention_heads % self.num_key_value_heads:
            raise ember.errors.ShapeError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

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
        if isinstance(d.get("rope_parameters"), dict):  # transformers >= 5 nests rope settings
            rp = d["rope_parameters"]
            d.setdefault("rope_theta", rp.get("rope_theta", 10000.0))
            if rp.get("rope_type", "default") != "default":
                d.setdefault("rope_scaling", rp)
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in d.items() if k in names}
        known["extra"] = {k: v for k, v in d.items() if k not in names}
        return cls(**known)


class LlamaAttention(nn.Module):
    """Multi-head attention with grouped key/value heads and rotary positions."""

    def __init__(self, cfg: LlamaConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.interleaved = cfg.rope_interleaved
        h, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, self.num_heads * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * hd, h, bias=cfg.o_proj_bias)
        if cfg.qk_norm:
            self.q_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)
            self.k_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.qkv = LinearGroup()

    def forward(self, x, cos, sin, mask: CausalMask, cache=None):
        b, t, _ = x.shape
        q, k, v = self.qkv(x, self.q_proj, self.k_proj, self.v_proj)
        q = q.view(b, t, self.num_heads, self.head_dim)
        k = k.view(b, t, self.num_kv_heads, self.head_dim)
        v = v.view(b, t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary_qk(q, k, cos, sin, self.interleaved)
        out = cached_attention(q, k, v, mask, cache, self.layer_idx)  # (b, t, heads * head_dim)
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: down(act(gate(x)) * up(x))."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(h, i, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(i, h, bias=cfg.mlp_bias)
        self.act = cfg.hidden_act
        self.gate_up = LinearGroup()

    def forward(self, x):
        g, u = self.gate_up(x, self.gate_proj, self.up_proj)
        if self.act == "silu":
            return self.down_proj(silu_mul(g, u))
        return self.down_proj(F.gelu(g, approximate="tanh") * u)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: LlamaConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, layer_idx)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask: CausalMask, cache=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Embeddings, the decoder stack and the final norm."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            [LlamaDecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers)]
        )
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """A LLaMA-family decoder with its language-model head."""

    config_class = LlamaConfig

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)

    def forward(
        self, input_ids, attention_mask=None, position_ids=None, cache=None, logits_to_keep: int = 0
    ):
        """Logits (batch, seq, vocab); with logits_to_keep=n only for the last n positions."""
        ids = token_ids(input_ids)
        t = ids.shape[1]
        past = cache.pos if cache is not None else 0
        pad, pos = positions(ids, past, attention_mask, position_ids)
        # (b, t, 1, d/2), on the ids' device (meta: shapes only)
        cos, sin = rope_tables(self._inv_freq, pos[:, :, None], np.float32, device=ids._device)
        mask = CausalMask(t, past, pad, self.config.sliding_window, ids._device)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, cache)
        if cache is not None:
            cache.advance(t)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return self.lm_head(self.model.norm(x))

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads per layer (the KV cache's second dim)."""
        return self.config.num_key_value_heads


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
    if position_ids is not None:
        pos = np.asarray(getattr(position_ids, "_data", position_ids))
        return pad, np.broadcast_to(pos.reshape(-1, t), (b, t))
    if pad is not None:
        return pad, np.maximum(np.cumsum(pad, axis=1) - 1, 0)[:, past : past + t]
    return pad, np.broadcast_to(np.arange(past, past + t), (b, t))


def causal_mask(
    t: int, past: int, pad: np.ndarray | None, window: int | None, device: Device = CPU
):
    """Boolean (batch|1, 1, t, past + t) mask of allowed positions, or None when all are allowed."""
    return CausalMask(t, past, pad, window, device).dense()


# --- fused inference helpers used above --------------------------------------------------------


class LinearGroup:
    """Linear layers that share their input, run as one product when their weights allow it.

    Quantized weights of one block type stack row-wise into one matrix (the stacked copy is made
    on first use and remade if a layer's weight is replaced): one matrix-vector kernel call
    instead of three for q/k/v, two for gate/up. Otherwise, or with a gradient to record, each
    layer runs on its own.
    """

    def __init__(self) -> None:
        self._key: tuple = ()
        self._weight: QTensor | None = None
        self._bias: np.ndarray | None = None
        self._splits: list[int] = []

    def __call__(self, x: ember.Tensor, *layers) -> list:
        """[layer(x) for layer in layers]."""
        if ember.is_grad_enabled() and (
            x.requires_grad
            or any(lin.bias is not None and lin.bias.requires_grad for lin in layers)
        ):
            return [lin(x) for lin in layers]
        key = tuple(lin.weight for lin in layers)
        if len(key) != len(self._key) or any(a is not b for a, b in zip(key, self._key)):
            self._fuse(layers)
            self._key = key
        w = self._weight
        if w is None or x._data.dtype != np.float32 or x._device is not CPU:
            return [lin(x) for lin in layers]
        xd = x._data
        k = xd.shape[-1]
        y = w.matmul_t(xd.reshape(k) if xd.size == k else xd.reshape(-1, k))
        if self._bias is not None:
            y = y + self._bias
        y = y.reshape(xd.shape[:-1] + (y.shape[-1],))
        s = self._splits
        return [ember.Tensor._wrap(y[..., s[i] : s[i + 1]]) for i in range(len(layers))]

    def _fuse(self, layers) -> None:
        self._weight = self._bias = None
        ws = [lin.weight for lin in layers]
        if not all(type(w) is QTensor and w.ndim == 2 for w in ws):
            return
        if len({(w.qtype, w.shape[1]) for w in ws}) != 1:
            return
        rows = [w.data.reshape(w.shape[0], -1) for w in ws]
        n = sum(w.shape[0] for w in ws)
        self._weight = QTensor(np.concatenate(rows), ws[0].qtype, (n, ws[0].shape[1]))
        self._splits = list(np.cumsum([0] + [w.shape[0] for w in ws]))
        if any(lin.bias is not None for lin in layers):
            self._bias = np.concatenate([
                np.zeros(w.shape[0], np.float32) if lin.bias is None
                else lin.bias._data.astype(np.float32)
                for lin, w in zip(layers, ws)
            ])  # fmt: skip


class SiluMul(Function):
    """silu(g) * u (SwiGLU's gate) in one pass; backward in closed form."""

    def meta(self, g, u):
        """The broadcast shape and g's dtype, without loading the numba kernel."""
        return np.broadcast_shapes(g.shape, u.shape), np.result_type(g.dtype, u.dtype)

    def forward(self, g, u):
        self.g, self.u = g, u
        if g.dtype == np.float32 and u.dtype == np.float32:
            from ember.kernels.cpu.llm import silu_mul as kernel

            return kernel(g, u)
        return g / (1 + np.exp(-g)) * u

    def backward(self, grad):
        g, u = self.g, self.u
        sig = 1 / (1 + np.exp(-g))
        dg = grad * u * sig * (1 + g * (1 - sig)) if self.needs_input_grad[0] else None
        du = grad * g * sig if self.needs_input_grad[1] else None
        return dg, du


def silu_mul(g: ember.Tensor, u: ember.Tensor) -> ember.Tensor:
    """silu(g) * u for float tensors of one shape."""
    if g.shape != u.shape or g.dtype != u.dtype or not g.is_floating_point():
        return F.silu(g) * u
    return SiluMul.apply(g, u)
