"""The Learner: a training loop with metrics, logging, checkpoints, early stopping and resume.

    learner = Learner(model, optim.AdamW(model.parameters()), F.cross_entropy,
                      metrics=[Accuracy()], out_dir="runs/digits")
    learner.fit(train_loader, valid_loader, epochs=10)      # epochs: the total to reach
    learner.fit(train_loader, valid_loader, epochs=10, resume=True)   # after an interrupt

Each batch: ``out = model(*batch[:-1])``, ``loss = loss_fn(out, batch[-1])``, backward, step
(override ``unpack`` for other batch layouts). Evaluation runs under no_grad in eval mode.
With ``out_dir`` the learner writes ``log.csv``, ``last.safetensors`` (every epoch),
``best.safetensors`` (best monitored value), ``curves.png``, and on Ctrl-C
``interrupted.safetensors`` before returning.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ember.autograd import no_grad
from ember.tensor import Tensor
from ember.train import checkpoint as ckpt
from ember.train.callbacks import Callback, CSVLogger, ModelCheckpoint
from ember.train.metrics import Loss, Metric
from ember.train.plot import PlotCurves
from ember.train.progress import ProgressBar

_STEP_SCHEDULERS = ("OneCycleLR", "CyclicLR")


class Learner:
    """Bundles model, optimizer, loss, metrics, scheduler and callbacks; ``fit`` trains."""

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        loss_fn: Callable[[Any, Any], Tensor],
        metrics: Iterable[Metric] = (),
        scheduler: Any = None,
        callbacks: Iterable[Callback] = (),
        out_dir: str | os.PathLike | None = None,
        *,
        progress: Any = None,
        scheduler_interval: str | None = None,
        clip_grad_norm: float | None = None,
        train_metrics: bool = True,
        verbose: bool = True,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.metrics = [m() if isinstance(m, type) else m for m in metrics]
        self.scheduler = scheduler
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.clip_grad_norm = clip_grad_norm
        self.train_metrics = train_metrics
        self.verbose = verbose
        if scheduler_interval is None:
            scheduler_interval = "step" if type(scheduler).__name__ in _STEP_SCHEDULERS else "epoch"
        if scheduler_interval not in ("step", "epoch"):
            raise ValueError(
                f"scheduler_interval must be 'step' or 'epoch', got {scheduler_interval!r}"
            )
        self.scheduler_interval = scheduler_interval
        self.callbacks: list[Callback] = list(callbacks)
        have = {type(c) for c in self.callbacks}
        if progress is not False and not any(isinstance(c, ProgressBar) for c in self.callbacks):
            self.callbacks.append(ProgressBar(progress))
        if self.out_dir is not None:
            for cls in (CSVLogger, ModelCheckpoint, PlotCurves):
                if cls in have:
                    continue
                if cls is PlotCurves and importlib.util.find_spec("matplotlib") is None:
                    continue
                self.callbacks.append(cls())
        self.epoch = 0  # epochs completed
        self.epochs = 0  # the epoch count fit() runs up to
        self.global_step = 0
        self.history: list[dict[str, Any]] = []
        self.stop_training = False
        self.interrupted = False
        self.train_loader: Any = None
        self.valid_loader: Any = None

    # ------------------------------------------------------------------ helpers
    def log(self, message: str) -> None:
        """Print a message (when verbose)."""
        if self.verbose:
            print(message, flush=True)

    @property
    def default_monitor(self) -> str:
        """'valid_loss' when there is validation data, else 'train_loss'."""
        return "valid_loss" if self.valid_loader is not None else "train_loss"

    def _sorted_callbacks(self) -> list[Callback]:
        return sorted(self.callbacks, key=lambda c: getattr(c, "order", 0))

    def _call(self, hook: str, *args: Any) -> None:
        for cb in self._sorted_callbacks():
            getattr(cb, hook)(self, *args)

    def unpack(self, batch: Any) -> tuple[Sequence[Any], Any]:
        """Split a batch into (model inputs, target): by default (batch[:-1], batch[-1])."""
        if isinstance(batch, (list, tuple)) and len(batch) >= 2:
            return batch[:-1], batch[-1]
        if isinstance(batch, dict) and "target" in batch:
            inputs = {k: v for k, v in batch.items() if k != "target"}
            return [inputs["input"]] if list(inputs) == ["input"] else [inputs], batch["target"]
        raise TypeError(
            "Learner.unpack: expected batches like (inputs..., target); override unpack() "
            f"for {type(batch).__name__} batches"
        )

    def _forward(self, inputs: Sequence[Any]) -> Any:
        if len(inputs) == 1 and isinstance(inputs[0], dict):
            return self.model(**inputs[0])
        return self.model(*inputs)

    @staticmethod
    def _size(target: Any) -> int:
        shape = getattr(target, "shape", None)
        return int(shape[0]) if shape else 1

    # ------------------------------------------------------------------ training
    def fit(
        self,
        train_loader: Iterable,
        valid_loader: Iterable | None = None,
        epochs: int = 1,
        resume: str | os.PathLike | bool | None = None,
    ) -> list[dict[str, Any]]:
        """Train until ``epochs`` epochs are done in total; returns the history (one dict each).

        ``resume``: a checkpoint path, or True for ``out_dir/last.safetensors`` when it exists;
        restores model, optimizer, scheduler, RNG states, history and callback state first.
        Ctrl-C saves ``out_dir/interrupted.safetensors`` and returns cleanly.
        """
        self.train_loader, self.valid_loader, self.epochs = train_loader, valid_loader, epochs
        self.stop_training = self.interrupted = False
        if resume:
            path = resume
            if resume is True:
                path = self.out_dir / "last.safetensors" if self.out_dir is not None else None
            if path is not None and Path(path).exists():
                self.load_checkpoint(path)
                self.log(f"resumed from {path} after epoch {self.epoch}")
            elif resume is not True:
                raise FileNotFoundError(f"resume: no checkpoint at {path}")
        try:
            self._call("on_fit_start")
            while self.epoch < epochs and not self.stop_training:
                logs, stats = self._train_epoch()
                if valid_loader is not None:
                    for k, v in self.evaluate(valid_loader).items():
                        logs[f"valid_{k}"] = v
                logs.update(stats)
                self._step_scheduler_epoch(logs)
                self.epoch += 1
                self.history.append(logs)
                self._call("on_epoch_end", logs)
        except KeyboardInterrupt:
            self.interrupted = True
            path = None
            if self.out_dir is not None:
                path = self.out_dir / "interrupted.safetensors"
                self.save_checkpoint(path)
            where = f"; checkpoint saved to {path}" if path else ""
            self.log(f"\ninterrupted during epoch {self.epoch + 1}{where}")
            self._call("on_interrupt", None if path is None else str(path))
        finally:
            self._call("on_fit_end")
        return self.history

    def _train_epoch(self) -> tuple[dict[str, Any], dict[str, Any]]:
        self.model.train()
        lr = self.optimizer.param_groups[0]["lr"]
        self._call("on_epoch_start")
        loss_m = Loss()
        metrics = self.metrics if self.train_metrics else []
        for m in metrics:
            m.reset()
        step_sched = self.scheduler is not None and self.scheduler_interval == "step"
        seen = 0
        t0 = time.perf_counter()
        for i, batch in enumerate(self.train_loader):
            self._call("on_batch_start", batch)
            inputs, target = self.unpack(batch)
            out = self._forward(inputs)
            loss = self.loss_fn(out, target)
            self.optimizer.zero_grad()
            loss.backward()
            if self.clip_grad_norm is not None:
                from ember.nn.utils import clip_grad_norm_

                clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
            self.optimizer.step()
            if step_sched:
                self.scheduler.step()
            self.global_step += 1
            value = loss.item()
            size = self._size(target)
            seen += size
            loss_m.update(None, target, value)
            if metrics:
                detached = out.detach() if isinstance(out, Tensor) else out
                for m in metrics:
                    m.update(detached, target, value)
            self._call("on_batch_end", {"loss": value, "batch": i, "size": size})
            # the output (an LM's logits: batch x seq x vocab) and the loss go before the next
            # batch's forward, not after it
            out = loss = detached = None
        dt = time.perf_counter() - t0
        logs: dict[str, Any] = {"epoch": self.epoch + 1, "train_loss": loss_m.compute()}
        for m in metrics:
            logs[f"train_{m.name}"] = m.compute()
        stats = {"lr": lr, "time": dt, "samples_per_s": seen / dt if dt > 0 else float("nan")}
        return logs, stats

    def _step_scheduler_epoch(self, logs: dict[str, Any]) -> None:
        s = self.scheduler
        if s is None or self.scheduler_interval != "epoch":
            return
        if type(s).__name__ == "ReduceLROnPlateau":
            s.step(logs[self.default_monitor])
        else:
            s.step()

    @no_grad()
    def evaluate(self, loader: Iterable) -> dict[str, float]:
        """Loss and metrics over a loader, under no_grad with the model in eval mode."""
        was_training = getattr(self.model, "training", True)
        self.model.eval()
        loss_m = Loss()
        for m in self.metrics:
            m.reset()
        try:
            for batch in loader:
                inputs, target = self.unpack(batch)
                out = self._forward(inputs)
                value = self.loss_fn(out, target).item()
                loss_m.update(None, target, value)
                for m in self.metrics:
                    m.update(out, target, value)
                del out  # before the next batch's forward
        finally:
            self.model.train(was_training)
        return {"loss": loss_m.compute(), **{m.name: m.compute() for m in self.metrics}}

    @no_grad()
    def predict(self, loader: Iterable) -> Tensor:
        """The model's outputs over a loader, concatenated along dim 0 (eval mode, no_grad)."""
        import numpy as np

        was_training = getattr(self.model, "training", True)
        self.model.eval()
        outs = []
        try:
            for batch in loader:
                inputs = (
                    self.unpack(batch)[0] if isinstance(batch, (list, tuple, dict)) else [batch]
                )
                outs.append(self._forward(inputs)._data)
        finally:
            self.model.train(was_training)
        return Tensor._wrap(np.concatenate(outs))

    # ------------------------------------------------------------------ checkpoints
    def _generators(self) -> dict[str, Any]:
        """The ember.Generators the loaders draw from, by a stable name."""
        out: dict[str, Any] = {}
        for name, loader in (("train", self.train_loader), ("valid", self.valid_loader)):
            if loader is None:
                continue
            bs = getattr(loader, "batch_sampler", None)
            owners = [loader, getattr(loader, "sampler", None), bs, getattr(bs, "sampler", None)]
            seen: set[int] = {id(g) for g in out.values()}
            for k, obj in enumerate(owners):
                g = getattr(obj, "generator", None)
                if g is not None and hasattr(g, "get_state") and id(g) not in seen:
                    seen.add(id(g))
                    out[f"{name}_loader.{k}"] = g
        return out

    def _callback_keys(self) -> list[tuple[str, Callback]]:
        counts: dict[str, int] = {}
        keys = []
        for cb in self.callbacks:
            name = type(cb).__name__
            keys.append((f"{name}.{counts.get(name, 0)}", cb))
            counts[name] = counts.get(name, 0) + 1
        return keys

    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """Model + optimizer + scheduler + epoch + RNG states + history + callback states."""
        extra = {
            "global_step": self.global_step,
            "history": self.history,
            "callbacks": {k: cb.state_dict() for k, cb in self._callback_keys()},
        }
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        ckpt.save_checkpoint(
            path,
            self.model,
            self.optimizer,
            self.scheduler,
            epoch=self.epoch,
            generators=self._generators(),
            extra=extra,
        )

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restore everything save_checkpoint wrote; training continues after its epoch."""
        meta = ckpt.load_checkpoint(
            path, self.model, self.optimizer, self.scheduler, generators=self._generators()
        )
        extra = meta["extra"]
        self.epoch = int(meta["epoch"])
        self.global_step = int(extra.get("global_step", 0))
        self.history = list(extra.get("history", []))
        states = extra.get("callbacks", {})
        for key, cb in self._callback_keys():
            if key in states:
                cb.load_state_dict(states[key])
        return meta


def fit(
    model: Any,
    train_loader: Iterable,
    valid_loader: Iterable | None = None,
    optimizer: Any = None,
    loss_fn: Callable[[Any, Any], Tensor] | None = None,
    epochs: int = 1,
    *,
    metrics: Iterable[Metric] = (),
    scheduler: Any = None,
    callbacks: Iterable[Callback] = (),
    out_dir: str | os.PathLike | None = None,
    resume: str | os.PathLike | bool | None = None,
    **learner_kwargs: Any,
) -> Learner:
    """Function form: build a Learner, fit it, return it (history in ``.history``)."""
    if optimizer is None or loss_fn is None:
        raise TypeError("fit() needs an optimizer and a loss_fn")
    learner = Learner(
        model, optimizer, loss_fn, metrics, scheduler, callbacks, out_dir, **learner_kwargs
    )
    learner.fit(train_loader, valid_loader, epochs=epochs, resume=resume)
    return learner
