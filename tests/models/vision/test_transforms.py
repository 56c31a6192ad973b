"""ember.vision: loading and preprocessing, checked against Pillow and numpy by hand."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
import skimage
from PIL import Image

import ember
from ember.models.vision import imagenet_labels
from ember.vision import load_image, preprocess
from ember.vision import transforms as T

CHELSEA = os.path.join(os.path.dirname(skimage.__file__), "data", "chelsea.png")


def test_resize_shorter_side_like_torchvision():
    r = T.Resize(256)
    assert r.target(451, 300) == (384, 256)  # int(256 * 451 / 300) = 384
    assert r.target(300, 451) == (256, 384)
    assert T.Resize((100, 50)).target(451, 300) == (50, 100)
    img = Image.new("RGB", (451, 300))
    assert r(img).size == (384, 256)


def test_center_crop_image_and_tensor():
    a = np.arange(7 * 9 * 3, dtype=np.uint8).reshape(7, 9, 3)
    img = Image.fromarray(a)
    out = np.asarray(T.CenterCrop(4)(img))
    top, left = int(round((7 - 4) / 2)), int(round((9 - 4) / 2))
    np.testing.assert_array_equal(out, a[top : top + 4, left : left + 4])
    t = T.ToTensor()(img)
    np.testing.assert_array_equal(T.CenterCrop((4, 4))(t).numpy(), t.numpy()[:, 2:6, 2:6])
    small = T.CenterCrop(12)(img)  # smaller images are zero-padded, as torchvision
    assert small.size == (12, 12)


def test_to_tensor_and_normalize():
    a = np.random.default_rng(0).integers(0, 256, (5, 6, 3), dtype=np.uint8)
    t = T.ToTensor()(Image.fromarray(a))
    assert t.shape == (3, 5, 6) and t.dtype == ember.float32
    np.testing.assert_allclose(t.numpy(), a.transpose(2, 0, 1) / 255.0, atol=1e-7)
    n = T.Normalize([0.5, 0.4, 0.3], [0.2, 0.25, 0.5])(t)
    ref = (a.transpose(2, 0, 1) / 255.0 - np.array([0.5, 0.4, 0.3])[:, None, None]) / np.array(
        [0.2, 0.25, 0.5]
    )[:, None, None]
    np.testing.assert_allclose(n.numpy(), ref, atol=1e-6)
    with pytest.raises(ember.errors.ShapeError):
        T.Normalize([0.5] * 4, [1.0] * 4)(t)


def test_preprocess_pipeline_and_sources():
    ref = Image.open(CHELSEA).convert("RGB").resize((384, 256), Image.BILINEAR)
    left, top = int(round((384 - 224) / 2)), 16
    ref = np.asarray(ref.crop((left, top, left + 224, top + 224)), np.float32) / 255.0
    ref = (ref - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    with open(CHELSEA, "rb") as f:
        raw = f.read()
    for src in (CHELSEA, raw, io.BytesIO(raw), skimage.data.chelsea(), Image.open(CHELSEA)):
        x = preprocess(src)
        assert x.shape == (1, 3, 224, 224)
        np.testing.assert_allclose(x.numpy()[0], ref.transpose(2, 0, 1), atol=1e-5)
    assert load_image(skimage.data.camera()).mode == "RGB"  # grayscale -> RGB
    with pytest.raises(ember.errors.FormatError):
        load_image(b"not an image")


def test_imagenet_labels_ship_with_the_package():
    labels = imagenet_labels()
    assert len(labels) == 1000
    assert labels[0].startswith("tench") and labels[967].startswith("espresso")
    assert imagenet_labels(synsets=True)[281] == "n02123045"
