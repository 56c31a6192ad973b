"""Object detection end to end (YOLOv8): letterbox, the model, NMS, boxes in image pixels.

det = YOLODetector.load("yolov8n.safetensors")
for d in det(["street.jpg"])[0]: print(d.label, d.score, d.box)

Pre- and post-processing follow Ultralytics' predict: the image is resized (bilinear, no
antialiasing, as cv2.INTER_LINEAR) so its long side is 640, padded with gray 114 to a multiple of
the stride 32 (auto=True, Ultralytics' default for PyTorch weights) or to 640 x 640 (auto=False,
its ONNX export's shape); detections whose best class score passes `conf` go through per-class
non-max suppression at IoU `iou`, and the boxes are mapped back through the letterbox.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

import ember
from ember.errors import ShapeError

_LABELS = Path(__file__).with_name("coco_labels.txt")
MAX_WH = 7680  # per-class box offset in NMS (Ultralytics' max_wh)


@lru_cache(maxsize=1)
def _coco() -> tuple[str, ...]:
    rows = [ln for ln in _LABELS.read_text(encoding="utf-8").splitlines() if ln and ln[0] != "#"]
    return tuple(rows)


def coco_labels() -> list[str]:
    """The 80 COCO class names in YOLOv8's index order."""
    return list(_coco())


def resize_bilinear(img: np.ndarray, width: int, height: int) -> np.ndarray:
    """(H, W, C) uint8 -> (height, width, C) uint8, half-pixel bilinear (cv2.INTER_LINEAR)."""
    h, w = img.shape[:2]
    if (h, w) == (height, width):
        return img.copy()

    def taps(n_out: int, n_in: int) -> tuple:
        f = np.maximum((np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5, 0.0)
        i0 = np.minimum(np.floor(f).astype(np.intp), n_in - 1)
        i1 = np.minimum(i0 + 1, n_in - 1)
        return i0, i1, (f - i0).astype(np.float32)

    y0, y1, wy = taps(height, h)
    x0, x1, wx = taps(width, w)
    a = img.astype(np.float32)
    rows = a[y0] * (1 - wy)[:, None, None] + a[y1] * wy[:, None, None]
    out = rows[:, x0] * (1 - wx)[None, :, None] + rows[:, x1] * wx[None, :, None]
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


@dataclass
class Letterbox:
    """A letterboxed image and how it maps back: original = (padded - pad) / gain."""

    image: np.ndarray  # (H, W, 3) uint8, H and W multiples of the stride
    gain: float
    pad: tuple  # (left, top) in pixels
    shape: tuple  # original (height, width)


def letterbox(
    img: np.ndarray, size: int = 640, stride: int = 32, auto: bool = True, fill: int = 114
) -> Letterbox:
    """Resize (H, W, 3) uint8 so it fits size x size (aspect kept) and pad with `fill`."""
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
        raise ShapeError(f"letterbox expects an (H, W, 3) uint8 image, got {img.shape} {img.dtype}")
    if size % stride:
        raise ShapeError(f"letterbox size {size} is not a multiple of the stride {stride}")
    h, w = img.shape[:2]
    r = min(size / h, size / w)
    nw, nh = int(round(w * r)), int(round(h * r))
    dw, dh = size - nw, size - nh
    if auto:
        dw, dh = dw % stride, dh % stride
    left, top = int(round(dw / 2 - 0.1)), int(round(dh / 2 - 0.1))
    out = np.full((nh + dh, nw + dw, 3), fill, np.uint8)
    out[top : top + nh, left : left + nw] = resize_bilinear(img, nw, nh)
    return Letterbox(out, r, (left, top), (h, w))


def to_input(boxes: list) -> ember.Tensor:
    """Letterboxed images of one shape -> (N, 3, H, W) float32 RGB in [0, 1]."""
    a = np.stack([b.image for b in boxes]).astype(np.float32) / 255.0
    return ember.from_numpy(np.ascontiguousarray(a.transpose(0, 3, 1, 2)))


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    """Greedy NMS: indices of kept boxes (x1, y1, x2, y2), best score first (torchvision.ops.nms)."""
    order = np.argsort(-scores, kind="stable")
    x1, y1, x2, y2 = (boxes[:, i].astype(np.float64) for i in range(4))
    area = (x2 - x1) * (y2 - y1)
    keep = []
    while order.size:
        i, rest = order[0], order[1:]
        keep.append(i)
        iw = np.clip(np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]), 0, None)
        ih = np.clip(np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]), 0, None)
        inter = iw * ih
        order = rest[inter / (area[i] + area[rest] - inter) <= iou]
    return np.asarray(keep, dtype=np.intp)


