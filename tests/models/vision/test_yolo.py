"""YOLOv8 against a torch model built from Ultralytics' layers (tests/models/vision/yolo_ref.py)."""

from __future__ import annotations

import sys
import types
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ember  # noqa: E402
from ember.errors import FormatError, ShapeError  # noqa: E402
from ember.models.vision.detection import (  # noqa: E402
    YOLODetector,
    coco_labels,
    letterbox,
    nms,
    non_max_suppression,
    resize_bilinear,
    scale_boxes,
)
from ember.models.vision.yolo import YOLOv8, YOLOv8Config, config_from_state_dict  # noqa: E402
from tests.models.vision.yolo_ref import TYOLOv8, randomize, torch_nms, torch_postprocess  # noqa: E402

TINY = dict(depth=0.33, width=0.125, mc=1024, nc=5)  # channels 8..128, one block per C2f


@pytest.fixture(autouse=True)
def _no_grad():
    with ember.no_grad():
        yield


def _ref(fused: bool = False, seed: int = 0, **kw) -> TYOLOv8:
    torch.manual_seed(seed)
    cfg = {**TINY, **kw}
    m = randomize(TYOLOv8(cfg["depth"], cfg["width"], cfg["mc"], cfg["nc"], fused), seed)
    with torch.no_grad():  # spread the class scores so some pass conf and NMS has work to do
        for seq in m.model[22].cv3:
            seq[2].weight.mul_(30)
            seq[2].bias.uniform_(-3, 0)
        for seq in m.model[22].cv2:
            seq[2].weight.mul_(10)
    return m


def _sd(m) -> dict:
    return {k: v.numpy() for k, v in m.state_dict().items()}


@pytest.fixture(scope="module")
def tiny():
    ref = _ref()
    return ref, YOLOv8.from_pretrained(_sd(ref))


def test_yolov8n_and_s_shapes_match_ultralytics():
    for size, params in (("n", 3_157_200), ("s", 11_166_560)):  # Ultralytics' printed counts
        with ember.device("meta"):
            m = YOLOv8(YOLOv8Config.size(size))
        ref = TYOLOv8(*{"n": (0.33, 0.25), "s": (0.33, 0.5)}[size])
        got = {k: tuple(v.shape) for k, v in m.state_dict().items()}
        assert got == {k: tuple(v.shape) for k, v in ref.state_dict().items()}
        assert sum(v.numel() for v in m.parameters()) == params
        assert config_from_state_dict(got_arrays(got)) == YOLOv8Config.size(size)
    assert "model.22.dfl.conv.weight" in got and "model.2.m.0.cv1.bn.running_var" in got


def got_arrays(shapes: dict) -> dict:
    """Shape-only stand-ins (config_from_state_dict reads only .shape)."""
    return {k: np.broadcast_to(np.float32(0), s) for k, s in shapes.items()}


