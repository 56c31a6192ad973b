"""Vision Transformer (ViT-B/16 and friends) with Hugging Face's tensor names and config fields.

Module names are those of the checkpoints on the Hub (`google/vit-base-patch16-224`):
`embeddings.patch_embeddings.projection`, `encoder.layer.N.attention.attention.query`,
`encoder.layer.N.intermediate.dense`, ... (transformers 4.x's ViTModel state_dict). transformers
5 renamed these in memory (`layers.N.attention.q_proj`, `mlp.fc1`, ...); such state_dicts load too
(renamed on the way in by `legacy_key`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, fields
from pathlib import Path

import ember
from ember import nn
from ember.errors import FormatError, ShapeError
from ember.models.vision._weights import apply_weights, build_checked, checkpoint_from, class_count

F = nn.functional


@dataclass
class ViTConfig:
    """Hugging Face ViTConfig's fields (defaults: ViT-B/16 at 224x224)."""

    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    qkv_bias: bool = True
    num_labels: int = 1000
    id2label: dict | None = None

    @classmethod
    def from_dict(cls, d: dict) -> ViTConfig:
        """Known fields from a config.json dict (num_labels from id2label when absent)."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if "num_labels" not in d and d.get("id2label"):
            kw["num_labels"] = len(d["id2label"])
        return cls(**kw)


_ACTS = {"gelu": lambda x: F.gelu(x), "gelu_new": lambda x: F.gelu(x, approximate="tanh")}
_ACTS.update(gelu_pytorch_tanh=_ACTS["gelu_new"], relu=F.relu)


class ViTPatchEmbeddings(nn.Module):
    """Image -> (N, num_patches, hidden) with one strided conv."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.image_size, self.patch_size = config.image_size, config.patch_size
        self.num_patches = (config.image_size // config.patch_size) ** 2
        p = config.patch_size
        self.projection = nn.Conv2d(config.num_channels, config.hidden_size, p, stride=p)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """(N, C, H, W) -> (N, H/p * W/p, hidden)."""
        if tuple(x.shape[-2:]) != (self.image_size, self.image_size):
            raise ShapeError(
                f"ViT: input image size {tuple(x.shape[-2:])} doesn't match the model's "
                f"({self.image_size}, {self.image_size})"
            )
        return self.projection(x).flatten(2).transpose(1, 2)


class ViTEmbeddings(nn.Module):
    """[CLS] + patch embeddings + learned position embeddings."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(ember.zeros(1, 1, config.hidden_size))
        self.patch_embeddings = ViTPatchEmbeddings(config)
        n = self.patch_embeddings.num_patches
        self.position_embeddings = nn.Parameter(ember.randn(1, n + 1, config.hidden_size) * 0.02)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """(N, C, H, W) -> (N, 1 + num_patches, hidden)."""
        e = self.patch_embeddings(x)
        cls = self.cls_token.expand(e.shape[0], -1, -1)
        return self.dropout(ember.cat([cls, e], dim=1) + self.position_embeddings)


class ViTSelfAttention(nn.Module):
    """query/key/value projections and scaled dot-product attention over all tokens."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        d, h = config.hidden_size, config.num_attention_heads
        if d % h:
            raise ShapeError(f"ViT: hidden_size {d} is not a multiple of num_attention_heads {h}")
        self.num_heads, self.head_dim = h, d // h
        self.query = nn.Linear(d, d, bias=config.qkv_bias)
        self.key = nn.Linear(d, d, bias=config.qkv_bias)
        self.value = nn.Linear(d, d, bias=config.qkv_bias)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """(N, T, D) -> (N, T, D) attention output before the output projection."""
        n, t, d = x.shape
        split = lambda y: y.reshape(n, t, self.num_heads, self.head_dim).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        o = F.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(self.head_dim))
        return o.transpose(1, 2).reshape(n, t, d)


class ViTSelfOutput(nn.Module):
    """Attention output projection (`attention.output.dense`)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """Project back to the residual stream."""
        return self.dropout(self.dense(x))


class ViTAttention(nn.Module):
    """`attention.attention` (self-attention) + `attention.output` (projection)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.attention = ViTSelfAttention(config)
        self.output = ViTSelfOutput(config)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """Projected self-attention of x."""
        return self.output(self.attention(x))


class ViTIntermediate(nn.Module):
    """MLP up-projection and activation (`intermediate.dense`)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = _ACTS[config.hidden_act]

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """act(dense(x))."""
        return self.act(self.dense(x))


class ViTOutput(nn.Module):
    """MLP down-projection (`output.dense`)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """dense(x)."""
        return self.dropout(self.dense(x))


