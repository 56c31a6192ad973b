"""Promptable segmentation end to end (SAM): resize, pad, normalise, prompt, upscale, threshold.

    predictor = SamPredictor.load("sam-vit-base")          # a transformers SamModel folder
    masks, scores = predictor("dog.jpg", points=[(420, 310)])
    best = masks[scores.argmax()]                           # (H, W) bool in the image's pixels

Pre- and post-processing follow transformers' SamProcessor (its Pillow backend): the image is
resized with Pillow's bilinear filter so its longest side is `longest_edge` (1024, or the
folder's preprocessor_config.json), scaled to [0, 1], normalised with ImageNet's mean and std and
zero-padded at the bottom and right to pad_size x pad_size. Point and box coordinates are scaled
by the same factors per axis. The low-resolution mask logits are upscaled (bilinear, no
antialiasing) to the padded size, cropped to the resized image, upscaled to the original size
and thresholded at 0.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

import ember
from ember.errors import FormatError, ShapeError
from ember.nn import functional as F

if TYPE_CHECKING:
    from PIL.Image import Image

# an image: a path, bytes, a file object, an (H, W, 3) array or a Pillow image
ImageSource = Any

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class SamPreprocess:
    """SamProcessor's image settings: longest side, padded size, rescale and normalisation."""

    longest_edge: int = 1024
    pad_size: tuple = (1024, 1024)  # (height, width)
    image_mean: tuple = IMAGENET_MEAN
    image_std: tuple = IMAGENET_STD
    rescale_factor: float = 1 / 255
    do_normalize: bool = True

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, image_size: int) -> SamPreprocess:
        """The folder's preprocessor_config.json (or transformers 5's processor_config.json)."""
        path = Path(folder) / "preprocessor_config.json"
        if not path.is_file():
            path = Path(folder) / "processor_config.json"
        if not path.is_file():
            return cls(image_size, (image_size, image_size))
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            if path.name == "processor_config.json":
                d = d.get("image_processor", {})
            size = d.get("size") or {}
            pad = d.get("pad_size") or {}
            longest = int(size.get("longest_edge", image_size))
            out = cls(
                longest,
                (int(pad.get("height", longest)), int(pad.get("width", longest))),
                tuple(float(v) for v in d.get("image_mean", IMAGENET_MEAN)),
                tuple(float(v) for v in d.get("image_std", IMAGENET_STD)),
                float(d.get("rescale_factor", 1 / 255)),
                bool(d.get("do_normalize", True)),
            )
        except (ValueError, TypeError, AttributeError, RecursionError) as e:
            raise FormatError(f"{path}: not a usable SAM preprocessor config ({e})") from None
        if not (1 <= out.longest_edge <= min(out.pad_size) <= 1 << 14):
            raise FormatError(f"{path}: longest_edge {out.longest_edge} must fit pad_size "
                              f"{out.pad_size}")  # fmt: skip
        if out.longest_edge != image_size or out.pad_size != (image_size, image_size):
            raise FormatError(
                f"{path}: images padded to {out.pad_size} but the model takes "
                f"{image_size} x {image_size}"
            )
        if len(out.image_mean) != 3 or len(out.image_std) != 3 or min(out.image_std) <= 0:
            raise FormatError(f"{path}: image_mean and image_std need 3 values (std > 0)")
        return out

    def resized_shape(self, height: int, width: int) -> tuple[int, int]:
        """(h, w) with the longest side longest_edge (rounded half up, as SamProcessor)."""
        scale = self.longest_edge * 1.0 / max(height, width)
        return int(height * scale + 0.5), int(width * scale + 0.5)


@dataclass
class SamImage:
    """A preprocessed image: pixel values and the sizes to map prompts and masks back."""

    pixel_values: np.ndarray  # (3, pad_h, pad_w) float32
    original_size: tuple  # (height, width)
    reshaped_size: tuple  # (height, width) after the resize, before padding


