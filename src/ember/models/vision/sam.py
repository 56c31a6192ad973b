"""Segment Anything (SAM) with transformers' SamModel names and SamConfig fields.

    model = SamModel.from_pretrained("sam-vit-base")        # config.json + model.safetensors
    out = model(pixel_values, input_points=pts, input_labels=labels)
    out.pred_masks  # (B, P, 3, 256, 256) low-resolution mask logits
    out.iou_scores  # (B, P, 3)

The image encoder is in sam_encoder.py, the prompt encoder and mask decoder in sam_decoder.py;
resizing, padding, coordinate rescaling and mask upscaling (SamProcessor's work) are in
ember.models.vision.segmentation (SamPredictor). Meta's own checkpoints (segment_anything's
`sam_vit_b_01ec64.pth`: `image_encoder.blocks.N...`, `mask_decoder.output_upscaling...`) load
too: their names are mapped to transformers' by `meta_to_hf` and the config is read from the
tensor shapes.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

import ember
from ember import nn
from ember.errors import FormatError, ShapeError
from ember.models.vision.sam_decoder import SamMaskDecoder, SamPromptEncoder
from ember.models.vision.sam_encoder import SamVisionEncoder
from ember.tensor import Tensor


def _known(cls, d: dict) -> dict:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


@dataclass
class SamVisionConfig:
    """transformers' SamVisionConfig fields (defaults: SAM ViT-B's image encoder)."""

    hidden_size: int = 768
    output_channels: int = 256
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_channels: int = 3
    image_size: int = 1024
    patch_size: int = 16
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-6
    qkv_bias: bool = True
    mlp_ratio: float = 4.0
    use_abs_pos: bool = True
    use_rel_pos: bool = True
    window_size: int = 14
    global_attn_indexes: list = field(default_factory=lambda: [2, 5, 8, 11])
    num_pos_feats: int = 128
    mlp_dim: int | None = None

    def __post_init__(self) -> None:
        if self.mlp_dim is None and isinstance(self.mlp_ratio, (int, float)):
            self.mlp_dim = int(self.hidden_size * self.mlp_ratio)


@dataclass
class SamPromptEncoderConfig:
    """transformers' SamPromptEncoderConfig fields."""

    hidden_size: int = 256
    image_size: int = 1024
    patch_size: int = 16
    mask_input_channels: int = 16
    num_point_embeddings: int = 4
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-6


@dataclass
class SamMaskDecoderConfig:
    """transformers' SamMaskDecoderConfig fields."""

    hidden_size: int = 256
    hidden_act: str = "relu"
    mlp_dim: int = 2048
    num_hidden_layers: int = 2
    num_attention_heads: int = 8
    attention_downsample_rate: int = 2
    num_multimask_outputs: int = 3
    iou_head_depth: int = 3
    iou_head_hidden_dim: int = 256
    layer_norm_eps: float = 1e-6


