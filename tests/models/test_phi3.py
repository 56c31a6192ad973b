"""Phi-3 vs transformers on tiny random configs saved as safetensors."""

import numpy as np
import pytest
import torch
import transformers

import ember
from ember.models import AutoModelForCausalLM
from ember.models.phi3 import Phi3Config, Phi3ForCausalLM
from tests.models.common import (
    assert_greedy_matches,
    assert_left_padded_batch_matches,
    assert_logits_match,
    assert_meta_forward,
    saved_fixture,
)

BASE = dict(
    vocab_size=144, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5,
    pad_token_id=0, eos_token_id=None, bos_token_id=2,
)  # fmt: skip
# longrope: pre-trained on 16 positions, so the 7 + 32 token test sequence crosses into long factors
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0, 1.3, 2.0, 4.0],
    "long_factor": [3.0, 5.0, 9.0, 20.0],
}

VARIANTS = {
    "phi3": {},
    "phi3_partial_rotary_window": {
        "partial_rotary_factor": 0.75, "sliding_window": 9, "num_key_value_heads": 4,
    },
    "phi3_longrope": {
        "partial_rotary_factor": 0.5, "rope_scaling": LONGROPE, "max_position_embeddings": 64,
        "original_max_position_embeddings": 16,
    },
}  # fmt: skip


def _save(tmp_path, name):
    torch.manual_seed(0)
    cfg = transformers.Phi3Config(**{**BASE, **VARIANTS[name]})
    cfg._attn_implementation = "eager"
    ref = transformers.Phi3ForCausalLM(cfg).eval()
    d = tmp_path / name
    ref.save_pretrained(d, safe_serialization=True)
    return ref, d


saved = saved_fixture(_save)  # name -> (transformers model, its saved folder)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_and_greedy_match_transformers(saved, name):
    ref, d = saved(name)
    model = AutoModelForCausalLM.from_pretrained(d)
    assert isinstance(model, Phi3ForCausalLM)
    rng = np.random.default_rng(0)
    for t in (11, 23):  # longrope: short factors up to 16 positions, long ones beyond
        ids = rng.integers(0, BASE["vocab_size"], (3, t))
        assert_logits_match(ref, model, ids)

    assert_greedy_matches(ref, model, ids[0, :7].tolist())


def test_longrope_left_padded_batch_matches_transformers(saved):
    ref, d = saved("phi3_longrope")
    model = AutoModelForCausalLM.from_pretrained(d)
    prompts = [[5, 9, 17, 3, 44, 2, 8, 8, 1, 7], [7, 1], [100, 3, 8]]
    assert_left_padded_batch_matches(ref, model, prompts, 14)


def test_config_layouts():
    v4 = Phi3Config.from_dict({
        "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 128,
        "original_max_position_embeddings": 16, "rope_theta": 500.0,
        "rope_scaling": {"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
    })  # fmt: skip
    assert v4.rope_type == "longrope" and v4.rotary_dim == 16 and v4.rope_theta == 500.0
    v5 = Phi3Config.from_dict({
        "hidden_size": 64, "num_attention_heads": 4,
        "rope_parameters": {
            "rope_theta": 250.0, "partial_rotary_factor": 0.5, "rope_type": "default",
        },
    })  # fmt: skip
    assert v5.rope_type == "default" and v5.rotary_dim == 8 and v5.rope_theta == 250.0
    bad = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]},
    }
    with pytest.raises(ember.errors.UnsupportedError, match="short_factor must list 8"):
        Phi3ForCausalLM(Phi3Config.from_dict(bad))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_meta_device_forward(name):
    big = {"vocab_size": 50000, "max_position_embeddings": 8192}
    cfg = transformers.Phi3Config(**{**BASE, **VARIANTS[name], **big})
    assert_meta_forward(Phi3ForCausalLM, Phi3Config.from_dict(cfg.to_dict()), 50000)
