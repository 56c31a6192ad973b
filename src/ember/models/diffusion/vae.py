"""AutoencoderKL: Stable Diffusion's VAE (images <-> latents), with diffusers' names and config.

``encoder.conv_in``, ``encoder.down_blocks.N.resnets.M``, ``encoder.mid_block``,
``quant_conv``, ``post_quant_conv``, ``decoder.conv_in``, ``decoder.mid_block.attentions.0``,
``decoder.up_blocks.N.resnets.M``, ``decoder.up_blocks.N.upsamplers.0.conv``,
``decoder.conv_norm_out``, ``decoder.conv_out``; older checkpoints' attention names
(``query``/``key``/``value``/``proj_attn``) are renamed at load. ``decode`` takes latents as the
UNet produces them divided by ``scaling_factor`` (the pipeline does that); ``encode`` returns the
posterior's mean and log-variance.
"""

from __future__ import annotations

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
    rename_old_attention,
)
from ember.tensor import Tensor


@dataclass
class AutoencoderKLConfig:
    """diffusers' AutoencoderKL config.json fields (defaults: Stable Diffusion's VAE)."""

    in_channels: int = 3
    out_channels: int = 3
    down_block_types: list = field(default_factory=lambda: ["DownEncoderBlock2D"] * 4)
    up_block_types: list = field(default_factory=lambda: ["UpDecoderBlock2D"] * 4)
    block_out_channels: list = field(default_factory=lambda: [128, 256, 512, 512])
    layers_per_block: int = 2
    act_fn: str = "silu"
    latent_channels: int = 4
    norm_num_groups: int = 32
    sample_size: int = 512
    scaling_factor: float = 0.18215
    shift_factor: float | None = None
    force_upcast: bool = True
    use_quant_conv: bool = True
    use_post_quant_conv: bool = True
    mid_block_add_attention: bool = True
    extra: dict = field(default_factory=dict, repr=False)

    def validate(self, where: str = "VAE config") -> None:
        """Refuse block types ember does not build and sizes no model has."""
        n = len(self.block_out_channels or [])
        if n == 0 or n > 8:
            raise FormatError(f"{where}: block_out_channels must list 1 to 8 sizes, got {n}")
        for name, want in (("down_block_types", "DownEncoderBlock2D"),
                           ("up_block_types", "UpDecoderBlock2D")):  # fmt: skip
            kinds = getattr(self, name)
            if len(kinds) != n:
                raise FormatError(
                    f"{where}: {name} has {len(kinds)} blocks, block_out_channels {n}"
                )
            for k in kinds:
                if k != want:
                    raise UnsupportedError(f"{where}: {name} entry {k!r} is not {want!r}")
        groups = check_count(self.norm_num_groups, "norm_num_groups", where)
        for c in self.block_out_channels:
            if check_count(c, "block_out_channels", where) % groups:
                raise FormatError(
                    f"{where}: block_out_channels {c} is not a multiple of norm_num_groups {groups}"
                )
        for name in ("in_channels", "out_channels", "latent_channels"):
            check_count(getattr(self, name), name, where)
        check_count(self.layers_per_block, "layers_per_block", where, high=64)
        activation(self.act_fn, where)
        sf = self.scaling_factor
        if isinstance(sf, bool) or not isinstance(sf, (int, float)) or not 0 < sf < 1e6:
            raise FormatError(f"{where}: scaling_factor must be a positive number, got {sf!r}")
        if self.extra.get("norm_type", "group") != "group":
            raise UnsupportedError(f"{where}: norm_type {self.extra['norm_type']!r} is not 'group'")

    @classmethod
    def from_dict(cls, d: dict, where: str = "VAE config") -> AutoencoderKLConfig:
        """From a diffusers config.json dict (unknown keys kept in ``extra``), checked."""
        return config_from_dict(cls, d, where)


