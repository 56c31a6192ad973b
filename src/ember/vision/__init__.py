"""Images in, tensors out: load with Pillow, resize, center-crop, normalize, batch (NCHW).

    from ember.vision import load_image, transforms as T
    tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    batch = ember.stack([tf(load_image(p)) for p in paths])      # (N, 3, 224, 224) float32

Pillow is the `vision` extra (`pip install ember[vision]`); it is imported on first use.
"""

from ember.vision import transforms
from ember.vision.image import IMAGENET_MEAN, IMAGENET_STD, load_image, preprocess

__all__ = ["transforms", "load_image", "preprocess", "IMAGENET_MEAN", "IMAGENET_STD"]
