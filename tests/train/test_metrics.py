"""Metrics against scikit-learn / torch, accumulated over uneven batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, f1_score, top_k_accuracy_score

import ember
from ember.train import F1, Accuracy, Loss, MeanSquaredError, TopKAccuracy
from ember.train.checkpoint import decode, encode


def _feed(metric, scores, target, splits=(0, 7, 8, 30, 61)):
    metric.reset()
    for a, b in zip(splits[:-1], splits[1:]):
        metric.update(ember.tensor(scores[a:b]), ember.tensor(target[a:b]))
    return metric.compute()


@pytest.fixture
def multiclass():
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((61, 5)).astype(np.float32)
    target = rng.integers(0, 5, 61)
    target[:20] = scores[:20].argmax(1)  # better than chance
    return scores, target


def test_accuracy(multiclass):
    scores, target = multiclass
    assert _feed(Accuracy(), scores, target) == pytest.approx(
        accuracy_score(target, scores.argmax(1))
    )
    # binary: one logit per sample, threshold at 0
    logits = scores[:, 0]
    y = (np.random.default_rng(1).random(61) < 0.5).astype(np.int64)
    want = accuracy_score(y, (logits > 0).astype(int))
    assert _feed(Accuracy(), logits, y) == pytest.approx(want)
    assert _feed(Accuracy(), logits[:, None], y) == pytest.approx(want)
    with pytest.raises(ember.errors.ShapeError):
        Accuracy().update(ember.tensor(scores[:4]), ember.tensor(target[:3]))


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_topk_accuracy(multiclass, k):
    scores, target = multiclass
    want = top_k_accuracy_score(target, scores, k=k, labels=range(5))
    assert _feed(TopKAccuracy(k), scores, target) == pytest.approx(want)
    assert TopKAccuracy(k).name == f"top{k}_accuracy"


def test_f1_macro(multiclass):
    scores, target = multiclass
    pred = scores.argmax(1)
    assert _feed(F1(), scores, target) == pytest.approx(f1_score(target, pred, average="macro"))
    # a class never predicted nor present counts as 0 when num_classes says it exists
    want = f1_score(target, pred, average="macro", labels=range(7), zero_division=0)
    assert _feed(F1(num_classes=7), scores, target) == pytest.approx(want)
    # a class that only appears in predictions
    t2 = target.copy()
    t2[t2 == 4] = 0
    assert _feed(F1(), scores, t2) == pytest.approx(f1_score(t2, pred, average="macro"))


def test_loss_and_mse():
    m = Loss()
    m.update(None, ember.zeros(3), 2.0)
    m.update(None, ember.zeros(1), 6.0)
    assert m.compute() == pytest.approx(3.0)
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((61, 2)), rng.standard_normal((61, 2))
    want = torch.nn.functional.mse_loss(torch.tensor(a), torch.tensor(b)).item()
    assert _feed(MeanSquaredError(), a, b) == pytest.approx(want)
    assert np.isnan(Loss().compute())


def test_checkpoint_json_codec():
    from collections import Counter

    obj = {
        "betas": (0.9, 0.999),
        "milestones": Counter({3: 1, 10: 2}),
        "int_keys": {0: "a", 5: [1, (2, 3)]},
        "nested": [{"x": float("inf")}, None, True],
        "np": np.float32(1.5),
        "arr": np.arange(3),
    }
    import json

    back = decode(json.loads(json.dumps(encode(obj))))
    assert back["betas"] == (0.9, 0.999)
    assert isinstance(back["milestones"], Counter) and back["milestones"][10] == 2
    assert back["int_keys"] == {0: "a", 5: [1, (2, 3)]}
    assert back["nested"] == [{"x": float("inf")}, None, True]
    assert back["np"] == 1.5 and back["arr"].tolist() == [0, 1, 2]
    with pytest.raises(TypeError):
        encode(object())
