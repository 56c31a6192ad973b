"""torchvision.transforms' everyday subset: Compose, Resize, CenterCrop, ToTensor, Normalize.

Resize and CenterCrop take Pillow images (CenterCrop also takes (..., H, W) tensors); ToTensor
turns an image into a (C, H, W) float32 tensor in [0, 1]; Normalize standardises per channel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ember.errors import ShapeError
from ember.tensor import Tensor
from ember.vision._pil import pil, resample


def _pair(size) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    if len(size) == 1:
        return int(size[0]), int(size[0])
    return int(size[0]), int(size[1])


class Compose:
    """Apply transforms in order."""

    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x

    def __repr__(self) -> str:
        inner = "".join(f"\n    {t!r}," for t in self.transforms)
        return f"Compose({inner}\n)"


class Resize:
    """Resize a Pillow image: an int matches the shorter side (aspect kept), (h, w) is exact."""

    def __init__(self, size, interpolation: str = "bilinear", max_size: int | None = None) -> None:
        self.size, self.interpolation, self.max_size = size, interpolation, max_size
        self._filter = resample(interpolation)

    def target(self, w: int, h: int) -> tuple[int, int]:
        """(new_w, new_h) for a w x h image (as torchvision: the long side is truncated)."""
        if isinstance(self.size, int) or len(self.size) == 1:
            s = self.size if isinstance(self.size, int) else self.size[0]
            short, long = (w, h) if w <= h else (h, w)
            new_short, new_long = s, int(s * long / short)
            if self.max_size is not None and new_long > self.max_size:
                new_short, new_long = int(self.max_size * new_short / new_long), self.max_size
            return (new_short, new_long) if w <= h else (new_long, new_short)
        th, tw = _pair(self.size)
        return tw, th

    def __call__(self, img):
        w, h = img.size
        size = self.target(w, h)
        return img if size == (w, h) else img.resize(size, self._filter)

    def __repr__(self) -> str:
        return f"Resize(size={self.size}, interpolation={self.interpolation})"


class CenterCrop:
    """Crop the center (h, w) of a Pillow image or a (..., H, W) tensor (zero-pads if smaller)."""

    def __init__(self, size) -> None:
        self.size = _pair(size)

    def __call__(self, img):
        th, tw = self.size
        if isinstance(img, Tensor):
            h, w = img.shape[-2:]
            if h < th or w < tw:
                raise ShapeError(
                    f"CenterCrop: tensor of {h}x{w} is smaller than the crop {th}x{tw}"
                )
            top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
            return img[..., top : top + th, left : left + tw]
        w, h = img.size
        if w < tw or h < th:
            canvas = pil().new(img.mode, (max(w, tw), max(h, th)))
            canvas.paste(img, ((max(w, tw) - w) // 2, (max(h, th) - h) // 2))
            img, (w, h) = canvas, canvas.size
        top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
        return img.crop((left, top, left + tw, top + th))

    def __repr__(self) -> str:
        return f"CenterCrop(size={self.size})"


class ToTensor:
    """Pillow image or (H, W[, C]) uint8 array -> (C, H, W) float32 tensor in [0, 1]."""

    def __call__(self, img) -> Tensor:
        a = np.asarray(img)
        if a.ndim == 2:
            a = a[:, :, None]
        if a.ndim != 3:
            raise ShapeError(f"ToTensor: expected an (H, W[, C]) image, got shape {a.shape}")
        scale = 1.0 / 255.0 if a.dtype == np.uint8 else 1.0
        out = np.ascontiguousarray(a.transpose(2, 0, 1), dtype=np.float32)
        if scale != 1.0:
            out *= np.float32(scale)
        return Tensor._wrap(out)

    def __repr__(self) -> str:
        return "ToTensor()"


class Normalize:
    """(x - mean) / std per channel of a (..., C, H, W) float tensor."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = np.asarray(mean, np.float32)
        self.std = np.asarray(std, np.float32)
        if np.any(self.std == 0):
            raise ValueError(f"Normalize: std must be non-zero, got {list(std)}")

    def __call__(self, x: Tensor) -> Tensor:
        a = x._data
        c = a.shape[-3]
        if self.mean.size not in (1, c) or self.std.size not in (1, c):
            raise ShapeError(
                f"Normalize: {self.mean.size} means / {self.std.size} stds for {c} channels"
            )
        shape = (-1, 1, 1)
        out = (a - self.mean.reshape(shape)) / self.std.reshape(shape)
        return Tensor._wrap(out.astype(np.float32, copy=False))

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean.tolist()}, std={self.std.tolist()})"


__all__ = ["Compose", "Resize", "CenterCrop", "ToTensor", "Normalize"]
