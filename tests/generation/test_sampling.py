"""Samplers against hand-computed distributions, and the generate loop's stop handling."""

import numpy as np
import pytest

from ember.generation.generate import _stop_split
from ember.generation.sampling import Sampler, SamplingParams, apply_penalties, filter_logits

LOGITS = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05], np.float32))


def _kept(p: SamplingParams) -> list[int]:
    return [i for i, v in enumerate(filter_logits(LOGITS, p)) if np.isfinite(v)]


def test_greedy_is_argmax():
    assert Sampler()(np.array([0.1, 3.0, -1.0], np.float32)) == 1


def test_top_k_top_p_min_p_filters():
    assert _kept(SamplingParams(temperature=1.0, top_k=2)) == [0, 1]
    assert _kept(SamplingParams(temperature=1.0, top_p=0.7)) == [0, 1]  # 0.5 + 0.2 reaches 0.7
    assert _kept(SamplingParams(temperature=1.0, top_p=0.71)) == [0, 1, 2]
    assert _kept(SamplingParams(temperature=1.0, min_p=0.29)) == [0, 1, 2]  # >= 0.29 * 0.5
    assert _kept(SamplingParams(temperature=1.0, top_k=4, min_p=0.25)) == [0, 1, 2]


def test_temperature_scales_logits():
    x = filter_logits(LOGITS, SamplingParams(temperature=0.5))
    np.testing.assert_allclose(x, LOGITS.astype(np.float64) / 0.5, rtol=1e-6)


def test_seeded_sampling_is_reproducible_and_follows_the_distribution():
    p = SamplingParams(temperature=1.0, seed=7)
    a = [Sampler(p)(LOGITS) for _ in range(5)]
    b = [Sampler(p)(LOGITS) for _ in range(5)]
    assert a == b
    s = Sampler(SamplingParams(temperature=1.0, seed=1))
    counts = np.bincount([s(LOGITS) for _ in range(4000)], minlength=5) / 4000
    np.testing.assert_allclose(counts, [0.5, 0.2, 0.15, 0.1, 0.05], atol=0.03)


def test_penalties():
    logits = np.array([2.0, -1.0, 0.5, 0.0], np.float32)
    hist = np.array([0, 1, 1])
    rep = apply_penalties(logits, hist, SamplingParams(repetition_penalty=2.0))
    np.testing.assert_allclose(rep, [1.0, -2.0, 0.5, 0.0])  # positive / p, negative * p
    pres = apply_penalties(
        logits, hist, SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    )
    np.testing.assert_allclose(pres, [2.0 - 0.75, -1.0 - 1.0, 0.5, 0.0])
    assert apply_penalties(logits, hist, SamplingParams()) is logits


def test_bad_parameters_are_refused():
    for kw in (
        {"temperature": -1},
        {"top_p": 0.0},
        {"min_p": 1.0},
        {"top_k": -1},
        {"repetition_penalty": 0},
    ):
        with pytest.raises(ValueError):
            SamplingParams(**kw)


def test_stop_strings_hold_back_possible_prefixes():
    assert _stop_split("hello wor", ["world"]) == ("hello wor", False, 3)
    assert _stop_split("hello world!", ["world"]) == ("hello ", True, 0)
    assert _stop_split("abc", ["x"]) == ("abc", False, 0)
