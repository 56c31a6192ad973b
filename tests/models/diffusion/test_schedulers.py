"""ember's DDIM and Euler schedulers against diffusers': timesteps, sigmas and every step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember.errors import EmberError, FormatError, ShapeError, UnsupportedError
from ember.models.diffusion import DDIMScheduler, EulerDiscreteScheduler

SD = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1)


def _pair(kind: str, **kw):
    import diffusers

    if kind == "ddim":
        kw = dict(clip_sample=False, set_alpha_to_one=False, **kw)
        return diffusers.DDIMScheduler(**kw), DDIMScheduler(**kw)
    return diffusers.EulerDiscreteScheduler(**kw), EulerDiscreteScheduler(**kw)


@pytest.mark.parametrize("kind", ["ddim", "euler"])
@pytest.mark.parametrize("spacing", ["leading", "trailing", "linspace"])
@pytest.mark.parametrize("pred", ["epsilon", "v_prediction"])
@pytest.mark.parametrize("steps", [1, 7, 50])
def test_steps_match_diffusers(kind, spacing, pred, steps):
    ref, ours = _pair(kind, timestep_spacing=spacing, prediction_type=pred, **SD)
    ref.set_timesteps(steps)
    ts = ours.set_timesteps(steps)
    np.testing.assert_array_equal(ts, ref.timesteps.numpy())
    assert ts.dtype == (np.int64 if kind == "ddim" else np.float32)
    assert ours.init_noise_sigma == pytest.approx(float(ref.init_noise_sigma), rel=1e-6)
    if kind == "euler":
        np.testing.assert_allclose(ours.sigmas, ref.sigmas.numpy(), rtol=1e-6)
    rng = np.random.default_rng(steps)
    x = (rng.standard_normal((2, 4, 3, 5)) * ours.init_noise_sigma).astype(np.float32)
    xt, xe = torch.from_numpy(x), ember.tensor(x)
    for t in ref.timesteps:
        out = rng.standard_normal(x.shape).astype(np.float32)
        a, b = ref.scale_model_input(xt, t), ours.scale_model_input(xe, t.item())
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-5)
        step_ref = ref.step(torch.from_numpy(out), t, xt)
        step = ours.step(ember.tensor(out), t.item(), xe)
        np.testing.assert_allclose(step.pred_original_sample.numpy(), step_ref.pred_original_sample.numpy(), rtol=1e-5, atol=1e-5)  # fmt: skip
        xt, xe = step_ref.prev_sample, step.prev_sample
        np.testing.assert_allclose(xe.numpy(), xt.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kind, kw",
    [
        ("ddim", dict(beta_schedule="linear", prediction_type="sample", clip_sample=True)),
        (
            "ddim",
            dict(
                beta_schedule="squaredcos_cap_v2",
                set_alpha_to_one=True,
                rescale_betas_zero_snr=True,
                timestep_spacing="trailing",
                prediction_type="v_prediction",
            ),
        ),  # fmt: skip
        (
            "euler",
            dict(beta_schedule="linear", final_sigmas_type="sigma_min", prediction_type="sample"),
        ),  # fmt: skip
    ],
)
def test_other_schedules_match_diffusers(kind, kw):
    import diffusers

    cls = {"ddim": diffusers.DDIMScheduler, "euler": diffusers.EulerDiscreteScheduler}[kind]
    ref, ours = cls(**kw), (DDIMScheduler if kind == "ddim" else EulerDiscreteScheduler)(**kw)
    ref.set_timesteps(10)
    ours.set_timesteps(10)
    x = np.random.default_rng(0).standard_normal((1, 4, 2, 3)).astype(np.float32)
    xt, xe = torch.from_numpy(x), ember.tensor(x)
    for t in ref.timesteps:
        out = np.random.default_rng(int(t)).standard_normal(x.shape).astype(np.float32)
        xt = ref.step(torch.from_numpy(out), t, ref.scale_model_input(xt, t)).prev_sample
        xe = ours.step(
            ember.tensor(out), t.item(), ours.scale_model_input(xe, t.item())
        ).prev_sample
        np.testing.assert_allclose(xe.numpy(), xt.numpy(), rtol=1e-5, atol=1e-5)


def test_ddim_eta_adds_noise_of_the_right_size():
    s = DDIMScheduler(**SD)
    s.set_timesteps(10)
    x = ember.zeros(1, 4, 8, 8)
    a = s.step(ember.zeros(1, 4, 8, 8), s.timesteps[0], x).prev_sample.numpy()
    b = s.step(ember.zeros(1, 4, 8, 8), s.timesteps[0], x, eta=1.0,
               generator=np.random.default_rng(0)).prev_sample.numpy()  # fmt: skip
    assert np.all(a == 0) and 0.1 < b.std() < 1.0


def test_bad_configs_and_calls():
    with pytest.raises(UnsupportedError, match="timestep_spacing"):
        DDIMScheduler(timestep_spacing="karras")
    with pytest.raises(UnsupportedError, match="prediction_type"):
        EulerDiscreteScheduler(prediction_type="flow")
    with pytest.raises(UnsupportedError, match="use_karras_sigmas"):
        EulerDiscreteScheduler(use_karras_sigmas=True)
    with pytest.raises(UnsupportedError, match="beta_schedule"):
        DDIMScheduler(beta_schedule="sigmoid")
    with pytest.raises(UnsupportedError, match="thresholding"):
        DDIMScheduler(thresholding=True)
    with pytest.raises(FormatError, match="num_train_timesteps"):
        DDIMScheduler(num_train_timesteps=10**9)
    with pytest.raises(FormatError, match="malformed"):
        DDIMScheduler(beta_start="small")
    with pytest.raises(FormatError, match="trained_betas"):
        DDIMScheduler(trained_betas=[0.1, 0.2])
    s = EulerDiscreteScheduler(**SD)
    with pytest.raises(EmberError, match=r"num_inference_steps must be in \[1, 1000\]"):
        s.set_timesteps(0)
    with pytest.raises(EmberError, match="num_inference_steps"):
        s.set_timesteps(1001)
    s.set_timesteps(3)
    with pytest.raises(EmberError, match="not in the schedule"):
        s.scale_model_input(ember.zeros(1), 5.5)
    with pytest.raises(ShapeError, match="differ"):
        s.step(ember.zeros(1, 4), float(s.timesteps[0]), ember.zeros(2, 4))
    with pytest.raises(EmberError, match="set_timesteps"):
        DDIMScheduler().step(ember.zeros(1), 1, ember.zeros(1))
    cfg = DDIMScheduler.from_config({"_class_name": "PNDMScheduler", "skip_prk_steps": True, **SD})
    assert cfg.config.steps_offset == 1 and cfg.config.extra == {"skip_prk_steps": True}
