"""Pieces the UNet and the VAE share, with diffusers' module names, and the folder readers.

ResnetBlock2D (``norm1 conv1 time_emb_proj norm2 conv2 conv_shortcut``), Downsample2D and
Upsample2D (``conv``), and Attention (``group_norm to_q to_k to_v to_out.0``) as diffusers lays
them out, so that a diffusers checkpoint's tensor names land on them unchanged.
"""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from ember import nn
from ember.errors import FormatError, UnsupportedError
from ember.io._common import read_json_object
from ember.nn import functional as F
from ember.tensor import Tensor

MAX_CHANNELS = 1 << 15  # no real model comes near; a config past it is a broken file


def check_count(value: Any, name: str, where: str, low: int = 1, high: int = MAX_CHANNELS) -> int:
    """An integer config field in [low, high], or a FormatError naming the file and the field."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise FormatError(f"{where}: {name} must be an integer in [{low}, {high}], got {value!r}")
    return value


def config_from_dict(cls, d: dict, where: str):
    """A config dataclass from a config.json dict: known keys set, the rest kept in ``extra``."""
    if not isinstance(d, dict):
        raise FormatError(f"{where}: expected a JSON object, got {type(d).__name__}")
    names = {f.name for f in fields(cls)} - {"extra"}
    known = {k: v for k, v in d.items() if k in names}
    cfg = cls(**known, extra={k: v for k, v in d.items() if k not in names})
    try:
        cfg.validate(where)
    except (TypeError, ValueError) as e:  # a field of the wrong JSON type (a number for a list)
        raise FormatError(f"{where}: malformed config ({type(e).__name__}: {e})") from None
    return cfg


def read_json(path: Path) -> dict:
    """A JSON object from a file, or a FormatError saying which file is missing or broken."""
    return read_json_object(path)


def find_weights(folder: Path, stem: str) -> Path:
    """The safetensors weights of one diffusers component folder: full precision, fp16, or sharded."""
    for name in (
        f"{stem}.safetensors",
        f"{stem}.safetensors.index.json",
        f"{stem}.fp16.safetensors",
        f"{stem}.fp16.safetensors.index.json",
    ):
        if (folder / name).is_file():
            return folder / name
    others = sorted(p.name for p in folder.glob("*.bin")) if folder.is_dir() else []
    hint = f" (found {', '.join(others)}: convert with `ember convert`)" if others else ""
    raise FormatError(f"{folder}: no {stem}.safetensors (or .fp16 / sharded index){hint}")


def load_weights(folder: Path, stem: str) -> dict:
    """The component's tensors as memory-mapped arrays (read lazily, never copied here)."""
    from ember.io import load_safetensors

    return load_safetensors(find_weights(folder, stem))


def activation(name: str, where: str):
    """The diffusers act_fn of a name (silu/swish, gelu, mish, relu) as a function."""
    acts = {"silu": F.silu, "swish": F.silu, "gelu": F.gelu, "mish": F.mish, "relu": F.relu}
    if name not in acts:
        raise UnsupportedError(f"{where}: act_fn {name!r} is not one of {sorted(acts)}")
    return acts[name]


class ResnetBlock2D(nn.Module):
    """GroupNorm, act, 3x3 conv, + time embedding, GroupNorm, act, 3x3 conv; plus a (1x1) shortcut."""

    def __init__(
        self, cin: int, cout: int, temb: int | None, groups: int, eps: float, act=F.silu,
        output_scale_factor: float = 1.0,
    ) -> None:  # fmt: skip
        super().__init__()
        self.act, self.output_scale_factor = act, output_scale_factor
        self.norm1 = nn.GroupNorm(groups, cin, eps=eps)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        if temb is not None:
            self.time_emb_proj = nn.Linear(temb, cout)
        self.norm2 = nn.GroupNorm(groups, cout, eps=eps)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        if cin != cout:
            self.conv_shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, x: Tensor, temb: Tensor | None = None) -> Tensor:
        """(b, cin, h, w), time embedding (b, temb) or None -> (b, cout, h, w)."""
        h = self.conv1(self.act(self.norm1(x)))
        if temb is not None and hasattr(self, "time_emb_proj"):
            t = self.time_emb_proj(self.act(temb))
            h = h + t.reshape(t.shape[0], t.shape[1], 1, 1)
        h = self.conv2(self.act(self.norm2(h)))
        if hasattr(self, "conv_shortcut"):
            x = self.conv_shortcut(x)
        out = x + h
        return out if self.output_scale_factor == 1.0 else out / self.output_scale_factor


