"""Functional forms of linear, convolution, pooling, resampling, padding and embedding.

All of these are ember ops (ember.ops.linalg/conv/pool/movement/index) that already take
torch.nn.functional's signatures; nn.functional re-exports them as they are.
"""

from __future__ import annotations

from ember.ops._gather import embedding, one_hot
from ember.ops.conv import conv1d, conv2d, conv_transpose1d, conv_transpose2d
from ember.ops.linalg import bilinear, linear
from ember.ops.movement import pad
from ember.ops.pool import (
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    adaptive_max_pool1d,
    adaptive_max_pool2d,
    avg_pool1d,
    avg_pool2d,
    fold,
    interpolate,
    max_pool1d,
    max_pool2d,
    pixel_shuffle,
    pixel_unshuffle,
    unfold,
    upsample,
)

__all__ = [
    "linear",
    "bilinear",
    "conv1d",
    "conv2d",
    "conv_transpose1d",
    "conv_transpose2d",
    "max_pool1d",
    "max_pool2d",
    "avg_pool1d",
    "avg_pool2d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "interpolate",
    "upsample",
    "pad",
    "embedding",
    "one_hot",
    "pixel_shuffle",
    "pixel_unshuffle",
    "unfold",
    "fold",
]