class _MidBlock(nn.Module):
    """UNetMidBlock2D without a time embedding: resnet, (attention, resnet)."""

    def __init__(self, cfg: AutoencoderKLConfig, act) -> None:
        super().__init__()
        c, g = cfg.block_out_channels[-1], cfg.norm_num_groups
        self.resnets = nn.ModuleList([ResnetBlock2D(c, c, None, g, 1e-6, act) for _ in range(2)])
        if cfg.mid_block_add_attention:
            self.attentions = nn.ModuleList(
                [Attention(c, 1, c, bias=True, norm_groups=g, eps=1e-6)]
            )

    def forward(self, x: Tensor) -> Tensor:
        """(b, c, h, w) -> (b, c, h, w)."""
        x = self.resnets[0](x)
        if hasattr(self, "attentions"):
            x = self.attentions[0](x)
        return self.resnets[1](x)


class _EncoderBlock(nn.Module):
    """DownEncoderBlock2D: resnets, then a stride-2 conv padded at the bottom right."""

    def __init__(self, cin: int, cout: int, n: int, groups: int, act, down: bool) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(
            [
                ResnetBlock2D(cin if j == 0 else cout, cout, None, groups, 1e-6, act)
                for j in range(n)
            ]
        )
        if down:
            self.downsamplers = nn.ModuleList([Downsample2D(cout, padding=0)])

    def forward(self, x: Tensor) -> Tensor:
        """(b, cin, h, w) -> (b, cout, h/2, w/2) (or h, w for the last block)."""
        for r in self.resnets:
            x = r(x)
        return self.downsamplers[0](x) if hasattr(self, "downsamplers") else x


class _DecoderBlock(nn.Module):
    """UpDecoderBlock2D: resnets, then nearest x2 and a conv."""

    def __init__(self, cin: int, cout: int, n: int, groups: int, act, up: bool) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(
            [
                ResnetBlock2D(cin if j == 0 else cout, cout, None, groups, 1e-6, act)
                for j in range(n)
            ]
        )
        if up:
            self.upsamplers = nn.ModuleList([Upsample2D(cout)])

    def forward(self, x: Tensor) -> Tensor:
        """(b, cin, h, w) -> (b, cout, 2h, 2w) (or h, w for the last block)."""
        for r in self.resnets:
            x = r(x)
        return self.upsamplers[0](x) if hasattr(self, "upsamplers") else x


