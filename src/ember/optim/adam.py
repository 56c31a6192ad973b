"""Adam and AdamW (decoupled weight decay), with amsgrad and maximize."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ember.optim.optimizer import Optimizer


class Adam(Optimizer):
    """torch.optim.Adam: bias-corrected first and second moment estimates."""

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        decoupled_weight_decay: bool = False,
    ) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            decoupled_weight_decay=decoupled_weight_decay,
        )
        super().__init__(params, defaults)

    def _update(self, p: np.ndarray, g: np.ndarray, state: dict, group: dict) -> None:
        beta1, beta2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        if not state:
            state["step"] = 0
            state["exp_avg"] = self._zeros(p)
            state["exp_avg_sq"] = self._zeros(p)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = self._zeros(p)
        state["step"] += 1
        step = state["step"]
        if group["decoupled_weight_decay"]:
            if wd:
                p *= 1 - lr * wd
            grad = self._grad(p, g, group, wd=0)
        else:
            grad = self._grad(p, g, group)
        m, v = state["exp_avg"]._data, state["exp_avg_sq"]._data
        tmp = self._tmp(p)
        np.subtract(grad, m, out=tmp)  # m.lerp_(grad, 1 - beta1)
        tmp *= 1 - beta1
        m += tmp
        v *= beta2  # v = beta2 * v + (1 - beta2) * grad**2
        np.multiply(grad, grad, out=tmp)
        tmp *= 1 - beta2
        v += tmp
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        if group["amsgrad"]:
            vmax = state["max_exp_avg_sq"]._data
            np.maximum(vmax, v, out=vmax)
            v = vmax
        np.sqrt(v, out=tmp)  # denom = sqrt(v) / sqrt(bias_correction2) + eps
        tmp /= math.sqrt(bias_correction2)
        tmp += group["eps"]
        np.divide(m, tmp, out=tmp)
        tmp *= -step_size
        p += tmp


class AdamW(Adam):
    """torch.optim.AdamW: Adam with weight decay applied to the parameters, not the gradient."""

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            decoupled_weight_decay=True,
        )
