"""Metrics: small stateful classes fed batch by batch (``update``) and read per epoch (``compute``).

Write your own by subclassing Metric: set ``name`` (the log column), ``higher_is_better`` (for
early stopping and best checkpoints), and implement ``reset``, ``update`` and ``compute``.
They work on numpy arrays (``update`` receives the model output and target as ember Tensors).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import ShapeError
from ember.tensor import Tensor


def _np(x: Any) -> np.ndarray:
    if isinstance(x, Tensor):
        return x._data
    return np.asarray(x)


class Metric:
    """Base class: accumulate over batches, compute one number per epoch."""

    name = "metric"
    higher_is_better = True

    def reset(self) -> None:
        """Forget everything accumulated (called at the start of each epoch / evaluation)."""
        raise NotImplementedError

    def update(self, output: Tensor, target: Tensor, loss: float | None = None) -> None:
        """Accumulate one batch."""
        raise NotImplementedError

    def compute(self) -> float:
        """The metric over everything accumulated since reset()."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class Loss(Metric):
    """The mean loss per sample (batch losses weighted by batch size)."""

    name = "loss"
    higher_is_better = False

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Zero the running sum."""
        self.total, self.count = 0.0, 0

    def update(self, output: Tensor, target: Tensor, loss: float | None = None) -> None:
        """Add one batch's mean loss times its size."""
        if loss is None:
            return
        n = _np(target).shape[0] if _np(target).ndim else 1
        self.total += float(loss) * n
        self.count += n

    def compute(self) -> float:
        """The mean loss (nan before any batch)."""
        return self.total / self.count if self.count else float("nan")


def _predictions(out: np.ndarray, threshold: float) -> np.ndarray:
    if out.ndim >= 2 and out.shape[1] > 1:
        return out.argmax(axis=1)
    out = out.reshape(out.shape[0], *out.shape[2:]) if out.ndim >= 2 else out
    if out.dtype.kind in "iub":
        return out.astype(np.int64)
    return (out > threshold).astype(np.int64)


class Accuracy(Metric):
    """Fraction of correct predictions: argmax over dim 1 of the scores (class logits), or
    ``output > threshold`` for a single score per sample (binary)."""

    name = "accuracy"

    def __init__(self, threshold: float = 0.0) -> None:
        self.threshold = threshold
        self.reset()

    def reset(self) -> None:
        """Zero the counts."""
        self.correct, self.count = 0, 0

    def update(self, output: Tensor, target: Tensor, loss: float | None = None) -> None:
        """Count correct predictions in one batch."""
        pred = _predictions(_np(output), self.threshold)
        tgt = _np(target)
        if tgt.size == pred.size:
            tgt = tgt.reshape(pred.shape)
        if pred.shape != tgt.shape:
            raise ShapeError(
                f"Accuracy: predictions of shape {pred.shape} vs targets of shape {tgt.shape}"
            )
        self.correct += int((pred == tgt).sum())
        self.count += pred.size

    def compute(self) -> float:
        """Correct / total."""
        return self.correct / self.count if self.count else float("nan")


class TopKAccuracy(Metric):
    """Fraction of samples whose target is among the k highest scores."""

    higher_is_better = True

    def __init__(self, k: int = 5) -> None:
        self.k = k
        self.name = f"top{k}_accuracy"
        self.reset()

    def reset(self) -> None:
        """Zero the counts."""
        self.correct, self.count = 0, 0

    def update(self, output: Tensor, target: Tensor, loss: float | None = None) -> None:
        """Count hits in one batch."""
        out, tgt = _np(output), _np(target)
        if out.ndim != 2 or tgt.shape != out.shape[:1]:
            raise ShapeError(
                f"TopKAccuracy: expected scores (N, C) and targets (N,), got {out.shape} and "
                f"{tgt.shape}"
            )
        k = min(self.k, out.shape[1])
        top = np.argpartition(-out, k - 1, axis=1)[:, :k]
        self.correct += int((top == tgt[:, None]).any(axis=1).sum())
        self.count += out.shape[0]

    def compute(self) -> float:
        """Hits / total."""
        return self.correct / self.count if self.count else float("nan")


class F1(Metric):
    """Macro-averaged F1 over classes (sklearn's ``f1_score(average='macro')``).

    With ``num_classes`` every class counts; without, the classes seen in targets or
    predictions. A class with no true or predicted samples scores 0, as sklearn's default.
    """

    name = "f1"

    def __init__(self, num_classes: int | None = None, threshold: float = 0.0) -> None:
        self.num_classes = num_classes
        self.threshold = threshold
        self.reset()

    def reset(self) -> None:
        """Zero the confusion counts."""
        self.tp: dict[int, int] = {}
        self.fp: dict[int, int] = {}
        self.fn: dict[int, int] = {}

    def update(self, output: Tensor, target: Tensor, loss: float | None = None) -> None:
        """Accumulate true/false positives and false negatives per class."""
        pred = _predictions(_np(output), self.threshold).reshape(-1)
        tgt = _np(target).reshape(-1).astype(np.int64)
        if pred.shape != tgt.shape:
            raise ShapeError(f"F1: {pred.shape[0]} predictions vs {tgt.shape[0]} targets")
        n = max(int(pred.max(initial=0)), int(tgt.max(initial=0))) + 1
        if self.num_classes is not None:
            n = max(n, self.num_classes)
        tp = np.bincount(tgt[pred == tgt], minlength=n)
        pc = np.bincount(pred, minlength=n)
        tc = np.bincount(tgt, minlength=n)
        for c in np.nonzero(pc + tc)[0].tolist():
            self.tp[c] = self.tp.get(c, 0) + int(tp[c])
            self.fp[c] = self.fp.get(c, 0) + int(pc[c] - tp[c])
            self.fn[c] = self.fn.get(c, 0) + int(tc[c] - tp[c])

    def compute(self) -> float:
        """The unweighted mean of per-class F1."""
        classes = range(self.num_classes) if self.num_classes is not None else sorted(self.tp)
        scores = []
        for c in classes:
            tp, fp, fn = self.tp.get(c, 0), self.fp.get(c, 0), self.fn.get(c, 0)
            denom = 2 * tp + fp + fn
            scores.append(2 * tp / denom if denom else 0.0)
        return float(np.mean(scores)) if scores else float("nan")


class MeanSquaredError(Metric):
    """Mean of (output - target)**2 over all elements."""

    name = "mse"
    higher_is_better = False

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Zero the running sum."""
        self.total, self.count = 0.0, 0

    def update(self, output: Tensor, target: Tensor, loss: float | None = None) -> None:
        """Add one batch's squared errors."""
        d = _np(output).astype(np.float64) - _np(target).astype(np.float64)
        self.total += float((d * d).sum())
        self.count += d.size

    def compute(self) -> float:
        """The mean squared error."""
        return self.total / self.count if self.count else float("nan")


__all__ = ["Metric", "Loss", "Accuracy", "TopKAccuracy", "F1", "MeanSquaredError"]
