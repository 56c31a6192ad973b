"""The Learner lets go of a batch's output (an LM's logits) before the next batch's forward."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

import ember
from ember import nn, optim
from ember.data import DataLoader, TensorDataset
from ember.nn import functional as F
from ember.train import Accuracy, Learner


class _Watch(nn.Module):
    """A linear model that records, at each forward, whether the last output is still alive."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 3)
        self.last = None
        self.alive_at_forward: list[bool] = []

    def forward(self, x):
        self.alive_at_forward.append(self.last is not None and self.last() is not None)
        out = self.lin(x)
        self.last = weakref.ref(out._data)  # the array: a detached view shares it
        return out


@pytest.mark.parametrize("metrics", [[], [Accuracy()]])
def test_previous_output_is_freed_before_the_next_forward(metrics):
    rng = np.random.default_rng(0)
    x = ember.tensor(rng.standard_normal((48, 6)).astype(np.float32))
    y = ember.tensor(rng.integers(0, 3, 48))
    loader = DataLoader(TensorDataset(x, y), 8)
    model = _Watch()
    learner = Learner(model, optim.SGD(model.parameters(), lr=0.1), F.cross_entropy,
                      metrics=metrics, train_metrics=True)  # fmt: skip
    learner.fit(loader, loader, epochs=2)
    assert len(model.alive_at_forward) == 2 * (6 + 6)
    assert not any(model.alive_at_forward), model.alive_at_forward
