"""StableDiffusionPipeline: text -> CLIP states -> denoised latents -> VAE -> an RGB image.

Reads a diffusers folder as it is laid out on disk::

    model_index.json
    text_encoder/  config.json, model.safetensors            (transformers CLIPTextModel)
    tokenizer/     vocab.json, merges.txt, special_tokens_map.json, tokenizer_config.json
    unet/          config.json, diffusion_pytorch_model.safetensors
    vae/           config.json, diffusion_pytorch_model.safetensors
    scheduler/     scheduler_config.json

(``*.fp16.safetensors`` variants and sharded ``*.safetensors.index.json`` are read too; weights
are memory-mapped, float16 ones cast to float32.) Classifier-free guidance runs the UNet on the
negative (or empty) prompt and the prompt in one batch and moves the noise prediction
``guidance_scale`` times along their difference. The starting latents come from numpy's
generator seeded with ``seed`` (so the same seed gives the same image in ember, not the image
torch's generator would give); pass ``latents`` to start from given noise.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import ember
from ember.errors import EmberError, FormatError, ShapeError, UnsupportedError
from ember.models.diffusion._layers import read_json
from ember.models.diffusion.clip_text import CLIPTextModel
from ember.models.diffusion.schedulers import CLASS_NAMES, SCHEDULERS, DDIMScheduler
from ember.models.diffusion.tokenizer import CLIPTokenizer
from ember.models.diffusion.unet import UNet2DConditionModel
from ember.models.diffusion.vae import AutoencoderKL
from ember.tensor import Tensor

LAYOUT = (
    "a diffusers Stable Diffusion folder: model_index.json, text_encoder/ (config.json + "
    "model.safetensors), tokenizer/ (vocab.json + merges.txt), unet/ and vae/ (config.json + "
    "diffusion_pytorch_model.safetensors), scheduler/scheduler_config.json"
)
SUBFOLDERS = ("text_encoder", "tokenizer", "unet", "vae", "scheduler")
MAX_SIDE = 4096  # pixels; a 4096 x 4096 image already needs tens of GB of activations


@dataclass
class StableDiffusionOutput:
    """images: (b, H, W, 3) uint8 (None for output_type "latent"); latents: the final latents."""

    images: np.ndarray | None
    latents: np.ndarray


class StableDiffusionPipeline:
    """Text-to-image with a CLIP text encoder, a UNet, a VAE and a DDIM or Euler scheduler."""

    def __init__(self, text_encoder: CLIPTextModel, tokenizer: CLIPTokenizer,
                 unet: UNet2DConditionModel, vae: AutoencoderKL, scheduler) -> None:  # fmt: skip
        """Put the parts together; checks that their sizes fit one another."""
        self.text_encoder, self.tokenizer = text_encoder, tokenizer
        self.unet, self.vae, self.scheduler = unet, vae, scheduler
        hidden = text_encoder.config.hidden_size
        cross = set(unet.config.per_block("cross_attention_dim"))
        if cross != {hidden}:
            raise ShapeError(
                f"Stable Diffusion: the text encoder's hidden_size {hidden} does not match the "
                f"UNet's cross_attention_dim {sorted(cross)}"
            )
        if unet.config.in_channels != vae.config.latent_channels:
            raise ShapeError(
                f"Stable Diffusion: the UNet takes {unet.config.in_channels} channels, the VAE "
                f"makes {vae.config.latent_channels}-channel latents"
            )
        limit = text_encoder.config.max_position_embeddings
        tokenizer.model_max_length = min(tokenizer.model_max_length, limit)
        self.source: str | None = None

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, scheduler: str | None = None, optimize: bool = True
    ):
        """Load a diffusers folder; scheduler "ddim" or "euler" (default: the folder's, else DDIM).

        optimize: run ``optimize_for_inference`` on the text encoder, UNet and VAE (packed GEMM
        weights, channels-last convs: about 1.3-2x faster on the CPU; the packed panels take
        as much memory again as the float32 weights).
        """
        p = Path(path)
        if not p.is_dir():
            raise FormatError(f"{p}: no such folder; expected {LAYOUT}")
        if not (p / "model_index.json").is_file():
            raise FormatError(f"{p}: no model_index.json; expected {LAYOUT}")
        index = read_json(p / "model_index.json")
        kind = index.get("_class_name", "StableDiffusionPipeline")
        if kind not in ("StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline"):
            raise UnsupportedError(f"{p}: a {kind}; ember runs StableDiffusionPipeline folders")
        missing = [s for s in SUBFOLDERS if not (p / s).is_dir()]
        if missing:
            raise FormatError(f"{p}: missing {', '.join(s + '/' for s in missing)}; expected {LAYOUT}")  # fmt: skip
        sched_cfg = read_json(p / "scheduler" / "scheduler_config.json")
        name = scheduler or CLASS_NAMES.get(sched_cfg.get("_class_name"), "ddim")
        if name not in SCHEDULERS:
            raise UnsupportedError(f"scheduler {name!r} is not one of {sorted(SCHEDULERS)}")
        pipe = cls(
            CLIPTextModel.from_pretrained(p / "text_encoder"),
            CLIPTokenizer.from_pretrained(p / "tokenizer"),
            UNet2DConditionModel.from_pretrained(p / "unet"),
            AutoencoderKL.from_pretrained(p / "vae", decoder_only=True),
            SCHEDULERS[name].from_config(sched_cfg),
        )
        if optimize:
            for name in ("text_encoder", "unet", "vae"):
                setattr(pipe, name, getattr(pipe, name).optimize_for_inference(inplace=True))
        pipe.source = str(p)
        return pipe

    @property
    def vae_scale_factor(self) -> int:
        """Pixels per latent along each side."""
        return self.vae.scale_factor

    def default_size(self) -> tuple[int, int]:
        """(height, width) the UNet was trained at: sample_size latents times the VAE's factor."""
        s = self.unet.config.sample_size
        if isinstance(s, int) and not isinstance(s, bool):
            s = (s, s)
        if not (
            isinstance(s, (list, tuple)) and len(s) == 2 and all(isinstance(v, int) for v in s)
        ):
            raise EmberError(f"Stable Diffusion: the UNet's sample_size {s!r} gives no default size; pass height and width")  # fmt: skip
        return s[0] * self.vae_scale_factor, s[1] * self.vae_scale_factor

    def encode_prompt(self, prompts: list[str], negative: list[str] | None, cfg: bool) -> Tensor:
        """Text states (b, tokens, dim), with the negative prompts' states first when ``cfg``."""
        n = self.tokenizer.model_max_length
        texts = (negative if negative is not None else [""] * len(prompts)) + prompts if cfg else prompts  # fmt: skip
        ids = self.tokenizer.encode(texts, n)
        return self.text_encoder(ids).last_hidden_state

    def _check_size(self, height: int, width: int) -> None:
        f = self.vae_scale_factor
        for name, v in (("height", height), ("width", width)):
            if isinstance(v, bool) or not isinstance(v, int) or not f <= v <= MAX_SIDE or v % f:
                raise EmberError(
                    f"Stable Diffusion: {name} must be a multiple of {f} in [{f}, {MAX_SIDE}], got {v!r}"
                )

    def __call__(
        self, prompt: str | list[str], negative_prompt: str | list[str] | None = None,
        height: int | None = None, width: int | None = None, num_inference_steps: int = 50,
        guidance_scale: float = 7.5, seed: int | None = None, latents=None,
        output_type: str = "np", eta: float = 0.0,
        callback: Callable[[int, int], None] | None = None,
    ) -> StableDiffusionOutput:  # fmt: skip
        """Generate one image per prompt; output_type "np" (uint8 images) or "latent"."""
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        if not prompts:
            raise EmberError("Stable Diffusion: no prompt given")
        negative = None
        if negative_prompt is not None:
            negative = [negative_prompt] * len(prompts) if isinstance(negative_prompt, str) else list(negative_prompt)  # fmt: skip
            if len(negative) != len(prompts):
                raise ShapeError(f"Stable Diffusion: {len(negative)} negative prompts for {len(prompts)} prompts")  # fmt: skip
        if not math.isfinite(guidance_scale) or not math.isfinite(eta) or eta < 0:
            raise EmberError(f"Stable Diffusion: guidance_scale and eta must be finite (eta >= 0), got {guidance_scale}, {eta}")  # fmt: skip
        if output_type not in ("np", "latent"):
            raise EmberError(f"Stable Diffusion: output_type must be 'np' or 'latent', got {output_type!r}")  # fmt: skip
        if height is None or width is None:
            dh, dw = self.default_size()
            height, width = height or dh, width or dw
        self._check_size(height, width)
        f, c = self.vae_scale_factor, self.unet.config.in_channels
        shape = (len(prompts), c, height // f, width // f)
        if latents is None:
            start = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
        else:
            start = np.asarray(latents.numpy() if isinstance(latents, Tensor) else latents, np.float32)  # fmt: skip
            if start.shape != shape:
                raise ShapeError(f"Stable Diffusion: latents must be {shape}, got {start.shape}")
        sched = self.scheduler
        timesteps = sched.set_timesteps(num_inference_steps)
        cfg = guidance_scale > 1.0
        if eta and not isinstance(sched, DDIMScheduler):
            raise UnsupportedError("Stable Diffusion: eta > 0 needs the DDIM scheduler")
        extra = {"eta": eta, "generator": np.random.default_rng(seed)} if eta else {}
        with ember.no_grad():
            ctx = self.encode_prompt(prompts, negative, cfg)
            x = ember.from_numpy(np.ascontiguousarray(start)) * float(sched.init_noise_sigma)
            for i, t in enumerate(timesteps):
                inp = ember.cat([x, x], dim=0) if cfg else x
                inp = sched.scale_model_input(inp, t)
                noise = self.unet(inp, t, ctx)
                if cfg:
                    uncond, text = noise.chunk(2, dim=0)
                    noise = uncond + (text - uncond) * guidance_scale
                x = sched.step(noise, t, x, **extra).prev_sample
                if callback is not None:
                    callback(i + 1, len(timesteps))
            final = x.numpy()
            if output_type == "latent":
                return StableDiffusionOutput(None, final)
            image = self.vae.decode(x * (1.0 / self.vae.config.scaling_factor))
            image = (image * 0.5 + 0.5).clamp(0.0, 1.0)
        pixels = np.round(image.numpy().transpose(0, 2, 3, 1) * 255.0).astype(np.uint8)
        return StableDiffusionOutput(pixels, final)


__all__ = ["StableDiffusionPipeline", "StableDiffusionOutput", "LAYOUT"]
