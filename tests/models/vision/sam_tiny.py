"""A tiny random transformers SamModel folder (config.json, model.safetensors, processor_config.json).

The grid is 8 x 8 patches with 3 x 3 windows (so windows are padded) and one global layer; every
parameter is drawn at a scale where it matters (transformers zero-initialises the relative and
absolute position tables, gives LayerNorms weight 1, and draws the Fourier matrix far wider
than trained checkpoints hold it).
"""

from __future__ import annotations

TINY = dict(
    vision_config=dict(hidden_size=32, output_channels=16, num_hidden_layers=2,
                       num_attention_heads=2, image_size=64, patch_size=8, window_size=3,
                       global_attn_indexes=[1], num_pos_feats=8, mlp_dim=40),
    prompt_encoder_config=dict(hidden_size=16, image_size=64, patch_size=8, mask_input_channels=8),
    mask_decoder_config=dict(hidden_size=16, mlp_dim=24, num_hidden_layers=2,
                             num_attention_heads=2, iou_head_hidden_dim=12),
)  # fmt: skip


def randomize(model, seed: int = 0):
    """Draw every parameter of a torch SamModel at a scale where it shows in the output."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "positional_embedding" in name:  # N(0, 1) as in SAM's checkpoints (MobileSAM's
                p.copy_(torch.randn(p.shape, generator=g))  # std 1.04); transformers draws
                continue  # std hidden/2, angles in the hundreds, where float32 rounding shows
            if "layer_norm" in name and name.endswith("weight"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif p.ndim >= 2 and not any(s in name for s in ("embed", "token", "rel_pos")):
                p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model


def tiny_reference(seed: int = 0, **overrides):
    """A randomised transformers SamModel on the TINY config (overrides: {sub: {field: value}})."""
    import copy

    from transformers import SamConfig, SamModel

    cfg = copy.deepcopy(TINY)
    for sub, fields in overrides.items():
        cfg[sub].update(fields)
    return randomize(SamModel(SamConfig(**cfg)).eval(), seed)


def save_folder(model, path) -> str:
    """save_pretrained the model and a SamProcessor sized for it into path."""
    from transformers import SamImageProcessorPil, SamProcessor

    size = model.config.vision_config.image_size
    model.save_pretrained(path)
    proc = SamProcessor(SamImageProcessorPil(size={"longest_edge": size},
                                             pad_size={"height": size, "width": size}))  # fmt: skip
    proc.save_pretrained(path)
    return str(path)
