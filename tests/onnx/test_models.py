"""torch exports of ember's zoo models: ember.onnx's outputs equal onnxruntime's within 1e-4."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import onnxruntime as ort  # noqa: E402

import ember  # noqa: E402
import ember.onnx  # noqa: E402
from tests.onnx.exports import MODELS  # noqa: E402


def _ort(path, feeds):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_zoo_export_matches_onnxruntime(tmp_path, name):
    path, feeds = MODELS[name](tmp_path)
    want = _ort(path, feeds)
    m = ember.onnx.load(path)
    got = m.run(feeds)
    assert list(got) == m.output_names
    for w, n in zip(want, m.output_names):
        g = got[n]
        assert isinstance(g, ember.Tensor) and g.shape == w.shape and g.dtype == ember.float32
        np.testing.assert_allclose(g.numpy(), w, rtol=0, atol=1e-4)
    # batch 1 through the dynamic batch axis, ember tensors in, positional call
    one = {k: v[:1] for k, v in feeds.items()}
    out = m(*[ember.from_numpy(np.ascontiguousarray(one[k])) for k in m.input_names])
    np.testing.assert_allclose(out.numpy(), _ort(path, one)[0], rtol=0, atol=1e-4)


@pytest.mark.parametrize("opset", [9, 13, 18])
def test_mobilenet_at_other_opsets(tmp_path, opset):
    path, feeds = MODELS["mobilenet_v2"](tmp_path, opset=opset)
    m = ember.onnx.load(path)
    assert m.opset == opset
    np.testing.assert_allclose(m(**feeds).numpy(), _ort(path, feeds)[0], rtol=0, atol=1e-4)


@pytest.mark.parametrize("opset", [11, 14])
def test_minilm_at_other_opsets(tmp_path, opset):
    path, feeds = MODELS["minilm"](tmp_path, opset=opset)
    m = ember.onnx.load(path.read_bytes())
    np.testing.assert_allclose(m(**feeds).numpy(), _ort(path, feeds)[0], rtol=0, atol=1e-4)


PPOCR = {  # the PP-OCR models rapidocr-onnxruntime ships (pip install --no-deps rapidocr-onnxruntime==1.4.4)
    "ch_PP-OCRv4_det_infer.onnx": (1, 3, 64, 96),
    "ch_PP-OCRv4_rec_infer.onnx": (2, 3, 48, 160),
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": (2, 3, 48, 192),
}


@pytest.mark.parametrize("name", sorted(PPOCR))
def test_shipped_ppocr_models_match_onnxruntime(name):
    from ember.models.hub import package_dir

    d = package_dir("rapidocr_onnxruntime")
    if d is None:
        pytest.skip(
            "rapidocr-onnxruntime is not installed (pip install --no-deps rapidocr-onnxruntime==1.4.4)"
        )
    path = d / "models" / name
    x = np.random.default_rng(5).standard_normal(PPOCR[name]).astype(np.float32)
    m = ember.onnx.load(path)
    (inp,) = m.input_names
    want = _ort(path, {inp: x})
    got = m.run({inp: x})
    for w, n in zip(want, m.output_names):
        np.testing.assert_allclose(got[n].numpy(), w, rtol=0, atol=1e-4)
