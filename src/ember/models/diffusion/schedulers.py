"""DDIM and Euler (discrete) samplers, with diffusers' config fields, timesteps and steps.

Both start from the training noise schedule (``beta_schedule`` linear, scaled_linear or
squaredcos_cap_v2, or ``trained_betas``), pick ``num_inference_steps`` timesteps with
``timestep_spacing`` "leading", "trailing" or "linspace" (plus ``steps_offset``), and turn a
model output (``prediction_type`` epsilon, v_prediction or sample) into the next latents:

- DDIM (eta 0 is deterministic): x_prev = sqrt(a_prev) * x0 + sqrt(1 - a_prev - s^2) * eps + s * z
- Euler: sigma_t = sqrt((1 - a_t) / a_t); x_prev = x + (x - x0) / sigma_t * (sigma_next - sigma_t),
  the model input scaled by 1 / sqrt(sigma_t^2 + 1) (``scale_model_input``).

The arithmetic is float32 where diffusers' is, so the latents agree to float32 rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

import ember
from ember.errors import EmberError, FormatError, ShapeError, UnsupportedError
from ember.tensor import Tensor

SPACINGS = ("leading", "trailing", "linspace")
PREDICTIONS = ("epsilon", "v_prediction", "sample")


@dataclass
class SchedulerOutput:
    """prev_sample: the latents for the next step; pred_original_sample: the model's x0."""

    prev_sample: Tensor
    pred_original_sample: Tensor

    def __getitem__(self, i: int) -> Tensor:
        return (self.prev_sample, self.pred_original_sample)[i]


@dataclass
class _Config:
    num_train_timesteps: int = 1000
    beta_start: float = 0.0001
    beta_end: float = 0.02
    beta_schedule: str = "linear"
    trained_betas: list | None = None
    prediction_type: str = "epsilon"
    steps_offset: int = 0
    timestep_spacing: str = "leading"
    rescale_betas_zero_snr: bool = False
    extra: dict = field(default_factory=dict, repr=False)


@dataclass
class DDIMConfig(_Config):
    """diffusers' DDIMScheduler config fields and defaults."""

    clip_sample: bool = True
    clip_sample_range: float = 1.0
    set_alpha_to_one: bool = True
    thresholding: bool = False


@dataclass
class EulerConfig(_Config):
    """diffusers' EulerDiscreteScheduler config fields and defaults."""

    timestep_spacing: str = "linspace"
    interpolation_type: str = "linear"
    use_karras_sigmas: bool = False
    use_exponential_sigmas: bool = False
    use_beta_sigmas: bool = False
    final_sigmas_type: str = "zero"
    timestep_type: str = "discrete"


def _betas(cfg: _Config) -> np.ndarray:
    n = cfg.num_train_timesteps
    if cfg.trained_betas is not None:
        betas = np.asarray(cfg.trained_betas, dtype=np.float64)
        if betas.shape != (n,):
            raise FormatError(f"scheduler: trained_betas has {betas.size} values for {n} timesteps")
    elif cfg.beta_schedule == "linear":
        betas = np.linspace(cfg.beta_start, cfg.beta_end, n)
    elif cfg.beta_schedule == "scaled_linear":
        betas = np.linspace(cfg.beta_start**0.5, cfg.beta_end**0.5, n, dtype=np.float32) ** 2
    elif cfg.beta_schedule == "squaredcos_cap_v2":
        bar = lambda t: math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2
        betas = np.array([min(1 - bar((i + 1) / n) / bar(i / n), 0.999) for i in range(n)])
    else:
        raise UnsupportedError(
            f"scheduler: beta_schedule {cfg.beta_schedule!r} is not linear, scaled_linear "
            "or squaredcos_cap_v2"
        )
    betas = betas.astype(np.float32)
    if cfg.rescale_betas_zero_snr:  # shift and scale sqrt(alpha_bar) so that the last is 0
        root = np.sqrt(np.cumprod(1.0 - betas.astype(np.float64)))
        first, last = root[0], root[-1]
        root = (root - last) * first / (first - last)
        bar = root**2
        alphas = np.concatenate([bar[:1], bar[1:] / bar[:-1]])
        betas = (1.0 - alphas).astype(np.float32)
    return betas


