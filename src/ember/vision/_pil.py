"""Pillow, imported on first use with an install hint when missing."""

from __future__ import annotations

from ember.errors import UnsupportedError


def pil():
    """The PIL.Image module."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - pillow is installed in the test environment
        raise UnsupportedError(
            "ember.vision needs Pillow: `pip install ember[vision]` (or `pip install pillow`)"
        ) from None
    return Image


INTERPOLATION = {"nearest": 0, "bilinear": 2, "bicubic": 3, "lanczos": 1, "box": 4, "hamming": 5}


def resample(name: str) -> int:
    """Pillow's resampling filter number for a torchvision-style interpolation name."""
    try:
        return INTERPOLATION[name]
    except KeyError:
        raise ValueError(
            f"interpolation must be one of {sorted(INTERPOLATION)}, got {name!r}"
        ) from None
