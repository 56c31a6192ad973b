"""A small CNN on scikit-learn's 8x8 handwritten digits, trained with ember's Learner.

The data is the CSV that ships inside scikit-learn (sklearn/datasets/data/digits.csv.gz), read
with numpy and gzip: no network, and sklearn is never imported (only its folder is located).
Run: python examples/train_digits.py [--epochs 20] [--out runs/digits]
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import os
import time

import numpy as np

import ember
from ember import nn, optim
from ember.data import DataLoader, TensorDataset, random_split
from ember.nn import functional as F
from ember.train import F1, Accuracy, Learner


def digits_file() -> str:
    """The path of digits.csv.gz inside the installed scikit-learn package."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("scikit-learn is not installed: it ships the digits data file")
    return os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")


def load_digits(test_fraction: float = 0.2, seed: int = 0):
    """(x_train, y_train, x_test, y_test): images (N, 1, 8, 8) scaled to [0, 1], labels 0-9."""
    with gzip.open(digits_file(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    x = (table[:, :64] / 16.0).reshape(-1, 1, 8, 8)
    y = table[:, 64].astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


class DigitsCNN(nn.Module):
    """conv(1->16) -> pool -> conv(16->32) -> pool -> linear(128->64) -> linear(64->10)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, 10)
        self.dropout = nn.Dropout(0.2)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # (N, 16, 4, 4)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # (N, 32, 2, 2)
        x = self.dropout(F.relu(self.fc1(x.flatten(1))))
        return self.fc2(x)


def train(
    epochs: int = 20,
    out_dir: str | None = "runs/digits",
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    progress=None,
    limit: int | None = None,
):
    """Train on 90% of the training images (10% validate), then evaluate on the held-out test
    images; returns (learner, test metrics dict, training seconds)."""
    ember.manual_seed(seed)
    x_train, y_train, x_test, y_test = load_digits(seed=seed)
    if limit is not None:
        x_train, y_train = x_train[:limit], y_train[:limit]
    g = ember.Generator().manual_seed(seed)
    full = TensorDataset(ember.tensor(x_train), ember.tensor(y_train))
    train_ds, valid_ds = random_split(full, [0.9, 0.1], generator=g)  # valid picks the best
    test_ds = TensorDataset(ember.tensor(x_test), ember.tensor(y_test))
    train_loader = DataLoader(train_ds, batch_size=batch_size, shuffle=True, generator=g)
    valid_loader = DataLoader(valid_ds, batch_size=256)
    test_loader = DataLoader(test_ds, batch_size=256)

    model = DigitsCNN()
    optimizer = optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    scheduler = optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=lr, epochs=epochs, steps_per_epoch=len(train_loader)
    )
    learner = Learner(
        model,
        optimizer,
        F.cross_entropy,
        metrics=[Accuracy(), F1(num_classes=10)],
        scheduler=scheduler,
        out_dir=out_dir,
        progress=progress,
    )
    t0 = time.perf_counter()
    learner.fit(train_loader, valid_loader, epochs=epochs)
    seconds = time.perf_counter() - t0
    return learner, learner.evaluate(test_loader), seconds


def main() -> None:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--out", default="runs/digits", help="log.csv, checkpoints, curves.png")
    args = ap.parse_args()
    _, metrics, seconds = train(args.epochs, args.out, args.batch_size, args.lr)
    print(
        f"test accuracy {metrics['accuracy']:.4f}  macro F1 {metrics['f1']:.4f}  "
        f"({seconds:.1f} s for {args.epochs} epochs; curves in {args.out}/curves.png)"
    )


if __name__ == "__main__":
    main()