class _Scheduler:
    """The training schedule, the config checks and the timestep -> step-index bookkeeping."""

    config_class: type = _Config

    def __init__(self, **config) -> None:
        """Build from diffusers' config fields (keyword arguments); unknown ones are kept aside."""
        names = {f.name for f in fields(self.config_class)} - {"extra"}
        known = {k: v for k, v in config.items() if k in names}
        extra = {k: v for k, v in config.items() if k not in names}
        self.config = self.config_class(**known, extra=extra)
        try:
            self._validate()
            betas = _betas(self.config)
        except (TypeError, ValueError) as e:  # a field of the wrong JSON type
            raise FormatError(f"scheduler config: malformed ({type(e).__name__}: {e})") from None
        self.betas = betas
        # torch's float32 cumprod accumulates in double: so does this, to the same float32 values
        alphas = (np.float32(1.0) - betas).astype(np.float64)
        self.alphas_cumprod = np.cumprod(alphas).astype(np.float32)
        self.num_inference_steps: int | None = None
        self.timesteps = np.arange(self.config.num_train_timesteps)[::-1].copy()

    def _validate(self) -> None:
        cfg = self.config
        n = cfg.num_train_timesteps
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 100_000:
            raise FormatError(f"scheduler: num_train_timesteps must be in [1, 100000], got {n!r}")
        if cfg.timestep_spacing not in SPACINGS:
            raise UnsupportedError(
                f"scheduler: timestep_spacing {cfg.timestep_spacing!r} is not one of {SPACINGS}"
            )
        if cfg.prediction_type not in PREDICTIONS:
            raise UnsupportedError(
                f"scheduler: prediction_type {cfg.prediction_type!r} is not one of {PREDICTIONS}"
            )

    @classmethod
    def from_config(cls, config: dict):
        """From a scheduler_config.json dict (any diffusers scheduler's: the fields this one uses)."""
        if not isinstance(config, dict):
            raise FormatError(f"scheduler config: expected a JSON object, got {type(config).__name__}")  # fmt: skip
        return cls(**{k: v for k, v in config.items() if not k.startswith("_")})

    def _spaced(self, steps: int) -> np.ndarray:
        """The timesteps (float64, descending) that ``timestep_spacing`` picks."""
        cfg = self.config
        n = cfg.num_train_timesteps
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= n:
            raise EmberError(f"scheduler: num_inference_steps must be in [1, {n}], got {steps!r}")
        if cfg.timestep_spacing == "linspace":
            return np.linspace(0, n - 1, steps)[::-1].round()
        if cfg.timestep_spacing == "leading":
            ratio = n // steps
            return (np.arange(steps) * ratio).round()[::-1].astype(np.float64) + cfg.steps_offset
        return np.round(np.arange(n, 0, -n / steps)).astype(np.float64) - 1

    def scale_model_input(self, sample: Tensor, timestep=None) -> Tensor:
        """The UNet's input at this timestep (unchanged for DDIM)."""
        return sample

    @staticmethod
    def _x0_eps(cfg: _Config, out: Tensor, x: Tensor, a: float) -> tuple[Tensor, Tensor]:
        """(x0, eps) from a model output at alpha_bar a."""
        b = 1.0 - a
        if cfg.prediction_type == "epsilon":
            return (x - out * b**0.5) * (1.0 / a**0.5), out
        if cfg.prediction_type == "v_prediction":
            return x * a**0.5 - out * b**0.5, out * a**0.5 + x * b**0.5
        return out, (x - out * a**0.5) * (1.0 / b**0.5)


