"""`ember classify`: top-5 labels with probabilities from the bundled EfficientNet-Lite0."""

from __future__ import annotations

import json
import os

import skimage

from ember.cli.main import main

DATA = os.path.join(os.path.dirname(skimage.__file__), "data")


def test_classify_prints_top5(capsys):
    assert (
        main(["classify", os.path.join(DATA, "coffee.png"), os.path.join(DATA, "chelsea.png")]) == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("coffee.png") and len(out) == 12
    assert "espresso (967)" in out[1] and out[1].strip().split("%")[0].replace(".", "").isdigit()
    assert any(f"({c})" in out[7] for c in (281, 282, 285))


def test_classify_json_and_errors(capsys, tmp_path):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"nope")
    rc = main(["classify", "--json", "--top", "3", os.path.join(DATA, "coffee.png"), str(bad)])
    captured = capsys.readouterr()
    assert rc == 1 and "broken.jpg" in captured.err
    row = json.loads(captured.out.splitlines()[0])
    assert row["top"][0]["index"] == 967 and len(row["top"]) == 3
    assert main(["classify", "--model", "resnet50", os.path.join(DATA, "coffee.png")]) == 1
    assert "--weights" in capsys.readouterr().err


def test_classify_with_resnet_and_vit_weights(capsys, tmp_path):
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    from tests.models.vision import twins

    torch.manual_seed(0)
    torch.save(
        twins.randomize_bn(twins.resnet("resnet18", 1000)).state_dict(), tmp_path / "r18.pth"
    )
    img = os.path.join(DATA, "coffee.png")
    assert (
        main(["classify", "--model", "resnet18", "--weights", str(tmp_path / "r18.pth"), img]) == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 6 and out[1].strip().endswith(")")
    labels = {i: f"thing{i}" for i in range(3)}
    small = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    cfg = ViTConfig(**small, image_size=32, patch_size=8, id2label=labels)
    ViTForImageClassification(cfg).save_pretrained(tmp_path / "vit")
    rc = main(
        ["classify", "--model", "vit_b_16", "--weights", str(tmp_path / "vit"), "--json", img]
    )
    row = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(row["top"]) == 3 and row["top"][0]["label"].startswith("thing")