@dataclass
class SamConfig:
    """The three sub-configs, as SamConfig's vision_config / prompt_encoder_config / mask_decoder_config."""

    vision_config: SamVisionConfig = field(default_factory=SamVisionConfig)
    prompt_encoder_config: SamPromptEncoderConfig = field(default_factory=SamPromptEncoderConfig)
    mask_decoder_config: SamMaskDecoderConfig = field(default_factory=SamMaskDecoderConfig)

    @classmethod
    def from_dict(cls, d: dict, where: str = "config.json") -> SamConfig:
        """From a config.json dict (missing sub-configs and fields take transformers' defaults)."""
        if not isinstance(d, dict):
            raise FormatError(f"{where}: expected a JSON object, found {type(d).__name__}")
        if d.get("model_type", "sam") != "sam":
            raise FormatError(f"{where}: model_type is {d.get('model_type')!r}, not 'sam'")
        parts = {}
        for name, sub in (("vision_config", SamVisionConfig),
                          ("prompt_encoder_config", SamPromptEncoderConfig),
                          ("mask_decoder_config", SamMaskDecoderConfig)):  # fmt: skip
            raw = d.get(name) or {}
            if not isinstance(raw, dict):
                raise FormatError(f"{where}: {name} must be an object, found {type(raw).__name__}")
            try:
                parts[name] = sub(**_known(sub, raw))
            except (TypeError, ValueError) as e:
                raise FormatError(f"{where}: {name}: {e}") from None
        config = cls(**parts)
        config.check(where)
        return config

    def check(self, where: str = "SamConfig") -> None:
        """Every size a module is built from: positive, divisible and consistent, or FormatError."""
        v, p, m = self.vision_config, self.prompt_encoder_config, self.mask_decoder_config
        ints = [(f"vision_config.{k}", getattr(v, k)) for k in (
            "hidden_size", "output_channels", "num_hidden_layers", "num_attention_heads",
            "num_channels", "image_size", "patch_size", "num_pos_feats", "mlp_dim")]  # fmt: skip
        ints += [(f"prompt_encoder_config.{k}", getattr(p, k)) for k in (
            "hidden_size", "image_size", "patch_size", "mask_input_channels")]  # fmt: skip
        ints += [(f"mask_decoder_config.{k}", getattr(m, k)) for k in (
            "hidden_size", "mlp_dim", "num_hidden_layers", "num_attention_heads",
            "attention_downsample_rate", "iou_head_hidden_dim")]  # fmt: skip
        ints += [("mask_decoder_config.iou_head_depth", m.iou_head_depth - 1)]
        ints += [("prompt_encoder_config.num_point_embeddings", p.num_point_embeddings - 3)]
        for name, val in ints:
            if type(val) is not int or val < 1 or val > 1 << 20:
                raise FormatError(f"{where}: {name} must be a positive integer, found {val!r:.40}")
        if type(v.window_size) is not int or not 0 <= v.window_size <= 1 << 12:
            raise FormatError(f"{where}: vision_config.window_size must be an integer >= 0")
        if type(m.num_multimask_outputs) is not int or not 0 <= m.num_multimask_outputs <= 64:
            raise FormatError(f"{where}: mask_decoder_config.num_multimask_outputs out of range")
        idx = v.global_attn_indexes
        if not isinstance(idx, (list, tuple)) or any(
            type(i) is not int or not 0 <= i < v.num_hidden_layers for i in idx
        ):
            raise FormatError(
                f"{where}: vision_config.global_attn_indexes must list layer indexes below "
                f"{v.num_hidden_layers}, found {idx!r:.60}"
            )
        if v.window_size == 0 and len(set(idx)) < v.num_hidden_layers:
            raise FormatError(f"{where}: vision_config.window_size 0 but not every layer is global")
        for name, a, b in (
            ("vision_config.hidden_size", v.hidden_size, v.num_attention_heads),
            ("mask_decoder_config.hidden_size", m.hidden_size,
             m.num_attention_heads * m.attention_downsample_rate),
            ("mask_decoder_config.hidden_size", m.hidden_size, 8),
            ("prompt_encoder_config.mask_input_channels", p.mask_input_channels, 4),
            ("vision_config.image_size", v.image_size, v.patch_size),
        ):  # fmt: skip
            if a % b:
                raise FormatError(f"{where}: {name} {a} is not a multiple of {b}")
        if not (v.output_channels == p.hidden_size == m.hidden_size == 2 * v.num_pos_feats):
            raise FormatError(
                f"{where}: the image embedding ({v.output_channels} channels), the prompt "
                f"tokens ({p.hidden_size}), the mask decoder ({m.hidden_size}) and 2 x "
                f"num_pos_feats ({2 * v.num_pos_feats}) must all be the same size"
            )
        if p.image_size // p.patch_size != v.image_size // v.patch_size:
            raise FormatError(
                f"{where}: the prompt encoder's grid ({p.image_size}/{p.patch_size}) differs "
                f"from the image encoder's ({v.image_size}/{v.patch_size})"
            )


