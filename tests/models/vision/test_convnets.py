"""ResNet and MobileNetV2 against torch twins with torchvision's module trees (random weights)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember.inference import optimize_for_inference
from ember.models.vision import MODELS, MobileNetV2, ResNet
from tests.models.vision import twins

# torchvision's parameter counts (torchvision.models.<name>().parameters())
PARAMS = {
    "resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032,
    "resnet101": 44_549_160, "resnet152": 60_192_808, "mobilenet_v2": 3_504_872,
}  # fmt: skip


def _twin(name: str, num_classes: int = 1000) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "mobilenet_v2":
        m = twins.MobileNetV2(num_classes=num_classes)
    else:
        m = twins.resnet(name, num_classes)
    twins.randomize_bn(m)
    with torch.no_grad():  # logits of a useful size, so 1e-4 is a real tolerance
        fc = m.fc if hasattr(m, "fc") else m.classifier[1]
        fc.weight.mul_(30.0)
    return m.eval()


@pytest.mark.parametrize("name", list(PARAMS))
def test_state_dict_keys_and_shapes_match_torchvision(name):
    with ember.device("meta"):
        em = MODELS[name]()
    tm = _twin(name) if name in ("resnet18", "mobilenet_v2") else None
    ours = {k: tuple(v.shape) for k, v in em.state_dict().items()}
    if tm is None:  # deep nets: build the twin cheaply on torch's meta device
        with torch.device("meta"):
            tm = twins.resnet(name)
    theirs = {k: tuple(v.shape) for k, v in tm.state_dict().items()}
    assert list(ours) == list(theirs)
    assert ours == theirs
    assert sum(p.numel() for p in em.parameters()) == PARAMS[name]


@pytest.mark.parametrize("name", ["resnet18", "resnet34", "resnet50", "mobilenet_v2"])
def test_logits_match_torch_twin(name):
    tm = _twin(name, num_classes=10)
    x = np.random.default_rng(1).standard_normal((2, 3, 64, 64)).astype(np.float32)
    ref = twins.logits(tm, x)
    assert np.abs(ref).max() > 1.0
    em = MODELS[name](weights=twins.to_numpy_state(tm), num_classes=10)
    assert not em.training
    with ember.no_grad():
        y = em(ember.from_numpy(x)).numpy()
    np.testing.assert_allclose(y, ref, atol=1e-4, rtol=1e-4)
    fused = optimize_for_inference(em)
    y2 = fused(ember.from_numpy(x)).numpy()
    np.testing.assert_allclose(y2, ref, atol=1e-4, rtol=1e-4)
    # the original module is untouched and still loads torchvision's keys
    assert list(em.state_dict()) == list(tm.state_dict())


def test_deep_resnets_run_and_match(tmp_path):
    tm = _twin("resnet101", num_classes=5)
    x = np.random.default_rng(2).standard_normal((2, 3, 32, 32)).astype(np.float32)
    ref = twins.logits(tm, x)
    path = tmp_path / "resnet101.pth"
    torch.save(tm.state_dict(), path)
    fast = ResNet.from_pretrained(path)  # depth read from the checkpoint, fused
    np.testing.assert_allclose(fast(ember.from_numpy(x)).numpy(), ref, atol=1e-4, rtol=1e-4)


def test_from_pretrained_mobilenet_and_legacy_checkpoint(tmp_path):
    tm = _twin("mobilenet_v2", num_classes=7)
    path = tmp_path / "mnv2.pth"
    torch.save({"state_dict": tm.state_dict()}, path, _use_new_zipfile_serialization=False)
    x = np.random.default_rng(3).standard_normal((1, 3, 40, 48)).astype(np.float32)
    fast = MobileNetV2.from_pretrained(path)
    np.testing.assert_allclose(fast(ember.from_numpy(x)).numpy(), twins.logits(tm, x), atol=1e-4)
    plain = MobileNetV2.from_pretrained(path, optimize=False)
    assert list(plain.state_dict()) == list(tm.state_dict())


def test_wrong_checkpoint_is_a_clear_error():
    tm = _twin("resnet18")
    sd = twins.to_numpy_state(tm)
    del sd["layer1.0.conv1.weight"]
    with pytest.raises(ember.nn.StateDictError, match="layer1.0.conv1.weight"):
        MODELS["resnet18"](weights=sd)
    with pytest.raises(ember.errors.FormatError):
        MODELS["resnet18"](weights="/nonexistent/resnet18.pth")