class DDIMScheduler(_Scheduler):
    """Denoising diffusion implicit models: deterministic for eta = 0."""

    config_class = DDIMConfig
    init_noise_sigma = 1.0

    def _validate(self) -> None:
        super()._validate()
        if self.config.thresholding:
            raise UnsupportedError("DDIM: thresholding (dynamic thresholding) is not supported")

    @property
    def final_alpha_cumprod(self) -> float:
        """alpha_bar past the last step: 1 (set_alpha_to_one) or alpha_bar[0]."""
        return 1.0 if self.config.set_alpha_to_one else float(self.alphas_cumprod[0])

    def set_timesteps(self, num_inference_steps: int) -> np.ndarray:
        """Pick the steps; returns (and keeps in ``timesteps``) int64 timesteps, descending."""
        self.timesteps = self._spaced(num_inference_steps).astype(np.int64)
        if self.timesteps.max() >= self.config.num_train_timesteps or self.timesteps.min() < 0:
            raise EmberError(
                f"DDIM: steps_offset {self.config.steps_offset} pushes timesteps past "
                f"[0, {self.config.num_train_timesteps})"
            )
        self.num_inference_steps = num_inference_steps
        return self.timesteps

    def step(self, model_output: Tensor, timestep, sample: Tensor, eta: float = 0.0,
             generator: np.random.Generator | None = None) -> SchedulerOutput:  # fmt: skip
        """The latents one step earlier; eta > 0 adds fresh noise (drawn from ``generator``)."""
        if self.num_inference_steps is None:
            raise EmberError("DDIM: call set_timesteps before step")
        _same_shape(model_output, sample)
        cfg = self.config
        t = int(timestep)
        prev = t - cfg.num_train_timesteps // self.num_inference_steps
        a = float(self.alphas_cumprod[t])
        a_prev = float(self.alphas_cumprod[prev]) if prev >= 0 else self.final_alpha_cumprod
        x0, eps = self._x0_eps(cfg, model_output, sample, a)
        if cfg.clip_sample:
            r = cfg.clip_sample_range
            x0 = x0.clamp(-r, r)  # eps stays the one from the unclipped x0, as in diffusers
        var = (1.0 - a_prev) / (1.0 - a) * (1.0 - a / a_prev)
        std = eta * var**0.5
        out = x0 * a_prev**0.5 + eps * max(1.0 - a_prev - std**2, 0.0) ** 0.5
        if eta > 0:
            rng = generator if generator is not None else np.random.default_rng()
            noise = rng.standard_normal(tuple(sample.shape)).astype(np.float32)
            out = out + ember.from_numpy(noise) * std
        return SchedulerOutput(out, x0)


