"""SAM's prompt encoder and mask decoder (transformers' SamPromptEncoder / SamMaskDecoder names).

Prompt encoder: points and box corners become sparse tokens, a random Fourier encoding of their
position (`shared_embedding.positional_embedding`, a fixed Gaussian 2 x F matrix:
[sin, cos](2 pi (2 xy - 1) G)) plus a learned embedding for their kind (`point_embed.0`
background point, `.1` foreground point, `.2` / `.3` box corners, `not_a_point_embed` for padding);
an input mask becomes a dense map through a small conv stack (`mask_embed`), and without one
every position gets `no_mask_embed`.

Mask decoder: an iou token and 1 + num_multimask_outputs mask tokens are prepended to the prompt
tokens; a two-way transformer (`transformer.layers.N`: token self-attention, tokens -> image
cross-attention, MLP, image -> tokens cross-attention) mixes them with the image embedding; the
image side is upscaled 4x (`upscale_conv1/2`), each mask token's MLP
(`output_hypernetworks_mlps.i`) gives the weights of a dot product with it, and
`iou_prediction_head` scores each mask.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import ember
from ember import nn
from ember.errors import ShapeError
from ember.models.vision.sam_encoder import SamLayerNorm, SamMLPBlock, activation
from ember.nn import functional as F
from ember.tensor import Tensor

if TYPE_CHECKING:
    from ember.models.vision.sam import SamConfig, SamMaskDecoderConfig


class SamPositionalEmbedding(nn.Module):
    """Random Fourier features of 2-D coordinates in [0, 1]: (..., 2) -> (..., 2 * num_pos_feats)."""

    def __init__(self, num_pos_feats: int) -> None:
        super().__init__()
        self.positional_embedding = nn.Parameter(ember.randn(2, num_pos_feats))

    def forward(self, coords: Tensor) -> Tensor:
        """[sin, cos] of 2 pi (2 coords - 1) @ G."""
        x = (coords * 2.0 - 1.0) @ self.positional_embedding
        x = x * (2.0 * math.pi)
        return ember.cat([x.sin(), x.cos()], dim=-1)

    def grid(self, size: int) -> Tensor:
        """(1, C, size, size): the encoding of every image-embedding cell's centre."""
        c = (ember.arange(size, dtype=ember.float32) + 0.5) / size
        xy = ember.stack([c[None, :].expand(size, size), c[:, None].expand(size, size)], dim=-1)
        return self(xy).permute(2, 0, 1)[None]


class SamMaskEmbedding(nn.Module):
    """(B, 1, 4s, 4s) mask logits -> (B, hidden, s, s): two 2x2 stride-2 convs (LN, act), 1x1 conv."""

    def __init__(self, hidden: int, mask_channels: int, act: str, eps: float) -> None:
        super().__init__()
        c = mask_channels // 4
        self.conv1 = nn.Conv2d(1, c, 2, stride=2)
        self.layer_norm1 = SamLayerNorm(c, eps=eps, channels_first=True)
        self.conv2 = nn.Conv2d(c, mask_channels, 2, stride=2)
        self.layer_norm2 = SamLayerNorm(mask_channels, eps=eps, channels_first=True)
        self.conv3 = nn.Conv2d(mask_channels, hidden, 1)
        self.act = activation(act)

    def forward(self, masks: Tensor) -> Tensor:
        """The dense prompt embedding of a mask."""
        x = self.act(self.layer_norm1(self.conv1(masks)))
        x = self.act(self.layer_norm2(self.conv2(x)))
        return self.conv3(x)


