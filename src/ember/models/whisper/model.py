"""Whisper: a convolutional-stem Transformer encoder over log-mel frames and a text decoder.

Module and parameter names are transformers' WhisperForConditionalGeneration's, so its
state_dict loads as is (``model.encoder.conv1``, ``model.encoder.layers.N.self_attn.q_proj``,
``model.decoder.layers.N.encoder_attn.k_proj``, ``proj_out`` tied to the token embedding).

Decoding uses two caches: the decoder's self-attention keys/values grow one position per step
(``ember.nn.KVCache``), and each layer's cross-attention keys/values are
projected from the encoder output once per audio window (``cross_kv``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

import ember
from ember import nn
from ember.errors import FormatError, ShapeError
from ember.nn import functional as F
from ember.tensor import Tensor


@dataclass
class WhisperConfig:
    """Hyper-parameters with transformers' WhisperConfig field names (defaults: tiny.en)."""

    vocab_size: int = 51864
    num_mel_bins: int = 80
    d_model: int = 384
    encoder_layers: int = 4
    decoder_layers: int = 4
    encoder_attention_heads: int = 6
    decoder_attention_heads: int = 6
    encoder_ffn_dim: int = 1536
    decoder_ffn_dim: int = 1536
    max_source_positions: int = 1500
    max_target_positions: int = 448
    activation_function: str = "gelu"
    scale_embedding: bool = False
    layer_norm_eps: float = 1e-5
    decoder_start_token_id: int = 50257
    eos_token_id: int = 50256
    suppress_tokens: list | None = None
    begin_suppress_tokens: list | None = None
    lang_ids: list | None = None
    alignment_heads: list | None = None
    model_type: str = "whisper"
    extra: dict = field(default_factory=dict, repr=False)

    @property
    def is_multilingual(self) -> bool:
        """Whether the vocabulary has language tokens in use (openai: n_vocab >= 51865)."""
        return self.vocab_size >= 51865

    @classmethod
    def from_dict(cls, d: dict) -> WhisperConfig:
        """Build from a config.json-style dict; unknown keys go to ``extra``."""
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in d.items() if k in names and k != "extra"}
        known["extra"] = {k: v for k, v in d.items() if k not in names}
        return cls(**known)