def preprocess_image(image: ImageSource, pre: SamPreprocess) -> SamImage:
    """Any image Pillow reads (path, bytes, array, Pillow image) -> SamImage."""
    from ember.vision._pil import pil
    from ember.vision.image import load_image

    img = load_image(image)
    w, h = img.size
    if h < 1 or w < 1:
        raise ShapeError(f"SAM: empty image ({w} x {h})")
    nh, nw = pre.resized_shape(h, w)
    a = np.asarray(img.resize((nw, nh), resample=pil().BILINEAR))
    a = (a.astype(np.float64) * pre.rescale_factor).astype(np.float32)
    if pre.do_normalize:
        mean, std = np.float32(pre.image_mean), np.float32(pre.image_std)
        a = (a - mean) / std
    out = np.zeros((3, *pre.pad_size), np.float32)
    out[:, :nh, :nw] = a.transpose(2, 0, 1)
    return SamImage(out, (h, w), (nh, nw))


def scale_coords(coords: np.ndarray, original_size: tuple, reshaped_size: tuple) -> np.ndarray:
    """(..., 2) x, y in the original image -> in the resized one (float32)."""
    c = np.array(coords, dtype=np.float64)
    c[..., 0] *= reshaped_size[1] / original_size[1]
    c[..., 1] *= reshaped_size[0] / original_size[0]
    return c.astype(np.float32)


def postprocess_masks(
    low_res: ember.Tensor | np.ndarray,
    original_size: tuple,
    reshaped_size: tuple,
    pad_size: tuple,
    threshold: float | None = 0.0,
) -> np.ndarray:
    """(..., h, w) mask logits -> (..., H, W) in the original image: bool, or logits if threshold is None."""
    x = low_res if isinstance(low_res, ember.Tensor) else ember.from_numpy(np.asarray(low_res))
    lead = tuple(x.shape[:-2])
    x = x.reshape(-1, 1, *x.shape[-2:])
    x = F.interpolate(x, size=tuple(pad_size), mode="bilinear", align_corners=False)
    x = x[..., : reshaped_size[0], : reshaped_size[1]]
    x = F.interpolate(x, size=tuple(original_size), mode="bilinear", align_corners=False)
    out = x.numpy().reshape(*lead, *original_size)
    return out if threshold is None else out > threshold


def check_points(
    points: ArrayLike, labels: ArrayLike | None, size: tuple
) -> tuple[np.ndarray, np.ndarray]:
    """Points (n, 2) and labels (n,) checked to lie in an image of size (h, w)."""
    try:
        p = np.asarray(points, dtype=np.float64)
    except (TypeError, ValueError):
        raise ShapeError(f"SAM: points must be (x, y) pairs, got {points!r:.60}") from None
    if p.ndim != 2 or p.shape[1] != 2 or len(p) == 0:
        raise ShapeError(f"SAM: points must be a list of (x, y) pairs, got shape {p.shape}")
    h, w = size
    bad = ~np.isfinite(p).all(1) | (p[:, 0] < 0) | (p[:, 0] >= w) | (p[:, 1] < 0) | (p[:, 1] >= h)
    if bad.any():
        x, y = p[np.argmax(bad)]
        raise ShapeError(f"SAM: point ({x:g}, {y:g}) is outside the {w} x {h} image")
    lab = np.ones(len(p), np.int64) if labels is None else np.asarray(labels)
    if lab.shape != (len(p),) or not np.isin(lab, (0, 1)).all():
        raise ShapeError(
            f"SAM: labels must be one 0 (background) or 1 (foreground) per point, got {labels!r:.60}"
        )
    return p, lab.astype(np.int64)