@pytest.mark.parametrize("hw", [(64, 96), (96, 32)])
def test_raw_head_and_decoded_output_match_torch(tiny, hw):
    ref, m = tiny
    x = torch.rand(2, 3, *hw)
    with torch.no_grad():
        want, want_raw = ref(x)
    got_raw = m.raw(ember.from_numpy(x.numpy()))
    for g, w in zip(got_raw, want_raw):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-4)
    got = m(ember.from_numpy(x.numpy())).numpy()
    assert got.shape == (2, 4 + 5, sum(hw[0] * hw[1] // s**2 for s in (8, 16, 32)))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-3)  # pixels up to ~100


def test_fused_checkpoint_and_optimized_model_match(tiny):
    ref, _ = tiny
    x = torch.rand(1, 3, 64, 64)
    fused = _ref(fused=True, seed=3)
    with torch.no_grad():
        want, _ = fused(x)
    m = YOLOv8.from_pretrained(_sd(fused))
    assert m.config.fused and "model.0.bn.weight" not in m.state_dict()
    np.testing.assert_allclose(m(ember.from_numpy(x.numpy())).numpy(), want.numpy(), atol=1e-3)
    fast = YOLOv8.from_pretrained(_sd(ref)).optimize_for_inference(inplace=True)
    with torch.no_grad():
        want, _ = ref(x)
    np.testing.assert_allclose(fast(ember.from_numpy(x.numpy())).numpy(), want.numpy(), atol=1e-3)


def _few(pred) -> float:
    """A conf threshold that 20-200 candidates pass, midway in a clear gap between scores.

    NMS is discontinuous: two candidates whose scores differ by float32 rounding may swap and
    keep different boxes. A random-weight model has thousands of near-tied candidates, so the
    end-to-end comparison keeps a few dozen, separated by a gap far above the rounding.
    """
    s = np.sort(np.asarray(pred)[:, 4:].max(1).ravel())[::-1]
    gaps = s[20:200] - s[21:201]
    i = 20 + int(gaps.argmax())
    assert gaps.max() > 1e-4
    return float((s[i] + s[i + 1]) / 2)


def test_nms_matches_torch_on_the_same_predictions(tiny):
    ref, _ = tiny
    with torch.no_grad():
        pred = ref(torch.rand(2, 3, 96, 128))[0]
    want = torch_postprocess(pred, conf=0.5, iou=0.7)
    got = non_max_suppression(pred.numpy(), conf=0.5, iou=0.7)
    assert sum(len(w) for w in want) > 20
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w.numpy())
    got = non_max_suppression(pred.numpy(), conf=0.5, iou=0.7, max_det=3)
    assert [len(g) for g in got] == [3, 3]


def test_boxes_after_nms_match_torch(tiny):
    ref, m = tiny
    x = torch.rand(2, 3, 96, 128)
    with torch.no_grad():
        pred = ref(x)[0]
    for i in range(2):
        conf = _few(pred[i : i + 1])
        (want,) = torch_postprocess(pred[i : i + 1], conf=conf, iou=0.5)
        (got,) = non_max_suppression(m(ember.from_numpy(x[i : i + 1].numpy())).numpy(), conf, 0.5)
        assert len(got) == len(want) >= 3
        np.testing.assert_array_equal(got[:, 5], want[:, 5].numpy())
        np.testing.assert_allclose(got[:, :5], want[:, :5].numpy(), rtol=1e-4, atol=1e-3)


def test_nms_matches_torch_on_random_boxes():
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 100, (300, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(5, 40, (300, 2))], 1).astype(np.float32)
    scores = rng.random(300).astype(np.float32)
    for iou in (0.3, 0.7):
        want = torch_nms(torch.from_numpy(boxes), torch.from_numpy(scores), iou).numpy()
        np.testing.assert_array_equal(nms(boxes, scores, iou), want)
    assert len(nms(boxes[:0], scores[:0], 0.5)) == 0
    with pytest.raises(ShapeError):
        non_max_suppression(np.zeros((1, 4, 10)))


def test_resize_matches_torch_bilinear():
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    for w, h in ((80, 56), (20, 14), (53, 37)):
        t = torch.from_numpy(img.astype(np.float32)).permute(2, 0, 1)[None]
        want = torch.nn.functional.interpolate(t, (h, w), mode="bilinear", align_corners=False)
        want = want[0].permute(1, 2, 0).round().clamp(0, 255).numpy()
        got = resize_bilinear(img, w, h).astype(np.float32)
        assert np.abs(got - want).max() <= 1  # rounding of .5 ties only


def test_letterbox_geometry_and_scale_back():
    img = np.zeros((427, 640, 3), np.uint8)
    lb = letterbox(img)  # auto: pad to the stride only
    assert lb.image.shape == (448, 640, 3) and lb.gain == 1.0 and lb.pad == (0, 10)
    assert (lb.image[:10] == 114).all() and (lb.image[10:437] == 0).all()
    sq = letterbox(np.zeros((300, 200, 3), np.uint8), auto=False)
    assert sq.image.shape == (640, 640, 3) and sq.pad == (106, 0)  # 213 columns: 106 left
    box = np.array([[106 + 32.0, 64.0, 106 + 640.0, 640.0, 0.9, 1.0]])
    np.testing.assert_allclose(scale_boxes(box, sq)[0, :4], [15, 30, 200, 300])  # x2 clipped
    with pytest.raises(ShapeError):
        letterbox(np.zeros((10, 10), np.uint8))


def test_detector_end_to_end_matches_torch_on_an_image(tiny):
    ref, _ = tiny
    rng = np.random.default_rng(2)
    img = rng.integers(0, 256, (90, 150, 3), dtype=np.uint8)
    det = YOLODetector(YOLOv8.from_pretrained(_sd(ref)), [f"c{i}" for i in range(5)], size=128)
    lb = letterbox(img, 128)
    assert lb.image.shape == (96, 128, 3)
    x = torch.from_numpy(lb.image.astype(np.float32) / 255).permute(2, 0, 1)[None]
    with torch.no_grad():
        pred = ref(x)[0]
    conf = _few(pred)
    # iou 0.6: at 0.7 this random model has box pairs whose IoU is 0.7 to float32 rounding
    (want,) = torch_postprocess(pred, conf=conf, iou=0.6)
    (got,) = det([img], conf=conf, iou=0.6)
    assert len(got) == len(want) > 0
    for d, w in zip(got, want.numpy()):
        assert d.class_id == int(w[5]) and d.label == f"c{int(w[5])}"
        assert abs(d.score - w[4]) < 1e-4
        wb = (w[[0, 2]] - lb.pad[0]) / lb.gain, (w[[1, 3]] - lb.pad[1]) / lb.gain
        wb = [np.clip(wb[0][0], 0, 150), np.clip(wb[1][0], 0, 90)]
        np.testing.assert_allclose(d.box[:2], wb, atol=1e-2)