class SamPromptEncoder(nn.Module):
    """Points, boxes and masks -> (sparse tokens (B, P, T, C), dense map (B, C, s, s))."""

    def __init__(self, config: SamConfig) -> None:
        super().__init__()
        pc = config.prompt_encoder_config
        self.shared_embedding = SamPositionalEmbedding(config.vision_config.num_pos_feats)
        self.mask_embed = SamMaskEmbedding(
            pc.hidden_size, pc.mask_input_channels, pc.hidden_act, pc.layer_norm_eps
        )
        self.no_mask_embed = nn.Embedding(1, pc.hidden_size)
        self.point_embed = nn.ModuleList(
            nn.Embedding(1, pc.hidden_size) for _ in range(pc.num_point_embeddings)
        )
        self.not_a_point_embed = nn.Embedding(1, pc.hidden_size)
        self.hidden_size = pc.hidden_size
        self.input_image_size = pc.image_size
        self.embedding_size = pc.image_size // pc.patch_size

    def _encode(self, xy: Tensor) -> Tensor:
        """Pixel coordinates in the model's input frame (pixel centres) -> Fourier features."""
        return self.shared_embedding((xy + 0.5) / float(self.input_image_size))

    def embed_points(self, points: Tensor, labels: Tensor, pad: bool) -> Tensor:
        """(B, P, N, 2) points, (B, P, N) labels -> (B, P, N (+1), C) tokens."""
        emb = self._encode(points)
        lab = labels.to(ember.int64)
        if pad:  # a "not a point" token closes a prompt that has no box (as SAM does)
            b, p = points.shape[:2]
            emb = ember.cat([emb, ember.zeros(b, p, 1, emb.shape[-1])], dim=2)
            lab = ember.cat([lab, ember.full((b, p, 1), -1, dtype=ember.int64)], dim=2)
        lab = lab[..., None]
        zero = ember.zeros(())
        emb = ember.where(lab == -1, self.not_a_point_embed.weight[0], emb)
        emb = ember.where(lab == -10, zero, emb)  # padding points contribute nothing
        emb = emb + ember.where(lab == 0, self.point_embed[0].weight[0], zero)
        return emb + ember.where(lab == 1, self.point_embed[1].weight[0], zero)

    def embed_boxes(self, boxes: Tensor) -> Tensor:
        """(B, nb, 4) boxes x1 y1 x2 y2 -> (B, nb, 2, C) corner tokens."""
        b, nb = boxes.shape[:2]
        corners = self._encode(boxes.reshape(b, nb, 2, 2))
        kind = ember.cat([self.point_embed[2].weight, self.point_embed[3].weight], dim=0)
        return corners + kind

    def forward(
        self,
        input_points: Tensor | None = None,
        input_labels: Tensor | None = None,
        input_boxes: Tensor | None = None,
        input_masks: Tensor | None = None,
    ) -> tuple[Tensor | None, Tensor]:
        """(sparse (B, P, T, C) or None, dense (B, C, s, s)) embeddings of the prompts."""
        sparse, batch = None, 1
        if input_points is not None:
            if input_labels is None:
                raise ShapeError("SAM: input_points need input_labels (1 foreground, 0 background)")
            batch = input_points.shape[0]
            sparse = self.embed_points(input_points, input_labels, pad=input_boxes is None)
        if input_boxes is not None:
            batch = input_boxes.shape[0]
            boxes = self.embed_boxes(input_boxes)
            sparse = boxes if sparse is None else ember.cat([sparse, boxes], dim=2)
        if input_masks is not None:
            dense = self.mask_embed(input_masks)
        else:
            s = self.embedding_size
            dense = self.no_mask_embed.weight.reshape(1, -1, 1, 1).expand(batch, -1, s, s)
        return sparse, dense


