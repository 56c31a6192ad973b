"""The whole Stable Diffusion pipeline against diffusers' from the same folder and starting noise."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from ember.errors import EmberError, FormatError, ShapeError, UnsupportedError
from ember.models.diffusion import StableDiffusionPipeline

CASES = [  # scheduler, (height, width), prompts, negative prompt, guidance
    ("ddim", (16, 16), ["a photo of a cat"], None, 7.5),
    ("ddim", (16, 24), ["a dog", "astronaut riding a horse on mars"], "ugly", 3.0),
    ("euler", (24, 16), ["a red cat"], "blurry painting", 7.5),
    ("euler", (16, 8), ["a blue horse", "the dog"], None, 1.0),  # no guidance
]


@pytest.fixture(scope="module")
def pipes(sd):
    """diffusers' pipelines and ember's, both read from the saved folder.

    (From the folder, not the in-memory pipeline: diffusers' from_config drops the fields the
    in-memory DDIM config left at their defaults, timestep_spacing among them.)
    """
    from diffusers import DDIMScheduler, EulerDiscreteScheduler
    from diffusers import StableDiffusionPipeline as Ref

    folder, _ = sd
    ref = Ref.from_pretrained(folder, safety_checker=None, requires_safety_checker=False)
    euler = EulerDiscreteScheduler.from_config(ref.scheduler.config)
    refs = {"ddim": ref, "euler": Ref(**{**ref.components, "scheduler": euler})}
    assert isinstance(ref.scheduler, DDIMScheduler)
    for r in refs.values():
        r.set_progress_bar_config(disable=True)
    ours = {k: StableDiffusionPipeline.from_pretrained(folder, scheduler=k) for k in refs}
    return refs, ours


@pytest.mark.parametrize("sched, hw, prompts, negative, guidance", CASES)
def test_final_latents_and_image_match_diffusers(pipes, sched, hw, prompts, negative, guidance):
    refs, ours = pipes
    ref, pipe = refs[sched], ours[sched]
    f = pipe.vae_scale_factor
    latents = np.random.default_rng(len(prompts)).standard_normal((len(prompts), 4, hw[0] // f, hw[1] // f)).astype(np.float32)  # fmt: skip
    kw = dict(height=hw[0], width=hw[1], num_inference_steps=4, guidance_scale=guidance,
              negative_prompt=None if negative is None else [negative] * len(prompts))  # fmt: skip
    with torch.no_grad():
        want = ref(prompts, latents=torch.from_numpy(latents), output_type="latent", **kw).images.numpy()  # fmt: skip
        want_img = ref(prompts, latents=torch.from_numpy(latents), output_type="np", **kw).images
    got = pipe(prompts, latents=latents, **kw)
    assert np.abs(want).max() > 1.0
    np.testing.assert_allclose(got.latents, want, atol=1e-4, rtol=0)
    assert got.images.shape == (len(prompts), *hw, 3) and got.images.dtype == np.uint8
    # uint8 rounding may flip at a .5 boundary
    assert np.abs(got.images.astype(int) - np.round(want_img * 255).astype(int)).max() <= 1


def test_seed_is_reproducible_and_defaults(pipes, sd):
    _, ours = pipes
    pipe = ours["ddim"]
    plain = StableDiffusionPipeline.from_pretrained(sd[0], optimize=False)
    np.testing.assert_allclose(
        plain("a cat", num_inference_steps=2, seed=3, output_type="latent").latents,
        pipe("a cat", num_inference_steps=2, seed=3, output_type="latent").latents,
        atol=1e-4,
    )
    a = pipe("a cat", num_inference_steps=2, seed=3)
    b = pipe("a cat", num_inference_steps=2, seed=3)
    c = pipe("a cat", num_inference_steps=2, seed=4)
    np.testing.assert_array_equal(a.images, b.images)
    assert not np.array_equal(a.latents, c.latents)
    assert a.images.shape == (1, 16, 16, 3)  # sample_size 8 latents x VAE factor 2
    e = pipe("a cat", num_inference_steps=2, seed=3, eta=0.5)
    assert e.latents.shape == a.latents.shape and not np.array_equal(e.latents, a.latents)


def test_bad_calls(pipes):
    _, ours = pipes
    pipe = ours["euler"]
    with pytest.raises(EmberError, match="height must be a multiple of 2"):
        pipe("x", height=15, num_inference_steps=1)
    with pytest.raises(EmberError, match="width must be"):
        pipe("x", width=10**6, num_inference_steps=1)
    with pytest.raises(EmberError, match="num_inference_steps"):
        pipe("x", num_inference_steps=0)
    with pytest.raises(ShapeError, match="latents must be"):
        pipe("x", latents=np.zeros((1, 4, 3, 3), np.float32), num_inference_steps=1)
    with pytest.raises(ShapeError, match="2 negative prompts for 1 prompts"):
        pipe("x", negative_prompt=["a", "b"], num_inference_steps=1)
    with pytest.raises(UnsupportedError, match="DDIM"):
        pipe("x", eta=0.3, num_inference_steps=1)
    with pytest.raises(EmberError, match="must be finite"):
        pipe("x", guidance_scale=float("nan"), num_inference_steps=1)
    with pytest.raises(EmberError, match="no prompt"):
        pipe([], num_inference_steps=1)


def _edited(src, dst, name, change):
    shutil.copytree(src, dst)
    path = dst / name
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    return dst


def test_bad_folders(sd, tmp_path):
    folder, _ = sd
    with pytest.raises(FormatError, match="no model_index.json; expected a diffusers"):
        StableDiffusionPipeline.from_pretrained(tmp_path)
    with pytest.raises(FormatError, match="no such folder"):
        StableDiffusionPipeline.from_pretrained(tmp_path / "nope")
    broken = tmp_path / "no_vae"
    shutil.copytree(folder, broken, ignore=shutil.ignore_patterns("vae"))
    with pytest.raises(FormatError, match=r"missing vae/"):
        StableDiffusionPipeline.from_pretrained(broken)
    xl = _edited(folder, tmp_path / "xl", "model_index.json", {"_class_name": "StableDiffusionXLPipeline"})  # fmt: skip
    with pytest.raises(UnsupportedError, match="StableDiffusionXLPipeline"):
        StableDiffusionPipeline.from_pretrained(xl)
    wide = _edited(folder, tmp_path / "wide", "text_encoder/config.json", {"hidden_size": 32, "intermediate_size": 37})  # fmt: skip
    with pytest.raises(ShapeError, match="does not fit"):
        StableDiffusionPipeline.from_pretrained(wide)
    with pytest.raises(UnsupportedError, match="scheduler 'pndm'"):
        StableDiffusionPipeline.from_pretrained(folder, scheduler="pndm")
    pndm = _edited(folder, tmp_path / "pndm", "scheduler/scheduler_config.json", {"_class_name": "PNDMScheduler"})  # fmt: skip
    assert type(StableDiffusionPipeline.from_pretrained(pndm).scheduler).__name__ == "DDIMScheduler"
