"""Training curves to PNG with matplotlib (optional ``train`` extra), without pyplot state."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ember.train.callbacks import Callback

if TYPE_CHECKING:  # pragma: no cover
    from ember.train.learner import Learner

_SKIP = {"epoch", "time", "samples_per_s"}


def plot_history(history: list[dict[str, Any]], filename: str | os.PathLike) -> Path:
    """Draw one panel per quantity (train and valid curves together) and save a PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names: list[str] = []
    for row in history:
        for k in row:
            base = k.split("_", 1)[1] if k.startswith(("train_", "valid_")) else k
            if k not in _SKIP and base not in names:
                names.append(base)
    n = max(len(names), 1)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig = Figure(figsize=(4.2 * cols, 3.2 * rows), tight_layout=True)
    FigureCanvasAgg(fig)
    epochs = [row.get("epoch", i + 1) for i, row in enumerate(history)]
    for i, name in enumerate(names):
        ax = fig.add_subplot(rows, cols, i + 1)
        for key, label in ((f"train_{name}", "train"), (f"valid_{name}", "valid"), (name, None)):
            pts = [(e, r[key]) for e, r in zip(epochs, history) if r.get(key) is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o", markersize=3, label=label or name)
        ax.set_title(name)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        if name in ("lr",):
            ax.set_yscale("log")
        ax.legend()
    path = Path(filename)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


class PlotCurves(Callback):
    """Save the training curves as a PNG when fitting ends (and every `every` epochs if set)."""

    order = 60

    def __init__(self, filename: str | os.PathLike | None = None, every: int | None = None) -> None:
        self.filename = filename
        self.every = every

    def on_fit_start(self, learner: Learner) -> None:
        """Resolve the file name (out_dir/curves.png by default)."""
        if self.filename is None:
            if learner.out_dir is None:
                raise ValueError("PlotCurves needs a filename or a Learner out_dir")
            self.filename = Path(learner.out_dir) / "curves.png"

    def on_epoch_end(self, learner: Learner, logs: dict[str, Any]) -> None:
        """Redraw every `every` epochs, if asked."""
        if self.every and int(logs["epoch"]) % self.every == 0:
            plot_history(learner.history, self.filename)

    def on_fit_end(self, learner: Learner) -> None:
        """Draw the final curves."""
        if learner.history:
            plot_history(learner.history, self.filename)
