"""The StepRunner's shared-prefix reuse on the bundled model: whole prompt chunks are reused
from a finished or a running sequence's slot, and every output stays bitwise the cold one."""

from __future__ import annotations

import numpy as np
import pytest

from ember.serve.engine import StepInput, StepRunner

BLOCK = 16


@pytest.fixture(scope="module")
def model():
    from ember.models import AutoModelForCausalLM
    from ember.models.hub import default_model_path

    return AutoModelForCausalLM.from_pretrained(default_model_path())


def _run(runner, prompt, n=5, keep=False):
    """Prefill in whole chunks at fixed offsets (as the engine does), then n greedy tokens."""
    cache = runner.new_cache(len(prompt) + n, prompt, BLOCK)
    fed = cache.reused
    while fed < len(prompt):
        end = min(len(prompt), (fed // BLOCK + 1) * BLOCK)
        row = runner.step([StepInput(prompt[fed:end], runner.reserve(cache, end))])[0]
        fed = end
    rows, toks = [row], []
    for _ in range(n):
        toks.append(int(rows[-1].argmax()))
        runner.reserve(cache, fed + len(toks))
        rows.append(runner.step([StepInput([toks[-1]], cache)])[0])
    if not keep:
        runner.release(cache)
    return cache, toks, rows


def _cold(model, prompt):
    return _run(StepRunner(model, slots=2), prompt)[1:]


def test_a_finished_prefix_is_reused_in_place_and_changes_nothing(model):
    rng = np.random.default_rng(0)
    system = rng.integers(100, 9000, 40).tolist()
    a = [1, *system, 5, 6]
    b = [1, *system, 7, 8, 9]
    runner = StepRunner(model, slots=2)
    first, _, _ = _run(runner, a)
    assert first.reused == 0
    second, toks, rows = _run(runner, b)
    assert second.reused == 32 and second.index == first.index  # 2 whole blocks, same slot
    cold_toks, cold_rows = _cold(model, b)
    assert toks == cold_toks
    for r, c in zip(rows, cold_rows):
        np.testing.assert_array_equal(r, c)
    assert runner.reused_tokens == 32


def test_a_running_sequences_prefix_is_copied_and_a_short_match_is_ignored(model):
    rng = np.random.default_rng(1)
    system = rng.integers(100, 9000, 50).tolist()
    runner = StepRunner(model, slots=3)
    running, _, _ = _run(runner, [1, *system], keep=True)  # still holds its slot
    other = [1, *system[:20], 42, 43]  # shares one whole block only: reused, copied
    c, toks, rows = _run(runner, other)
    assert c.reused == 16 and c.index != running.index
    assert (toks, rows[-1].tolist()) == (
        _cold(model, other)[0],
        _cold(model, other)[1][-1].tolist(),
    )
    tiny = [1, *system[:10], 9, 9]  # less than a block in common: a cold start
    assert runner.new_cache(20, tiny, BLOCK).reused == 0
    whole = [1, *system]  # the prompt itself: at least one token is still fed
    assert runner.new_cache(80, whole, BLOCK).reused == 48


def test_sixteen_decode_rows_in_one_forward_give_each_rows_logits_alone(model):
    """The bundled model's weights all run the _idot kernels where they can (16 decode rows per
    forward, else 8): each row's logits are bitwise those of the same sequence stepped alone."""
    from ember.kernels.cpu.quant import _idot

    runner, alone = StepRunner(model, slots=16), StepRunner(model, slots=16)
    assert runner.decode_batch == (16 if _idot.available() else 8)
    rng = np.random.default_rng(2)
    prompts = [[1, *rng.integers(100, 9000, 3 + i % 5).tolist()] for i in range(16)]
    pairs = []
    for p in prompts:
        a, b = runner.new_cache(len(p) + 2), alone.new_cache(len(p) + 2)
        for r, c in ((runner, a), (alone, b)):
            r.step([StepInput(p, r.reserve(c, len(p)))])
        pairs.append((a, b, len(p)))
    batched = runner.step(
        [StepInput([7 + i], runner.reserve(a, n + 1)) for i, (a, _, n) in enumerate(pairs)]
    )
    for i, (_, b, n) in enumerate(pairs):
        np.testing.assert_array_equal(
            batched[i], alone.step([StepInput([7 + i], alone.reserve(b, n + 1))])[0]
        )
