"""Callbacks: hooks the Learner calls around fitting, epochs and batches.

Subclass Callback and override what you need; every hook receives the Learner. Set
``learner.stop_training = True`` to stop after the current epoch. A callback with state that
must survive a resume implements ``state_dict`` / ``load_state_dict`` (JSON-able values).
Callbacks run in ascending ``order`` (ModelCheckpoint runs last, so it saves the others' state).
"""

from __future__ import annotations

import csv
import math
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ember.train.learner import Learner


class Callback:
    """Base class: every hook is a no-op."""

    order = 0

    def on_fit_start(self, learner: Learner) -> None:
        """Before the first epoch (after a resume has been restored)."""

    def on_epoch_start(self, learner: Learner) -> None:
        """Before each training epoch."""

    def on_batch_start(self, learner: Learner, batch: Any) -> None:
        """Before each training batch."""

    def on_batch_end(self, learner: Learner, logs: dict[str, Any]) -> None:
        """After each optimizer step; logs has 'loss', 'batch', 'size'."""

    def on_epoch_end(self, learner: Learner, logs: dict[str, Any]) -> None:
        """After training and validation of an epoch; logs holds the epoch's numbers."""

    def on_interrupt(self, learner: Learner, path: str | None) -> None:
        """After Ctrl-C stopped training (path: the checkpoint saved, if any)."""

    def on_fit_end(self, learner: Learner) -> None:
        """After the last epoch, an early stop, or an interrupt."""

    def state_dict(self) -> dict[str, Any]:
        """State to keep in checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state_dict()."""


class LambdaCallback(Callback):
    """A callback from plain functions: LambdaCallback(on_epoch_end=lambda learner, logs: ...)."""

    def __init__(self, **hooks: Callable[..., None]) -> None:
        for name, fn in hooks.items():
            if not name.startswith("on_") or not hasattr(Callback, name):
                raise ValueError(f"LambdaCallback: unknown hook {name!r}")
            setattr(self, name, fn)


def _mode_for(monitor: str, mode: str, learner: Learner | None) -> str:
    if mode in ("min", "max"):
        return mode
    if mode != "auto":
        raise ValueError(f"mode must be 'min', 'max' or 'auto', got {mode!r}")
    if learner is not None:
        for m in learner.metrics:
            if monitor.endswith("_" + m.name):
                return "max" if m.higher_is_better else "min"
    return "min" if any(s in monitor for s in ("loss", "error", "mse", "mae")) else "max"


