"""Samplers: pick the next token from a row of logits (numpy, float32).

They live below the models, in ``ember.nn.sampling`` (``model.generate`` uses them); this is their
public home and re-exports them.
"""

from ember.nn.sampling import (
    Sampler,
    SamplingParams,
    apply_penalties,
    filter_logits,
    token_logprobs,
)

__all__ = ["Sampler", "SamplingParams", "apply_penalties", "filter_logits", "token_logprobs"]
