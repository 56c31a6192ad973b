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
from dataclasses import dataclass, field

import ember
from ember import nn
from ember.errors import UnsupportedError
from ember.models.llama import (
    ACTIVATIONS,
    DecoderForCausalLM,
    DecoderNames,
    DecoderSpec,
    config_from_dict,
)
from ember.nn import functional as F

_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu", "relu", "silu", "swish")
# GPT2LMHeadModel's module names (transformer.h.0.attn.c_attn, ...)
_NAMES = DecoderNames(
    model="transformer", embed="wte", pos_embed="wpe", layers="h", final_norm="ln_f",
    attn="attn", mlp="mlp", attn_norm="ln_1", mlp_norm="ln_2",
    qkv="c_attn", o="c_proj", up="c_fc", down="c_proj",
)  # fmt: skip
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
        return config_from_dict(cls, d)

    def decoder_spec(self) -> DecoderSpec:
        """The decoder's flags: LayerNorm, learned positions, fused c_attn, a plain gelu MLP."""
        return DecoderSpec(
            vocab_size=self.vocab_size,
            hidden_size=self.n_embd,
            intermediate_size=self.intermediate_size,
            num_layers=self.n_layer,
            num_heads=self.n_head,
            num_kv_heads=self.n_head,
            head_dim=self.head_dim,
            norm="layer",
            norm_eps=self.layer_norm_epsilon,
            activation=ACTIVATIONS[self.activation_function],
            gated=False,
            mlp_bias=True,
            qkv_bias=True,
            o_bias=True,
            fused_qkv=True,
            query_scale=None if self.scale_attn_weights else 1.0,
            scale_by_inverse_layer=self.scale_attn_by_inverse_layer_idx,
            positions="learned",
            max_positions=self.n_positions,
            tie_word_embeddings=self.tie_word_embeddings,
            linear=Conv1D,
            names=_NAMES,
        )


class Conv1D(nn.Module):
    """GPT-2's linear layer: y = x W + b with W stored as (in_features, out_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(ember.empty(in_features, out_features))
        self.bias = nn.Parameter(ember.zeros(out_features)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight.t(), self.bias)

    def extra_repr(self) -> str:
        """in_features, out_features."""
        return f"in_features={self.in_features}, out_features={self.out_features}"


class GPT2LMHeadModel(DecoderForCausalLM):
    """GPT-2 with its language-model head (tied to the token embeddings)."""

    config_class = GPT2Config

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
