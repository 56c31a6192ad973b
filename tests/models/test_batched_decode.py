"""Batched decoding over a BatchKVCache: each sequence in a batched step computes what it computes
alone (bitwise on the bundled quantized model), for every decoder family."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import nn
from ember.errors import ShapeError, UnsupportedError
from tests.models.test_stack_linears import _tiny, _tiny_llama

PROMPTS = [[1, 422, 9987, 314, 3543], [1, 77, 88], [1, 5, 6, 7, 8, 9, 10, 11, 12, 13], [1, 999]]


def _dims(model):
    spec = model.spec
    return spec.num_layers, model.num_kv_heads, spec.head_dim


def _alone(model, prompt, n, max_len=48):
    layers, hk, hd = _dims(model)
    cache = nn.KVCache(layers, 1, hk, max_len, hd)
    logits, toks = [], []
    with ember.no_grad():
        lg = model(ember.tensor([prompt]), cache=cache, logits_to_keep=1).numpy()[0, -1]
        for _ in range(n):
            logits.append(lg)
            toks.append(int(lg.argmax()))
            lg = model(ember.tensor([[toks[-1]]]), cache=cache).numpy()[0, -1]
    return toks, logits


def _batched(model, prompts, slots, n, max_len=48, late=None):
    """Prefill each prompt on its slot, then decode all together; ``late`` = (step, prompt,
    slot): after that step the first sequence ends and a new one takes its slot (reset)."""
    layers, hk, hd = _dims(model)
    cache = nn.BatchKVCache(layers, max(slots) + 2, hk, max_len, hd)
    rows = list(slots)
    seqs = {s: {"logits": [], "toks": []} for s in rows}

    def prefill(prompt, slot):
        lg = model(ember.tensor([prompt]), cache=cache.rows([slot]), logits_to_keep=1)
        return lg.numpy()[0, -1]

    with ember.no_grad():
        last = {s: prefill(p, s) for p, s in zip(prompts, rows)}
        done = {}
        for step in range(n):
            for s in rows:
                seqs[s]["logits"].append(last[s])
                seqs[s]["toks"].append(int(last[s].argmax()))
            if late is not None and step == late[0]:
                gone = rows[0]
                done["first"] = seqs.pop(gone)
                cache.reset(gone)
                seqs[gone] = {"logits": [], "toks": []}
                last[gone] = prefill(late[1], gone)
                seqs[gone]["logits"].append(last[gone])
                seqs[gone]["toks"].append(int(last[gone].argmax()))
            ids = ember.tensor([[seqs[s]["toks"][-1]] for s in rows])
            out = model(ids, cache=cache.rows(rows)).numpy()[:, -1]
            last = dict(zip(rows, out))
    return seqs, done


@pytest.fixture(scope="module")
def bundled():
    from ember.models import AutoModelForCausalLM
    from ember.models.hub import default_model_path

    return AutoModelForCausalLM.from_pretrained(default_model_path())


def test_bundled_model_batched_equals_alone_bitwise(bundled):
    n = 8
    ref = [_alone(bundled, p, n) for p in PROMPTS]
    seqs, _ = _batched(bundled, PROMPTS, [4, 1, 0, 3], n)
    for (toks, logits), s in zip(ref, [4, 1, 0, 3]):
        assert seqs[s]["toks"] == toks
        for a, b in zip(seqs[s]["logits"], logits):
            np.testing.assert_array_equal(a, b)


def test_a_slot_is_reused_while_the_others_keep_decoding(bundled):
    n, late = 6, (2, [1, 314, 2000, 17])
    seqs, done = _batched(bundled, PROMPTS[:3], [0, 2, 1], n, late=late)
    new_toks, _ = _alone(bundled, late[1], n - 2)
    assert seqs[0]["toks"][: n - 2] == new_toks  # the newcomer in slot 0
    assert done["first"]["toks"] == _alone(bundled, PROMPTS[0], 3)[0]
    for p, s in zip(PROMPTS[1:3], [2, 1]):
        assert seqs[s]["toks"] == _alone(bundled, p, n)[0]


@pytest.mark.parametrize("family", ["llama", "gemma2", "phi3", "gpt2"])
def test_every_family_batched_equals_alone(family):
    model = _tiny_llama() if family == "llama" else _tiny(family)
    if family != "llama":
        for p in model.parameters():
            p._data[...] = np.random.default_rng(p.numel()).standard_normal(p.shape) * 0.2
    vocab = model.config.vocab_size
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, vocab, n).tolist() for n in (7, 2, 5)]  # past gemma2's window
    n = 6
    ref = [_alone(model, p, n) for p in prompts]
    seqs, _ = _batched(model, prompts, [1, 0, 2], n)
    for (toks, logits), s in zip(ref, [1, 0, 2]):
        np.testing.assert_allclose(np.stack(seqs[s]["logits"]), np.stack(logits), 1e-5, 1e-5)
        assert seqs[s]["toks"] == toks


def test_batch_cache_checks_and_slot_operations():
    cache = nn.BatchKVCache(2, 3, 1, 8, 4)
    with pytest.raises(ShapeError):
        cache.rows([0, 3])
    with pytest.raises(ShapeError):
        cache.rows([1, 1])
    rows = cache.rows([2, 0])
    k = np.ones((2, 5, 1, 4), np.float32)
    assert rows.store(0, k, k) == 5
    rows.advance(5)
    assert cache.lengths.tolist() == [5, 0, 5]
    with pytest.raises(ShapeError, match="overflow"):
        rows.store(0, np.ones((2, 4, 1, 4), np.float32), np.ones((2, 4, 1, 4), np.float32))
    with pytest.raises(ShapeError):
        rows.store(0, k[:1], k[:1])
    cache.copy(2, 1, 3)
    assert cache.lengths[1] == 3 and (cache.k[0][1, :, :3] == 1).all()
    cache.crop(0, 2)
    cache.reset(2)
    assert cache.lengths.tolist() == [2, 3, 0] and cache.nbytes == 4 * 3 * 8 * 4 * 4


def test_batched_step_refuses_masks_and_position_ids():
    model = _tiny_llama()
    layers, hk, hd = _dims(model)
    cache = nn.BatchKVCache(layers, 2, hk, 16, hd)
    with ember.no_grad(), pytest.raises(UnsupportedError):
        model(ember.tensor([[1], [2]]), attention_mask=np.ones((2, 1)), cache=cache.rows([0, 1]))
