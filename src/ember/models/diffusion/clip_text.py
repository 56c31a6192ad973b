"""CLIPTextModel: the text encoder of Stable Diffusion, with transformers' names and config.

Parameters are named as transformers names them (``text_model.embeddings.token_embedding``,
``text_model.embeddings.position_embedding``, ``text_model.encoder.layers.N.self_attn.q_proj``,
``...mlp.fc1``, ``...layer_norm1``, ``text_model.final_layer_norm``), so a diffusers
``text_encoder/`` folder (config.json + model.safetensors) loads as is. Pre-LayerNorm layers with
a causal mask; ``hidden_act`` quick_gelu (SD 1.x), gelu (SD 2.x) or the tanh gelus.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import ember
from ember import nn
from ember.errors import FormatError, ShapeError, UnsupportedError
from ember.models.diffusion._layers import check_count, config_from_dict, load_weights, read_json
from ember.nn import functional as F
from ember.tensor import Tensor

_ACTS = ("quick_gelu", "gelu", "gelu_new", "gelu_pytorch_tanh")
# checkpoint tensors a text encoder folder may hold that the encoder does not use
_UNUSED = (
    "text_model.embeddings.position_ids", "embeddings.position_ids", "text_projection.weight",
    "logit_scale",
)  # fmt: skip


@dataclass
class CLIPTextConfig:
    """transformers' CLIPTextConfig fields (defaults: the ViT-L/14 text tower of SD 1.x)."""

    vocab_size: int = 49408
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    max_position_embeddings: int = 77
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 1
    bos_token_id: int = 49406
    eos_token_id: int = 49407
    model_type: str = "clip_text_model"
    extra: dict = field(default_factory=dict, repr=False)

    def validate(self, where: str = "CLIP text config") -> None:
        """Refuse activations ember does not have and sizes no model has."""
        if self.hidden_act not in _ACTS:
            raise UnsupportedError(f"{where}: hidden_act {self.hidden_act!r} is not one of {_ACTS}")
        check_count(self.vocab_size, "vocab_size", where, high=1 << 22)
        check_count(self.hidden_size, "hidden_size", where)
        check_count(self.intermediate_size, "intermediate_size", where, high=1 << 17)
        check_count(self.num_hidden_layers, "num_hidden_layers", where, high=256)
        check_count(self.max_position_embeddings, "max_position_embeddings", where, high=1 << 16)
        if self.hidden_size % check_count(self.num_attention_heads, "num_attention_heads", where):
            raise FormatError(
                f"{where}: hidden_size {self.hidden_size} does not split into "
                f"{self.num_attention_heads} heads"
            )

    @classmethod
    def from_dict(cls, d: dict, where: str = "CLIP text config") -> CLIPTextConfig:
        """From a config.json dict (a CLIPConfig's text_config is taken), checked."""
        if d.get("model_type") == "clip" and isinstance(d.get("text_config"), dict):
            d = d["text_config"]
        return config_from_dict(cls, d, where)


@dataclass
class CLIPTextOutput:
    """last_hidden_state (b, n, hidden), pooler_output (b, hidden), hidden_states if asked."""

    last_hidden_state: Tensor
    pooler_output: Tensor
    hidden_states: tuple | None = None

    def __getitem__(self, i: int) -> Tensor:
        return (self.last_hidden_state, self.pooler_output)[i]


def _act(name: str, x: Tensor) -> Tensor:
    if name == "quick_gelu":
        return x * (x * 1.702).sigmoid()
    return F.gelu(x, approximate="none" if name == "gelu" else "tanh")


class CLIPEmbeddings(nn.Module):
    """token_embedding + position_embedding."""

    def __init__(self, cfg: CLIPTextConfig) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embedding = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)

    def forward(self, ids: Tensor) -> Tensor:
        """(b, n) token ids -> (b, n, hidden)."""
        n = ids.shape[1]
        pos = ember.arange(n, dtype=ember.int64).reshape(1, n)
        return self.token_embedding(ids) + self.position_embedding(pos)