@dataclass
class SamImageSegmentationOutput:
    """What SamModel returns: iou_scores (B, P, M) and pred_masks (B, P, M, 4s, 4s) logits."""

    iou_scores: Tensor
    pred_masks: Tensor


def _as_tensor(x, name: str, dtype=ember.float32) -> Tensor | None:
    if x is None or isinstance(x, Tensor):
        return x
    try:
        return ember.from_numpy(np.ascontiguousarray(np.asarray(x, dtype=dtype.np)))
    except (TypeError, ValueError) as e:
        raise ShapeError(f"SAM: {name} is not a numeric array ({e})") from None


class SamModel(nn.Module):
    """The image encoder, the prompt encoder and the mask decoder (transformers' SamModel)."""

    def __init__(self, config: SamConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or SamConfig()
        config.check()
        self.vision_encoder = SamVisionEncoder(config.vision_config)
        self.prompt_encoder = SamPromptEncoder(config)
        self.mask_decoder = SamMaskDecoder(config.mask_decoder_config)

    def get_image_embeddings(self, pixel_values: Tensor | np.ndarray) -> Tensor:
        """(B, 3, S, S) preprocessed pixels -> (B, C, S/p, S/p) image embeddings."""
        return self.vision_encoder(_as_tensor(pixel_values, "pixel_values"))

    def get_image_wide_positional_embeddings(self) -> Tensor:
        """(1, C, s, s): the Fourier encoding of every image-embedding cell."""
        return self.prompt_encoder.shared_embedding.grid(self.prompt_encoder.embedding_size)

    def get_prompt_embeddings(
        self,
        input_points: ArrayLike | None = None,
        input_labels: ArrayLike | None = None,
        input_boxes: ArrayLike | None = None,
        input_masks: ArrayLike | None = None,
    ) -> tuple[Tensor | None, Tensor]:
        """(sparse, dense) prompt embeddings (points in the model's input frame)."""
        return self.prompt_encoder(*self._prompts(input_points, input_labels, input_boxes,
                                                  input_masks, None))  # fmt: skip

    def _prompts(self, points, labels, boxes, masks, batch: int | None) -> tuple:
        """Prompts as tensors with their shapes checked against each other and the batch."""
        points = _as_tensor(points, "input_points")
        boxes = _as_tensor(boxes, "input_boxes")
        masks = _as_tensor(masks, "input_masks")
        labels = _as_tensor(labels, "input_labels", ember.int64)
        if points is not None:
            if points.ndim != 4 or points.shape[-1] != 2:
                raise ShapeError(
                    "SAM: input_points must be (batch, point_batch, points, 2), got "
                    f"{tuple(points.shape)}"
                )
            if labels is None:
                labels = ember.ones(*points.shape[:3], dtype=ember.int64)
            if tuple(labels.shape) != tuple(points.shape[:3]):
                raise ShapeError(
                    f"SAM: input_labels {tuple(labels.shape)} must be (batch, point_batch, "
                    f"points) = {tuple(points.shape[:3])}"
                )
        elif labels is not None:
            raise ShapeError("SAM: input_labels given without input_points")
        if boxes is not None and (boxes.ndim != 3 or boxes.shape[-1] != 4):
            raise ShapeError(
                f"SAM: input_boxes must be (batch, boxes, 4), got {tuple(boxes.shape)}"
            )
        if points is not None and boxes is not None and points.shape[1] != boxes.shape[1]:
            raise ShapeError(
                f"SAM: {points.shape[1]} point prompts but {boxes.shape[1]} boxes: each box "
                "goes with one point prompt"
            )
        if masks is not None:
            s = 4 * self.prompt_encoder.embedding_size
            if masks.ndim != 4 or tuple(masks.shape[1:]) != (1, s, s):
                raise ShapeError(f"SAM: input_masks must be (batch, 1, {s}, {s}), got "
                                 f"{tuple(masks.shape)}")  # fmt: skip
        for name, t in (("input_points", points), ("input_boxes", boxes), ("input_masks", masks)):
            if t is not None and batch is not None and t.shape[0] != batch:
                raise ShapeError(f"SAM: {name} has batch {t.shape[0]}, the images {batch}")
        return points, labels, boxes, masks

    def forward(
        self,
        pixel_values: ArrayLike | None = None,
        input_points: ArrayLike | None = None,
        input_labels: ArrayLike | None = None,
        input_boxes: ArrayLike | None = None,
        input_masks: ArrayLike | None = None,
        image_embeddings: ArrayLike | None = None,
        multimask_output: bool = True,
    ) -> SamImageSegmentationOutput:
        """Masks for each prompt: pixels (or cached image_embeddings) + points/boxes/masks."""
        if (pixel_values is None) == (image_embeddings is None):
            raise ShapeError("SAM: give exactly one of pixel_values and image_embeddings")
        if image_embeddings is None:
            image_embeddings = self.get_image_embeddings(pixel_values)
        image_embeddings = _as_tensor(image_embeddings, "image_embeddings")
        s, c = self.prompt_encoder.embedding_size, self.config.mask_decoder_config.hidden_size
        if image_embeddings.ndim != 4 or tuple(image_embeddings.shape[1:]) != (c, s, s):
            raise ShapeError(f"SAM: image_embeddings must be (batch, {c}, {s}, {s}), got "
                             f"{tuple(image_embeddings.shape)}")  # fmt: skip
        b = image_embeddings.shape[0]
        prompts = self._prompts(input_points, input_labels, input_boxes, input_masks, b)
        sparse, dense = self.prompt_encoder(*prompts)
        if dense.shape[0] != b:
            dense = dense.expand(b, -1, -1, -1)
        masks, iou = self.mask_decoder(
            image_embeddings, self.get_image_wide_positional_embeddings(), sparse, dense,
            multimask_output,
        )  # fmt: skip
        return SamImageSegmentationOutput(iou_scores=iou, pred_masks=masks)

    @classmethod
    def from_state_dict(cls, config: SamConfig | dict, weights: dict) -> SamModel:
        """Build on the meta device and take transformers-named (or Meta-named) weights."""
        from ember.models._weights import assign_weights

        cfg = config if isinstance(config, SamConfig) else SamConfig.from_dict(config)
        weights = hf_names(weights)
        with ember.device("meta"):
            model = cls(cfg)
        try:
            assign_weights(model, weights)
        except ShapeError as e:
            raise FormatError(f"checkpoint does not fit the SAM config: {e}") from None
        return model.eval()

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> SamModel:
        """A transformers SamModel folder, or one checkpoint file (Meta's sam_vit_*.pth)."""
        p = Path(os.fspath(path)).expanduser()
        if p.is_file():
            return cls.from_state_dict(*_meta_checkpoint(p))
        if not p.is_dir():
            raise FormatError(f"{p}: no such SAM folder or checkpoint (ember never downloads)")
        cfg_path = p / "config.json"
        if not cfg_path.is_file():
            raise FormatError(f"{p}: no config.json (expected a transformers SamModel folder)")
        try:
            raw = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise FormatError(f"{cfg_path}: not valid JSON ({e})") from None
        config = SamConfig.from_dict(raw, str(cfg_path))
        if any(p.glob("*.safetensors")) or (p / "model.safetensors.index.json").is_file():
            from ember.io.safetensors import load_safetensors

            weights = load_safetensors(p)
        else:
            from ember.models.vision._weights import checkpoint_from

            weights = checkpoint_from(p)  # pytorch_model.bin through the safe unpickler
        model = cls.from_state_dict(config, weights)
        model.source = str(p)
        return model


_TIED = ("shared_image_embedding.positional_embedding",
         "prompt_encoder.shared_embedding.positional_embedding")  # fmt: skip

_META = [
    (r"^image_encoder\.", "vision_encoder."),
    (r"\.blocks\.(\d+)\.", r".layers.\1."),
    (r"\.norm([1-4])\.", r".layer_norm\1."),
    (r"\.norm_final_attn\.", ".layer_norm_final_attn."),
    (r"^vision_encoder\.patch_embed\.proj\.", "vision_encoder.patch_embed.projection."),
    (r"^vision_encoder\.neck\.0\.", "vision_encoder.neck.conv1."),
    (r"^vision_encoder\.neck\.1\.", "vision_encoder.neck.layer_norm1."),
    (r"^vision_encoder\.neck\.2\.", "vision_encoder.neck.conv2."),
    (r"^vision_encoder\.neck\.3\.", "vision_encoder.neck.layer_norm2."),
    (
        r"^prompt_encoder\.pe_layer\.positional_encoding_gaussian_matrix$",
        "prompt_encoder.shared_embedding.positional_embedding",
    ),
    (r"^prompt_encoder\.point_embeddings\.", "prompt_encoder.point_embed."),
    (r"^prompt_encoder\.mask_downscaling\.0\.", "prompt_encoder.mask_embed.conv1."),
    (r"^prompt_encoder\.mask_downscaling\.1\.", "prompt_encoder.mask_embed.layer_norm1."),
    (r"^prompt_encoder\.mask_downscaling\.3\.", "prompt_encoder.mask_embed.conv2."),
    (r"^prompt_encoder\.mask_downscaling\.4\.", "prompt_encoder.mask_embed.layer_norm2."),
    (r"^prompt_encoder\.mask_downscaling\.6\.", "prompt_encoder.mask_embed.conv3."),
    (r"^mask_decoder\.output_upscaling\.0\.", "mask_decoder.upscale_conv1."),
    (r"^mask_decoder\.output_upscaling\.1\.", "mask_decoder.upscale_layer_norm."),
    (r"^mask_decoder\.output_upscaling\.3\.", "mask_decoder.upscale_conv2."),
]
_HEADS = re.compile(
    r"^(mask_decoder\.(?:output_hypernetworks_mlps\.\d+|iou_prediction_head))\.layers\.(\d+)\.(.*)$"
)


def meta_to_hf(key: str, depth: dict | None = None) -> str:
    """One Meta segment_anything key as transformers spells it (`image_encoder.blocks.0...`).

    depth: layers per head MLP (`mask_decoder.iou_prediction_head` -> 3); Meta numbers them
    layers.0..n-1, transformers calls the first proj_in and the last proj_out.
    """
    for pat, rep in _META:
        key = re.sub(pat, rep, key)
    m = _HEADS.match(key)
    if m and depth:
        head, i, rest = m.group(1), int(m.group(2)), m.group(3)
        if i == 0:
            return f"{head}.proj_in.{rest}"
        return f"{head}.proj_out.{rest}" if i == depth.get(head, 0) - 1 else (
            f"{head}.layers.{i - 1}.{rest}")  # fmt: skip
    return key


def hf_names(weights: dict) -> dict:
    """A SAM state dict in transformers' names (Meta's renamed; the tied encoding kept once)."""
    if any(k.startswith("image_encoder.") or k.startswith("mask_decoder.output_upscaling")
           for k in weights):  # fmt: skip
        depth: dict = {}
        for k in weights:
            if m := _HEADS.match(k):
                depth[m.group(1)] = max(depth.get(m.group(1), 0), int(m.group(2)) + 1)
        weights = {meta_to_hf(k, depth): v for k, v in weights.items()}
    out = {k: v for k, v in weights.items() if k not in _TIED}
    enc = next((weights[k] for k in _TIED if k in weights), None)
    if enc is None:
        raise FormatError(
            "SAM checkpoint has no positional encoding (shared_image_embedding."
            "positional_embedding)"
        )
    out[_TIED[1]] = enc
    return out


_VIT_HEADS = {768: 12, 1024: 16, 1280: 16}  # SAM ViT-B / L / H
# Meta's two-way transformer normalises with torch's default eps; transformers' config says 1e-6
# (a 4e-3 relative difference in MobileSAM's mask logits), so Meta's checkpoints get Meta's eps
META_DECODER_EPS = 1e-5


def _meta_checkpoint(path: Path) -> tuple[SamConfig, dict]:
    """Config and weights of a checkpoint file without config.json (Meta's sam_vit_*.pth)."""
    from ember.models.vision._weights import checkpoint_from

    sd = checkpoint_from(path)
    sd = hf_names(sd)
    shape = {k: tuple(np.shape(v)) for k, v in sd.items()}
    proj = shape.get("vision_encoder.patch_embed.projection.weight")
    if proj is None or len(proj) != 4:
        raise FormatError(
            f"{path}: no SAM ViT image encoder in this checkpoint (vision_encoder.patch_embed / "
            "image_encoder.patch_embed.proj); MobileSAM's TinyViT encoder is not supported"
        )
    hidden, patch = proj[0], proj[2]
    layers = sorted({int(m.group(1)) for k in sd
                     if (m := re.match(r"vision_encoder\.layers\.(\d+)\.", k))})  # fmt: skip
    if not layers or layers != list(range(len(layers))):
        raise FormatError(f"{path}: the image encoder's layers are missing or not numbered 0..n")
    grid = shape["vision_encoder.pos_embed"][1] if "vision_encoder.pos_embed" in shape else 64
    rel = [shape.get(f"vision_encoder.layers.{i}.attn.rel_pos_h", (0,))[0] for i in layers]
    glob = [i for i, r in enumerate(rel) if r == 2 * grid - 1]
    window = next(((r + 1) // 2 for r in rel if r != 2 * grid - 1), 14)
    out_ch = shape.get("vision_encoder.neck.conv1.weight", (256,))[0]
    mlp = shape.get("vision_encoder.layers.0.mlp.lin1.weight", (4 * hidden,))[0]
    vision = SamVisionConfig(
        hidden_size=hidden, num_hidden_layers=len(layers),
        num_attention_heads=_VIT_HEADS.get(hidden, max(1, hidden // 64)),
        image_size=grid * patch, patch_size=patch, output_channels=out_ch,
        window_size=window, global_attn_indexes=glob, num_pos_feats=out_ch // 2, mlp_dim=mlp,
        use_abs_pos="vision_encoder.pos_embed" in shape,
    )  # fmt: skip
    dec_mlp = shape.get("mask_decoder.transformer.layers.0.mlp.lin1.weight", (2048,))[0]
    n_dec = len({k.split(".")[3] for k in sd if k.startswith("mask_decoder.transformer.layers.")})
    tokens = shape.get("mask_decoder.mask_tokens.weight", (4,))[0]
    iou_hidden = shape.get("mask_decoder.iou_prediction_head.proj_in.weight", (256,))[0]
    iou_depth = 2 + len({k for k in sd if k.startswith("mask_decoder.iou_prediction_head.layers.")
                         and k.endswith(".weight")})  # fmt: skip
    mask_ch = shape.get("prompt_encoder.mask_embed.conv2.weight", (16,))[0]
    config = SamConfig(
        vision,
        SamPromptEncoderConfig(hidden_size=out_ch, image_size=grid * patch, patch_size=patch,
                               mask_input_channels=mask_ch),
        SamMaskDecoderConfig(hidden_size=out_ch, mlp_dim=dec_mlp, num_hidden_layers=n_dec,
                             num_multimask_outputs=tokens - 1, iou_head_hidden_dim=iou_hidden,
                             iou_head_depth=iou_depth, layer_norm_eps=META_DECODER_EPS),  # 8 heads
    )  # fmt: skip
    config.check(str(path))
    return config, sd


__all__ = [
    "SamConfig", "SamVisionConfig", "SamPromptEncoderConfig", "SamMaskDecoderConfig", "SamModel",
    "SamImageSegmentationOutput", "hf_names", "meta_to_hf",
]  # fmt: skip