class _Monitor(Callback):
    """Shared logic: track the best value of a logged number."""

    def __init__(self, monitor: str | None, mode: str, min_delta: float) -> None:
        self.monitor = monitor
        self.mode = mode
        self.min_delta = abs(min_delta)
        self.best: float | None = None
        self.best_epoch: int | None = None
        self._warned = False

    def _setup(self, learner: Learner) -> None:
        if self.monitor is None:
            self.monitor = learner.default_monitor
        self._mode = _mode_for(self.monitor, self.mode, learner)

    def _improved(self, logs: dict[str, Any]) -> bool | None:
        value = logs.get(self.monitor)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            if not self._warned:
                warnings.warn(
                    f"{type(self).__name__}: {self.monitor!r} is not in the logs "
                    f"(have: {', '.join(logs)})",
                    stacklevel=3,
                )
                self._warned = True
            return None
        if self.best is None:
            better = True
        elif self._mode == "min":
            better = value < self.best - self.min_delta
        else:
            better = value > self.best + self.min_delta
        if better:
            self.best = float(value)
            self.best_epoch = int(logs["epoch"])
        return better

    def state_dict(self) -> dict[str, Any]:
        """Best value and epoch so far."""
        return {"best": self.best, "best_epoch": self.best_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the best value and epoch."""
        self.best, self.best_epoch = state.get("best"), state.get("best_epoch")


class EarlyStopping(_Monitor):
    """Stop when ``monitor`` has not improved (by more than min_delta) for ``patience`` epochs."""

    order = 10

    def __init__(
        self,
        monitor: str | None = None,
        patience: int = 3,
        mode: str = "auto",
        min_delta: float = 0.0,
    ) -> None:
        super().__init__(monitor, mode, min_delta)
        self.patience = patience
        self.wait = 0
        self.stopped_epoch: int | None = None

    def on_fit_start(self, learner: Learner) -> None:
        """Resolve the monitored name and mode."""
        self._setup(learner)

    def on_epoch_end(self, learner: Learner, logs: dict[str, Any]) -> None:
        """Count epochs without improvement; ask the learner to stop after `patience`."""
        better = self._improved(logs)
        if better is None:
            return
        if better:
            self.wait = 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            self.stopped_epoch = int(logs["epoch"])
            learner.stop_training = True
            learner.log(
                f"early stopping at epoch {self.stopped_epoch}: {self.monitor} has not improved "
                f"for {self.patience} epochs (best {self.best:.6g} at epoch {self.best_epoch})"
            )

    def state_dict(self) -> dict[str, Any]:
        """Best value, its epoch and the epochs waited."""
        return {**super().state_dict(), "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore best value, epoch and wait count."""
        super().load_state_dict(state)
        self.wait = int(state.get("wait", 0))


class ModelCheckpoint(_Monitor):
    """Save ``last.safetensors`` every ``every_n_epochs`` and ``best.safetensors`` when
    ``monitor`` improves; ``restore_best`` loads the best weights into the model at the end."""

    order = 100

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        monitor: str | None = None,
        mode: str = "auto",
        save_last: bool = True,
        save_best: bool = True,
        every_n_epochs: int = 1,
        restore_best: bool = False,
        min_delta: float = 0.0,
    ) -> None:
        super().__init__(monitor, mode, min_delta)
        self.dirpath = dirpath
        self.save_last = save_last
        self.save_best = save_best
        self.every_n_epochs = every_n_epochs
        self.restore_best = restore_best

    @property
    def last_path(self) -> Path:
        """Where the latest checkpoint goes."""
        return Path(self.dirpath) / "last.safetensors"

    @property
    def best_path(self) -> Path:
        """Where the best checkpoint goes."""
        return Path(self.dirpath) / "best.safetensors"

    def on_fit_start(self, learner: Learner) -> None:
        """Resolve the directory, the monitored name and the mode."""
        if self.dirpath is None:
            if learner.out_dir is None:
                raise ValueError("ModelCheckpoint needs a dirpath or a Learner out_dir")
            self.dirpath = learner.out_dir
        Path(self.dirpath).mkdir(parents=True, exist_ok=True)
        self._setup(learner)

    def on_epoch_end(self, learner: Learner, logs: dict[str, Any]) -> None:
        """Save the last and (when improved) the best checkpoint."""
        better = self._improved(logs) if self.save_best else False
        due = int(logs["epoch"]) % self.every_n_epochs == 0 or learner.stop_training
        if (self.save_last and due) or better:
            learner.save_checkpoint(self.last_path)
            if better:
                shutil.copyfile(self.last_path, self.best_path)
            if not self.save_last:
                os.unlink(self.last_path)

    def on_fit_end(self, learner: Learner) -> None:
        """Load the best weights back into the model when asked to."""
        if self.restore_best and self.best_path.exists():
            from ember.train.checkpoint import load_model_state

            learner.model.load_state_dict(load_model_state(self.best_path))
            learner.log(
                f"restored the best weights (epoch {self.best_epoch}) from {self.best_path}"
            )


class CSVLogger(Callback):
    """Write the history, one row per epoch, to a CSV file (rewritten each epoch)."""

    order = 50

    def __init__(self, filename: str | os.PathLike | None = None) -> None:
        self.filename = filename

    def on_fit_start(self, learner: Learner) -> None:
        """Resolve the file name (out_dir/log.csv by default)."""
        if self.filename is None:
            if learner.out_dir is None:
                raise ValueError("CSVLogger needs a filename or a Learner out_dir")
            self.filename = Path(learner.out_dir) / "log.csv"
        Path(self.filename).parent.mkdir(parents=True, exist_ok=True)

    def on_epoch_end(self, learner: Learner, logs: dict[str, Any]) -> None:
        """Rewrite the file from learner.history (so a resume keeps earlier rows)."""
        write_csv(learner.history, self.filename)


def write_csv(history: list[dict[str, Any]], filename: str | os.PathLike) -> None:
    """Write a list of per-epoch dicts as CSV (columns: the union of keys, in first-seen order)."""
    fields: list[str] = []
    for row in history:
        fields.extend(k for k in row if k not in fields)
    tmp = Path(f"{os.fspath(filename)}.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for row in history:
            w.writerow({k: _fmt(v) for k, v in row.items()})
    os.replace(tmp, filename)


def _fmt(v: Any) -> Any:
    return f"{v:.8g}" if isinstance(v, float) else v


__all__ = [
    "Callback", "LambdaCallback", "EarlyStopping", "ModelCheckpoint", "CSVLogger", "write_csv",
]  # fmt: skip
