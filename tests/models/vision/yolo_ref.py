"""A torch YOLOv8 written from Ultralytics' layer definitions (the test reference; no ultralytics).

Module names follow Ultralytics' DetectionModel, so its state_dict has the real checkpoint keys.
Also a torch port of its predict post-processing (non_max_suppression with a plain greedy NMS).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _ch(c: int, w: float, mc: int) -> int:
    return int(math.ceil(min(c, mc) * w / 8) * 8)


class TConv(nn.Module):
    def __init__(self, c1, c2, k=1, s=1, fused=False):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=fused)
        self.bn = nn.Identity() if fused else nn.BatchNorm2d(c2, eps=0.001, momentum=0.03)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class TBottleneck(nn.Module):
    def __init__(self, c1, c2, shortcut, fused):
        super().__init__()
        self.cv1, self.cv2 = TConv(c1, c2, 3, fused=fused), TConv(c2, c2, 3, fused=fused)
        self.add = shortcut and c1 == c2

    def forward(self, x):
        return x + self.cv2(self.cv1(x)) if self.add else self.cv2(self.cv1(x))


class TC2f(nn.Module):
    def __init__(self, c1, c2, n, shortcut, fused):
        super().__init__()
        self.c = int(c2 * 0.5)
        self.cv1 = TConv(c1, 2 * self.c, 1, fused=fused)
        self.cv2 = TConv((2 + n) * self.c, c2, 1, fused=fused)
        self.m = nn.ModuleList(TBottleneck(self.c, self.c, shortcut, fused) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class TSPPF(nn.Module):
    def __init__(self, c1, c2, fused):
        super().__init__()
        c_ = c1 // 2
        self.cv1, self.cv2 = TConv(c1, c_, 1, fused=fused), TConv(c_ * 4, c2, 1, fused=fused)
        self.m = nn.MaxPool2d(5, 1, 2)

    def forward(self, x):
        y = [self.cv1(x)]
        y.extend(self.m(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


class TConcat(nn.Module):
    def forward(self, x):
        return torch.cat(x, 1)


class TDFL(nn.Module):
    def __init__(self, c1=16):
        super().__init__()
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        self.conv.weight.data[:] = torch.arange(c1, dtype=torch.float).view(1, c1, 1, 1)
        self.c1 = c1

    def forward(self, x):
        b, _, a = x.shape
        return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)


class TDetect(nn.Module):
    def __init__(self, nc, ch, fused):
        super().__init__()
        self.nc, self.nl, self.reg_max = nc, len(ch), 16
        self.no = nc + 64
        self.stride = torch.tensor([8.0, 16.0, 32.0])
        c2, c3 = max(16, ch[0] // 4, 64), max(ch[0], min(nc, 100))
        self.cv2 = nn.ModuleList(
            nn.Sequential(TConv(x, c2, 3, fused=fused), TConv(c2, c2, 3, fused=fused),
                          nn.Conv2d(c2, 64, 1)) for x in ch)  # fmt: skip
        self.cv3 = nn.ModuleList(
            nn.Sequential(TConv(x, c3, 3, fused=fused), TConv(c3, c3, 3, fused=fused),
                          nn.Conv2d(c3, nc, 1)) for x in ch)  # fmt: skip
        self.dfl = TDFL(16)

    def forward(self, x):
        raw = [torch.cat((self.cv2[i](x[i]), self.cv3[i](x[i])), 1) for i in range(self.nl)]
        b = raw[0].shape[0]
        xc = torch.cat([xi.view(b, self.no, -1) for xi in raw], 2)
        pts, strides = [], []
        for r, s in zip(raw, self.stride):
            h, w = r.shape[2:]
            sy, sx = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
            pts.append(torch.stack((sx, sy), -1).view(-1, 2))
            strides.append(torch.full((h * w, 1), float(s)))
        anchors, st = torch.cat(pts).T.unsqueeze(0), torch.cat(strides).T
        box, cls = xc.split((64, self.nc), 1)
        lt, rb = self.dfl(box).chunk(2, 1)
        x1y1, x2y2 = anchors - lt, anchors + rb
        dbox = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * st
        return torch.cat((dbox, cls.sigmoid()), 1), raw


class TYOLOv8(nn.Module):
    SOURCES = (-1,) * 11 + ([-1, 6], -1, -1, [-1, 4], -1, -1, [-1, 12], -1, -1, [-1, 9], -1,
                            [15, 18, 21])  # fmt: skip

    def __init__(self, depth=0.33, width=0.25, mc=1024, nc=80, fused=False):
        super().__init__()
        c = lambda x: _ch(x, width, mc)  # noqa: E731
        n = lambda x: max(round(x * depth), 1) if x > 1 else x  # noqa: E731
        f = fused
        up = lambda: nn.Upsample(scale_factor=2.0, mode="nearest")  # noqa: E731
        self.model = nn.Sequential(
            TConv(3, c(64), 3, 2, f), TConv(c(64), c(128), 3, 2, f),
            TC2f(c(128), c(128), n(3), True, f), TConv(c(128), c(256), 3, 2, f),
            TC2f(c(256), c(256), n(6), True, f), TConv(c(256), c(512), 3, 2, f),
            TC2f(c(512), c(512), n(6), True, f), TConv(c(512), c(1024), 3, 2, f),
            TC2f(c(1024), c(1024), n(3), True, f), TSPPF(c(1024), c(1024), f),
            up(), TConcat(), TC2f(c(1024) + c(512), c(512), n(3), False, f),
            up(), TConcat(), TC2f(c(512) + c(256), c(256), n(3), False, f),
            TConv(c(256), c(256), 3, 2, f), TConcat(), TC2f(c(256) + c(512), c(512), n(3), False, f),
            TConv(c(512), c(512), 3, 2, f), TConcat(),
            TC2f(c(512) + c(1024), c(1024), n(3), False, f),
            TDetect(nc, (c(256), c(512), c(1024)), f),
        )  # fmt: skip

    def forward(self, x):
        y = []
        for m, src in zip(self.model, self.SOURCES):
            if src != -1:
                x = [x if j == -1 else y[j] for j in src]
            x = m(x)
            y.append(x)
        return x


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial BatchNorm statistics and affine terms (a fresh BN is the identity)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return model.eval()


def torch_nms(boxes, scores, iou):
    order = scores.argsort(descending=True, stable=True)
    keep = []
    while order.numel():
        i = order[0]
        keep.append(int(i))
        if order.numel() == 1:
            break
        r = order[1:]
        lt = torch.maximum(boxes[i, :2], boxes[r, :2])
        rb = torch.minimum(boxes[i, 2:], boxes[r, 2:])
        inter = (rb - lt).clamp(min=0).prod(1)
        area = lambda b: (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])  # noqa: E731
        order = r[inter / (area(boxes[i]) + area(boxes[r]) - inter) <= iou]
    return torch.tensor(keep, dtype=torch.long)


def torch_postprocess(pred, conf=0.25, iou=0.7, max_det=300):
    """Ultralytics' non_max_suppression (single label, per-class) in torch."""
    out = []
    for x in pred.transpose(-1, -2):
        x = x[x[:, 4:].amax(1) > conf]
        xy, wh = x[:, :2], x[:, 2:4] / 2
        box = torch.cat((xy - wh, xy + wh), 1)
        c, j = x[:, 4:].max(1, keepdim=True)
        x = torch.cat((box, c, j.float()), 1)[c.view(-1) > conf]
        x = x[x[:, 4].argsort(descending=True, stable=True)[:30000]]
        i = torch_nms(x[:, :4] + x[:, 5:6] * 7680, x[:, 4], iou)[:max_det]
        out.append(x[i])
    return out
