"""Loading images (Pillow) and the usual classification preprocessing in one call."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence

import numpy as np

from ember.errors import FormatError
from ember.tensor import Tensor
from ember.vision import transforms as T
from ember.vision._pil import pil

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def load_image(src, mode: str = "RGB"):
    """A Pillow image in `mode` from a path, bytes, a file object, a numpy array or an image."""
    Image = pil()
    if isinstance(src, Image.Image):
        img = src
    elif isinstance(src, np.ndarray):
        a = src
        if a.dtype != np.uint8:
            a = np.clip(np.rint(a * 255.0 if a.dtype.kind == "f" else a), 0, 255).astype(np.uint8)
        img = Image.fromarray(a)
    else:
        fp = io.BytesIO(src) if isinstance(src, (bytes, bytearray)) else src
        try:
            img = Image.open(os.fspath(fp) if isinstance(fp, (str, os.PathLike)) else fp)
            img.load()
        except FileNotFoundError:
            raise
        except Exception as e:  # Pillow raises UnidentifiedImageError, OSError, ...
            raise FormatError(
                f"{src if isinstance(src, (str, os.PathLike)) else 'image'}: {e}"
            ) from None
    return img.convert(mode) if img.mode != mode else img


def preprocess(
    images,
    size: int = 224,
    resize: int | None = 256,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    interpolation: str = "bilinear",
) -> Tensor:
    """Image(s) -> (N, 3, size, size) float32: resize the shorter side, center-crop, normalize."""
    if not isinstance(images, (list, tuple)):
        images = [images]
    steps = [T.Resize(resize, interpolation)] if resize else []
    tf = T.Compose([*steps, T.CenterCrop(size), T.ToTensor(), T.Normalize(mean, std)])
    arrays = [tf(load_image(im))._data for im in images]
    return Tensor._wrap(np.stack(arrays))
