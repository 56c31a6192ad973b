"""`ember detect`: YOLOv8 boxes printed and drawn, bad input as one-line errors."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import skimage

import ember
from ember.cli.main import main
from ember.io.safetensors import save_safetensors
from ember.models.vision.yolo import YOLOv8, YOLOv8Config

DATA = os.path.join(os.path.dirname(skimage.__file__), "data")
COFFEE = os.path.join(DATA, "coffee.png")


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A tiny random YOLOv8 (80 classes) whose scores pass 0.25 in places."""
    ember.manual_seed(0)
    m = YOLOv8(YOLOv8Config(width=0.125))
    with ember.no_grad():
        for seq in m.model[22].cv3:
            seq[2].weight.mul_(30.0)
    path = tmp_path_factory.mktemp("yolo") / "tiny.safetensors"
    save_safetensors({k: v.numpy() for k, v in m.state_dict().items()}, path)
    return str(path)


def _error(capsys, argv: list[str], status: int = 1) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == status and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("ember detect: error: "), err
    return err


def test_detect_prints_boxes_and_draws_them(capsys, tmp_path, weights):
    out = tmp_path / "boxes.png"
    args = ["detect", COFFEE, "--model", weights, "-o", str(out), "--size", "128"]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{COFFEE}: ") and lines[-1] == f"  drawn: {out}"
    rows = [ln.split() for ln in lines[1:-1]]
    assert rows and int(lines[0].split(": ")[1].split()[0]) == len(rows)
    for r in rows:
        score, box = float(r[-5]), [float(v) for v in r[-4:]]
        assert 0.25 < score <= 1 and 0 <= box[0] <= box[2] <= 600 and 0 <= box[1] <= box[3] <= 400
    from PIL import Image

    drawn, orig = np.asarray(Image.open(out)), np.asarray(Image.open(COFFEE).convert("RGB"))
    assert drawn.shape == orig.shape and (drawn != orig).any()


def test_detect_json_several_images_and_a_folder(capsys, tmp_path, weights):
    chelsea = os.path.join(DATA, "chelsea.png")
    args = ["detect", COFFEE, chelsea, "--model", weights, "--json", "--size", "128"]
    assert main([*args, "--conf", "0.99", "-o", str(tmp_path / "drawn")]) == 0
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [r["image"] for r in rows] == [COFFEE, chelsea]
    assert sorted(os.listdir(tmp_path / "drawn")) == ["chelsea_detect.png", "coffee_detect.png"]
    assert main([*args, "--conf", "0.25"]) == 0
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    d = rows[0]["detections"][0]
    assert set(d) == {"label", "class", "score", "box"} and len(d["box"]) == 4


def test_detect_bad_inputs_are_one_line_errors(capsys, tmp_path, weights):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"not an image")
    assert "no such file" in _error(
        capsys, ["detect", str(tmp_path / "no.png"), "--model", weights]
    )
    assert "--model is required" in _error(capsys, ["detect", COFFEE])
    assert "no such file" in _error(capsys, ["detect", COFFEE, "--model", str(tmp_path / "x.pt")])
    text = tmp_path / "w.safetensors"
    text.write_text("nope")
    assert "w.safetensors" in _error(capsys, ["detect", COFFEE, "--model", str(text)])
    assert "--size" in _error(capsys, ["detect", COFFEE, "--model", weights, "--size", "100"])
    assert "--conf" in _error(capsys, ["detect", COFFEE, "--conf", "2"], status=2)
    assert "does not exist" in _error(
        capsys, ["detect", COFFEE, "--model", weights, "-o", str(tmp_path / "no" / "o.png")]
    )
    # a broken image among good ones: reported on its line, the others still run
    rc = main(["detect", str(bad), COFFEE, "--model", weights, "--size", "64", "--json"])
    captured = capsys.readouterr()
    assert rc == 1 and "broken.jpg" in captured.err and len(captured.err.splitlines()) == 1
    assert json.loads(captured.out)["image"] == COFFEE
