"""UNet2DConditionModel: Stable Diffusion's noise predictor, with diffusers' names and config.

Modules and parameters are named as diffusers names them (``conv_in``,
``time_embedding.linear_1``, ``down_blocks.N.resnets.M``,
``down_blocks.N.attentions.M.transformer_blocks.K.attn1/attn2/ff``, ``mid_block``,
``up_blocks``, ``conv_norm_out``, ``conv_out``), and the config takes diffusers' config.json
fields, so a diffusers ``unet/`` folder loads as is. Block types: CrossAttnDownBlock2D,
DownBlock2D, UNetMidBlock2DCrossAttn, UpBlock2D, CrossAttnUpBlock2D (Stable Diffusion 1.x and
2.x); SDXL's added embeddings and other variants are refused with UnsupportedError.

A quirk kept from diffusers: config.json's ``attention_head_dim`` is the number of heads (its
``num_attention_heads`` falls back to it); each head is ``channels // heads`` wide.
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
from ember.models.diffusion._layers import (
    Attention,
    Downsample2D,
    ResnetBlock2D,
    Upsample2D,
    activation,
    check_count,
    config_from_dict,
    load_weights,
    read_json,
)
from ember.nn import functional as F
from ember.tensor import Tensor

DOWN_TYPES = ("CrossAttnDownBlock2D", "DownBlock2D")
UP_TYPES = ("CrossAttnUpBlock2D", "UpBlock2D")
# config fields whose non-default value selects a variant ember does not build
_MUST_BE = {
    "class_embed_type": None, "addition_embed_type": None, "encoder_hid_dim_type": None,
    "time_cond_proj_dim": None, "timestep_post_act": None, "time_embedding_act_fn": None,
    "num_class_embeds": None, "time_embedding_type": "positional",
    "resnet_time_scale_shift": "default", "dual_cross_attention": False,
    "attention_type": "default", "cross_attention_norm": None, "resnet_skip_time_act": False,
    "reverse_transformer_layers_per_block": None, "class_embeddings_concat": False,
}  # fmt: skip


def _per_block(value, n: int, name: str, where: str) -> list:
    """An int (or None) for every block, or a list of one per block."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise FormatError(f"{where}: {name} has {len(value)} entries for {n} blocks")
        return list(value)
    return [value] * n


