"""Image classification: ResNet, MobileNetV2 (torchvision names), ViT (Hugging Face names) and
EfficientNet-Lite0 (efficientnet_pytorch names), plus ImageNet labels and a classify helper.

    from ember.models.vision import resnet50, efficientnet_lite0
    model = resnet50(weights="resnet50.pth").eval()      # torchvision checkpoint, plain module
    fast = ember.models.vision.ResNet.from_pretrained("resnet50.pth")  # fused for inference
"""

from ember.models.vision.efficientnet import (
    EfficientNetLite,
    MBConvBlock,
    bundled_weights,
    efficientnet_lite0,
)
from ember.models.vision.labels import imagenet_labels
from ember.models.vision.mobilenet import InvertedResidual, MobileNetV2, mobilenet_v2
from ember.models.vision.resnet import (
    BasicBlock,
    Bottleneck,
    ResNet,
    resnet18,
    resnet34,
    resnet50,
    resnet101,
    resnet152,
)
from ember.models.vision.vit import ViTConfig, ViTForImageClassification, ViTModel, vit_b_16

MODELS = {
    "efficientnet_lite0": efficientnet_lite0, "resnet18": resnet18, "resnet34": resnet34,
    "resnet50": resnet50, "resnet101": resnet101, "resnet152": resnet152,
    "mobilenet_v2": mobilenet_v2, "vit_b_16": vit_b_16,
}  # fmt: skip

__all__ = [
    "BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet34", "resnet50", "resnet101",
    "resnet152", "InvertedResidual", "MobileNetV2", "mobilenet_v2", "ViTConfig", "ViTModel",
    "ViTForImageClassification", "vit_b_16", "EfficientNetLite", "MBConvBlock",
    "efficientnet_lite0", "bundled_weights", "imagenet_labels", "MODELS",
]  # fmt: skip
