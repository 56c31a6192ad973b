"""RMSprop: gradients scaled by a running RMS, optionally centered, with momentum."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ember.optim.optimizer import Optimizer


class RMSprop(Optimizer):
    """torch.optim.RMSprop."""

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        *,
        maximize: bool = False,
    ) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if alpha < 0.0:
            raise ValueError(f"Invalid alpha value: {alpha}")
        defaults = dict(
            lr=lr,
            alpha=alpha,
            eps=eps,
            weight_decay=weight_decay,
            momentum=momentum,
            centered=centered,
            maximize=maximize,
        )
        super().__init__(params, defaults)

    def _update(self, p: np.ndarray, g: np.ndarray, state: dict, group: dict) -> None:
        alpha, momentum = group["alpha"], group["momentum"]
        if not state:
            state["step"] = 0
            state["square_avg"] = self._zeros(p)
            if momentum > 0:
                state["momentum_buffer"] = self._zeros(p)
            if group["centered"]:
                state["grad_avg"] = self._zeros(p)
        state["step"] += 1
        grad = self._grad(p, g, group)
        sq = state["square_avg"]._data
        tmp = self._tmp(p)
        sq *= alpha  # square_avg = alpha * square_avg + (1 - alpha) * grad**2
        np.multiply(grad, grad, out=tmp)
        tmp *= 1 - alpha
        sq += tmp
        if group["centered"]:
            ga = state["grad_avg"]._data
            np.subtract(grad, ga, out=tmp)  # grad_avg.lerp_(grad, 1 - alpha)
            tmp *= 1 - alpha
            ga += tmp
            np.multiply(ga, ga, out=tmp)
            np.subtract(sq, tmp, out=tmp)
            np.sqrt(tmp, out=tmp)
        else:
            np.sqrt(sq, out=tmp)
        tmp += group["eps"]
        np.divide(grad, tmp, out=tmp)
        if momentum > 0:
            buf = state["momentum_buffer"]._data
            buf *= momentum
            buf += tmp
            np.multiply(buf, -group["lr"], out=tmp)
        else:
            tmp *= -group["lr"]
        p += tmp
