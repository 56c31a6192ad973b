"""A tiny random Stable Diffusion folder saved by diffusers (shared by the model and CLI tests).

The tokenizer is a real CLIP BPE layout (vocab.json + merges.txt, byte-level, ``</w>`` word
ends) over a small vocabulary: the 256 byte symbols, each with ``</w>``, the merges that spell a
few words, and the two special tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

WORDS = ("a", "photo", "of", "the", "cat", "dog", "astronaut", "riding", "horse", "on", "mars",
         "red", "blue", "blurry", "ugly", "painting", "ca")  # fmt: skip
MAX_TOKENS = 12  # the tokenizer's model_max_length (77 in real folders)

UNET = dict(
    sample_size=8,
    in_channels=4,
    out_channels=4,
    block_out_channels=(8, 16),
    layers_per_block=1,
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    cross_attention_dim=16,
    attention_head_dim=2,
    norm_num_groups=4,
)
VAE = dict(
    block_out_channels=(8, 16),
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 2,
    up_block_types=("UpDecoderBlock2D",) * 2,
    latent_channels=4,
    norm_num_groups=4,
    layers_per_block=1,
    sample_size=16,
)


def clip_text_config(
    vocab_size: int, act: str = "quick_gelu", max_tokens: int = MAX_TOKENS
) -> dict:
    """A 2-layer, 16-wide CLIP text tower."""
    return dict(
        bos_token_id=vocab_size - 2, eos_token_id=vocab_size - 1, pad_token_id=vocab_size - 1,
        hidden_size=16, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
        vocab_size=vocab_size, max_position_embeddings=max_tokens, hidden_act=act,
    )  # fmt: skip


def write_tokenizer(
    folder: Path, words=WORDS, pad: str = "<|endoftext|>", max_tokens: int = MAX_TOKENS
) -> int:
    """vocab.json, merges.txt and the configs of a CLIP tokenizer; returns the vocabulary size."""
    from tokenizers.pre_tokenizers import ByteLevel

    folder.mkdir(parents=True, exist_ok=True)
    symbols = sorted(ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(symbols + [s + "</w>" for s in symbols])}
    merges: list[tuple[str, str]] = []
    for word in words:
        parts = list(word[:-1]) + [word[-1] + "</w>"]
        while len(parts) > 1:  # merge left to right, each merge a new vocabulary entry
            pair = (parts[0], parts[1])
            if pair not in merges:
                merges.append(pair)
                vocab.setdefault(pair[0] + pair[1], len(vocab))
            parts = [pair[0] + pair[1]] + parts[2:]
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in merges]
    (folder / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    special = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
               "unk_token": "<|endoftext|>", "pad_token": pad}  # fmt: skip
    (folder / "special_tokens_map.json").write_text(json.dumps(special))
    cfg = dict(special, model_max_length=max_tokens, tokenizer_class="CLIPTokenizer")
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return len(vocab)


def randomize(module, seed: int) -> None:
    """Give every parameter random values of a trained model's scale (diffusers zero-inits some)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif p.ndim >= 2:  # unit gain: activations stay O(1) through the network
                p.copy_(noise / p[0].numel() ** 0.5)
            else:
                p.copy_(0.1 * noise)


def save_pipeline(folder: Path, seed: int = 0, scheduler: str = "ddim", act: str = "quick_gelu",
                  unet: dict | None = None, vae: dict | None = None, text: dict | None = None,
                  max_tokens: int = MAX_TOKENS, **scheduler_kw):  # fmt: skip
    """Save a random tiny StableDiffusionPipeline to folder; returns the diffusers pipeline."""
    import torch
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        EulerDiscreteScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    n = write_tokenizer(folder / "tokenizer", max_tokens=max_tokens)
    torch.manual_seed(seed)
    text = CLIPTextModel(
        CLIPTextConfig(**{**clip_text_config(n, act, max_tokens), **(text or {})})
    ).eval()
    u = UNet2DConditionModel(**(unet or UNET)).eval()
    v = AutoencoderKL(**(vae or VAE)).eval()
    for i, m in enumerate((text, u, v)):
        randomize(m, seed * 10 + i)
    kw = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
              steps_offset=1, **scheduler_kw)  # fmt: skip
    if scheduler == "ddim":
        sched = DDIMScheduler(clip_sample=False, set_alpha_to_one=False, **kw)
    else:
        sched = EulerDiscreteScheduler(**kw)
    pipe = StableDiffusionPipeline(
        vae=v,
        text_encoder=text,
        tokenizer=CLIPTokenizer.from_pretrained(folder / "tokenizer"),
        unet=u,
        scheduler=sched,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    pipe.save_pretrained(folder, safe_serialization=True)
    return pipe