class Downsample2D(nn.Module):
    """A 3x3 stride-2 conv; padding 0 pads one row and column at the bottom right first (the VAE)."""

    def __init__(self, channels: int, padding: int = 1) -> None:
        super().__init__()
        self.padding = padding
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=padding)

    def forward(self, x: Tensor) -> Tensor:
        """(b, c, h, w) -> (b, c, ceil(h/2), ceil(w/2)) (padding 1)."""
        if self.padding == 0:
            x = F.pad(x, (0, 1, 0, 1))
        return self.conv(x)


class Upsample2D(nn.Module):
    """Nearest-neighbour x2 (or to a given size), then a 3x3 conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor, size: tuple[int, int] | None = None) -> Tensor:
        """(b, c, h, w) -> (b, c, 2h, 2w), or (b, c, *size)."""
        if size is None:
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        else:
            x = F.interpolate(x, size=tuple(size), mode="nearest")
        return self.conv(x)


class Attention(nn.Module):
    """Multi-head attention with diffusers' names: to_q, to_k, to_v, to_out.0 (and group_norm).

    Given ``norm_groups`` it is the VAE's spatial self-attention: it takes (b, c, h, w), normalises
    it, attends over the h*w positions and adds the input back.
    """

    def __init__(
        self, dim: int, heads: int, head_dim: int, context_dim: int | None = None,
        bias: bool = False, norm_groups: int | None = None, eps: float = 1e-5,
    ) -> None:  # fmt: skip
        super().__init__()
        inner = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        if norm_groups is not None:
            self.group_norm = nn.GroupNorm(norm_groups, dim, eps=eps)
        self.to_q = nn.Linear(dim, inner, bias=bias)
        self.to_k = nn.Linear(context_dim or dim, inner, bias=bias)
        self.to_v = nn.Linear(context_dim or dim, inner, bias=bias)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])

    def _split(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        return x.reshape(b, n, self.heads, self.head_dim).transpose(1, 2)

    def attend(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """(b, n, dim) queries over (b, m, context_dim) keys (x itself when None) -> (b, n, dim)."""
        ctx = x if context is None else context
        q, k, v = (
            self._split(self.to_q(x)),
            self._split(self.to_k(ctx)),
            self._split(self.to_v(ctx)),
        )
        o = F.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(self.head_dim))
        b, _, n, _ = o.shape
        return self.to_out[0](o.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Sequence attention, or (b, c, h, w) spatial self-attention plus the residual."""
        if x.ndim == 3:
            return self.attend(x, context)
        b, c, h, w = x.shape
        seq = self.group_norm(x) if hasattr(self, "group_norm") else x
        seq = seq.reshape(b, c, h * w).transpose(1, 2)
        out = self.attend(seq).transpose(1, 2).reshape(b, c, h, w)
        return out + x


# diffusers' pre-0.14 names of the VAE's attention (an AttentionBlock) -> today's
_OLD_ATTN = {
    ".query.": ".to_q.", ".key.": ".to_k.", ".value.": ".to_v.", ".proj_attn.": ".to_out.0.",
}  # fmt: skip


def rename_old_attention(weights: dict) -> dict:
    """Checkpoint arrays with the old VAE attention names renamed and 1x1-conv weights flattened."""
    out = {}
    for name, value in weights.items():
        new = name
        for old, now in _OLD_ATTN.items():
            if ".attentions." in name and old in name:
                new = name.replace(old, now)
        if new != name and new.endswith(".weight") and np.ndim(value) == 4:
            value = np.asarray(value).reshape(value.shape[0], value.shape[1])
        out[new] = value
    return out