def check_box(box: ArrayLike, size: tuple) -> np.ndarray:
    """A box (x1, y1, x2, y2) checked to lie in an image of size (h, w)."""
    try:
        b = np.asarray(box, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ShapeError(f"SAM: box must be x1, y1, x2, y2, got {box!r:.60}") from None
    h, w = size
    if b.shape != (4,) or not np.isfinite(b).all():
        raise ShapeError(f"SAM: box must be 4 numbers x1, y1, x2, y2, got {box!r:.60}")
    if not (0 <= b[0] < b[2] <= w and 0 <= b[1] < b[3] <= h):
        raise ShapeError(
            f"SAM: box ({', '.join(f'{v:g}' for v in b)}) must have x1 < x2, y1 < y2 and lie in "
            f"the {w} x {h} image"
        )
    return b


@dataclass
class SamPredictor:
    """A SamModel with its preprocessing; set_image once, then predict for any number of prompts."""

    model: ember.nn.Module
    pre: SamPreprocess = field(default_factory=SamPreprocess)
    image: SamImage | None = None
    embeddings: ember.Tensor | None = None
    low_res_logits: np.ndarray | None = None  # the last prediction's (M, 4s, 4s) logits

    @classmethod
    def load(cls, folder: str | os.PathLike) -> SamPredictor:
        """A predictor from a transformers SamModel folder (or Meta's sam_vit_*.pth)."""
        from ember.models.vision.sam import SamModel

        model = SamModel.from_pretrained(folder)
        size = model.config.vision_config.image_size
        p = Path(os.fspath(folder)).expanduser()
        pre = (
            SamPreprocess.from_folder(p, size) if p.is_dir() else SamPreprocess(size, (size, size))
        )
        return cls(model, pre)

    def set_image(self, image: ImageSource) -> SamPredictor:
        """Preprocess an image and compute its embeddings (the expensive step, done once)."""
        self.image = preprocess_image(image, self.pre)
        with ember.no_grad():
            self.embeddings = self.model.get_image_embeddings(self.image.pixel_values[None])
        return self

    def predict(
        self,
        points: ArrayLike | None = None,
        labels: ArrayLike | None = None,
        box: ArrayLike | None = None,
        mask_input: ArrayLike | None = None,
        multimask_output: bool = True,
        threshold: float | None = 0.0,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(masks (M, H, W) bool, scores (M,)) for one prompt on the image set last."""
        if self.image is None:
            raise ShapeError("SAM: call set_image(image) before predict")
        if points is None and box is None and mask_input is None:
            raise ShapeError("SAM: give at least one point or a box (or a mask_input)")
        im = self.image
        kw = {}
        if points is not None:
            p, lab = check_points(points, labels, im.original_size)
            kw["input_points"] = scale_coords(p, im.original_size, im.reshaped_size)[None, None]
            kw["input_labels"] = lab[None, None]
        elif labels is not None:
            raise ShapeError("SAM: labels given without points")
        if box is not None:
            b = check_box(box, im.original_size).reshape(2, 2)
            kw["input_boxes"] = scale_coords(b, im.original_size, im.reshaped_size).reshape(1, 1, 4)
        if mask_input is not None:
            s = 4 * self.model.prompt_encoder.embedding_size
            m = np.asarray(mask_input, dtype=np.float32)
            if m.size != s * s:
                raise ShapeError(f"SAM: mask_input must be {s} x {s} low-resolution logits, got "
                                 f"{m.shape}")  # fmt: skip
            kw["input_masks"] = m.reshape(1, 1, s, s)
        with ember.no_grad():
            out = self.model(image_embeddings=self.embeddings, multimask_output=multimask_output,
                             **kw)  # fmt: skip
        low = out.pred_masks[0, 0]
        self.low_res_logits = low.numpy()
        masks = postprocess_masks(low, im.original_size, im.reshaped_size, self.pre.pad_size,
                                  threshold)  # fmt: skip
        return masks, out.iou_scores.numpy()[0, 0]

    def __call__(
        self,
        image: ImageSource,
        points: ArrayLike | None = None,
        labels: ArrayLike | None = None,
        box: ArrayLike | None = None,
        multimask_output: bool = True,
    ) -> tuple[np.ndarray, np.ndarray]:
        """set_image(image) then predict: (masks (M, H, W) bool, scores (M,))."""
        self.set_image(image)
        return self.predict(points, labels, box, multimask_output=multimask_output)


def mask_image(mask: np.ndarray) -> Image:
    """A (H, W) bool mask as a black-and-white Pillow image (255 inside)."""
    from ember.vision._pil import pil

    return pil().fromarray(np.where(mask, 255, 0).astype(np.uint8))


def overlay(
    image: ImageSource, mask: np.ndarray, color: tuple = (30, 144, 255), alpha: float = 0.5
) -> Image:
    """A copy of the image (Pillow) with the mask tinted in color and its prompts untouched."""
    from ember.vision._pil import pil
    from ember.vision.image import load_image

    a = np.asarray(load_image(image)).astype(np.float32)
    if a.shape[:2] != mask.shape:
        raise ShapeError(f"SAM: mask {mask.shape} does not fit the image {a.shape[:2]}")
    tint = a * (1 - alpha) + np.float32(color) * alpha
    a = np.where(mask[..., None], tint, a)
    return pil().fromarray(np.clip(np.rint(a), 0, 255).astype(np.uint8))
