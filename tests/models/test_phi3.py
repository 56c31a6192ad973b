"""Phi-3 vs transformers on tiny random configs saved as safetensors."""

import numpy as np
import pytest
import torch
import transformers

import ember
from ember.generation.generate import generate_tokens
from ember.models import AutoModelForCausalLM
from ember.models.phi3 import Phi3Config, Phi3ForCausalLM

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
    assert isinstance(model, Phi3ForCausalLM)
    rng = np.random.default_rng(0)
    for t in (11, 23):  # longrope: short factors up to 16 positions, long ones beyond
        ids = rng.integers(0, BASE["vocab_size"], (3, t))
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


def test_longrope_left_padded_batch_matches_transformers(saved):
    ref, d = saved("phi3_longrope")
    model = AutoModelForCausalLM.from_pretrained(d)
    prompts = [[5, 9, 17, 3, 44, 2, 8, 8, 1, 7], [7, 1], [100, 3, 8]]
    n = max(map(len, prompts))
    ids = torch.tensor([[0] * (n - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (n - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = ref.generate(
            ids, attention_mask=mask, max_new_tokens=14, do_sample=False, pad_token_id=0
        )
    batched = list(zip(*generate_tokens(model, prompts, 14)))
    for i in range(3):
        assert list(batched[i]) == out[i, n:].tolist()


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
