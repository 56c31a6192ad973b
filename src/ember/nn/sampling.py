"""Samplers: pick the next token from a row of logits (numpy, float32).

Order of application follows llama.cpp / transformers: penalties, then temperature, then the
truncation filters (top-k, top-p, min-p), then a seeded draw. temperature == 0 is greedy.
They need only numpy, so they sit below the models, where ``model.generate`` uses them;
their public home, which re-exports them, is the generation package's ``sampling`` module.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class SamplingParams:
    """How to choose tokens; the defaults are greedy decoding."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        """Whether this picks the argmax."""
        return self.temperature == 0.0


def apply_penalties(logits: np.ndarray, history: np.ndarray, p: SamplingParams) -> np.ndarray:
    """Repetition (transformers' rule), presence and frequency (OpenAI's rule) penalties."""
    if history.size == 0 or (
        p.repetition_penalty == 1.0 and not p.presence_penalty and not p.frequency_penalty
    ):
        return logits
    logits = logits.copy()
    ids, counts = np.unique(history, return_counts=True)
    if p.repetition_penalty != 1.0:
        sel = logits[ids]
        logits[ids] = np.where(sel > 0, sel / p.repetition_penalty, sel * p.repetition_penalty)
    if p.presence_penalty or p.frequency_penalty:
        logits[ids] -= p.presence_penalty + p.frequency_penalty * counts
    return logits


def filter_logits(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """Temperature-scaled logits with everything outside top-k / top-p / min-p set to -inf."""
    x = logits.astype(np.float64) / p.temperature
    if p.top_k and p.top_k < x.size:
        kth = np.partition(x, -p.top_k)[-p.top_k]
        x = np.where(x < kth, -np.inf, x)
    if p.top_p < 1.0 or p.min_p > 0.0:
        probs = np.exp(x - x.max())
        probs /= probs.sum()
        if p.min_p > 0.0:
            x = np.where(probs < p.min_p * probs.max(), -np.inf, x)
            probs = np.where(np.isinf(x), 0.0, probs)
            probs /= probs.sum()
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            keep = cum - probs[order] < p.top_p  # keep the smallest prefix reaching top_p
            drop = order[~keep]
            x[drop] = -np.inf
    return x


class Sampler:
    """Stateful sampler: holds the seeded generator for one generation."""

    def __init__(self, params: SamplingParams | None = None) -> None:
        self.params = params or SamplingParams()
        self.rng = np.random.default_rng(self.params.seed)

    def __call__(self, logits: np.ndarray, history: np.ndarray | None = None) -> int:
        """The next token id for one row of logits."""
        p = self.params
        if history is not None:
            logits = apply_penalties(logits, history, p)
        if p.greedy:
            return int(np.argmax(logits))
        x = filter_logits(logits, p)
        probs = np.exp(x - x.max())
        probs /= probs.sum()
        return int(self.rng.choice(probs.size, p=probs))


def token_logprobs(
    logits: np.ndarray, token: int, k: int = 0
) -> tuple[float, list[tuple[int, float]]]:
    """Log-probability of `token` under softmax(logits), and the k most likely (id, logprob)."""
    x = np.asarray(logits, np.float64)
    lse = x.max() + np.log(np.exp(x - x.max()).sum())
    top: list[tuple[int, float]] = []
    if k > 0:
        k = min(k, x.size)
        ids = np.argpartition(-x, k - 1)[:k]
        ids = ids[np.lexsort((ids, -x[ids]))]  # most likely first, ties by id
        top = [(int(i), float(x[i] - lse)) for i in ids]
    return float(x[int(token)] - lse), top
