"""Stable Diffusion: CLIP text encoder, UNet, VAE, DDIM/Euler schedulers and the pipeline (docs/models/diffusion.md)."""

from __future__ import annotations

from ember.models.diffusion.clip_text import CLIPTextConfig, CLIPTextModel
from ember.models.diffusion.pipeline import StableDiffusionOutput, StableDiffusionPipeline
from ember.models.diffusion.schedulers import DDIMScheduler, EulerDiscreteScheduler
from ember.models.diffusion.tokenizer import CLIPTokenizer
from ember.models.diffusion.unet import UNet2DConditionConfig, UNet2DConditionModel
from ember.models.diffusion.vae import AutoencoderKL, AutoencoderKLConfig

__all__ = [
    "AutoencoderKL", "AutoencoderKLConfig", "CLIPTextConfig", "CLIPTextModel", "CLIPTokenizer",
    "DDIMScheduler", "EulerDiscreteScheduler", "StableDiffusionOutput", "StableDiffusionPipeline",
    "UNet2DConditionConfig", "UNet2DConditionModel",
]  # fmt: skip