def non_max_suppression(
    pred: np.ndarray,
    conf: float = 0.25,
    iou: float = 0.7,
    max_det: int = 300,
    max_nms: int = 30000,
    agnostic: bool = False,
) -> list:
    """(N, 4 + classes, A) model output -> per image (n, 6): x1, y1, x2, y2, score, class."""
    pred = np.asarray(pred)
    if pred.ndim != 3 or pred.shape[1] < 5:
        raise ShapeError(f"expected (N, 4 + classes, anchors) predictions, got {pred.shape}")
    out = []
    for p in pred:
        x = p.T  # (A, 4 + classes)
        scores = x[:, 4:]
        cls = scores.argmax(1)
        best = scores[np.arange(len(x)), cls]
        ok = best > conf
        x, cls, best = x[ok], cls[ok], best[ok]
        order = np.argsort(-best, kind="stable")[:max_nms]
        x, cls, best = x[order], cls[order], best[order]
        xy, wh = x[:, :2], x[:, 2:4] / 2
        boxes = np.concatenate([xy - wh, xy + wh], 1)
        offset = 0.0 if agnostic else cls[:, None].astype(boxes.dtype) * MAX_WH
        keep = nms(boxes + offset, best, iou)[:max_det]
        out.append(
            np.concatenate([boxes[keep], best[keep, None], cls[keep, None].astype(boxes.dtype)], 1)
        )
    return out


def scale_boxes(det: np.ndarray, lb: Letterbox) -> np.ndarray:
    """Boxes of a letterboxed image -> the original image's pixels, clipped to it."""
    d = det.copy()
    d[:, [0, 2]] = (d[:, [0, 2]] - lb.pad[0]) / lb.gain
    d[:, [1, 3]] = (d[:, [1, 3]] - lb.pad[1]) / lb.gain
    h, w = lb.shape
    d[:, [0, 2]] = d[:, [0, 2]].clip(0, w)
    d[:, [1, 3]] = d[:, [1, 3]].clip(0, h)
    return d


@dataclass
class Detection:
    """One detected object: class, score and box (x1, y1, x2, y2) in image pixels."""

    label: str
    class_id: int
    score: float
    box: tuple


@dataclass
class YOLODetector:
    """A YOLOv8 model with its letterbox and NMS settings and class names."""

    model: ember.nn.Module
    labels: list = field(default_factory=coco_labels)
    size: int = 640
    auto: bool = True

    @classmethod
    def load(cls, weights, optimize: bool = True, size: int = 640, auto: bool = True):
        """A detector from YOLOv8 weights (.safetensors, a .pt state dict, an ONNX export)."""
        import os

        from ember.models.vision.yolo import YOLOv8, onnx_class_names

        model = YOLOv8.from_pretrained(weights)
        if optimize:
            model = model.optimize_for_inference(inplace=True)
        labels = coco_labels() if model.config.num_classes == 80 else []
        if isinstance(weights, (str, os.PathLike)) and os.fspath(weights).endswith(".onnx"):
            names = onnx_class_names(weights)
            labels = names if names and len(names) == model.config.num_classes else labels
        return cls(model, labels, size, auto)

    def predict(self, image, conf: float = 0.25, iou: float = 0.7) -> np.ndarray:
        """(n, 6) detections (x1, y1, x2, y2, score, class) of one image, in its pixels."""
        from ember.vision.image import load_image

        lb = letterbox(np.asarray(load_image(image)), self.size, 32, self.auto)
        with ember.no_grad():
            pred = self.model(to_input([lb])).numpy()
        return scale_boxes(non_max_suppression(pred, conf, iou)[0], lb)

    def __call__(self, images, conf: float = 0.25, iou: float = 0.7) -> list:
        """For each image (path, bytes, Pillow image or array), its Detections, best first."""
        if not isinstance(images, (list, tuple)):
            images = [images]
        out = []
        for im in images:
            d = self.predict(im, conf, iou)
            out.append([Detection(self._label(int(c)), int(c), float(s), tuple(map(float, b)))
                        for *b, s, c in d])  # fmt: skip
        return out

    def _label(self, i: int) -> str:
        return self.labels[i] if i < len(self.labels) else str(i)


def draw_detections(image, detections: list, width: int = 2):
    """A copy of the image (Pillow) with each detection's box and 'label score' drawn on it."""
    from PIL import ImageDraw

    from ember.vision.image import load_image

    img = load_image(image).copy()
    draw = ImageDraw.Draw(img)
    for d in detections:
        hue = (d.class_id * 47) % 360
        color = tuple(int(v) for v in _hsv(hue))
        draw.rectangle(d.box, outline=color, width=width)
        text = f"{d.label} {d.score:.2f}"
        x, y = d.box[0], max(d.box[1] - 11, 0)
        tb = draw.textbbox((x, y), text)
        draw.rectangle(tb, fill=color)
        draw.text((x, y), text, fill=(255, 255, 255))
    return img


def _hsv(h: float) -> tuple:
    """A saturated RGB colour for hue h (degrees)."""
    import colorsys

    return tuple(255 * c for c in colorsys.hsv_to_rgb(h / 360, 0.85, 0.9))
