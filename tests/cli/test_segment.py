"""`ember segment`: a SAM mask written as a PNG, bad input as one-line errors."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import skimage

from ember.cli.main import main

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

DATA = os.path.join(os.path.dirname(skimage.__file__), "data")
COFFEE = os.path.join(DATA, "coffee.png")  # 600 x 400


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tests.models.vision.sam_tiny import save_folder, tiny_reference

    return save_folder(tiny_reference(seed=5), tmp_path_factory.mktemp("sam"))


def _error(capsys, argv: list[str], status: int = 1) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == status and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("ember segment: error: "), err
    return err


def test_segment_writes_the_best_mask_and_an_overlay(capsys, tmp_path, folder):
    from PIL import Image

    from ember.models.vision.segmentation import SamPredictor

    out, over = tmp_path / "mask.png", tmp_path / "over.png"
    args = ["segment", COFFEE, "--point", "300,200", "--neg", "20,30", "--model", folder,
            "-o", str(out), "--overlay", str(over)]  # fmt: skip
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{COFFEE}: mask ") and " of 3, score " in lines[0]
    assert lines[1:] == [f"  wrote {out}", f"  wrote {over}"]
    mask = np.asarray(Image.open(out))
    assert mask.shape == (400, 600) and set(np.unique(mask)) <= {0, 255}
    masks, scores = SamPredictor.load(folder)(COFFEE, points=[(300, 200), (20, 30)], labels=[1, 0])
    np.testing.assert_array_equal(mask == 255, masks[scores.argmax()])
    assert f"{int(masks[scores.argmax()].sum())} pixels" in lines[0]
    drawn, orig = np.asarray(Image.open(over)), np.asarray(Image.open(COFFEE).convert("RGB"))
    assert drawn.shape == orig.shape
    assert (drawn[mask == 255] != orig[mask == 255]).any() or not mask.any()
    assert (drawn[mask == 0] == orig[mask == 0]).all()


def test_segment_json_with_a_box_and_a_single_mask(capsys, tmp_path, folder):
    args = ["segment", COFFEE, "--box", "100,50,400,300", "--model", folder, "--json", "--single"]
    assert main(args) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["image"] == COFFEE and (row["width"], row["height"]) == (600, 400)
    assert row["best"] == 0 and len(row["scores"]) == 1 and row["mask"] is None
    assert row["area"] >= 0 and (row["box"] is None or len(row["box"]) == 4)
    with open(COFFEE, "rb") as f:  # '-' reads the image from stdin
        import io
        import sys

        old = sys.stdin
        sys.stdin = io.TextIOWrapper(io.BytesIO(f.read()))
        try:
            assert main(["segment", "-", "--point", "5,5", "--model", folder, "--json"]) == 0
        finally:
            sys.stdin = old
    assert json.loads(capsys.readouterr().out)["image"] == "-"


def test_segment_bad_inputs_are_one_line_errors(capsys, tmp_path, folder):
    assert "--model is required (ember ships no SAM weights)" in _error(
        capsys, ["segment", COFFEE, "--point", "1,1"]
    )
    assert "at least one --point" in _error(capsys, ["segment", COFFEE, "--model", folder])
    assert "outside the 600 x 400 image" in _error(
        capsys, ["segment", COFFEE, "--point", "600,10", "--model", folder]
    )
    assert "x1 < x2" in _error(capsys, ["segment", COFFEE, "--box", "9,9,3,30", "--model", folder])
    assert "--point: expected X,Y" in _error(
        capsys, ["segment", COFFEE, "--point", "3", "--model", folder], status=2
    )
    assert "--box: expected x1,y1,x2,y2" in _error(
        capsys, ["segment", COFFEE, "--box", "1,2,3,inf", "--model", folder], status=2
    )
    assert "no such file" in _error(
        capsys, ["segment", str(tmp_path / "no.png"), "--point", "1,1", "--model", folder]
    )
    assert "no such folder" in _error(
        capsys, ["segment", COFFEE, "--point", "1,1", "--model", str(tmp_path / "none")]
    )
    assert "no config.json" in _error(
        capsys, ["segment", COFFEE, "--point", "1,1", "--model", str(tmp_path)]
    )
    assert "does not exist" in _error(
        capsys,
        [
            "segment",
            COFFEE,
            "--point",
            "1,1",
            "--model",
            folder,
            "-o",
            str(tmp_path / "x" / "m.png"),
        ],
    )
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not an image")
    assert "broken.png" in _error(
        capsys, ["segment", str(bad), "--point", "1,1", "--model", folder]
    )