class SamAttention(nn.Module):
    """Attention with q/k/v projected to hidden / downsample_rate channels (`q_proj`...`out_proj`)."""

    def __init__(self, config: SamMaskDecoderConfig, downsample_rate: int = 1) -> None:
        super().__init__()
        d = config.hidden_size
        inner = d // downsample_rate
        self.num_heads = config.num_attention_heads
        self.q_proj = nn.Linear(d, inner)
        self.k_proj = nn.Linear(d, inner)
        self.v_proj = nn.Linear(d, inner)
        self.out_proj = nn.Linear(inner, d)
        self.scale = (inner // self.num_heads) ** -0.5

    def forward(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        """(N, Lq, C), (N, Lk, C), (N, Lk, C) -> (N, Lq, C)."""
        n, h = query.shape[0], self.num_heads

        def heads(x: Tensor) -> Tensor:
            """(N, L, h * d) -> (N, h, L, d)."""
            return x.reshape(n, x.shape[1], h, -1).transpose(1, 2)

        q, k, v = heads(self.q_proj(query)), heads(self.k_proj(key)), heads(self.v_proj(value))
        o = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return self.out_proj(o.transpose(1, 2).reshape(n, query.shape[1], -1))


class SamTwoWayAttentionBlock(nn.Module):
    """Tokens self-attend, attend to the image, pass an MLP; then the image attends to them."""

    def __init__(self, config: SamMaskDecoderConfig, skip_first_layer_pe: bool) -> None:
        super().__init__()
        d, eps, rate = config.hidden_size, config.layer_norm_eps, config.attention_downsample_rate
        self.self_attn = SamAttention(config, 1)
        self.layer_norm1 = nn.LayerNorm(d, eps=eps)
        self.cross_attn_token_to_image = SamAttention(config, rate)
        self.layer_norm2 = nn.LayerNorm(d, eps=eps)
        self.mlp = SamMLPBlock(d, config.mlp_dim, config.hidden_act)
        self.layer_norm3 = nn.LayerNorm(d, eps=eps)
        self.layer_norm4 = nn.LayerNorm(d, eps=eps)
        self.cross_attn_image_to_token = SamAttention(config, rate)
        self.skip_first_layer_pe = skip_first_layer_pe

    def forward(
        self, queries: Tensor, keys: Tensor, query_pe: Tensor, key_pe: Tensor
    ) -> tuple[Tensor, Tensor]:
        """(tokens (N, T, C), image (N, HW, C)) -> both updated."""
        if self.skip_first_layer_pe:
            queries = self.self_attn(queries, queries, queries)
        else:
            q = queries + query_pe
            queries = queries + self.self_attn(q, q, queries)
        queries = self.layer_norm1(queries)
        k = keys + key_pe
        queries = self.layer_norm2(
            queries + self.cross_attn_token_to_image(queries + query_pe, k, keys)
        )
        queries = self.layer_norm3(queries + self.mlp(queries))
        keys = self.layer_norm4(
            keys + self.cross_attn_image_to_token(k, queries + query_pe, queries)
        )
        return queries, keys


class SamTwoWayTransformer(nn.Module):
    """num_hidden_layers two-way blocks, then a last tokens -> image attention."""

    def __init__(self, config: SamMaskDecoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            SamTwoWayAttentionBlock(config, skip_first_layer_pe=i == 0)
            for i in range(config.num_hidden_layers)
        )
        self.final_attn_token_to_image = SamAttention(config, config.attention_downsample_rate)
        self.layer_norm_final_attn = nn.LayerNorm(config.hidden_size)  # torch's default eps

    def forward(self, tokens: Tensor, image: Tensor, image_pe: Tensor) -> tuple[Tensor, Tensor]:
        """tokens (N, T, C), image and its positions (N, HW, C) -> (tokens, image)."""
        queries, keys = tokens, image
        for layer in self.layers:
            queries, keys = layer(queries, keys, tokens, image_pe)
        attn = self.final_attn_token_to_image(queries + tokens, keys + image_pe, keys)
        return self.layer_norm_final_attn(queries + attn), keys


class SamFeedForward(nn.Module):
    """proj_in -> relu -> (layers.i -> relu)... -> proj_out."""

    def __init__(self, dim_in: int, hidden: int, dim_out: int, num_layers: int) -> None:
        super().__init__()
        self.proj_in = nn.Linear(dim_in, hidden)
        self.layers = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(num_layers - 2))
        self.proj_out = nn.Linear(hidden, dim_out)

    def forward(self, x: Tensor) -> Tensor:
        """The MLP."""
        x = F.relu(self.proj_in(x))
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.proj_out(x)


class SamMaskDecoder(nn.Module):
    """Image embedding + prompt tokens -> (masks (B, P, M, 4s, 4s), iou scores (B, P, M))."""

    def __init__(self, config: SamMaskDecoderConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.num_mask_tokens = config.num_multimask_outputs + 1
        self.iou_token = nn.Embedding(1, d)
        self.mask_tokens = nn.Embedding(self.num_mask_tokens, d)
        self.transformer = SamTwoWayTransformer(config)
        self.upscale_conv1 = nn.ConvTranspose2d(d, d // 4, 2, stride=2)
        self.upscale_conv2 = nn.ConvTranspose2d(d // 4, d // 8, 2, stride=2)
        self.upscale_layer_norm = SamLayerNorm(d // 4, channels_first=True)
        self.output_hypernetworks_mlps = nn.ModuleList(
            SamFeedForward(d, d, d // 8, 3) for _ in range(self.num_mask_tokens)
        )
        self.iou_prediction_head = SamFeedForward(
            d, config.iou_head_hidden_dim, self.num_mask_tokens, config.iou_head_depth
        )

    def forward(
        self,
        image_embeddings: Tensor,
        image_positional_embeddings: Tensor,
        sparse_prompt_embeddings: Tensor | None,
        dense_prompt_embeddings: Tensor,
        multimask_output: bool = True,
    ) -> tuple[Tensor, Tensor]:
        """Masks and scores for each of the P prompts of each of the B images."""
        b, c, h, w = image_embeddings.shape
        out_tokens = ember.cat([self.iou_token.weight, self.mask_tokens.weight], dim=0)
        if sparse_prompt_embeddings is None:
            p = 1
            tokens = out_tokens[None].expand(b, -1, -1)
        else:
            p = sparse_prompt_embeddings.shape[1]
            tokens = ember.cat(
                [out_tokens[None, None].expand(b, p, -1, -1), sparse_prompt_embeddings], dim=2
            )
            tokens = tokens.reshape(b * p, -1, c)
        image = (image_embeddings + dense_prompt_embeddings).flatten(2).transpose(1, 2)
        pe = image_positional_embeddings.flatten(2).transpose(1, 2)
        if p > 1:
            image = image.repeat_interleave(p, 0)
        pe = pe.expand(b * p, -1, -1) if pe.shape[0] == 1 else pe.repeat_interleave(p, 0)
        hs, image = self.transformer(tokens, image, pe)
        iou_out, mask_out = hs[:, 0], hs[:, 1 : 1 + self.num_mask_tokens]

        up = self.upscale_conv1(image.transpose(1, 2).reshape(b * p, c, h, w))
        up = F.gelu(self.upscale_layer_norm(up))
        up = F.gelu(self.upscale_conv2(up))
        uc, uh, uw = up.shape[1:]
        hyper = ember.stack(
            [mlp(mask_out[:, i]) for i, mlp in enumerate(self.output_hypernetworks_mlps)], dim=1
        )  # (BP, M, uc)
        masks = (hyper @ up.reshape(b * p, uc, uh * uw)).reshape(b, p, -1, uh, uw)
        iou = self.iou_prediction_head(iou_out).reshape(b, p, -1)
        sl = slice(1, None) if multimask_output else slice(0, 1)
        return masks[:, :, sl], iou[:, :, sl]
