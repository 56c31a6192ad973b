"""The bundled EfficientNet-Lite0 weights on scikit-image's sample photos (end to end)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import skimage

import ember
from ember.inference import optimize_for_inference
from ember.io.torch_pickle import load_torch
from ember.models.vision import EfficientNetLite, bundled_weights, efficientnet_lite0
from ember.models.vision.pipeline import PRESETS, ImageClassifier

DATA = os.path.join(os.path.dirname(skimage.__file__), "data")
CATS = {281, 282, 285}  # tabby, tiger cat, Egyptian cat
ESPRESSO = 967


@pytest.fixture(scope="module")
def classifier() -> ImageClassifier:
    return ImageClassifier.load()  # bundled Lite0, fused


def test_checkpoint_keys_are_the_model_keys():
    sd = load_torch(bundled_weights())
    with ember.device("meta"):
        m = EfficientNetLite()
    assert list(m.state_dict()) == list(sd)
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == {
        k: tuple(v.shape) for k, v in sd.items()
    }
    assert m._bn0.eps == 1e-3


def test_chelsea_is_a_cat_and_coffee_is_espresso(classifier):
    ((cat,),) = classifier([os.path.join(DATA, "chelsea.png")], top=1)
    ((coffee,),) = classifier([skimage.data.coffee()], top=1)
    assert cat[0] in CATS and cat[2] > 0.3, cat
    assert coffee[0] == ESPRESSO and coffee[2] > 0.8, coffee
    assert coffee[1].startswith("espresso")


def test_fused_matches_plain_module(classifier):
    x = PRESETS["efficientnet_lite0"]([skimage.data.chelsea(), skimage.data.coffee()])
    plain = efficientnet_lite0(weights="bundled")
    with ember.no_grad():
        ref = plain(x).numpy()
    np.testing.assert_allclose(classifier.model(x).numpy(), ref, atol=1e-3, rtol=1e-4)
    # odd sizes exercise TF 'SAME' padding (the extra pixel goes bottom/right)
    y = ember.from_numpy(np.random.default_rng(0).uniform(-1, 1, (1, 3, 75, 61)).astype(np.float32))
    with ember.no_grad():
        ref2 = plain(y).numpy()
    fused = optimize_for_inference(plain)
    np.testing.assert_allclose(fused(y).numpy(), ref2, atol=1e-3, rtol=1e-4)