@dataclass
class UNet2DConditionConfig:
    """diffusers' UNet2DConditionModel config.json fields (defaults: Stable Diffusion 1.x)."""

    sample_size: int | list | None = 64
    in_channels: int = 4
    out_channels: int = 4
    center_input_sample: bool = False
    flip_sin_to_cos: bool = True
    freq_shift: int = 0
    down_block_types: list = field(
        default_factory=lambda: ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"]
    )
    mid_block_type: str | None = "UNetMidBlock2DCrossAttn"
    up_block_types: list = field(default_factory=lambda: ["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3)
    only_cross_attention: bool | list = False
    block_out_channels: list = field(default_factory=lambda: [320, 640, 1280, 1280])
    layers_per_block: int | list = 2
    downsample_padding: int = 1
    mid_block_scale_factor: float = 1.0
    act_fn: str = "silu"
    norm_num_groups: int = 32
    norm_eps: float = 1e-5
    cross_attention_dim: int | list = 768
    transformer_layers_per_block: int | list = 1
    attention_head_dim: int | list = 8
    num_attention_heads: int | list | None = None
    use_linear_projection: bool = False
    upcast_attention: bool = False
    resnet_out_scale_factor: float = 1.0
    time_embedding_dim: int | None = None
    conv_in_kernel: int = 3
    conv_out_kernel: int = 3
    extra: dict = field(default_factory=dict, repr=False)

    def validate(self, where: str = "UNet config") -> None:
        """Refuse variants ember does not build and sizes no model has (one-line errors)."""
        for key, want in _MUST_BE.items():
            if self.extra.get(key, want) != want:
                raise UnsupportedError(
                    f"{where}: {key}={self.extra[key]!r} is not supported (ember builds the "
                    "Stable Diffusion 1.x/2.x UNet; SDXL, LCM and class-conditioned UNets are not)"
                )
        n = len(self.block_out_channels or [])
        if n == 0 or n > 8:
            raise FormatError(f"{where}: block_out_channels must list 1 to 8 sizes, got {n}")
        for name in ("down_block_types", "up_block_types"):
            if len(getattr(self, name)) != n:
                raise FormatError(
                    f"{where}: {name} has {len(getattr(self, name))} blocks, block_out_channels {n}"
                )
        for t in self.down_block_types:
            if t not in DOWN_TYPES:
                raise UnsupportedError(f"{where}: down block {t!r} is not one of {DOWN_TYPES}")
        for t in self.up_block_types:
            if t not in UP_TYPES:
                raise UnsupportedError(f"{where}: up block {t!r} is not one of {UP_TYPES}")
        if self.mid_block_type not in ("UNetMidBlock2DCrossAttn", None):
            raise UnsupportedError(
                f"{where}: mid block {self.mid_block_type!r} is not UNetMidBlock2DCrossAttn"
            )
        if any(_per_block(self.only_cross_attention, n, "only_cross_attention", where)):
            raise UnsupportedError(f"{where}: only_cross_attention UNets are not supported")
        groups = check_count(self.norm_num_groups, "norm_num_groups", where)
        for c in self.block_out_channels:
            if check_count(c, "block_out_channels", where) % groups:
                raise FormatError(
                    f"{where}: block_out_channels {c} is not a multiple of norm_num_groups {groups}"
                )
        for name in ("in_channels", "out_channels"):
            check_count(getattr(self, name), name, where)
        for name in ("layers_per_block", "transformer_layers_per_block"):
            for v in _per_block(getattr(self, name), n, name, where):
                check_count(v, name, where, high=64)
        for v in _per_block(self.cross_attention_dim, n, "cross_attention_dim", where):
            check_count(v, "cross_attention_dim", where)
        for c, h in zip(self.block_out_channels, self.heads):
            if check_count(h, "attention_head_dim", where, high=c) and c % h:
                raise FormatError(f"{where}: {c} channels do not split into {h} attention heads")
        for name in ("conv_in_kernel", "conv_out_kernel"):
            if check_count(getattr(self, name), name, where, high=15) % 2 == 0:
                raise FormatError(f"{where}: {name} must be odd, got {getattr(self, name)}")
        if self.act_fn not in ("silu", "swish", "gelu", "mish", "relu"):
            activation(self.act_fn, where)

    @classmethod
    def from_dict(cls, d: dict, where: str = "UNet config") -> UNet2DConditionConfig:
        """From a diffusers config.json dict (unknown keys kept in ``extra``), checked."""
        return config_from_dict(cls, d, where)

    @property
    def heads(self) -> list[int]:
        """Attention heads per block (num_attention_heads, else attention_head_dim, as diffusers)."""
        n = len(self.block_out_channels)
        value = self.num_attention_heads or self.attention_head_dim
        return _per_block(value, n, "attention_head_dim", "UNet config")

    def per_block(self, name: str) -> list:
        """A field that may be one value or one per block, as a list of one per block."""
        return _per_block(getattr(self, name), len(self.block_out_channels), name, "UNet config")


def timestep_embedding(t: np.ndarray, dim: int, flip_sin_to_cos: bool, shift: float) -> Tensor:
    """Sinusoidal embedding (b, dim) of timesteps (b,), in float32 as diffusers computes it."""
    half = dim // 2
    exponent = -math.log(10000.0) * np.arange(half, dtype=np.float32) / np.float32(half - shift)
    args = t.astype(np.float32)[:, None] * np.exp(exponent.astype(np.float32))[None, :]
    sin, cos = np.sin(args), np.cos(args)
    emb = np.concatenate([cos, sin] if flip_sin_to_cos else [sin, cos], axis=-1)
    if dim % 2:
        emb = np.pad(emb, ((0, 0), (0, 1)))
    return ember.from_numpy(np.ascontiguousarray(emb, dtype=np.float32))


class TimestepEmbedding(nn.Module):
    """linear_1, act, linear_2: the sinusoidal embedding -> the resnets' time embedding."""

    def __init__(self, cin: int, dim: int, act) -> None:
        super().__init__()
        self.act = act
        self.linear_1 = nn.Linear(cin, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        """(b, cin) -> (b, dim)."""
        return self.linear_2(self.act(self.linear_1(x)))


class GEGLU(nn.Module):
    """proj to 2 x inner, then hidden * gelu(gate)."""

    def __init__(self, dim: int, inner: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, inner * 2)

    def forward(self, x: Tensor) -> Tensor:
        """(..., dim) -> (..., inner)."""
        hidden, gate = self.proj(x).chunk(2, dim=-1)
        return F.geglu(gate.contiguous(), hidden.contiguous())


class FeedForward(nn.Module):
    """net.0 (GEGLU), net.1 (dropout), net.2 (Linear back to dim)."""

    def __init__(self, dim: int, mult: int = 4) -> None:
        super().__init__()
        self.net = nn.ModuleList(
            [GEGLU(dim, dim * mult), nn.Dropout(0.0), nn.Linear(dim * mult, dim)]
        )

    def forward(self, x: Tensor) -> Tensor:
        """(..., dim) -> (..., dim)."""
        return self.net[2](self.net[0](x))


class BasicTransformerBlock(nn.Module):
    """Self-attention, cross-attention over the text, GEGLU feed-forward; each pre-LayerNorm + residual."""

    def __init__(self, dim: int, heads: int, head_dim: int, context_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads, head_dim)
        self.norm2 = nn.LayerNorm(dim)
        self.attn2 = Attention(dim, heads, head_dim, context_dim=context_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x: Tensor, context: Tensor) -> Tensor:
        """(b, n, dim), text states (b, m, context_dim) -> (b, n, dim)."""
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context) + x
        return self.ff(self.norm3(x)) + x


class Transformer2DModel(nn.Module):
    """GroupNorm, proj_in (1x1 conv or Linear), transformer blocks, proj_out, plus the input."""

    def __init__(
        self, channels: int, heads: int, context_dim: int, layers: int, groups: int, linear: bool
    ) -> None:
        super().__init__()
        self.linear = linear
        head_dim = channels // heads
        self.norm = nn.GroupNorm(groups, channels, eps=1e-6)
        proj = (lambda: nn.Linear(channels, channels)) if linear else (lambda: nn.Conv2d(channels, channels, 1))  # fmt: skip
        self.proj_in = proj()
        self.transformer_blocks = nn.ModuleList(
            [BasicTransformerBlock(channels, heads, head_dim, context_dim) for _ in range(layers)]
        )
        self.proj_out = proj()

    def forward(self, x: Tensor, context: Tensor) -> Tensor:
        """(b, c, h, w), text states -> (b, c, h, w)."""
        b, c, h, w = x.shape
        y = self.norm(x)
        if not self.linear:
            y = self.proj_in(y)
        y = y.reshape(b, c, h * w).transpose(1, 2)
        if self.linear:
            y = self.proj_in(y)
        for block in self.transformer_blocks:
            y = block(y, context)
        if self.linear:
            y = self.proj_out(y)
        y = y.transpose(1, 2).reshape(b, c, h, w)
        if not self.linear:
            y = self.proj_out(y)
        return y + x


class _Block(nn.Module):
    """Common parts of the down, mid and up blocks: resnets and (for cross-attention) attentions."""

    def _build(self, cfg: UNet2DConditionConfig, ins: list[int], cout: int, temb: int, i: int,
               cross: bool, scale: float) -> None:  # fmt: skip
        act = activation(cfg.act_fn, "UNet config")
        g, eps = cfg.norm_num_groups, cfg.norm_eps
        self.resnets = nn.ModuleList(
            [ResnetBlock2D(c, cout, temb, g, eps, act, scale) for c in ins]
        )  # fmt: skip
        if cross:
            layers = cfg.per_block("transformer_layers_per_block")[i]
            ctx = cfg.per_block("cross_attention_dim")[i]
            heads = cfg.heads[i]
            n = len(ins) - 1 if isinstance(self, UNetMidBlock2DCrossAttn) else len(ins)
            self.attentions = nn.ModuleList(
                [Transformer2DModel(cout, heads, ctx, layers, g, cfg.use_linear_projection)
                 for _ in range(n)]
            )  # fmt: skip


class DownBlock2D(_Block):
    """Resnets (with cross-attention in CrossAttnDownBlock2D), then a strided conv."""

    def __init__(self, cfg: UNet2DConditionConfig, i: int, cin: int, cout: int, temb: int,
                 cross: bool) -> None:  # fmt: skip
        super().__init__()
        n = cfg.per_block("layers_per_block")[i]
        self._build(
            cfg, [cin] + [cout] * (n - 1), cout, temb, i, cross, cfg.resnet_out_scale_factor
        )
        if i < len(cfg.block_out_channels) - 1:
            self.downsamplers = nn.ModuleList([Downsample2D(cout, cfg.downsample_padding)])

    def forward(self, x: Tensor, temb: Tensor, ctx: Tensor) -> tuple[Tensor, list[Tensor]]:
        """The block's output and every state the up path takes as a skip connection."""
        skips = []
        attns = getattr(self, "attentions", None)
        for j, resnet in enumerate(self.resnets):
            x = resnet(x, temb)
            if attns is not None:
                x = attns[j](x, ctx)
            skips.append(x)
        if hasattr(self, "downsamplers"):
            x = self.downsamplers[0](x)
            skips.append(x)
        return x, skips


class CrossAttnDownBlock2D(DownBlock2D):
    """DownBlock2D with a Transformer2DModel after each resnet."""


class UNetMidBlock2DCrossAttn(_Block):
    """resnet, then (attention, resnet) pairs."""

    def __init__(self, cfg: UNet2DConditionConfig, temb: int) -> None:
        super().__init__()
        c = cfg.block_out_channels[-1]
        self._build(cfg, [c, c], c, temb, len(cfg.block_out_channels) - 1, True,
                    cfg.mid_block_scale_factor)  # fmt: skip

    def forward(self, x: Tensor, temb: Tensor, ctx: Tensor) -> Tensor:
        """(b, c, h, w) -> (b, c, h, w)."""
        x = self.resnets[0](x, temb)
        for attn, resnet in zip(self.attentions, self.resnets[1:]):
            x = resnet(attn(x, ctx), temb)
        return x


class UpBlock2D(_Block):
    """Resnets over (state, skip) concatenations (with cross-attention in CrossAttnUpBlock2D), then x2."""

    def __init__(self, cfg: UNet2DConditionConfig, i: int, cin: int, prev: int, cout: int,
                 temb: int, cross: bool) -> None:  # fmt: skip
        super().__init__()
        rev = list(reversed(cfg.per_block("layers_per_block")))
        n = rev[i] + 1
        ins = [(prev if j == 0 else cout) + (cin if j == n - 1 else cout) for j in range(n)]
        k = len(cfg.block_out_channels) - 1 - i  # the matching down block's per-block settings
        self._build(cfg, ins, cout, temb, k, cross, cfg.resnet_out_scale_factor)
        if i < len(cfg.block_out_channels) - 1:
            self.upsamplers = nn.ModuleList([Upsample2D(cout)])

    def forward(self, x: Tensor, skips: list[Tensor], temb: Tensor, ctx: Tensor,
                size: tuple[int, int] | None) -> Tensor:  # fmt: skip
        """Take this block's skips (last first), then up-sample to ``size`` or x2."""
        attns = getattr(self, "attentions", None)
        for j, resnet in enumerate(self.resnets):
            x = resnet(ember.cat([x, skips[-1 - j]], dim=1), temb)
            if attns is not None:
                x = attns[j](x, ctx)
        if hasattr(self, "upsamplers"):
            x = self.upsamplers[0](x, size)
        return x


class CrossAttnUpBlock2D(UpBlock2D):
    """UpBlock2D with a Transformer2DModel after each resnet."""


class UNet2DConditionModel(nn.Module):
    """Predicts the noise (or v) in latents (b, 4, h, w) at a timestep, given text states."""

    def __init__(self, config: UNet2DConditionConfig) -> None:
        super().__init__()
        self.config = cfg = config
        chans = cfg.block_out_channels
        act = activation(cfg.act_fn, "UNet config")
        temb = cfg.time_embedding_dim or chans[0] * 4
        self.conv_in = nn.Conv2d(cfg.in_channels, chans[0], cfg.conv_in_kernel,
                                 padding=(cfg.conv_in_kernel - 1) // 2)  # fmt: skip
        self.time_embedding = TimestepEmbedding(chans[0], temb, act)
        self.down_blocks = nn.ModuleList()
        cout = chans[0]
        for i, kind in enumerate(cfg.down_block_types):
            cin, cout = cout, chans[i]
            cls = CrossAttnDownBlock2D if kind == "CrossAttnDownBlock2D" else DownBlock2D
            self.down_blocks.append(cls(cfg, i, cin, cout, temb, cls is CrossAttnDownBlock2D))
        if cfg.mid_block_type is not None:
            self.mid_block = UNetMidBlock2DCrossAttn(cfg, temb)
        self.up_blocks = nn.ModuleList()
        rev = list(reversed(chans))
        cout = rev[0]
        for i, kind in enumerate(cfg.up_block_types):
            prev, cout = cout, rev[i]
            cin = rev[min(i + 1, len(chans) - 1)]
            cls = CrossAttnUpBlock2D if kind == "CrossAttnUpBlock2D" else UpBlock2D
            self.up_blocks.append(cls(cfg, i, cin, prev, cout, temb, cls is CrossAttnUpBlock2D))
        self.conv_norm_out = nn.GroupNorm(cfg.norm_num_groups, chans[0], eps=cfg.norm_eps)
        self.conv_out = nn.Conv2d(chans[0], cfg.out_channels, cfg.conv_out_kernel,
                                  padding=(cfg.conv_out_kernel - 1) // 2)  # fmt: skip
        self.act = act
        self.source: str | None = None

    def _check(self, sample: Tensor, ctx: Tensor) -> None:
        cfg = self.config
        if sample.ndim != 4 or sample.shape[1] != cfg.in_channels or 0 in sample.shape:
            raise ShapeError(
                f"UNet: sample must be (batch, {cfg.in_channels}, height, width), "
                f"got {tuple(sample.shape)}"
            )
        dims = set(cfg.per_block("cross_attention_dim"))
        if ctx.ndim != 3 or ctx.shape[0] != sample.shape[0] or ctx.shape[2] not in dims:
            raise ShapeError(
                f"UNet: encoder_hidden_states must be ({sample.shape[0]}, tokens, "
                f"{'/'.join(map(str, sorted(dims)))}), got {tuple(ctx.shape)}"
            )

    def forward(self, sample, timestep, encoder_hidden_states) -> Tensor:
        """Noise prediction (b, out_channels, h, w) for latents (b, in_channels, h, w).

        timestep: one number for the batch or one per sample (int or float);
        encoder_hidden_states: the text encoder's last hidden state (b, tokens, dim).
        """
        cfg = self.config
        x = sample if isinstance(sample, Tensor) else ember.tensor(np.asarray(sample, np.float32))
        ctx = encoder_hidden_states
        if not isinstance(ctx, Tensor):
            ctx = ember.tensor(np.asarray(ctx, np.float32))
        self._check(x, ctx)
        t = np.asarray(timestep.numpy() if isinstance(timestep, Tensor) else timestep)
        t = np.broadcast_to(t.reshape(-1), (x.shape[0],)) if t.size == 1 else t.reshape(-1)
        if t.shape[0] != x.shape[0]:
            raise ShapeError(f"UNet: {t.shape[0]} timesteps for a batch of {x.shape[0]}")
        emb = self.time_embedding(
            timestep_embedding(t, cfg.block_out_channels[0], cfg.flip_sin_to_cos, cfg.freq_shift)
        )
        if cfg.center_input_sample:
            x = 2 * x - 1.0
        up_factor = 2 ** (len(cfg.block_out_channels) - 1)
        forward_size = any(d % up_factor for d in x.shape[-2:])
        x = self.conv_in(x)
        skips = [x]
        for block in self.down_blocks:
            x, res = block(x, emb, ctx)
            skips += res
        if hasattr(self, "mid_block"):
            x = self.mid_block(x, emb, ctx)
        for block in self.up_blocks:
            n = len(block.resnets)
            res, skips = skips[-n:], skips[:-n]
            size = tuple(skips[-1].shape[2:]) if forward_size and skips else None
            x = block(x, res, emb, ctx, size)
        return self.conv_out(self.act(self.conv_norm_out(x)))

    # --- loading

    @classmethod
    def from_state_dict(cls, config: UNet2DConditionConfig | dict, weights: dict, dtype=None):
        """Build on the meta device and take diffusers-named weights (float16 ones cast)."""
        from ember.models._weights import assign_weights

        cfg = config if isinstance(config, UNet2DConditionConfig) else UNet2DConditionConfig.from_dict(config)  # fmt: skip
        with ember.device("meta"):
            model = cls(cfg)
        assign_weights(model, weights, dtype)
        return model.eval()

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike):
        """A diffusers ``unet/`` folder: config.json and diffusion_pytorch_model.safetensors."""
        p = Path(path)
        cfg = UNet2DConditionConfig.from_dict(read_json(p / "config.json"), str(p / "config.json"))
        model = cls.from_state_dict(cfg, load_weights(p, "diffusion_pytorch_model"))
        model.source = str(p)
        return model


__all__ = ["UNet2DConditionConfig", "UNet2DConditionModel", "timestep_embedding"]
