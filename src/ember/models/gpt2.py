"""GPT-2 (and checkpoints that keep its layout: DistilGPT2, small GPT-2-style models).

Learned position embeddings added to the token embeddings, pre-LayerNorm blocks, one fused
``c_attn`` projection for query/key/value, a gelu MLP and an output head tied to the token
embeddings. The projections are OpenAI's ``Conv1D``: a linear layer whose weight is stored
transposed, (in_features, out_features), so checkpoint tensors load as they are.

Parameter names follow transformers' ``GPT2LMHeadModel`` (``transformer.h.0.attn.c_attn.weight``);
checkpoints saved from a bare ``GPT2Model`` (the original ``gpt2`` files: ``h.0.attn...``, plus the
``attn.bias`` causal-mask buffers) load too, see ``checkpoint_weights``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

import numpy as np

import ember
from ember import nn
from ember.errors import UnsupportedError
from ember.models.llama import causal_mask, positions, token_ids
from ember.nn import functional as F

_GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
_ACTIVATIONS = (*_GELU_TANH, "gelu", "relu", "silu", "swish")
_MASK_BUFFER = re.compile(r"transformer\.h\.\d+\.attn\.(bias|masked_bias)$")


@dataclass
class GPT2Config:
    """Hyper-parameters, with GPT-2's config.json names (n_embd, n_layer, ...)."""

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    add_cross_attention: bool = False
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    pad_token_id: int | None = None
    model_type: str = "gpt2"
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ember.errors.ShapeError(
                f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})"
            )
        if self.activation_function not in _ACTIVATIONS:
            raise UnsupportedError(
                f"GPT-2 activation_function {self.activation_function!r} is not supported "
                f"({', '.join(_ACTIVATIONS)})"
            )
        if self.add_cross_attention:
            raise UnsupportedError(
                "GPT-2 with cross-attention (an encoder-decoder part) is not supported"
            )

    # the names the generate loop, the KV cache and `ember info` read
    @property
    def hidden_size(self) -> int:
        """n_embd."""
        return self.n_embd

    @property
    def num_hidden_layers(self) -> int:
        """n_layer."""
        return self.n_layer

    @property
    def num_attention_heads(self) -> int:
        """n_head."""
        return self.n_head

    @property
    def num_key_value_heads(self) -> int:
        """n_head (GPT-2 has no grouped key/value heads)."""
        return self.n_head

    @property
    def head_dim(self) -> int:
        """n_embd / n_head."""
        return self.n_embd // self.n_head

    @property
    def intermediate_size(self) -> int:
        """n_inner, 4 * n_embd by default."""
        return self.n_inner or 4 * self.n_embd

    @property
    def max_position_embeddings(self) -> int:
        """n_positions: the learned position table's length is the context limit."""
        return self.n_positions

    @classmethod
    def from_dict(cls, d: dict) -> GPT2Config:
        """Build from a config.json dict."""
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in d.items() if k in names}
        known["extra"] = {k: v for k, v in d.items() if k not in names}
        return cls(**known)


class Conv1D(nn.Module):
    """GPT-2's linear layer: y = x W + b with W stored as (in_features, out_features)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(ember.empty(in_features, out_features))
        self.bias = nn.Parameter(ember.zeros(out_features))

    def forward(self, x):
        return F.linear(x, self.weight.t(), self.bias)

    def extra_repr(self) -> str:
        """in_features, out_features."""
        return f"in_features={self.in_features}, out_features={self.out_features}"


def _activation(name: str, x):
    if name in _GELU_TANH:
        return F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu(x)
    return F.relu(x) if name == "relu" else F.silu(x)


class GPT2Attention(nn.Module):
    """Multi-head causal self-attention from one fused q/k/v projection."""

    def __init__(self, cfg: GPT2Config, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.head_dim = cfg.n_head, cfg.head_dim
        self.scale = self.head_dim**-0.5 if cfg.scale_attn_weights else 1.0
        if cfg.scale_attn_by_inverse_layer_idx:
            self.scale /= layer_idx + 1
        self.c_attn = Conv1D(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd)

    def forward(self, x, mask, cache=None):
        b, t, h = x.shape
        shape = (b, t, self.num_heads, self.head_dim)
        q, k, v = (a.reshape(shape).transpose(1, 2) for a in self.c_attn(x).split(h, dim=-1))
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return self.c_proj(out.transpose(1, 2).reshape(b, t, h))


class GPT2MLP(nn.Module):
    """c_proj(act(c_fc(x)))."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.c_fc = Conv1D(cfg.n_embd, cfg.intermediate_size)
        self.c_proj = Conv1D(cfg.intermediate_size, cfg.n_embd)
        self.act = cfg.activation_function

    def forward(self, x):
        return self.c_proj(_activation(self.act, self.c_fc(x)))


class GPT2Block(nn.Module):
    """Pre-norm block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, cfg: GPT2Config, layer_idx: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = GPT2Attention(cfg, layer_idx)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = GPT2MLP(cfg)

    def forward(self, x, mask, cache=None):
        x = x + self.attn(self.ln_1(x), mask, cache)
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    """Token and position embeddings, the blocks and the final LayerNorm."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList([GPT2Block(cfg, i) for i in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)


class GPT2LMHeadModel(nn.Module):
    """GPT-2 with its language-model head (tied to the token embeddings)."""

    config_class = GPT2Config

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        self.transformer = GPT2Model(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    def forward(
        self, input_ids, attention_mask=None, position_ids=None, cache=None, logits_to_keep: int = 0
    ):
        """Logits (batch, seq, vocab); with logits_to_keep=n only for the last n positions."""
        ids = token_ids(input_ids)
        b, t = ids.shape
        past = cache.pos if cache is not None else 0
        pad, pos = positions(ids, past, attention_mask, position_ids)
        if pos.size and pos.max() >= self.config.n_positions:
            raise ember.errors.ShapeError(
                f"GPT-2 position {int(pos.max())} is past its "
                f"{self.config.n_positions} learned positions"
            )
        mask = causal_mask(t, past, pad, None, ids._device)
        tr = self.transformer
        pos_ids = ember.from_numpy(np.ascontiguousarray(pos, dtype=np.int64)).to(ids._device)
        x = tr.wte(ids) + tr.wpe(pos_ids)
        for block in tr.h:
            x = block(x, mask, cache)
        if cache is not None:
            cache.advance(t)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return self.lm_head(tr.ln_f(x))

    def checkpoint_weights(self, weights: dict) -> dict:
        """Checkpoint names -> this model's: add the ``transformer.`` prefix bare GPT2Model files
        lack, drop the causal-mask buffers older files carry."""
        out = {}
        for name, value in weights.items():
            if not name.startswith(("transformer.", "lm_head.")):
                name = "transformer." + name
            if not _MASK_BUFFER.match(name):
                out[name] = value
        return out

    def tie_weights(self) -> None:
        """Make lm_head use the token embedding matrix (dense or quantized)."""
        from ember.quant.nn import QEmbedding, QLinear

        emb = self.transformer.wte
        if isinstance(emb, QEmbedding):
            self.lm_head = QLinear(emb.weight)
        else:
            self.lm_head.weight = emb.weight

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads per layer (the KV cache's second dim)."""
        return self.config.n_head
