"""SAM's image encoder: a ViT on 16x16 patches with windowed and global attention, then a neck.

Names are transformers' SamVisionEncoder's: `patch_embed.projection`, `pos_embed`,
`layers.N.{layer_norm1, attn.qkv, attn.proj, attn.rel_pos_h, attn.rel_pos_w, layer_norm2,
mlp.lin1, mlp.lin2}`, `neck.{conv1, layer_norm1, conv2, layer_norm2}`. Tokens stay on a grid
(N, H, W, C) throughout: a windowed layer cuts the grid into window_size x window_size tiles
(zero-padded to a multiple of the window), a global one (`global_attn_indexes`) attends over the
whole grid. Attention adds decomposed relative position terms (MViTv2): for a query at (y, x)
and a key at (y', x'), q . rel_pos_h[y - y'] + q . rel_pos_w[x - x'].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import ember
from ember import nn
from ember.errors import ShapeError
from ember.nn import functional as F
from ember.tensor import Tensor

if TYPE_CHECKING:
    from ember.models.vision.sam import SamVisionConfig

_ACTS = {
    "gelu": F.gelu,
    "relu": F.relu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


def activation(name: str) -> Callable[[Tensor], Tensor]:
    """The activation function a config names (transformers' ACT2FN spelling)."""
    return _ACTS[name]


class SamLayerNorm(nn.LayerNorm):
    """LayerNorm over the channels of a (N, H, W, C) grid, or of (N, C, H, W) when channels_first."""

    def __init__(self, channels: int, eps: float = 1e-6, channels_first: bool = False) -> None:
        super().__init__(channels, eps=eps)
        self.channels_first = channels_first

    def forward(self, x: Tensor) -> Tensor:
        """Normalise each position's channel vector."""
        if not self.channels_first:
            return super().forward(x)
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class SamMLPBlock(nn.Module):
    """lin2(act(lin1(x)))."""

    def __init__(self, dim: int, hidden: int, act: str) -> None:
        super().__init__()
        self.lin1 = nn.Linear(dim, hidden)
        self.lin2 = nn.Linear(hidden, dim)
        self.act = activation(act)

    def forward(self, x: Tensor) -> Tensor:
        """The two-layer perceptron."""
        return self.lin2(self.act(self.lin1(x)))


class SamPatchEmbeddings(nn.Module):
    """(N, 3, S, S) image -> (N, S/p, S/p, hidden) grid with one strided conv."""

    def __init__(self, config: SamVisionConfig) -> None:
        super().__init__()
        p = config.patch_size
        self.image_size, self.num_channels = config.image_size, config.num_channels
        self.projection = nn.Conv2d(config.num_channels, config.hidden_size, p, stride=p)

    def forward(self, pixel_values: Tensor) -> Tensor:
        """Patchify and project, channels last."""
        if pixel_values.ndim != 4 or pixel_values.shape[1] != self.num_channels:
            raise ShapeError(
                f"SAM: pixel_values must be (batch, {self.num_channels}, {self.image_size}, "
                f"{self.image_size}), got {tuple(pixel_values.shape)}"
            )
        if tuple(pixel_values.shape[2:]) != (self.image_size, self.image_size):
            raise ShapeError(
                f"SAM: input image size {tuple(pixel_values.shape[2:])} doesn't match the "
                f"model's ({self.image_size}, {self.image_size}); resize and pad it first "
                "(SamPredictor does)"
            )
        return self.projection(pixel_values).permute(0, 2, 3, 1)


def _rel_table(rel_pos: Tensor, size: int) -> Tensor:
    """(size, size, C): rel_pos[i - j + size - 1] for query i, key j (resized if it doesn't fit)."""
    need = 2 * size - 1
    if rel_pos.shape[0] != need:  # trained for another grid: linear resize, as MViTv2 does
        rel_pos = F.interpolate(rel_pos.t()[None], size=need, mode="linear")[0].t()
    idx = ember.arange(size)[:, None] - ember.arange(size)[None, :] + (size - 1)
    return rel_pos[idx]


class SamVisionAttention(nn.Module):
    """Multi-head self-attention over a (B, H, W, C) grid with decomposed relative positions."""

    def __init__(self, config: SamVisionConfig, window_size: int) -> None:
        super().__init__()
        d, h = config.hidden_size, config.num_attention_heads
        self.num_heads, self.head_dim = h, d // h
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(d, 3 * d, bias=config.qkv_bias)
        self.proj = nn.Linear(d, d)
        self.use_rel_pos = config.use_rel_pos
        if self.use_rel_pos:
            size = window_size or config.image_size // config.patch_size
            self.rel_pos_h = nn.Parameter(ember.zeros(2 * size - 1, self.head_dim))
            self.rel_pos_w = nn.Parameter(ember.zeros(2 * size - 1, self.head_dim))

    def forward(self, x: Tensor) -> Tensor:
        """(B, H, W, C) -> (B, H, W, C).

        The relative position terms ride along in the attention product instead of a (HW, HW)
        bias: the query gets its row terms q . rel_h[y - y'] (one per key row y') and column
        terms appended, each key a one-hot of its row y' and column x', so q' . k' = scale q . k
        + rel_h term + rel_w term, the same scores as SAM's, computed blocked by the fused
        attention kernel without materialising a bias. v is zero-padded to k's width (the
        kernel wants equal widths) and the padding dropped after.
        """
        b, height, width, c = x.shape
        hw, n, hd = height * width, self.num_heads, self.head_dim
        qkv = self.qkv(x).reshape(b, hw, 3, n, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, H*W, head_dim)
        if not self.use_rel_pos:
            o = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        else:
            rh = _rel_table(self.rel_pos_h, height)  # (H, H', c)
            rw = _rel_table(self.rel_pos_w, width)  # (W, W', c)
            q5 = q.reshape(b, n, height, width, hd)
            by_row = q5 @ rh.transpose(1, 2)  # (b, n, H, W, H'): row y against the table of y
            by_col = (q5.transpose(2, 3) @ rw.transpose(1, 2)).transpose(2, 3)  # (.., W')
            q = ember.cat([q * self.scale, by_row.reshape(b, n, hw, height),
                           by_col.reshape(b, n, hw, width)], dim=-1)  # fmt: skip
            tok = ember.arange(hw)
            onehot = ember.cat([ember.eye(height)[tok // width], ember.eye(width)[tok % width]], 1)
            k = ember.cat([k, onehot.expand(b, n, hw, height + width)], dim=-1)
            v = F.pad(v, (0, height + width))
            o = F.scaled_dot_product_attention(q, k, v, scale=1.0)[..., :hd]
        return self.proj(o.transpose(1, 2).reshape(b, height, width, c))


class SamVisionLayer(nn.Module):
    """Pre-norm block: x + attn(ln1(x)) (in windows unless global), then + mlp(ln2(x))."""

    def __init__(self, config: SamVisionConfig, window_size: int) -> None:
        super().__init__()
        d, eps = config.hidden_size, config.layer_norm_eps
        self.layer_norm1 = nn.LayerNorm(d, eps=eps)
        self.attn = SamVisionAttention(config, window_size)
        self.layer_norm2 = nn.LayerNorm(d, eps=eps)
        self.mlp = SamMLPBlock(d, config.mlp_dim, config.hidden_act)
        self.window_size = window_size

    def _windows(self, x: Tensor) -> Tensor:
        """(B, H, W, C) -> (B * tiles, ws, ws, C), zero-padded to whole windows."""
        b, h, w, c = x.shape
        ws = self.window_size
        ph, pw = -h % ws, -w % ws
        if ph or pw:
            x = F.pad(x, (0, 0, 0, pw, 0, ph))
        hp, wp = h + ph, w + pw
        x = x.reshape(b, hp // ws, ws, wp // ws, ws, c).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(-1, ws, ws, c)

    def _unwindow(self, x: Tensor, b: int, h: int, w: int) -> Tensor:
        """The inverse of _windows, padding dropped."""
        ws, c = self.window_size, x.shape[-1]
        hp, wp = h + (-h % ws), w + (-w % ws)
        x = x.reshape(b, hp // ws, wp // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5)
        x = x.reshape(b, hp, wp, c)
        return x[:, :h, :w] if (hp, wp) != (h, w) else x

    def forward(self, x: Tensor) -> Tensor:
        """One encoder block on the (B, H, W, C) grid."""
        h = self.layer_norm1(x)
        if self.window_size > 0:
            b, height, width = x.shape[:3]
            h = self._unwindow(self.attn(self._windows(h)), b, height, width)
        else:
            h = self.attn(h)
        x = x + h
        return x + self.mlp(self.layer_norm2(x))


class SamVisionNeck(nn.Module):
    """1x1 conv -> LayerNorm -> 3x3 conv -> LayerNorm, to output_channels, channels first."""

    def __init__(self, config: SamVisionConfig) -> None:
        super().__init__()
        c = config.output_channels
        self.conv1 = nn.Conv2d(config.hidden_size, c, 1, bias=False)
        self.layer_norm1 = SamLayerNorm(c, channels_first=True)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.layer_norm2 = SamLayerNorm(c, channels_first=True)

    def forward(self, x: Tensor) -> Tensor:
        """(B, H, W, hidden) -> (B, output_channels, H, W)."""
        x = self.layer_norm1(self.conv1(x.permute(0, 3, 1, 2)))
        return self.layer_norm2(self.conv2(x))


class SamVisionEncoder(nn.Module):
    """Patch embedding + absolute positions + the blocks + the neck: image -> embeddings."""

    def __init__(self, config: SamVisionConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = SamPatchEmbeddings(config)
        g = config.image_size // config.patch_size
        if config.use_abs_pos:
            self.pos_embed = nn.Parameter(ember.zeros(1, g, g, config.hidden_size))
        else:
            self.pos_embed = None
        glob = set(config.global_attn_indexes)
        self.layers = nn.ModuleList(
            SamVisionLayer(config, 0 if i in glob else config.window_size)
            for i in range(config.num_hidden_layers)
        )
        self.neck = SamVisionNeck(config)

    def forward(self, pixel_values: Tensor) -> Tensor:
        """(B, 3, S, S) normalised pixels -> (B, output_channels, S/p, S/p) image embeddings."""
        x = self.patch_embed(pixel_values)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        for layer in self.layers:
            x = layer(x)
        return self.neck(x)