class EulerDiscreteScheduler(_Scheduler):
    """Euler's method on the probability-flow ODE in sigma = sqrt((1 - a) / a)."""

    config_class = EulerConfig

    def __init__(self, **config) -> None:
        """Build from diffusers' config fields; sigmas start as the whole training schedule."""
        super().__init__(**config)
        ac = self.alphas_cumprod
        self.sigmas = np.concatenate([(((1 - ac) / ac) ** 0.5)[::-1], [0.0]]).astype(np.float32)
        self.timesteps = np.arange(self.config.num_train_timesteps, dtype=np.float32)[::-1].copy()
        self._step_index: int | None = None

    def _validate(self) -> None:
        super()._validate()
        cfg = self.config
        for flag in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas"):
            if getattr(cfg, flag):
                raise UnsupportedError(f"Euler: {flag} is not supported")
        if cfg.interpolation_type != "linear":
            raise UnsupportedError(f"Euler: interpolation_type {cfg.interpolation_type!r} is not 'linear'")  # fmt: skip
        if cfg.final_sigmas_type not in ("zero", "sigma_min"):
            raise UnsupportedError(f"Euler: final_sigmas_type {cfg.final_sigmas_type!r} is not 'zero' or 'sigma_min'")  # fmt: skip
        if cfg.timestep_type != "discrete":
            raise UnsupportedError(f"Euler: timestep_type {cfg.timestep_type!r} is not 'discrete'")
        if cfg.rescale_betas_zero_snr:
            raise UnsupportedError("Euler: rescale_betas_zero_snr is not supported (use DDIM)")

    @property
    def init_noise_sigma(self) -> float:
        """The standard deviation of the starting latents."""
        top = float(self.sigmas.max())
        return top if self.config.timestep_spacing in ("linspace", "trailing") else (top**2 + 1) ** 0.5  # fmt: skip

    def set_timesteps(self, num_inference_steps: int) -> np.ndarray:
        """Pick the steps; returns (and keeps in ``timesteps``) float32 timesteps, descending."""
        t = self._spaced(num_inference_steps)
        if self.config.timestep_spacing == "linspace":  # not rounded: sigmas are interpolated
            n = self.config.num_train_timesteps
            t = np.linspace(0, n - 1, num_inference_steps, dtype=np.float32)[::-1].astype(
                np.float64
            )
        if t.max() > self.config.num_train_timesteps - 1 or t.min() < 0:
            raise EmberError(f"Euler: steps_offset {self.config.steps_offset} pushes timesteps past the schedule")  # fmt: skip
        ac = self.alphas_cumprod
        full = ((1 - ac) / ac) ** 0.5
        sig = np.interp(t, np.arange(len(full)), full)
        last = float(full[0]) if self.config.final_sigmas_type == "sigma_min" else 0.0
        self.sigmas = np.concatenate([sig, [last]]).astype(np.float32)
        self.timesteps = t.astype(np.float32)
        self.num_inference_steps = num_inference_steps
        self._step_index = None
        return self.timesteps

    def _index(self, timestep) -> int:
        if self._step_index is None:
            hits = np.nonzero(self.timesteps == np.float32(float(timestep)))[0]
            if hits.size == 0:
                raise EmberError(f"Euler: timestep {float(timestep)} is not in the schedule")
            self._step_index = int(hits[1] if hits.size > 1 else hits[0])
        return self._step_index

    def scale_model_input(self, sample: Tensor, timestep=None) -> Tensor:
        """sample / sqrt(sigma^2 + 1) at this timestep."""
        sigma = np.float32(self.sigmas[self._index(timestep)])
        return sample / float(np.sqrt(sigma * sigma + np.float32(1.0)))

    def step(self, model_output: Tensor, timestep, sample: Tensor) -> SchedulerOutput:
        """One Euler step from sigma_t to the next sigma."""
        _same_shape(model_output, sample)
        i = self._index(timestep)
        if i + 1 >= len(self.sigmas):
            raise EmberError("Euler: step called past the last timestep (call set_timesteps again)")
        sigma, nxt = np.float32(self.sigmas[i]), np.float32(self.sigmas[i + 1])
        one = np.float32(1.0)
        cfg = self.config
        # scalars in float32 and diffusers' order of operations: at the first steps of a large
        # sigma the update cancels most of the sample, and a different rounding would show
        if cfg.prediction_type == "epsilon":
            x0 = sample - model_output * float(sigma)
        elif cfg.prediction_type == "v_prediction":
            c_out = -sigma / np.sqrt(sigma * sigma + one)
            x0 = model_output * float(c_out) + sample / float(sigma * sigma + one)
        else:
            x0 = model_output
        out = sample + (sample - x0) / float(sigma) * float(nxt - sigma)
        self._step_index = i + 1
        return SchedulerOutput(out, x0)


def _same_shape(a: Tensor, b: Tensor) -> None:
    if tuple(a.shape) != tuple(b.shape):
        raise ShapeError(
            f"scheduler: model_output {tuple(a.shape)} and sample {tuple(b.shape)} differ"
        )


SCHEDULERS = {"ddim": DDIMScheduler, "euler": EulerDiscreteScheduler}
CLASS_NAMES = {"DDIMScheduler": "ddim", "EulerDiscreteScheduler": "euler"}

__all__ = [
    "DDIMScheduler", "EulerDiscreteScheduler", "DDIMConfig", "EulerConfig", "SchedulerOutput",
    "SCHEDULERS",
]  # fmt: skip
