"""YOLOv8 detection (n/s/m/l/x) with Ultralytics' module tree, so state_dict keys match its own.

Read top to bottom: Conv (conv + BatchNorm + SiLU), Bottleneck, C2f, SPPF (the building blocks),
DFL and Detect (the anchor-free head), then YOLOv8 (the 23-layer graph of yolov8.yaml: backbone
0-9, neck 10-21, head 22) and its loader. Sizes differ only by depth/width multiples
(YOLOv8Config.size). The model returns Ultralytics' eval output: (N, 4 + classes, anchors), boxes
as (cx, cy, w, h) in input pixels followed by sigmoid class scores. Letterboxing, NMS and
mapping boxes back to the image are in ember.models.vision.detection.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import ember
from ember import nn
from ember.errors import FormatError
from ember.models.vision._weights import apply_weights, build_checked, checkpoint_from

# (depth multiple, width multiple, max channels) per size, from Ultralytics' yolov8.yaml
SIZES = {
    "n": (0.33, 0.25, 1024),
    "s": (0.33, 0.50, 1024),
    "m": (0.67, 0.75, 768),
    "l": (1.00, 1.00, 512),
    "x": (1.00, 1.25, 512),
}
STRIDES = (8, 16, 32)


@dataclass
class YOLOv8Config:
    """Size multiples, class count, DFL bins, and whether BatchNorms are folded into the convs."""

    depth: float = 0.33
    width: float = 0.25
    max_channels: int = 1024
    num_classes: int = 80
    reg_max: int = 16
    fused: bool = False  # Ultralytics' fuse(): convs carry a bias, no BatchNorm follows

    @classmethod
    def size(cls, name: str, **kw) -> YOLOv8Config:
        """The config of yolov8{name} (n, s, m, l, x)."""
        if name not in SIZES:
            raise ValueError(f"unknown YOLOv8 size {name!r}; choose one of {', '.join(SIZES)}")
        d, w, mc = SIZES[name]
        return cls(depth=d, width=w, max_channels=mc, **kw)

    def channels(self, c: int) -> int:
        """Channels of a layer written as c in the yaml (scaled, capped, rounded up to 8)."""
        return int(math.ceil(min(c, self.max_channels) * self.width / 8) * 8)

    def repeats(self, n: int) -> int:
        """Blocks of a C2f written as n in the yaml."""
        return max(round(n * self.depth), 1) if n > 1 else n


class Conv(nn.Module):
    """Conv2d (no bias, 'same' padding) -> BatchNorm2d -> SiLU; bias and no BatchNorm when fused."""

    inference_block = {"chain": ("conv", "bn", "act")}

    def __init__(
        self, c1: int, c2: int, k: int = 1, s: int = 1, g: int = 1, fused: bool = False
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, groups=g, bias=fused)
        self.bn = nn.Identity() if fused else nn.BatchNorm2d(c2, eps=0.001, momentum=0.03)
        self.act = nn.SiLU()

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """act(bn(conv(x)))."""
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    """Two 3x3 Convs, with a residual add when shortcut is on and channels match."""

    def __init__(self, c1: int, c2: int, shortcut: bool = True, fused: bool = False) -> None:
        super().__init__()
        self.cv1 = Conv(c1, c2, 3, fused=fused)
        self.cv2 = Conv(c2, c2, 3, fused=fused)
        self.add = shortcut and c1 == c2

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """x + cv2(cv1(x)) (or without x)."""
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """CSP block with two convs: split cv1's output, chain n Bottlenecks, concat all, cv2."""

    def __init__(
        self, c1: int, c2: int, n: int = 1, shortcut: bool = False, fused: bool = False
    ) -> None:
        super().__init__()
        self.c = c2 // 2
        self.cv1 = Conv(c1, 2 * self.c, 1, fused=fused)
        self.cv2 = Conv((2 + n) * self.c, c2, 1, fused=fused)
        self.m = nn.ModuleList(Bottleneck(self.c, self.c, shortcut, fused) for _ in range(n))

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """cv2(cat(halves of cv1(x), each Bottleneck's output))."""
        ys = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            ys.append(m(ys[-1]))
        return self.cv2(ember.cat(ys, 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 max pools, concatenated."""

    def __init__(self, c1: int, c2: int, k: int = 5, fused: bool = False) -> None:
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, fused=fused)
        self.cv2 = Conv(c_ * 4, c2, 1, fused=fused)
        self.m = nn.MaxPool2d(k, stride=1, padding=k // 2)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """cv2(cat(y, pool(y), pool(pool(y)), pool(pool(pool(y))))), y = cv1(x)."""
        ys = [self.cv1(x)]
        for _ in range(3):
            ys.append(self.m(ys[-1]))
        return self.cv2(ember.cat(ys, 1))


class Concat(nn.Module):
    """Concatenate a list of tensors along channels (a graph node with no weights)."""

    def forward(self, xs: list) -> ember.Tensor:
        """cat(xs, 1)."""
        return ember.cat(list(xs), 1)


class DFL(nn.Module):
    """Distribution focal loss decoding: expected value of a softmax over reg_max bins.

    The bins' values are the weight of a 1x1 conv (0, 1, ..., reg_max - 1 in checkpoints).
    """

    def __init__(self, c1: int = 16) -> None:
        super().__init__()
        self.c1 = c1
        self.conv = nn.Conv2d(c1, 1, 1, bias=False)
        self.conv.requires_grad_(False)
        with ember.no_grad():
            self.conv.weight.copy_(ember.arange(c1, dtype=ember.float32).reshape(1, c1, 1, 1))

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """(N, 4 * c1, A) bin logits -> (N, 4, A) distances."""
        b, _, a = x.shape
        p = x.reshape(b, 4, self.c1, a).transpose(2, 1).softmax(1)
        return self.conv(p).reshape(b, 4, a)


class Detect(nn.Module):
    """The anchor-free head: per level a box branch (cv2, DFL bins) and a class branch (cv3)."""

    def __init__(self, nc: int, ch: tuple, reg_max: int = 16, fused: bool = False) -> None:
        super().__init__()
        self.nc, self.reg_max, self.nl = nc, reg_max, len(ch)
        self.no = nc + 4 * reg_max
        c2 = max(16, ch[0] // 4, 4 * reg_max)
        c3 = max(ch[0], min(nc, 100))
        self.cv2 = nn.ModuleList(
            nn.Sequential(Conv(x, c2, 3, fused=fused), Conv(c2, c2, 3, fused=fused),
                          nn.Conv2d(c2, 4 * reg_max, 1))
            for x in ch
        )  # fmt: skip
        self.cv3 = nn.ModuleList(
            nn.Sequential(Conv(x, c3, 3, fused=fused), Conv(c3, c3, 3, fused=fused),
                          nn.Conv2d(c3, nc, 1))
            for x in ch
        )  # fmt: skip
        self.dfl = DFL(reg_max) if reg_max > 1 else nn.Identity()
        self.stride = STRIDES[: self.nl]
        self._anchors: dict = {}

    def raw(self, xs: list) -> list:
        """Per level (N, 4 * reg_max + classes, H, W): box bins then class logits."""
        return [ember.cat([self.cv2[i](x), self.cv3[i](x)], 1) for i, x in enumerate(xs)]

    def anchors(self, shapes: tuple) -> tuple:
        """(2, A) anchor centres in grid units and (1, A) strides for these level sizes."""
        if shapes not in self._anchors:
            pts, strides = [], []
            for (h, w), s in zip(shapes, self.stride):
                sy, sx = ember.meshgrid(
                    ember.arange(h, dtype=ember.float32) + 0.5,
                    ember.arange(w, dtype=ember.float32) + 0.5,
                    indexing="ij",
                )
                pts.append(ember.stack([sx.reshape(-1), sy.reshape(-1)], 0))
                strides.append(ember.full((1, h * w), float(s)))
            self._anchors[shapes] = (ember.cat(pts, 1), ember.cat(strides, 1))
        return self._anchors[shapes]

    def decode(self, raw: list) -> ember.Tensor:
        """Raw level maps -> (N, 4 + classes, A): (cx, cy, w, h) in pixels, sigmoid scores."""
        b = raw[0].shape[0]
        x = ember.cat([r.reshape(b, self.no, -1) for r in raw], 2)
        box, cls = x.split([4 * self.reg_max, self.nc], 1)
        anchor, stride = self.anchors(tuple(tuple(r.shape[2:]) for r in raw))
        lt, rb = self.dfl(box).chunk(2, 1)
        x1y1, x2y2 = anchor - lt, anchor + rb
        dbox = ember.cat([(x1y1 + x2y2) / 2, x2y2 - x1y1], 1) * stride
        return ember.cat([dbox, cls.sigmoid()], 1)

    def forward(self, xs: list) -> ember.Tensor:
        """decode(raw(xs))."""
        return self.decode(self.raw(xs))


class YOLOv8(nn.Module):
    """yolov8.yaml's graph in `model` (indices and names as Ultralytics' DetectionModel)."""

    # input index of each layer (-1: the previous one); lists feed a Concat or the Detect head
    SOURCES = (-1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
               -1, [-1, 6], -1, -1, [-1, 4], -1, -1, [-1, 12], -1, -1, [-1, 9], -1,
               [15, 18, 21])  # fmt: skip

    def __init__(self, config: YOLOv8Config | None = None) -> None:
        super().__init__()
        cfg = self.config = config or YOLOv8Config()
        c, n, f = cfg.channels, cfg.repeats, cfg.fused
        c64, c128, c256, c512, c1024 = c(64), c(128), c(256), c(512), c(1024)
        up = lambda: nn.Upsample(scale_factor=2.0, mode="nearest")  # noqa: E731
        self.model = nn.ModuleList([
            Conv(3, c64, 3, 2, fused=f),                          # 0  P1/2
            Conv(c64, c128, 3, 2, fused=f),                       # 1  P2/4
            C2f(c128, c128, n(3), True, f),                       # 2
            Conv(c128, c256, 3, 2, fused=f),                      # 3  P3/8
            C2f(c256, c256, n(6), True, f),                       # 4
            Conv(c256, c512, 3, 2, fused=f),                      # 5  P4/16
            C2f(c512, c512, n(6), True, f),                       # 6
            Conv(c512, c1024, 3, 2, fused=f),                     # 7  P5/32
            C2f(c1024, c1024, n(3), True, f),                     # 8
            SPPF(c1024, c1024, 5, f),                             # 9
            up(), Concat(), C2f(c1024 + c512, c512, n(3), False, f),    # 10-12
            up(), Concat(), C2f(c512 + c256, c256, n(3), False, f),     # 13-15 (P3 out)
            Conv(c256, c256, 3, 2, fused=f), Concat(),                  # 16-17
            C2f(c256 + c512, c512, n(3), False, f),                     # 18 (P4 out)
            Conv(c512, c512, 3, 2, fused=f), Concat(),                  # 19-20
            C2f(c512 + c1024, c1024, n(3), False, f),                   # 21 (P5 out)
            Detect(cfg.num_classes, (c256, c512, c1024), cfg.reg_max, f),  # 22
        ])  # fmt: skip

    def features(self, x: ember.Tensor) -> list:
        """The three neck outputs (P3, P4, P5) the head reads."""
        if x.ndim != 4 or x.shape[1] != 3:
            from ember.errors import ShapeError

            raise ShapeError(f"YOLOv8 expects (N, 3, H, W) images, got {tuple(x.shape)}")
        if x.shape[2] % 32 or x.shape[3] % 32:
            from ember.errors import ShapeError

            raise ShapeError(f"YOLOv8 needs H and W multiples of 32, got {tuple(x.shape[2:])}")
        outs: list = []
        for m, src in zip(self.model[:-1], self.SOURCES):
            inp = x if src == -1 else [x if j == -1 else outs[j] for j in src]
            x = m(inp)
            outs.append(x)
        return [outs[j] for j in self.SOURCES[-1]]

    def raw(self, x: ember.Tensor) -> list:
        """Raw head maps per level: (N, 4 * reg_max + classes, H / s, W / s), s = 8, 16, 32."""
        return self.model[-1].raw(self.features(x))

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """(N, 3, H, W) RGB in [0, 1] -> (N, 4 + classes, anchors) (cx, cy, w, h, scores...)."""
        return self.model[-1].decode(self.raw(x))

    @classmethod
    def from_pretrained(cls, src, num_classes: int | None = None) -> YOLOv8:
        """A model from a state dict (.pt/.pth, .safetensors, mapping) or an ONNX export."""
        sd = _state_dict(src)
        cfg = config_from_state_dict(sd)
        if num_classes is not None and num_classes != cfg.num_classes:
            raise FormatError(f"checkpoint has {cfg.num_classes} classes, not {num_classes}")
        model = build_checked(lambda: cls(cfg), sd)
        apply_weights(model, sd)
        return model.eval()


def _state_dict(src) -> dict:
    """name -> array from a checkpoint, with a clear word for Ultralytics' pickled models."""
    if isinstance(src, (str, os.PathLike)) and os.fspath(src).endswith(".onnx"):
        return _onnx_weights(src)
    try:
        return checkpoint_from(src)
    except FormatError as e:
        if "ultralytics" not in str(e):
            raise
        raise FormatError(
            f"{src}: this Ultralytics .pt pickles the whole model object, which ember's safe "
            "loader does not execute; save its tensors instead, e.g. "
            "`safetensors.torch.save_file(YOLO('yolov8n.pt').model.state_dict(), "
            "'yolov8n.safetensors')` (or torch.save of that state_dict)"
        ) from None


def _onnx_weights(path) -> dict:
    """The weights of an Ultralytics ONNX export: its initializers keep the module names."""
    import ember.onnx

    inits = ember.onnx.load(path, optimize=False).initializers  # the weights only: no rewrite
    sd = {k: v for k, v in inits.items() if k.startswith("model.")}
    if "model.0.conv.weight" not in sd:
        raise FormatError(f"{path}: no 'model.0.conv.weight' initializer: not a YOLOv8 export")
    return checkpoint_from(sd)


def onnx_class_names(path) -> list | None:
    """Class names an Ultralytics ONNX export records ('names' metadata), else None."""
    import ast

    from ember.onnx._proto import import_onnx

    model = import_onnx().load(os.fspath(path), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    try:
        names = ast.literal_eval(meta.get("names", "None"))  # a literal, never code
    except (ValueError, SyntaxError):
        return None
    if not isinstance(names, dict) or sorted(names) != list(range(len(names))):
        return None
    return [str(names[i]) for i in range(len(names))]


def config_from_state_dict(sd) -> YOLOv8Config:
    """Width, depth, channel cap, classes, DFL bins and fusing read from tensor shapes."""

    def shape(k: str) -> tuple:
        if k not in sd:
            raise FormatError(f"not a YOLOv8 detection checkpoint: no {k!r}")
        return tuple(sd[k].shape)

    c64 = shape("model.0.conv.weight")[0]
    c1024 = shape("model.9.cv2.conv.weight")[0]
    nc = shape("model.22.cv3.0.2.weight")[0]
    reg_max = shape("model.22.cv2.0.2.weight")[0] // 4
    blocks = len({k.split(".")[3] for k in sd if k.startswith("model.2.m.")})
    width = c64 / 64
    if c64 < 8 or c64 % 8 or blocks < 1 or nc < 1 or reg_max < 1:
        raise FormatError(f"not a YOLOv8 checkpoint: stem {c64}, {blocks} blocks, {nc} classes")
    max_ch = 1024 if c1024 >= int(math.ceil(1024 * width / 8) * 8) else int(round(c1024 / width))
    depth = {1: 0.33, 2: 0.67, 3: 1.0}.get(blocks, blocks / 3)
    fused = "model.0.bn.weight" not in sd
    return YOLOv8Config(depth, width, max_ch, nc, reg_max, fused)


def yolov8(size: str = "n", weights=None, **kw) -> YOLOv8:
    """yolov8{size} (random init), or loaded from `weights` (its size then comes from the file)."""
    if weights is not None:
        return YOLOv8.from_pretrained(weights)
    return YOLOv8(YOLOv8Config.size(size, **kw)).eval()