class ViTLayer(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then h + mlp(ln(h))."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.attention = ViTAttention(config)
        self.intermediate = ViTIntermediate(config)
        self.output = ViTOutput(config)
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.layernorm_after = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """One encoder block."""
        h = x + self.attention(self.layernorm_before(x))
        return h + self.output(self.intermediate(self.layernorm_after(h)))


class ViTEncoder(nn.Module):
    """The stack of blocks (`encoder.layer.N`)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList([ViTLayer(config) for _ in range(config.num_hidden_layers)])

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """All blocks in order."""
        for block in self.layer:
            x = block(x)
        return x


class ViTPooler(nn.Module):
    """tanh(dense([CLS])), as HF ViTModel's pooler."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """(N, T, D) -> (N, D)."""
        return ember.tanh(self.dense(x[:, 0]))


class ViTModel(nn.Module):
    """The ViT encoder: returns (last_hidden_state, pooler_output or None)."""

    def __init__(self, config: ViTConfig | None = None, add_pooling_layer: bool = True) -> None:
        super().__init__()
        self.config = config = config or ViTConfig()
        self.embeddings = ViTEmbeddings(config)
        self.encoder = ViTEncoder(config)
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.pooler = ViTPooler(config) if add_pooling_layer else None

    def forward(self, pixel_values: ember.Tensor):
        """(N, C, H, W) -> (last_hidden_state (N, T, D), pooler_output (N, D) or None)."""
        h = self.layernorm(self.encoder(self.embeddings(pixel_values)))
        return h, (None if self.pooler is None else self.pooler(h))

    @classmethod
    def from_pretrained(cls, path) -> ViTModel:
        """A ViTModel from a Hugging Face folder (config.json + weights)."""
        config, sd = _read_folder(path)
        pool = any(k.startswith("pooler.") for k in sd)
        sd = {k[4:] if k.startswith("vit.") else k: v for k, v in sd.items()}
        sd = {k: v for k, v in sd.items() if not k.startswith("classifier.")}
        model = build_checked(lambda: cls(config, add_pooling_layer=pool), sd, legacy_key)
        apply_weights(model, sd, legacy_key)
        return model.eval()


class ViTForImageClassification(nn.Module):
    """ViT (no pooler) + a linear classifier on the final [CLS] token; returns logits."""

    def __init__(self, config: ViTConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or ViTConfig()
        self.num_labels = config.num_labels
        self.vit = ViTModel(config, add_pooling_layer=False)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, pixel_values: ember.Tensor) -> ember.Tensor:
        """(N, C, H, W) -> (N, num_labels) logits."""
        h, _ = self.vit(pixel_values)
        return self.classifier(h[:, 0])

    @classmethod
    def from_pretrained(cls, path) -> ViTForImageClassification:
        """From a Hugging Face folder (config.json + model.safetensors / pytorch_model.bin)."""
        config, sd = _read_folder(path)
        if "classifier.weight" in sd:
            config.num_labels = class_count(sd, "classifier.weight", config.hidden_size)
        model = build_checked(lambda: cls(config), sd, legacy_key)
        apply_weights(model, sd, legacy_key)
        return model.eval()


_V5 = [
    (r"(^|\.)layers\.(\d+)\.", r"\1encoder.layer.\2."),
    (r"\.attention\.q_proj\.", ".attention.attention.query."),
    (r"\.attention\.k_proj\.", ".attention.attention.key."),
    (r"\.attention\.v_proj\.", ".attention.attention.value."),
    (r"\.attention\.o_proj\.", ".attention.output.dense."),
    (r"\.mlp\.fc1\.", ".intermediate.dense."),
    (r"\.mlp\.fc2\.", ".output.dense."),
]


def legacy_key(key: str) -> str:
    """A transformers-5 ViT key (`layers.0.mlp.fc1.weight`) as the Hub checkpoints spell it."""
    for pat, rep in _V5:
        key = re.sub(pat, rep, key)
    return key


def _read_folder(path) -> tuple[ViTConfig, dict]:
    p = Path(path)
    cfg = p / "config.json" if p.is_dir() else p.parent / "config.json"
    if not cfg.is_file():
        raise FormatError(f"{p}: no config.json next to the weights (a Hugging Face ViT folder)")
    try:
        config = ViTConfig.from_dict(json.loads(cfg.read_text()))
    except (ValueError, TypeError, RecursionError) as e:
        raise FormatError(f"{cfg}: not a usable ViT config.json ({e})") from None
    sd = checkpoint_from(p)
    _check_config(config, cfg, len(sd))
    return config, sd


def _check_config(config: ViTConfig, where, n_tensors: int) -> None:
    """Sizes a config.json may give, checked before any module is built from them."""
    for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "image_size", "patch_size", "num_channels", "num_labels"):  # fmt: skip
        v = getattr(config, name)
        if type(v) is not int or v < 1:
            raise FormatError(f"{where}: {name} must be a positive integer, found {v!r:.40}")
    if config.hidden_size % config.num_attention_heads:
        raise FormatError(
            f"{where}: hidden_size {config.hidden_size} is not a multiple of "
            f"num_attention_heads {config.num_attention_heads}"
        )
    if config.patch_size > config.image_size:
        raise FormatError(
            f"{where}: patch_size {config.patch_size} exceeds image_size {config.image_size}"
        )
    if config.num_hidden_layers > n_tensors:  # every layer holds tensors of its own
        raise FormatError(
            f"{where}: num_hidden_layers {config.num_hidden_layers} but the checkpoint holds "
            f"only {n_tensors} tensors"
        )


def vit_b_16(weights=None, num_labels: int = 1000) -> ViTForImageClassification:
    """ViT-B/16 at 224x224 for classification; weights: HF folder, checkpoint path or state_dict."""
    if isinstance(weights, (str, Path)) and Path(weights).is_dir():
        return ViTForImageClassification.from_pretrained(weights)
    model = ViTForImageClassification(ViTConfig(num_labels=num_labels))
    if weights is not None:
        apply_weights(model, checkpoint_from(weights), legacy_key)
        model.eval()
    return model
