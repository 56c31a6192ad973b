"""Progress display: a tqdm bar per epoch (live loss and throughput), or plain printed lines.

tqdm comes from the optional ``train`` extra; without it, or when stderr is not a terminal,
each epoch prints one summary line instead.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from ember.train.callbacks import Callback

if TYPE_CHECKING:  # pragma: no cover
    from ember.train.learner import Learner


def format_logs(logs: dict[str, Any], skip: tuple[str, ...] = ("epoch",)) -> str:
    """'train_loss 0.1234 | valid_accuracy 0.9812 | ...' for the numbers in logs."""
    parts = []
    for k, v in logs.items():
        if k in skip:
            continue
        if k == "samples_per_s":
            parts.append(f"{v:,.0f} samples/s")
        elif k == "time":
            parts.append(f"{v:.1f}s")
        elif isinstance(v, float):
            parts.append(f"{k} {v:.4g}")
        else:
            parts.append(f"{k} {v}")
    return " | ".join(parts)


def _use_tqdm(mode: Any) -> bool:
    if mode in (False, "plain", "none"):
        return False
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    if mode in ("tqdm", "bar"):
        return True
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


class ProgressBar(Callback):
    """Shows each epoch's progress: tqdm on a terminal, else one printed line per epoch."""

    order = -10

    def __init__(self, mode: Any = None, refresh_every: float = 0.2) -> None:
        self.mode = mode
        self.refresh_every = refresh_every
        self.bar = None

    def on_fit_start(self, learner: Learner) -> None:
        """Pick tqdm or plain printing."""
        self.tqdm = _use_tqdm(self.mode)

    def on_epoch_start(self, learner: Learner) -> None:
        """Open the epoch's bar."""
        self.t0 = self.last = time.perf_counter()
        self.loss_sum, self.seen, self.batches = 0.0, 0, 0
        if not self.tqdm:
            return
        from tqdm.auto import tqdm

        try:
            total = len(learner.train_loader)
        except TypeError:
            total = None
        self.bar = tqdm(
            total=total,
            desc=f"epoch {learner.epoch + 1}/{learner.epochs}",
            unit="batch",
            dynamic_ncols=True,
            leave=True,
            file=sys.stderr,
        )

    def on_batch_end(self, learner: Learner, logs: dict[str, Any]) -> None:
        """Advance the bar; show the running loss and samples per second."""
        self.loss_sum += logs["loss"] * logs["size"]
        self.seen += logs["size"]
        self.batches += 1
        if self.bar is None:
            return
        now = time.perf_counter()
        self.bar.update(1)
        if now - self.last >= self.refresh_every:
            self.last = now
            rate = self.seen / max(now - self.t0, 1e-9)
            self.bar.set_postfix_str(
                f"loss {self.loss_sum / self.seen:.4f}, {rate:,.0f} samples/s", refresh=False
            )

    def on_epoch_end(self, learner: Learner, logs: dict[str, Any]) -> None:
        """Close the bar with the epoch's summary (or print it)."""
        summary = format_logs(logs)
        if self.bar is not None:
            self.bar.set_postfix_str(summary.replace(" | ", ", "), refresh=False)
            self.bar.close()
            self.bar = None
        else:
            learner.log(f"epoch {logs['epoch']}/{learner.epochs} | {summary}")

    def on_fit_end(self, learner: Learner) -> None:
        """Close a bar left open by an interrupt."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
