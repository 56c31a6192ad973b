"""The digits example trains briefly and clearly beats chance (10 classes: 10%)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_digits.py"


def _example():
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_digits_data_file_reads_without_sklearn_import():
    mod = _example()
    x_train, y_train, x_test, y_test = mod.load_digits()
    assert x_train.shape == (1438, 1, 8, 8) and x_test.shape == (359, 1, 8, 8)
    assert x_train.min() >= 0.0 and x_train.max() <= 1.0
    assert sorted(np.unique(np.concatenate([y_train, y_test])).tolist()) == list(range(10))


def test_digits_cnn_learns(tmp_path):
    mod = _example()
    learner, metrics, _ = mod.train(epochs=3, out_dir=str(tmp_path), progress=False)
    assert metrics["accuracy"] > 0.6, metrics  # chance is 0.1
    assert len(learner.history) == 3
    assert (tmp_path / "log.csv").exists() and (tmp_path / "best.safetensors").exists()
