"""Image classification end to end: pick a model, preprocess as its weights expect, top-k labels.

clf = ImageClassifier.load()                        # bundled EfficientNet-Lite0
clf = ImageClassifier.load("resnet50", "resnet50.pth")
for idx, label, prob in clf(["cat.jpg"])[0]: ...
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import ember
from ember.errors import EmberError
from ember.models.vision.labels import imagenet_labels
from ember.vision.image import IMAGENET_MEAN, IMAGENET_STD, preprocess


@dataclass
class Preprocess:
    """How a model's weights expect images: resize (shorter side, or None), crop, normalization."""

    size: int = 224
    resize: int | None = 256
    mean: tuple = IMAGENET_MEAN
    std: tuple = IMAGENET_STD
    interpolation: str = "bilinear"
    squash: bool = False  # resize straight to size x size (Hugging Face ViT), no crop

    def __call__(self, images) -> ember.Tensor:
        """Images (paths, Pillow images, arrays) -> (N, 3, size, size) float32."""
        if self.squash:
            from ember.vision import transforms as T
            from ember.vision.image import load_image

            tf = T.Compose([T.Resize((self.size, self.size), self.interpolation), T.ToTensor(),
                            T.Normalize(self.mean, self.std)])  # fmt: skip
            imgs = images if isinstance(images, (list, tuple)) else [images]
            return ember.stack([tf(load_image(i)) for i in imgs])
        return preprocess(images, self.size, self.resize, self.mean, self.std, self.interpolation)


PRESETS = {
    # TF-trained Lite0: [-1, 1] inputs, bicubic, 224 crop of 256 (TF's crop_padding=32)
    "efficientnet_lite0": Preprocess(224, 256, (0.5,) * 3, (0.5,) * 3, "bicubic"),
    "resnet": Preprocess(),  # torchvision IMAGENET1K_V1 recipe
    "mobilenet_v2": Preprocess(),
    "vit": Preprocess(224, None, (0.5,) * 3, (0.5,) * 3, "bilinear", squash=True),
}


@dataclass
class ImageClassifier:
    """A classification model with its preprocessing and class names."""

    model: ember.nn.Module
    preprocess: Preprocess
    labels: list = field(default_factory=imagenet_labels)

    @classmethod
    def load(cls, name: str = "efficientnet_lite0", weights=None, optimize: bool = True):
        """Build `name` (see ember.models.vision.MODELS) with weights, fused for inference."""
        from ember.models.vision import MODELS
        from ember.models.vision.vit import ViTForImageClassification

        if name not in MODELS:
            raise EmberError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
        if weights is None and name != "efficientnet_lite0":
            raise EmberError(f"{name} needs --weights (ember ships only EfficientNet-Lite0's)")
        labels = imagenet_labels()
        if name.startswith("vit"):
            p = Path(weights)
            model = ViTForImageClassification.from_pretrained(p)
            prep = _hf_preprocess(p if p.is_dir() else p.parent, model.config.image_size)
            id2label = model.config.id2label
            if id2label:
                labels = [id2label.get(str(i), str(i)) for i in range(len(id2label))]
            if optimize:
                model = model.optimize_for_inference(inplace=True)
            return cls(model, prep, labels)
        model = MODELS[name](weights=weights or "bundled")
        if optimize:
            model = model.optimize_for_inference(inplace=True)
        key = "resnet" if name.startswith("resnet") else name
        return cls(model, PRESETS[key], labels)

    def logits(self, images) -> np.ndarray:
        """Raw scores (N, classes)."""
        with ember.no_grad():
            return self.model(self.preprocess(images)).numpy()

    def __call__(self, images, top: int = 5) -> list[list[tuple[int, str, float]]]:
        """For each image, the top (class index, label, probability) triples."""
        z = self.logits(images).astype(np.float64)
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        out = []
        for row in p:
            idx = np.argsort(-row, kind="stable")[:top]
            out.append([(int(i), self._label(int(i)), float(row[i])) for i in idx])
        return out

    def _label(self, i: int) -> str:
        return self.labels[i] if i < len(self.labels) else str(i)


def _hf_preprocess(folder: Path, image_size: int) -> Preprocess:
    """ViT preprocessing from preprocessor_config.json when present (else google/vit's values)."""
    v = PRESETS["vit"]
    prep = Preprocess(image_size, None, v.mean, v.std, v.interpolation, squash=True)
    f = folder / "preprocessor_config.json"
    if f.is_file():
        c = json.loads(f.read_text())
        size = c.get("size", image_size)
        size = size.get("height", image_size) if isinstance(size, dict) else size
        interp = {2: "bilinear", 3: "bicubic", 0: "nearest"}.get(c.get("resample", 2), "bilinear")
        prep = Preprocess(int(size), None, tuple(c.get("image_mean", prep.mean)),
                          tuple(c.get("image_std", prep.std)), interp, squash=True)  # fmt: skip
    return prep
