"""MobileNetV2 with torchvision's module tree (state_dict keys as torchvision's mobilenet_v2)."""

from __future__ import annotations

import ember
from ember import nn
from ember.models.vision._weights import apply_weights, build_checked, checkpoint_from, class_count


def _make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round channels to a multiple of divisor, never dropping more than 10% (as torchvision)."""
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class Conv2dNormActivation(nn.Sequential):
    """Conv2d (no bias) -> BatchNorm2d -> ReLU6, as torchvision.ops.Conv2dNormActivation."""

    def __init__(
        self, cin: int, cout: int, kernel_size: int = 3, stride: int = 1, groups: int = 1
    ) -> None:
        pad = (kernel_size - 1) // 2
        super().__init__(
            nn.Conv2d(cin, cout, kernel_size, stride, pad, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    """1x1 expand (ReLU6), 3x3 depthwise (ReLU6), 1x1 projection, residual if shapes allow."""

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.stride = stride
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(Conv2dNormActivation(inp, hidden, kernel_size=1))
        layers += [
            Conv2dNormActivation(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)
        self.out_channels = oup
        if self.use_res_connect:  # forward() as ember.inference reads it: x + conv(x)
            self.inference_block = {"chain": ("conv",), "add": "input"}

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """x + conv(x) when stride 1 and channels match, else conv(x)."""
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 (Sandler et al. 2018), torchvision's layout: features, classifier."""

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0, dropout: float = 0.2):
        super().__init__()
        setting = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2], [6, 96, 3, 1],
                   [6, 160, 3, 2], [6, 320, 1, 1]]  # fmt: skip
        inp = _make_divisible(32 * width_mult)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult))
        features: list[nn.Module] = [Conv2dNormActivation(3, inp, stride=2)]
        for t, c, n, s in setting:
            out = _make_divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidual(inp, out, s if i == 0 else 1, t))
                inp = out
        features.append(Conv2dNormActivation(inp, self.last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(self.last_channel, num_classes)
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """(N, 3, H, W) images -> (N, num_classes) logits."""
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(ember.flatten(x, 1))

    @classmethod
    def from_pretrained(cls, path, optimize: bool = True) -> nn.Module:
        """MobileNetV2 from a torchvision checkpoint; fused for inference unless optimize=False."""
        sd = checkpoint_from(path)
        classes = class_count(sd, "classifier.1.weight", _make_divisible(1280))
        model = build_checked(lambda: cls(num_classes=classes), sd)
        apply_weights(model, sd)
        model.eval()
        return model.optimize_for_inference(inplace=True) if optimize else model


def mobilenet_v2(weights=None, num_classes: int = 1000, width_mult: float = 1.0) -> MobileNetV2:
    """MobileNetV2; weights: a torchvision checkpoint path or a state_dict (torchvision's keys)."""
    model = MobileNetV2(num_classes=num_classes, width_mult=width_mult)
    if weights is not None:
        apply_weights(model, checkpoint_from(weights))
        model.eval()
    return model
