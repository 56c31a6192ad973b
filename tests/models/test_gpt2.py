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


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The reference runs tiny ops: one torch thread is far faster than two fighting for cores."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (transformers model, its saved folder), built once per module."""
    made = {}

    def get(name):
        if name not in made:
            made[name] = _save(tmp_path_factory.mktemp(name), name)
        return made[name]

    return get


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_and_greedy_match_transformers(saved, name):
    ref, d = saved(name)
    model = AutoModelForCausalLM.from_pretrained(d)
    assert isinstance(model, GPT2LMHeadModel)
    assert model.transformer.h[0].attn.c_attn.weight.shape == (64, 192)  # Conv1D: (in, out)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, BASE["vocab_size"], (3, 19))
    with torch.no_grad():
        want = ref(torch.tensor(ids)).logits.numpy()
    with ember.no_grad():
        got = model(ember.tensor(ids)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)

    prompt = ids[0, :7].tolist()
    with torch.no_grad():
        out = ref.generate(
            torch.tensor([prompt]), max_new_tokens=32, do_sample=False, min_new_tokens=32
        )
    want_tokens = out[0, len(prompt) :].tolist()
    got_tokens = [s[0] for s in generate_tokens(model, prompt, 32)]
    assert got_tokens == want_tokens
    seq = list(prompt)  # without the KV cache: recompute the whole sequence at every step
    with ember.no_grad():
        for _ in range(32):
            seq.append(int(model(ember.tensor([seq])).numpy()[0, -1].argmax()))
    assert seq[len(prompt) :] == want_tokens


def test_left_padded_batch_matches_transformers(saved):
    ref, d = saved("gpt2")
    model = AutoModelForCausalLM.from_pretrained(d)
    prompts = [[5, 9, 17, 3, 44, 2, 8, 8, 1], [7, 1], [100, 3, 8]]
    n = max(map(len, prompts))
    ids = torch.tensor([[0] * (n - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (n - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = ref.generate(
            ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0
        )
    batched = list(zip(*generate_tokens(model, prompts, 10)))
    for i in range(3):
        assert list(batched[i]) == out[i, n:].tolist()


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
