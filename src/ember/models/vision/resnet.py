"""ResNet-18/34/50/101/152 with torchvision's module tree, so state_dict keys match torchvision's.

Read top to bottom: BasicBlock and Bottleneck (the two residual blocks), ResNet (stem, four
stages, pooled classifier), then one constructor per depth. Each module whose forward is not a
Sequential states it as data in `inference_block` (its children in order, the residual add and
the activation after it), which ember.inference.optimize_for_inference reads to fold its
BatchNorms and fuse its residual add; see ember/inference/__init__.py.
"""

from __future__ import annotations

import ember
from ember import nn
from ember.models.vision._weights import apply_weights, build_checked, checkpoint_from, class_count


def conv3x3(cin: int, cout: int, stride: int = 1, groups: int = 1, dilation: int = 1) -> nn.Conv2d:
    """3x3 convolution with padding (no bias: a BatchNorm follows)."""
    return nn.Conv2d(
        cin, cout, 3, stride=stride, padding=dilation, groups=groups, bias=False, dilation=dilation
    )


def conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    """1x1 convolution (no bias)."""
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and a shortcut (ResNet-18/34)."""

    expansion = 1
    # forward() as ember.inference reads it: relu(chain(x) + downsample(x)) (or + x)
    inference_block = {
        "chain": ("conv1", "bn1", "relu", "conv2", "bn2"),
        "add": "downsample",
        "act": "relu",
    }

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))."""
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided, as torchvision v1.5), 1x1 expand, and a shortcut."""

    expansion = 4
    # forward() as ember.inference reads it: relu(chain(x) + downsample(x)) (or + x)
    inference_block = {
        "chain": ("conv1", "bn1", "relu", "conv2", "bn2", "relu", "conv3", "bn3"),
        "add": "downsample",
        "act": "relu",
    }

    def __init__(
        self,
        inplanes: int,
        planes: int,
        stride: int = 1,
        downsample: nn.Module | None = None,
        groups: int = 1,
        base_width: int = 64,
    ) -> None:
        super().__init__()
        width = int(planes * (base_width / 64.0)) * groups
        self.conv1 = conv1x1(inplanes, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride, groups)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = conv1x1(width, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """relu(bn3(conv3(...)) + shortcut(x))."""
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """Stem (7x7/2 conv, 3x3/2 max pool), four stages of residual blocks, global pool, fc."""

    # forward() as ember.inference reads it (so the stem's BatchNorm and ReLU fuse into conv1)
    inference_block = {
        "chain": ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4",
                  "avgpool", nn.Flatten(1), "fc"),
    }  # fmt: skip

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        layers: list[int],
        num_classes: int = 1000,
        zero_init_residual: bool = False,
    ) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        if zero_init_residual:
            for m in self.modules():
                last = getattr(m, "bn3", None) if isinstance(m, Bottleneck) else None
                last = getattr(m, "bn2", None) if isinstance(m, BasicBlock) else last
                if last is not None:
                    nn.init.zeros_(last.weight)

    def _make_layer(self, block, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward_features(self, x: ember.Tensor) -> ember.Tensor:
        """(N, 3, H, W) -> the last stage's feature map (N, 512*expansion, H/32, W/32)."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """(N, 3, H, W) images -> (N, num_classes) logits."""
        x = self.avgpool(self.forward_features(x))
        return self.fc(ember.flatten(x, 1))

    @classmethod
    def from_pretrained(cls, path, arch: str | None = None, optimize: bool = True) -> nn.Module:
        """A ResNet from a torchvision checkpoint (.pth/.pt/.bin/.safetensors, or a folder).

        The depth is read from the checkpoint unless `arch` ("resnet50", ...) is given; the result
        is fused for inference (`optimize=False` keeps the trainable module tree).
        """
        sd = checkpoint_from(path)
        name = arch or _guess_arch(sd)
        if name not in ARCHS:
            raise ember.errors.UnsupportedError(
                f"unknown ResNet arch {name!r}; known: {', '.join(ARCHS)}"
            )
        classes = class_count(sd, "fc.weight", 512 * _CONFIGS[name][0].expansion)
        model = build_checked(lambda: ARCHS[name](num_classes=classes), sd)
        apply_weights(model, sd)
        model.eval()
        return model.optimize_for_inference(inplace=True) if optimize else model


ARCHS: dict = {}


def _guess_arch(sd: dict) -> str:
    if "fc.weight" not in sd:
        raise ember.errors.FormatError("not a torchvision ResNet checkpoint: no 'fc.weight'")
    bottleneck = "layer1.0.conv3.weight" in sd
    counts = [len({k.split(".")[1] for k in sd if k.startswith(f"layer{i}.")}) for i in range(1, 5)]
    for name, (blk, layers) in _CONFIGS.items():
        if (blk is Bottleneck) == bottleneck and list(layers) == counts:
            return name
    raise ember.errors.FormatError(
        f"no ResNet with {counts} blocks per stage (bottleneck={bottleneck})"
    )


_CONFIGS = {
    "resnet18": (BasicBlock, (2, 2, 2, 2)),
    "resnet34": (BasicBlock, (3, 4, 6, 3)),
    "resnet50": (Bottleneck, (3, 4, 6, 3)),
    "resnet101": (Bottleneck, (3, 4, 23, 3)),
    "resnet152": (Bottleneck, (3, 8, 36, 3)),
}


def _resnet(name: str, weights, num_classes: int) -> ResNet:
    block, layers = _CONFIGS[name]
    model = ResNet(block, list(layers), num_classes=num_classes)
    if weights is not None:
        apply_weights(model, checkpoint_from(weights))
        model.eval()
    return model


def resnet18(weights=None, num_classes: int = 1000) -> ResNet:
    """ResNet-18; weights: a torchvision checkpoint path or a state_dict (keys as torchvision)."""
    return _resnet("resnet18", weights, num_classes)


def resnet34(weights=None, num_classes: int = 1000) -> ResNet:
    """ResNet-34; weights: a torchvision checkpoint path or a state_dict."""
    return _resnet("resnet34", weights, num_classes)


def resnet50(weights=None, num_classes: int = 1000) -> ResNet:
    """ResNet-50 (v1.5: stride in the 3x3); weights: a torchvision checkpoint or a state_dict."""
    return _resnet("resnet50", weights, num_classes)


def resnet101(weights=None, num_classes: int = 1000) -> ResNet:
    """ResNet-101; weights: a torchvision checkpoint path or a state_dict."""
    return _resnet("resnet101", weights, num_classes)


def resnet152(weights=None, num_classes: int = 1000) -> ResNet:
    """ResNet-152; weights: a torchvision checkpoint path or a state_dict."""
    return _resnet("resnet152", weights, num_classes)


ARCHS.update(
    resnet18=resnet18,
    resnet34=resnet34,
    resnet50=resnet50,
    resnet101=resnet101,
    resnet152=resnet152,
)
