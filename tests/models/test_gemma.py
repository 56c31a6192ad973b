"""Gemma and Gemma 2 vs transformers on tiny random configs saved as safetensors."""

import gguf
import numpy as np
import pytest
import torch
import transformers

import ember
from ember.models import AutoModelForCausalLM
from ember.models.gemma import GemmaConfig, GemmaForCausalLM
from tests.models.common import (
    assert_greedy_matches,
    assert_left_padded_batch_matches,
    assert_logits_match,
    assert_meta_forward,
    saved_fixture,
)

BASE = dict(
    vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=24, max_position_embeddings=128,
    rms_norm_eps=1e-5, eos_token_id=None,
)  # fmt: skip
G1 = (transformers.GemmaConfig, transformers.GemmaForCausalLM)
G2 = (transformers.Gemma2Config, transformers.Gemma2ForCausalLM)
VARIANTS = {
    "gemma": (*G1, {}),
    "gemma_mha_untied": (*G1, {
        "num_key_value_heads": 4, "tie_word_embeddings": False, "head_dim": 16,
    }),
    # caps small enough to bite on random weights, a window the 39-token test sequence outgrows
    "gemma2": (*G2, {
        "num_hidden_layers": 3, "query_pre_attn_scalar": 20, "sliding_window": 6,
        "attn_logit_softcapping": 0.5, "final_logit_softcapping": 2.0,
    }),
    "gemma2_no_caps": (*G2, {
        "sliding_window": 5, "attn_logit_softcapping": None, "final_logit_softcapping": None,
        "layer_types": ["full_attention", "sliding_attention"],
    }),
}  # fmt: skip


def _save(tmp_path, name):
    cfg_cls, model_cls, extra = VARIANTS[name]
    torch.manual_seed(0)
    cfg = cfg_cls(**{**BASE, **extra})
    cfg._attn_implementation = "eager"
    ref = model_cls(cfg).eval()
    with torch.no_grad():  # norms start at 0 (scale 1 + w), weights at std 0.02: make both matter
        for n, p in ref.named_parameters():
            p.normal_(0.0, 0.5 if n.endswith("norm.weight") else 0.05 if "embed" in n else 0.2)
    d = tmp_path / name
    ref.save_pretrained(d, safe_serialization=True)
    return ref, d


saved = saved_fixture(_save)  # name -> (transformers model, its saved folder)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_and_greedy_match_transformers(saved, name):
    ref, d = saved(name)
    model = AutoModelForCausalLM.from_pretrained(d)
    assert isinstance(model, GemmaForCausalLM)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, BASE["vocab_size"], (3, 17))
    assert_logits_match(ref, model, ids)

    assert_greedy_matches(ref, model, ids[0, :7].tolist())


def test_gemma2_left_padded_batch_matches_transformers(saved):
    ref, d = saved("gemma2")
    model = AutoModelForCausalLM.from_pretrained(d)
    prompts = [[5, 9, 17, 3, 44, 2, 8, 8, 1], [7, 1], [100, 3, 8]]
    assert_left_padded_batch_matches(ref, model, prompts, 12)


def test_config_defaults_and_errors():
    c = GemmaConfig.from_dict(
        {"model_type": "gemma2", "num_hidden_layers": 4, "hidden_act": "gelu"}
    )
    assert c.layer_types == ["sliding_attention", "full_attention"] * 2
    assert (c.attn_logit_softcapping, c.final_logit_softcapping, c.sliding_window) == (
        50.0,
        30.0,
        4096,
    )
    g1 = GemmaConfig.from_dict({"model_type": "gemma", "hidden_act": "gelu", "sliding_window": 3})
    assert g1.activation == "gelu_pytorch_tanh" and g1.sliding_window is None
    assert set(g1.layer_types) == {"full_attention"}
    with pytest.raises(ember.errors.UnsupportedError, match="bidirectional"):
        GemmaConfig.from_dict({"model_type": "gemma2", "use_bidirectional_attention": True})
    with pytest.raises(ember.errors.UnsupportedError, match="activation"):
        GemmaConfig.from_dict({"model_type": "gemma", "hidden_act": "relu"})


def test_gemma_gguf_is_refused_not_misread(tmp_path):
    """llama.cpp stores Gemma's norms as 1 + w: loading them through the llama mapping would be
    silently wrong, so GGUF files of non-llama architectures are refused with a clear error."""
    path = tmp_path / "tiny-gemma.gguf"
    w = gguf.GGUFWriter(str(path), "gemma")
    for key, value in [("block_count", 1), ("embedding_length", 8), ("feed_forward_length", 16),
                       ("attention.head_count", 2), ("context_length", 32)]:  # fmt: skip
        w.add_uint32(f"gemma.{key}", value)
    w.add_tensor("token_embd.weight", np.zeros((16, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ember.errors.UnsupportedError, match="GGUF files of architecture 'gemma'"):
        AutoModelForCausalLM.from_pretrained(path)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_meta_device_forward(name):
    cfg_cls, _, extra = VARIANTS[name]
    big = {"vocab_size": 50000, "max_position_embeddings": 8192}
    cfg = GemmaConfig.from_dict(cfg_cls(**{**BASE, **extra, **big}).to_dict())
    assert_meta_forward(GemmaForCausalLM, cfg, 50000)
