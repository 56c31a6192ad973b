"""Prompt chunks of several sequences in one forward (StepRunner.prompts_together): right-padded
rows, each attending over its own tokens only, give bitwise the logits each prompt gets alone,
and the cache holds only the real tokens."""

from __future__ import annotations

import numpy as np
import pytest
from tests.models.test_stack_linears import _tiny_llama

import ember
from ember.errors import ShapeError
from ember.nn import BatchKVCache, KVCache
from ember.serve.engine import StepInput, StepRunner, prompts_batch, ragged_groups


@pytest.fixture(scope="module")
def model():
    from ember.models import AutoModelForCausalLM
    from ember.models.hub import default_model_path

    return AutoModelForCausalLM.from_pretrained(default_model_path())


def _prompts(n, lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [[1, *rng.integers(100, 9000, k - 1).tolist()] for k in lengths[:n]]


def test_ragged_groups_keep_the_padding_small():
    assert ragged_groups([]) == []
    assert ragged_groups([5]) == [[0]]
    assert ragged_groups([37, 40, 36, 39]) == [[1, 3, 0, 2]]  # longest first, one forward
    # a long chunk and short prompts: the short ones do not pad up to it
    assert ragged_groups([200, 8, 9, 7]) == [[0], [2, 1, 3]]
    groups = ragged_groups([64, 3, 60, 1, 2, 33, 30])
    assert sorted(i for g in groups for i in g) == list(range(7))
    lengths = [64, 3, 60, 1, 2, 33, 30]
    for g in groups:
        top = max(lengths[i] for i in g)
        assert len(g) == 1 or len(g) * top <= 1.25 * sum(lengths[i] for i in g)


def test_the_bundled_model_batches_its_prompts_and_a_float_model_does_not(model):
    from ember.kernels.cpu.quant import _pdot

    assert prompts_batch(model) == _pdot.available()  # its products run on the panel kernels
    assert not prompts_batch(_tiny_llama())  # float weights: BLAS, not row-invariant


def test_prompts_together_equal_each_alone_bitwise(model):
    runner = StepRunner(model, slots=8)  # (without the panel kernels: one by one, the same)
    prompts = _prompts(7, [37, 40, 3, 36, 41, 17, 2])
    caches = [runner.new_cache(len(p) + 4) for p in prompts]
    together = runner.step(
        [StepInput(p, runner.reserve(c, len(p))) for p, c in zip(prompts, caches)]
    )
    assert runner.cache.lengths[[c.index for c in caches]].tolist() == [len(p) for p in prompts]
    for p, row in zip(prompts, together):
        alone = StepRunner(model, slots=1)
        c = alone.new_cache(len(p) + 4)
        np.testing.assert_array_equal(row, alone.step([StepInput(p, alone.reserve(c, len(p)))])[0])
    # decoding goes on from exactly the keys and values each prompt stores alone
    toks = [int(r.argmax()) for r in together]
    nxt = runner.step(
        [StepInput([t], runner.reserve(c, len(p) + 1)) for t, c, p in zip(toks, caches, prompts)]
    )
    for p, t, row in zip(prompts, toks, nxt):
        alone = StepRunner(model, slots=1)
        c = alone.new_cache(len(p) + 4)
        alone.step([StepInput(p, alone.reserve(c, len(p)))])
        np.testing.assert_array_equal(
            row, alone.step([StepInput([t], alone.reserve(c, len(p) + 1))])[0]
        )


def test_ragged_rows_store_only_their_tokens_and_pad_with_zeros():
    model = _tiny_llama()
    spec = model.spec
    cache = BatchKVCache(spec.num_layers, 3, model.num_kv_heads, 16, spec.head_dim)
    ids = np.array([[5, 6, 7, 8], [9, 10, 0, 0], [11, 12, 13, 0]])
    n = np.array([4, 2, 3])
    with ember.no_grad():
        logits = model(ember.tensor(ids), cache=cache.rows([2, 0, 1], n), logits_to_keep=n - 1)
    assert logits.shape == (3, 1, model.config.vocab_size)
    assert cache.lengths.tolist() == [2, 3, 4]
    for layer in range(spec.num_layers):
        for slot, k in ((0, 2), (1, 3), (2, 4)):
            assert not cache.k[layer][slot, :, k:].any() and cache.k[layer][slot, :, :k].any()
    for row, (slot, k) in enumerate(((2, 4), (0, 2), (1, 3))):  # each row as alone
        one = KVCache(spec.num_layers, 1, model.num_kv_heads, 16, spec.head_dim)
        with ember.no_grad():
            ref = model(ember.tensor(ids[row : row + 1, :k]), cache=one, logits_to_keep=1)
        np.testing.assert_allclose(logits.numpy()[row, 0], ref.numpy()[0, 0], rtol=1e-5, atol=1e-5)
        for layer in range(spec.num_layers):
            np.testing.assert_allclose(
                cache.k[layer][slot, :, :k], one.k[layer][0, :, :k], rtol=1e-5, atol=1e-6
            )


def test_new_tokens_are_checked():
    cache = BatchKVCache(1, 3, 1, 8, 4)
    with pytest.raises(ShapeError, match="at least one token"):
        cache.rows([0, 1], [2, 0])
    with pytest.raises(ShapeError, match="at least one token"):
        cache.rows([0, 1], [2])
