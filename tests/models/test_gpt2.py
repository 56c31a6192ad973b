"""GPT-2 vs transformers on tiny random configs saved as safetensors."""

import json
import shutil

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

import ember
from ember.generation.generate import generate_tokens
from ember.models import AutoModelForCausalLM
from ember.models.gpt2 import GPT2Config, GPT2LMHeadModel
from tests.models.common import (
    assert_greedy_matches,
    assert_left_padded_batch_matches,
    assert_logits_match,
    assert_meta_forward,
    saved_fixture,
)

BASE = dict(
    vocab_size=136,
    n_embd=64,
    n_layer=2,
    n_head=4,
    n_positions=64,
    bos_token_id=0,
    eos_token_id=None,
)

VARIANTS = {
    "gpt2": {},
    "gpt2_untied_variants": {
        "n_layer": 3, "n_inner": 80, "activation_function": "gelu",
        "scale_attn_by_inverse_layer_idx": True, "tie_word_embeddings": False,
    },
}  # fmt: skip


def _save(tmp_path, name):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(**{**BASE, **VARIANTS[name]})
    cfg._attn_implementation = "eager"
    ref = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # GPT-2's init (std 0.02, LayerNorm (1, 0), zero biases) hides too much
        for n, p in ref.named_parameters():
            std = 0.02 if n.endswith("bias") else 0.5 if n.split(".")[1] in ("wte", "wpe") else 0.2
            p.normal_(1.0 if n.endswith(("ln_1.weight", "ln_2.weight")) else 0.0, std)
    d = tmp_path / name
    ref.save_pretrained(d, safe_serialization=True)
    return ref, d


saved = saved_fixture(_save)  # name -> (transformers model, its saved folder)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_and_greedy_match_transformers(saved, name):
    ref, d = saved(name)
    model = AutoModelForCausalLM.from_pretrained(d)
    assert isinstance(model, GPT2LMHeadModel)
    assert model.transformer.h[0].attn.c_attn.weight.shape == (64, 192)  # Conv1D: (in, out)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, BASE["vocab_size"], (3, 19))
    assert_logits_match(ref, model, ids)

    assert_greedy_matches(ref, model, ids[0, :7].tolist())


def test_left_padded_batch_matches_transformers(saved):
    ref, d = saved("gpt2")
    model = AutoModelForCausalLM.from_pretrained(d)
    prompts = [[5, 9, 17, 3, 44, 2, 8, 8, 1], [7, 1], [100, 3, 8]]
    assert_left_padded_batch_matches(ref, model, prompts, 10)


def test_bare_gpt2model_checkpoint_with_mask_buffers(saved, tmp_path):
    """The original gpt2 files: no 'transformer.' prefix, causal-mask buffers in every block."""
    ref, src = saved("gpt2")
    d = shutil.copytree(src, tmp_path / "bare")
    w = load_file(d / "model.safetensors")
    bare = {k.removeprefix("transformer."): v for k, v in w.items()}
    for i in range(BASE["n_layer"]):
        bare[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 64, 64), np.float32))
        bare[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    save_file(bare, d / "model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(d)
    ids = [[3, 1, 4, 1, 5, 9, 2, 6]]
    with torch.no_grad():
        want = ref(torch.tensor(ids)).logits.numpy()
    with ember.no_grad():
        np.testing.assert_allclose(model(ember.tensor(ids)).numpy(), want, atol=1e-4, rtol=1e-4)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert "transformer.h.0.attn.bias" not in dict(model.named_parameters())


def test_config_names_and_context_limit(saved):
    _, d = saved("gpt2")
    cfg = GPT2Config.from_dict(json.loads((d / "config.json").read_text()))
    assert (
        cfg.num_hidden_layers,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.max_position_embeddings,
    ) == (2, 4, 16, 64)
    assert cfg.intermediate_size == 256
    model = AutoModelForCausalLM.from_pretrained(d)
    with pytest.raises(ember.errors.ShapeError, match="context"):
        next(generate_tokens(model, list(range(60)), 8))
    with pytest.raises(ember.errors.ShapeError, match="learned positions"), ember.no_grad():
        model(ember.tensor([list(range(65))]))
    with pytest.raises(ember.errors.UnsupportedError, match="activation"):
        GPT2Config.from_dict({"activation_function": "tanh"})


@pytest.mark.parametrize("name", list(VARIANTS))
def test_meta_device_forward(name):
    cfg = transformers.GPT2Config(
        **{**BASE, **VARIANTS[name], "vocab_size": 50000, "n_positions": 8192}
    )
    assert_meta_forward(GPT2LMHeadModel, GPT2Config.from_dict(cfg.to_dict()), 50000)