class CLIPAttention(nn.Module):
    """Multi-head self-attention: q_proj, k_proj, v_proj, out_proj (with biases)."""

    def __init__(self, cfg: CLIPTextConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.heads, self.head_dim = cfg.num_attention_heads, d // cfg.num_attention_heads
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.v_proj, self.out_proj = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """(b, n, d) -> (b, n, d); mask: an additive (b, 1, n, n) mask, or None for causal only."""
        b, n, d = x.shape

        def split(t: Tensor) -> Tensor:
            return t.reshape(b, n, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        scale = 1.0 / math.sqrt(self.head_dim)
        if mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return self.out_proj(o.transpose(1, 2).reshape(b, n, d))


class CLIPMLP(nn.Module):
    """fc1, activation, fc2."""

    def __init__(self, cfg: CLIPTextConfig) -> None:
        super().__init__()
        self.act = cfg.hidden_act
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        """(..., hidden) -> (..., hidden)."""
        return self.fc2(_act(self.act, self.fc1(x)))


class CLIPEncoderLayer(nn.Module):
    """x + attn(layer_norm1(x)), then + mlp(layer_norm2(x))."""

    def __init__(self, cfg: CLIPTextConfig) -> None:
        super().__init__()
        self.self_attn = CLIPAttention(cfg)
        self.layer_norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = CLIPMLP(cfg)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """(b, n, hidden) -> (b, n, hidden)."""
        x = x + self.self_attn(self.layer_norm1(x), mask)
        return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(nn.Module):
    """The stack of encoder layers."""

    def __init__(self, cfg: CLIPTextConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList([CLIPEncoderLayer(cfg) for _ in range(cfg.num_hidden_layers)])


class CLIPTextTransformer(nn.Module):
    """embeddings, encoder, final_layer_norm."""

    def __init__(self, cfg: CLIPTextConfig) -> None:
        super().__init__()
        self.embeddings = CLIPEmbeddings(cfg)
        self.encoder = CLIPEncoder(cfg)
        self.final_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)


class CLIPTextModel(nn.Module):
    """CLIP's text tower: token ids -> per-token states (what the UNet attends to) and a pooled one."""

    def __init__(self, config: CLIPTextConfig) -> None:
        super().__init__()
        self.config = config
        self.text_model = CLIPTextTransformer(config)
        self.source: str | None = None

    def _ids(self, input_ids) -> np.ndarray:
        ids = np.asarray(input_ids.numpy() if isinstance(input_ids, Tensor) else input_ids)
        if ids.ndim == 1:
            ids = ids[None]
        cfg = self.config
        if ids.ndim != 2 or ids.shape[1] == 0 or ids.dtype.kind not in "iu":
            raise ShapeError(f"CLIP text: input_ids must be integers (batch, tokens), got {ids.dtype} {ids.shape}")  # fmt: skip
        if ids.shape[1] > cfg.max_position_embeddings:
            raise ShapeError(
                f"CLIP text: {ids.shape[1]} tokens; the model takes at most "
                f"{cfg.max_position_embeddings}"
            )
        if ids.size and (ids.min() < 0 or ids.max() >= cfg.vocab_size):
            raise ShapeError(f"CLIP text: token ids must be in [0, {cfg.vocab_size}), got "
                             f"[{ids.min()}, {ids.max()}]")  # fmt: skip
        return ids.astype(np.int64)

    def forward(self, input_ids, attention_mask=None, output_hidden_states: bool = False,
                clip_skip: int = 0) -> CLIPTextOutput:  # fmt: skip
        """Encode (b, n) token ids; attention_mask (b, n) of 1/0 hides padding keys.

        clip_skip: take the states that many layers before the last (then final_layer_norm),
        as diffusers' pipelines do.
        """
        ids = self._ids(input_ids)
        b, n = ids.shape
        tm = self.text_model
        mask = None
        if attention_mask is not None:
            am = np.asarray(
                attention_mask.numpy() if isinstance(attention_mask, Tensor) else attention_mask
            )
            if am.shape != ids.shape:
                raise ShapeError(f"CLIP text: attention_mask {am.shape} does not match input_ids {ids.shape}")  # fmt: skip
            neg = np.finfo(np.float32).min
            causal = np.triu(np.full((n, n), neg, np.float32), 1)
            pad = np.where(am[:, None, None, :] > 0, 0.0, neg).astype(np.float32)
            mask = ember.from_numpy(np.minimum(causal[None, None], pad))
        x = tm.embeddings(ember.from_numpy(ids))
        states = [x]
        for layer in tm.encoder.layers:
            x = layer(x, mask)
            states.append(x)
        if not 0 <= clip_skip < len(tm.encoder.layers):
            raise ShapeError(f"CLIP text: clip_skip must be in [0, {len(tm.encoder.layers)}), got {clip_skip}")  # fmt: skip
        last = tm.final_layer_norm(states[-1 - clip_skip])
        eos = self.config.eos_token_id
        pos = ids.argmax(-1) if eos == 2 else (ids == eos).astype(np.int64).argmax(-1)
        pooled = last[ember.from_numpy(np.arange(b)), ember.from_numpy(pos)]
        return CLIPTextOutput(last, pooled, tuple(states) if output_hidden_states else None)

    # --- loading

    @classmethod
    def from_state_dict(cls, config: CLIPTextConfig | dict, weights: dict, dtype=None):
        """Build on the meta device and take transformers-named weights (float16 ones cast).

        Names may carry the ``text_model.`` prefix (diffusers' folders, transformers < 5) or not
        (transformers >= 5 saves the tower's modules at the top).
        """
        from ember.models._weights import assign_weights

        cfg = config if isinstance(config, CLIPTextConfig) else CLIPTextConfig.from_dict(config)
        with ember.device("meta"):
            model = cls(cfg)
        if not any(k.startswith("text_model.") for k in weights):  # transformers >= 5 drops it
            weights = {f"text_model.{k}": v for k, v in weights.items() if k not in _UNUSED}
        assign_weights(model, {k: v for k, v in weights.items() if k not in _UNUSED}, dtype)
        return model.eval()

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike):
        """A transformers CLIPTextModel folder (diffusers' ``text_encoder/``)."""
        p = Path(path)
        raw = read_json(p / "config.json")
        mt = raw.get("model_type", "clip_text_model")
        if mt not in ("clip_text_model", "clip"):
            raise FormatError(f"{p / 'config.json'}: model_type {mt!r} is not a CLIP text model")
        cfg = CLIPTextConfig.from_dict(raw, str(p / "config.json"))
        model = cls.from_state_dict(cfg, load_weights(p, "model"))
        model.source = str(p)
        return model


__all__ = ["CLIPTextConfig", "CLIPTextModel", "CLIPTextOutput"]
