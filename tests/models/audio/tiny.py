"""A tiny random transformers EncodecModel saved with save_pretrained (shared by the model and CLI tests)."""

from __future__ import annotations

from pathlib import Path

# 8 kHz, hop 8 -> 1000 steps/s; 32-entry codebooks (5 bits): 5 kbps per codebook, 2 codebooks
TINY = dict(
    sampling_rate=8000,
    hidden_size=16,
    num_filters=4,
    upsampling_ratios=[4, 2],
    codebook_size=32,
    target_bandwidths=[5.0, 10.0],
    num_lstm_layers=2,
)
# the 48 kHz model's shape: stereo, normalised, 20 ms chunks with 10 % overlap
TINY_48K = dict(TINY, audio_channels=2, normalize=True, chunk_length_s=0.02, overlap=0.1)


def save_tiny(folder: Path, seed: int = 0, **kw):
    """Save a random EncodecModel(EncodecConfig(**kw)) to folder; returns the torch model."""
    import torch
    from transformers import EncodecConfig, EncodecModel

    torch.manual_seed(seed)
    model = EncodecModel(EncodecConfig(**kw)).eval()
    with torch.no_grad():  # transformers starts codebooks at zero and weight-norm gains at ||v||
        for layer in model.quantizer.layers:
            layer.codebook.embed.normal_()
        for name, p in model.named_parameters():
            if name.endswith("original0"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    return model
