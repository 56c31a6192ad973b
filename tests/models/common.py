"""Shared checks for causal LMs against their transformers twins."""

import tracemalloc

import numpy as np
import pytest
import torch

import ember
from ember.generation.generate import generate_tokens


def save_tiny(path, ref):
    """Save a transformers model as safetensors; returns (ref in eval mode, folder)."""
    ref = ref.eval()
    ref.save_pretrained(path, safe_serialization=True)
    return ref, path


def saved_fixture(save):
    """A module-scoped fixture: name -> save(fresh folder, name), each variant built once."""

    @pytest.fixture(scope="module")
    def saved(tmp_path_factory):
        made = {}

        def get(name):
            if name not in made:
                made[name] = save(tmp_path_factory.mktemp(name), name)
            return made[name]

        return get

    return saved


def assert_logits_match(ref, model, ids: np.ndarray, tol: float = 1e-4) -> None:
    """Full-sequence logits of ember and transformers agree within tol (float32)."""
    with torch.no_grad():
        want = ref(torch.tensor(ids)).logits.numpy()
    with ember.no_grad():
        got = model(ember.tensor(ids)).numpy()
    np.testing.assert_allclose(got, want, atol=tol, rtol=tol)


def assert_greedy_matches(ref, model, prompt: list[int], n: int = 32) -> None:
    """n greedy tokens equal transformers' generate(), with ember's KV cache and without it."""
    with torch.no_grad():
        out = ref.generate(
            torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n
        )
    want = out[0, len(prompt) :].tolist()
    assert [s[0] for s in generate_tokens(model, prompt, n)] == want
    seq = list(prompt)  # without the KV cache: recompute the whole sequence at every step
    with ember.no_grad():
        for _ in range(n):
            seq.append(int(model(ember.tensor([seq])).numpy()[0, -1].argmax()))
    assert seq[len(prompt) :] == want


def assert_left_padded_batch_matches(ref, model, prompts: list[list[int]], n: int) -> None:
    """Batched generation of prompts of different lengths equals transformers' left-padded batch."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = ref.generate(
            ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0
        )
    batched = list(zip(*generate_tokens(model, prompts, n)))
    for i in range(len(prompts)):
        assert list(batched[i]) == out[i, width:].tolist()


def assert_meta_forward(model_cls, config, vocab_size: int, batch: int = 2, seq: int = 4096):
    """Built and run on the meta device, the model gives meta logits of the right shape and dtype
    while allocating nothing of a weight's or an activation's size (real logits: 1.6 GB here)."""
    with ember.device("meta"):
        model = model_cls(config)
        ids = ember.zeros(batch, seq, dtype=ember.int64)
    assert all(p.device == "meta" for p in model.parameters())
    with ember.no_grad():
        model(ids[:, :3])  # first-use imports are not the forward's memory
    tracemalloc.start()
    try:
        logits = model(ids)  # grad mode on: a plain call records the graph too
        with ember.no_grad():
            last = model(ids, attention_mask=np.ones((batch, seq), bool), logits_to_keep=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert logits.device == "meta" and last.device == "meta"
    assert logits.shape == (batch, seq, vocab_size) and last.shape == (batch, 1, vocab_size)
    assert logits.dtype == last.dtype == ember.float32
    assert peak < 4 << 20, f"the meta forward traced {peak / 2**20:.1f} MiB"