def test_loads_pt_and_safetensors_files(tmp_path, tiny):
    ref, m = tiny
    from safetensors.numpy import save_file

    torch.save(ref.state_dict(), tmp_path / "y.pt")
    save_file(_sd(ref), str(tmp_path / "y.safetensors"))
    x = ember.rand(1, 3, 32, 32)
    want = m(x).numpy()
    for name in ("y.pt", "y.safetensors"):
        got = YOLOv8.from_pretrained(tmp_path / name)(x).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    torch.save(ref.half().state_dict(), tmp_path / "h.pt")  # Ultralytics saves fp16
    ref.float()
    assert YOLOv8.from_pretrained(tmp_path / "h.pt").model[0].conv.weight.dtype == ember.float32


class _Export(torch.nn.Module):
    """The reference with only the decoded output, as Ultralytics exports it."""

    def __init__(self, ref) -> None:
        super().__init__()
        self.model = ref.model

    def forward(self, x):
        return TYOLOv8.forward(self, x)[0]


_Export.SOURCES = TYOLOv8.SOURCES


def test_loads_an_onnx_export_and_matches_onnxruntime(tmp_path):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    ref = _ref(fused=True, seed=5)  # Ultralytics exports fused convs
    path = tmp_path / "y.onnx"
    x = torch.rand(1, 3, 64, 96)
    with warnings.catch_warnings():  # the tracer's notes on the anchors' Python loops
        warnings.simplefilter("ignore")
        torch.onnx.export(_Export(ref), (x,), str(path), dynamo=False, opset_version=13,
                          input_names=["images"], output_names=["output0"])  # fmt: skip
    proto = onnx.load(str(path))
    proto.metadata_props.add(key="names", value=str({i: f"k{i}" for i in range(5)}))
    onnx.save(proto, str(path))
    want = ort.InferenceSession(str(path)).run(None, {"images": x.numpy()})[0]
    m = YOLOv8.from_pretrained(path)
    assert m.config.fused and m.config.num_classes == 5
    got = m(ember.from_numpy(x.numpy())).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    det = YOLODetector.load(path, size=96)
    assert det.labels == [f"k{i}" for i in range(5)]
    bad = tmp_path / "other.onnx"
    proto = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", 1, [1])],
        [onnx.helper.make_tensor_value_info("y", 1, [1])]))  # fmt: skip
    onnx.save(proto, str(bad))
    with pytest.raises(FormatError, match="not a YOLOv8 export"):
        YOLOv8.from_pretrained(bad)


def test_ultralytics_pickled_model_is_refused_with_a_hint(tmp_path):
    mod = types.ModuleType("ultralytics.nn.tasks")

    class DetectionModel:
        pass

    DetectionModel.__module__, DetectionModel.__qualname__ = mod.__name__, "DetectionModel"
    mod.DetectionModel = DetectionModel
    names = ("ultralytics", "ultralytics.nn", mod.__name__)
    for name in names[:2]:
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules[mod.__name__] = mod
    try:
        torch.save({"model": DetectionModel(), "epoch": -1}, tmp_path / "yolov8n.pt")
    finally:
        for name in names:
            sys.modules.pop(name, None)
    with pytest.raises(FormatError, match="pickles the whole model object.*safetensors"):
        YOLOv8.from_pretrained(tmp_path / "yolov8n.pt")


def test_bad_checkpoints_and_inputs(tiny):
    _, m = tiny
    with pytest.raises(FormatError, match="not a YOLOv8"):
        YOLOv8.from_pretrained({"model.0.conv.weight": np.zeros((8, 3, 3, 3), np.float32)})
    sd = _sd(_ref())
    sd.pop("model.12.cv2.conv.weight")
    with pytest.raises(FormatError, match="missing"):
        YOLOv8.from_pretrained(sd)
    with pytest.raises(ShapeError, match="multiples of 32"):
        m(ember.rand(1, 3, 40, 64))
    with pytest.raises(ShapeError):
        m(ember.rand(1, 1, 64, 64))


def test_coco_labels():
    labels = coco_labels()
    assert len(labels) == 80 and labels[0] == "person" and labels[79] == "toothbrush"