class WhisperAttention(nn.Module):
    """Multi-head attention; k_proj has no bias, as in Whisper.

    Three uses: the encoder's self-attention (every frame sees every frame), the decoder's
    causal self-attention over a KV cache (``causal=True``: ``F.cached_attention`` stores the
    new keys/values and attends over the cache in one op), and cross-attention to given keys
    and values (``kv``).
    """

    def __init__(self, d_model: int, num_heads: int, causal: bool = False) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ShapeError(f"d_model {d_model} is not a multiple of {num_heads} heads")
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.causal = causal
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model)
        self.q_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def heads(self, x: Tensor) -> Tensor:
        """(b, t, d) -> (b, heads, t, head_dim)."""
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of x, split into heads."""
        return self.heads(self.k_proj(x)), self.heads(self.v_proj(x))

    def forward(
        self,
        x: Tensor,
        kv: tuple[Tensor, Tensor] | None = None,
        cache: nn.KVCache | None = None,
        layer_idx: int = 0,
        mask: nn.CausalMask | None = None,
    ) -> Tensor:
        """Self-attention over x (causal: also over the cache), or attention to kv (keys, values)."""
        b, t, d = x.shape
        if self.causal and kv is None:
            shape = (b, t, self.num_heads, self.head_dim)
            q = self.q_proj(x).view(shape)
            k, v = self.k_proj(x).view(shape), self.v_proj(x).view(shape)
            return self.out_proj(F.cached_attention(q, k, v, mask, cache, layer_idx))
        q = self.heads(self.q_proj(x))
        k, v = self.project_kv(x) if kv is None else kv
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, d))


class WhisperEncoderLayer(nn.Module):
    """Pre-norm block: x + attn(ln(x)), then x + fc2(gelu(fc1(ln(x))))."""

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.self_attn = WhisperAttention(d, cfg.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.fc1 = nn.Linear(d, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class WhisperDecoderLayer(nn.Module):
    """Pre-norm block: causal self-attention, cross-attention to the audio, then the MLP."""

    def __init__(self, cfg: WhisperConfig, layer_idx: int) -> None:
        super().__init__()
        d = cfg.d_model
        self.layer_idx = layer_idx
        self.self_attn = WhisperAttention(d, cfg.decoder_attention_heads, causal=True)
        self.self_attn_layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.encoder_attn = WhisperAttention(d, cfg.decoder_attention_heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.fc1 = nn.Linear(d, cfg.decoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.decoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)

    def forward(
        self,
        x: Tensor,
        cross: tuple[Tensor, Tensor],
        mask: nn.CausalMask | None = None,
        cache: nn.KVCache | None = None,
    ) -> Tensor:
        h = self.self_attn_layer_norm(x)
        x = x + self.self_attn(h, cache=cache, layer_idx=self.layer_idx, mask=mask)
        x = x + self.encoder_attn(self.encoder_attn_layer_norm(x), kv=cross)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class WhisperEncoder(nn.Module):
    """Two GELU convolutions (the second halves the frame rate), positions, Transformer blocks."""

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.conv1 = nn.Conv1d(cfg.num_mel_bins, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(cfg.max_source_positions, d)
        self.layers = nn.ModuleList([WhisperEncoderLayer(cfg) for _ in range(cfg.encoder_layers)])
        self.layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)

    def forward(self, input_features: Tensor) -> Tensor:
        """(batch, n_mels, frames) log-mel -> (batch, frames // 2, d_model).

        30 s windows (3000 frames) are what the model was trained on; shorter inputs use the
        first positions (a speed/quality trade, as whisper.cpp's audio_ctx).
        """
        x = input_features
        if x.ndim == 2:
            x = x.unsqueeze(0)
        n_pos = self.embed_positions.weight.shape[0]
        if x.shape[1] != self.conv1.in_channels or x.shape[2] > 2 * n_pos:
            raise ShapeError(
                f"WhisperEncoder: expected (batch, {self.conv1.in_channels}, <= {2 * n_pos}) "
                f"log-mel features, got {tuple(x.shape)}"
            )
        x = F.gelu(self.conv1(x))
        x = F.gelu(self.conv2(x)).transpose(1, 2)
        x = x + self.embed_positions.weight[: x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class WhisperDecoder(nn.Module):
    """Token and learned position embeddings, blocks with cross-attention, final norm."""

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.embed_tokens = nn.Embedding(cfg.vocab_size, d)
        self.embed_positions = nn.Embedding(cfg.max_target_positions, d)
        self.layers = nn.ModuleList(
            [WhisperDecoderLayer(cfg, i) for i in range(cfg.decoder_layers)]
        )
        self.layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)

    def embed(self, input_ids: Tensor, past: int = 0) -> Tensor:
        """Token plus position embeddings (b, t, d_model) of ids at positions past.."""
        t = input_ids.shape[1]
        n_pos = self.embed_positions.weight.shape[0]
        if past + t > n_pos:
            raise ShapeError(f"WhisperDecoder: {past + t} positions, the model has {n_pos}")
        return self.embed_tokens(input_ids) + self.embed_positions.weight[past : past + t]

    def body(self, x: Tensor, cross: list, past=0, cache: nn.KVCache | None = None) -> Tensor:
        """The blocks and the final norm on embeddings x at positions past.. (an int, or a (b,)
        array the attention op reads when it runs: a step can be captured, see
        ``ember.nn.graph``). The caller advances the cache."""
        mask = nn.CausalMask(x.shape[1], past, device=x.device)
        for layer, kv in zip(self.layers, cross):
            x = layer(x, kv, mask, cache)
        return self.layer_norm(x)

    def forward(self, input_ids: Tensor, cross: list, cache: nn.KVCache | None = None) -> Tensor:
        """(batch, t) ids -> (batch, t, d_model) hidden states; past positions come from cache."""
        past = cache.pos if cache is not None else 0
        x = self.body(self.embed(input_ids, past), cross, past, cache)
        if cache is not None:
            cache.advance(input_ids.shape[1])
        return x


class WhisperModel(nn.Module):
    """Encoder plus decoder (transformers' ``model.`` prefix)."""

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        self.encoder = WhisperEncoder(cfg)
        self.decoder = WhisperDecoder(cfg)


class WhisperForConditionalGeneration(nn.Module):
    """Whisper with its output projection (tied to the token embedding)."""

    config_class = WhisperConfig

    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        self.config = config
        self.model = WhisperModel(config)
        self.proj_out = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.proj_out.weight = self.model.decoder.embed_tokens.weight

    # --- the pieces decoding uses

    def encode(self, input_features) -> Tensor:
        """Encoder output for (batch, n_mels, frames) or (n_mels, frames) features."""
        x = (
            input_features
            if isinstance(input_features, Tensor)
            else ember.from_numpy(np.ascontiguousarray(input_features, dtype=np.float32))
        )
        with ember.no_grad():
            return self.model.encoder(x)

    def cross_kv(self, encoder_hidden_states: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each decoder layer's cross-attention keys and values (batch, heads, frames, head_dim),
        projected once per window and laid out head by head (each head's keys contiguous)."""
        with ember.no_grad():
            out = []
            for layer in self.model.decoder.layers:
                k, v = layer.encoder_attn.project_kv(encoder_hidden_states)
                out.append((k.contiguous(), v.contiguous()))
            return out

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> nn.KVCache:
        """An empty self-attention cache for the decoder."""
        cfg = self.config
        hd = cfg.d_model // cfg.decoder_attention_heads
        n = max_len or cfg.max_target_positions
        return nn.KVCache(cfg.decoder_layers, batch, cfg.decoder_attention_heads, n, hd)

    def decode(self, input_ids, cross: list, cache: nn.KVCache | None = None) -> Tensor:
        """Logits (batch, t, vocab) for new tokens, given the cross keys/values and the cache."""
        ids = self._ids(input_ids)
        with ember.no_grad():
            return self.proj_out(self.model.decoder(ids, cross, cache))

    def decode_inputs(self, input_ids, past: int = 0) -> Tensor:
        """The decoder's input embeddings (batch, t, d_model) of new tokens at positions past.."""
        with ember.no_grad():
            return self.model.decoder.embed(self._ids(input_ids), past)

    def decode_body(self, x: Tensor, cross: list, past=0, cache: nn.KVCache | None = None):
        """Logits (batch, t, vocab) of embeddings x (``decode_inputs``) at positions past.. (an
        int, or a (batch,) int64 array read when the attention op runs). Everything a one-token
        step changes comes in as x, past and the cache's buffers, so the step can be captured
        and replayed (``ember.generation.whisper.DecoderSteps``). The caller advances the cache."""
        with ember.no_grad():
            return self.proj_out(self.model.decoder.body(x, cross, past, cache))

    @staticmethod
    def _ids(input_ids) -> Tensor:
        ids = input_ids if isinstance(input_ids, Tensor) else ember.tensor(np.asarray(input_ids))
        return ids.unsqueeze(0) if ids.ndim == 1 else ids

    def forward(self, input_features, decoder_input_ids) -> Tensor:
        """Logits (batch, t, vocab) of the decoder over the whole token prefix (no cache)."""
        enc = self.encode(input_features)
        return self.decode(decoder_input_ids, self.cross_kv(enc))

    # --- loading

    @classmethod
    def from_state_dict(cls, config: WhisperConfig | dict, weights: dict, dtype=None):
        """Build on the meta device and take the (HF-named) weights without copying floats."""
        from ember.models._weights import assign_weights

        cfg = config if isinstance(config, WhisperConfig) else WhisperConfig.from_dict(config)
        with ember.device("meta"):
            model = cls(cfg)
        weights = dict(weights)
        tied = weights.pop("proj_out.weight", None)
        expected = {k for k, _ in model.named_parameters()} - {"proj_out.weight"}
        missing = sorted(expected - set(weights))
        if missing:
            raise FormatError(f"Whisper weights lack {len(missing)} tensors, e.g. {missing[:5]}")
        assign_weights(model, weights, dtype, strict=False)
        model.proj_out.weight = model.model.decoder.embed_tokens.weight
        if tied is not None:
            emb = model.model.decoder.embed_tokens.weight
            if tied.shape != tuple(emb.shape) or not np.array_equal(np.asarray(tied), emb.numpy()):
                model.proj_out.weight = nn.Parameter(
                    ember.from_numpy(np.asarray(tied, dtype=np.float32)), requires_grad=False
                )
        return model.eval()

    @classmethod
    def from_ct2(cls, path: str | os.PathLike):
        """Load a CTranslate2 Whisper directory (model.bin, config.json) or a model.bin file."""
        from ember.models.whisper.ct2 import read_ct2, whisper_config_from_ct2, whisper_state_dict

        p = Path(path)
        ct2 = read_ct2(p)
        cfg_path = (p if p.is_dir() else p.parent) / "config.json"
        extra = json.loads(cfg_path.read_text()) if cfg_path.is_file() else None
        cfg = whisper_config_from_ct2(ct2, extra)
        model = cls.from_state_dict(cfg, whisper_state_dict(ct2))
        model.source = str(p)
        model.storage = ct2.summary()
        return model

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike):
        """A CTranslate2 directory (model.bin) or a Hugging Face one (config.json + safetensors)."""
        p = Path(path)
        if (p.is_file() and p.suffix == ".bin") or (p / "model.bin").is_file():
            return cls.from_ct2(p)
        if (p / "config.json").is_file():
            from ember.io import load_safetensors, load_safetensors_dir

            cfg = json.loads((p / "config.json").read_text())
            single = p / "model.safetensors"
            weights = load_safetensors(single) if single.is_file() else load_safetensors_dir(p)
            model = cls.from_state_dict(cfg, weights)
            model.source = str(p)
            return model
        raise FormatError(f"{path}: expected a CTranslate2 model.bin or a folder with config.json")
