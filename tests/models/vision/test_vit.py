"""ViT against transformers' ViTModel / ViTForImageClassification (random weights, small config)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import ViTConfig as HFConfig
from transformers import ViTForImageClassification as HFClassifier
from transformers import ViTModel as HFModel

import ember
from ember.inference import optimize_for_inference
from ember.kernels.cpu import gemm as G
from ember.models.vision import ViTConfig, ViTForImageClassification, ViTModel, vit_b_16
from ember.models.vision.vit import legacy_key

SMALL = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
             image_size=32, patch_size=8, num_labels=7)  # fmt: skip
# transformers 4.x / Hub checkpoint names of one block (what ember's modules are called)
HUB_BLOCK = [
    "attention.attention.query.weight", "attention.attention.query.bias",
    "attention.attention.key.weight", "attention.attention.key.bias",
    "attention.attention.value.weight", "attention.attention.value.bias",
    "attention.output.dense.weight", "attention.output.dense.bias",
    "intermediate.dense.weight", "intermediate.dense.bias", "output.dense.weight",
    "output.dense.bias", "layernorm_before.weight", "layernorm_before.bias",
    "layernorm_after.weight", "layernorm_after.bias",
]  # fmt: skip


def _hf(cls, **kw):
    torch.manual_seed(0)
    cfg = HFConfig(**{**SMALL, **kw})
    m = cls(cfg).eval()
    with torch.no_grad():  # HF inits biases/cls to zero: make every tensor matter
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m


def _sd(m) -> dict:
    return {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}


def test_module_names_are_the_hub_checkpoint_names():
    with ember.device("meta"):
        m = ViTModel(ViTConfig(**{k: v for k, v in SMALL.items() if k != "num_labels"}))
    keys = list(m.state_dict())
    assert keys[:4] == [
        "embeddings.cls_token", "embeddings.position_embeddings",
        "embeddings.patch_embeddings.projection.weight",
        "embeddings.patch_embeddings.projection.bias",
    ]  # fmt: skip
    prefix = "encoder.layer.0."
    assert [k[len(prefix) :] for k in keys if k.startswith(prefix)] == HUB_BLOCK
    assert keys[-4:] == [
        "layernorm.weight",
        "layernorm.bias",
        "pooler.dense.weight",
        "pooler.dense.bias",
    ]
    # the installed transformers' names map one-to-one onto them
    hf = HFModel(HFConfig(**SMALL))
    assert sorted(legacy_key(k) for k in hf.state_dict()) == sorted(keys)


def test_vit_b_16_shape_and_parameter_count():
    with ember.device("meta"):
        m = vit_b_16()
    assert sum(p.numel() for p in m.parameters()) == 86_567_656  # HF google/vit-base-patch16-224
    assert m.state_dict()["vit.embeddings.position_embeddings"].shape == (1, 197, 768)


def test_classifier_logits_match_transformers():
    hf = _hf(HFClassifier)
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        ref = hf(pixel_values=torch.from_numpy(x)).logits.numpy()
    cfg = ViTConfig(**SMALL)
    em = ViTForImageClassification(cfg)
    ember_sd = {legacy_key(k): v for k, v in _sd(hf).items()}
    em.load_state_dict(ember_sd)
    with ember.no_grad():
        y = em.eval()(ember.from_numpy(x)).numpy()
    np.testing.assert_allclose(y, ref, atol=1e-4, rtol=1e-4)
    fast = optimize_for_inference(em)  # Linears and the patch conv on the packed GEMM
    assert type(fast) is ViTForImageClassification and fast.num_labels == 7
    if G.panel_width() is not None:
        assert G.packed_panels(fast.classifier.weight._data) is not None
        assert type(fast.vit.embeddings.patch_embeddings.projection).__name__ == "FusedConv2d"
    np.testing.assert_allclose(fast(ember.from_numpy(x)).numpy(), ref, atol=1e-4, rtol=1e-4)


def test_vit_model_hidden_states_and_pooler_match(tmp_path):
    hf = _hf(HFModel)
    x = np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        out = hf(pixel_values=torch.from_numpy(x))
    # a Hub-style folder: config.json + safetensors with transformers' (v5) names
    from safetensors.torch import save_file

    save_file(
        {k: v.contiguous() for k, v in hf.state_dict().items()}, tmp_path / "model.safetensors"
    )
    (tmp_path / "config.json").write_text(json.dumps(hf.config.to_dict()))
    em = ViTModel.from_pretrained(tmp_path)
    with ember.no_grad():
        h, pooled = em(ember.from_numpy(x))
    np.testing.assert_allclose(h.numpy(), out.last_hidden_state.numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(pooled.numpy(), out.pooler_output.numpy(), atol=1e-4, rtol=1e-4)


def test_wrong_image_size_is_a_shape_error():
    m = ViTForImageClassification(ViTConfig(**SMALL)).eval()
    with pytest.raises(ember.errors.ShapeError, match="image size"):
        m(ember.zeros(1, 3, 48, 48))
