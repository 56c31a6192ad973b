"""`ember imagine` with the tiny random Stable Diffusion folder: an image, and one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from ember.cli.main import main
from ember.models.diffusion import StableDiffusionPipeline
from tests.cli.test_cli_errors import one_line_error


def test_writes_the_pipelines_image(sd, tmp_path, capsys):
    from PIL import Image

    folder, _ = sd
    out = tmp_path / "out.png"
    argv = ["imagine", "a photo of a cat", "-o", str(out), "--model", str(folder), "--steps", "3",
            "--seed", "7", "--guidance", "5", "--negative-prompt", "ugly", "--scheduler", "euler",
            "--height", "16", "--width", "24", "-v", "--no-optimize"]  # fmt: skip
    assert main(argv) == 0
    cap = capsys.readouterr()
    assert "24x16 image, 3 steps, seed 7" in cap.out and "s/step" in cap.err
    image = np.asarray(Image.open(out))
    pipe = StableDiffusionPipeline.from_pretrained(folder, scheduler="euler", optimize=False)
    want = pipe("a photo of a cat", negative_prompt="ugly", height=16, width=24,
                num_inference_steps=3, guidance_scale=5.0, seed=7).images[0]  # fmt: skip
    np.testing.assert_array_equal(image, want)


@pytest.mark.parametrize(
    "extra, match",
    [
        ([], "--model FOLDER is required (ember ships no Stable Diffusion weights): a diffusers"),
        (["--model", "/no/such/folder"], "no such folder"),
        (["--model", "."], "no model_index.json"),
        (["--model", "MODEL", "--height", "20"], "--height must be a multiple of 8"),
        (["--model", "MODEL", "--steps", "0"], "--steps: must be >= 1"),
        (["--model", "MODEL", "--guidance", "nan"], "--guidance"),
        (["--model", "MODEL", "--scheduler", "pndm"], "--scheduler: invalid choice"),
        (["--model", "MODEL", "--height", "40000"], "height must be a multiple of 2 in [2, 4096]"),
    ],
)
def test_one_line_errors(sd, tmp_path, capsys, extra, match):
    folder, _ = sd
    extra = [str(folder) if a == "MODEL" else a for a in extra]
    line = one_line_error(capsys, ["imagine", "a cat", "-o", str(tmp_path / "x.png"), *extra], "imagine")  # fmt: skip
    assert match in line
    assert not (tmp_path / "x.png").exists()


def test_output_folder_must_exist(capsys, tmp_path):
    line = one_line_error(capsys, ["imagine", "a cat", "-o", str(tmp_path / "no" / "x.png")], "imagine")  # fmt: skip
    assert "does not exist" in line