class Encoder(nn.Module):
    """Image (b, 3, H, W) -> moments (b, 2 * latent_channels, H/f, W/f)."""

    def __init__(self, cfg: AutoencoderKLConfig) -> None:
        super().__init__()
        ch, g = cfg.block_out_channels, cfg.norm_num_groups
        self.act = act = activation(cfg.act_fn, "VAE config")
        self.conv_in = nn.Conv2d(cfg.in_channels, ch[0], 3, padding=1)
        self.down_blocks = nn.ModuleList(
            [_EncoderBlock(ch[max(i - 1, 0)], ch[i], cfg.layers_per_block, g, act, i < len(ch) - 1)
             for i in range(len(ch))]
        )  # fmt: skip
        self.mid_block = _MidBlock(cfg, act)
        self.conv_norm_out = nn.GroupNorm(g, ch[-1], eps=1e-6)
        self.conv_out = nn.Conv2d(ch[-1], 2 * cfg.latent_channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        """(b, 3, H, W) -> (b, 2 * latent_channels, h, w)."""
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        x = self.mid_block(x)
        return self.conv_out(self.act(self.conv_norm_out(x)))


class Decoder(nn.Module):
    """Latents (b, latent_channels, h, w) -> image (b, 3, h*f, w*f), f = 2 ** (blocks - 1)."""

    def __init__(self, cfg: AutoencoderKLConfig) -> None:
        super().__init__()
        ch, g = list(reversed(cfg.block_out_channels)), cfg.norm_num_groups
        self.act = act = activation(cfg.act_fn, "VAE config")
        self.conv_in = nn.Conv2d(cfg.latent_channels, ch[0], 3, padding=1)
        self.mid_block = _MidBlock(cfg, act)
        n = cfg.layers_per_block + 1
        self.up_blocks = nn.ModuleList(
            [_DecoderBlock(ch[max(i - 1, 0)], ch[i], n, g, act, i < len(ch) - 1)
             for i in range(len(ch))]
        )  # fmt: skip
        self.conv_norm_out = nn.GroupNorm(g, ch[-1], eps=1e-6)
        self.conv_out = nn.Conv2d(ch[-1], cfg.out_channels, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        """(b, latent_channels, h, w) -> (b, out_channels, H, W), roughly in [-1, 1]."""
        x = self.mid_block(self.conv_in(z))
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(self.act(self.conv_norm_out(x)))


class AutoencoderKL(nn.Module):
    """The VAE: ``encode`` images to latent moments, ``decode`` latents to images."""

    def __init__(self, config: AutoencoderKLConfig, decoder_only: bool = False) -> None:
        super().__init__()
        self.config = cfg = config
        if not decoder_only:
            self.encoder = Encoder(cfg)
            if cfg.use_quant_conv:
                self.quant_conv = nn.Conv2d(2 * cfg.latent_channels, 2 * cfg.latent_channels, 1)
        if cfg.use_post_quant_conv:
            self.post_quant_conv = nn.Conv2d(cfg.latent_channels, cfg.latent_channels, 1)
        self.decoder = Decoder(cfg)
        self.source: str | None = None

    @property
    def scale_factor(self) -> int:
        """Pixels per latent along each side: 2 ** (blocks - 1)."""
        return 2 ** (len(self.config.block_out_channels) - 1)

    @staticmethod
    def _tensor(x) -> Tensor:
        return x if isinstance(x, Tensor) else ember.tensor(np.asarray(x, dtype=np.float32))

    def decode(self, z) -> Tensor:
        """Image (b, 3, H, W) in about [-1, 1] from latents (b, latent_channels, h, w)."""
        z = self._tensor(z)
        c = self.config.latent_channels
        if z.ndim != 4 or z.shape[1] != c or 0 in z.shape:
            raise ShapeError(f"VAE: latents must be (batch, {c}, h, w), got {tuple(z.shape)}")
        if hasattr(self, "post_quant_conv"):
            z = self.post_quant_conv(z)
        return self.decoder(z)

    def encode(self, x) -> tuple[Tensor, Tensor]:
        """(mean, logvar) of the latent posterior of images (b, 3, H, W) in [-1, 1]."""
        if not hasattr(self, "encoder"):
            raise UnsupportedError("VAE: this model was loaded decoder-only; it cannot encode")
        x = self._tensor(x)
        c = self.config.in_channels
        if x.ndim != 4 or x.shape[1] != c or 0 in x.shape:
            raise ShapeError(f"VAE: images must be (batch, {c}, H, W), got {tuple(x.shape)}")
        moments = self.encoder(x)
        if hasattr(self, "quant_conv"):
            moments = self.quant_conv(moments)
        mean, logvar = moments.chunk(2, dim=1)
        return mean, logvar.clamp(-30.0, 20.0)

    def forward(self, x) -> Tensor:
        """Encode to the posterior mean, decode back."""
        return self.decode(self.encode(x)[0])

    # --- loading

    @classmethod
    def from_state_dict(cls, config: AutoencoderKLConfig | dict, weights: dict, dtype=None,
                        decoder_only: bool = False):  # fmt: skip
        """Build on the meta device and take diffusers-named weights (old attention names too)."""
        from ember.models._weights import assign_weights

        cfg = config if isinstance(config, AutoencoderKLConfig) else AutoencoderKLConfig.from_dict(config)  # fmt: skip
        with ember.device("meta"):
            model = cls(cfg, decoder_only)
        weights = rename_old_attention(weights)
        if decoder_only:
            weights = {k: v for k, v in weights.items()
                       if not k.startswith(("encoder.", "quant_conv."))}  # fmt: skip
        assign_weights(model, weights, dtype)
        return model.eval()

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, decoder_only: bool = False):
        """A diffusers ``vae/`` folder: config.json and diffusion_pytorch_model.safetensors."""
        p = Path(path)
        cfg = AutoencoderKLConfig.from_dict(read_json(p / "config.json"), str(p / "config.json"))
        model = cls.from_state_dict(
            cfg, load_weights(p, "diffusion_pytorch_model"), decoder_only=decoder_only
        )
        model.source = str(p)
        return model


__all__ = ["AutoencoderKL", "AutoencoderKLConfig"]
