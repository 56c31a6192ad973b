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
