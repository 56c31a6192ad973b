"""LLaMA-family models vs transformers on tiny random configs saved as safetensors."""

import numpy as np
import pytest
import torch
import transformers

import ember
from ember.generation.generate import generate_tokens
from ember.models import AutoModelForCausalLM
from ember.models.llama import LlamaConfig, LlamaForCausalLM
from tests.models.common import (
    assert_greedy_matches,
    assert_logits_match,
    assert_meta_forward,
)

BASE = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5,
)  # fmt: skip

VARIANTS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "llama_mha_bias": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"num_key_value_heads": 4, "attention_bias": True, "mlp_bias": True}),
    "llama3_rope": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}, "rope_theta": 500000.0}),
    "smollm_tied": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"tie_word_embeddings": True, "rope_theta": 100000.0}),
    "mistral_window": (transformers.MistralConfig, transformers.MistralForCausalLM, {"sliding_window": 8}),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 32}),
}  # fmt: skip


def _save(tmp_path, name):
    cfg_cls, model_cls, extra = VARIANTS[name]
    torch.manual_seed(0)
    cfg = cfg_cls(**{**BASE, **extra})
    if hasattr(cfg, "_attn_implementation"):
        cfg._attn_implementation = "eager"
    ref = model_cls(cfg).eval()
    d = tmp_path / name
    ref.save_pretrained(d, safe_serialization=True)
    return ref, d


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_and_greedy_match_transformers(tmp_path, name):
    ref, d = _save(tmp_path, name)
    model = AutoModelForCausalLM.from_pretrained(d)
    ids = np.random.default_rng(0).integers(0, BASE["vocab_size"], (2, 20))
    assert_logits_match(ref, model, ids)
    assert_greedy_matches(ref, model, ids[0, :7].tolist())


def test_batched_generation_with_padding_matches_single(tmp_path):
    _, d = _save(tmp_path, "llama")
    model = AutoModelForCausalLM.from_pretrained(d)
    prompts = [[5, 9, 17, 3, 44, 2], [7, 1], [100, 3, 8]]
    singles = [[s[0] for s in generate_tokens(model, p, 10)] for p in prompts]
    batched = list(zip(*generate_tokens(model, prompts, 10)))
    for i in range(3):
        assert list(batched[i]) == singles[i]


def test_context_overflow_is_a_clear_error(tmp_path):
    _, d = _save(tmp_path, "llama")
    model = AutoModelForCausalLM.from_pretrained(d)
    with pytest.raises(ember.errors.ShapeError, match="context"):
        next(generate_tokens(model, list(range(100)), 64))
    toks = [s[0] for s in generate_tokens(model, list(range(100)), 64, truncate=True)]
    assert len(toks) == 64


def test_meta_load_does_not_allocate_and_dtype_option(tmp_path):
    _, d = _save(tmp_path, "llama")
    model = AutoModelForCausalLM.from_pretrained(d, dtype="float64")
    assert model.model.layers[0].mlp.up_proj.weight.dtype is ember.float64


def test_quantize_at_load_keeps_greedy_tokens_close(tmp_path):
    from ember.quant import QLinear

    _, d = _save(tmp_path, "llama")
    dense = AutoModelForCausalLM.from_pretrained(d)
    q8 = AutoModelForCausalLM.from_pretrained(d, quantize="q8_0")
    assert isinstance(q8.model.layers[0].mlp.up_proj, QLinear)
    ids = ember.tensor([[5, 9, 17, 3, 44, 2, 7]])
    with ember.no_grad():
        a, b = dense(ids).numpy(), q8(ids).numpy()
    assert np.abs(a - b).max() < 0.05 * np.abs(a).max()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_meta_device_forward(name):
    cfg_cls, _, extra = VARIANTS[name]
    big = {"vocab_size": 50000, "max_position_embeddings": 8192}
    cfg = LlamaConfig.from_dict(cfg_cls(**{**BASE, **extra, **big}).to_dict())
    assert_meta_forward(LlamaForCausalLM, cfg, 50000)
