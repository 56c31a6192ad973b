"""Stochastic gradient descent with momentum, dampening, Nesterov, weight decay, maximize."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ember.optim.optimizer import Optimizer
from ember.tensor import Tensor


class SGD(Optimizer):
    """torch.optim.SGD: p -= lr * (momentum buffer of (grad + weight_decay * p))."""

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
    ) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            maximize=maximize,
        )
        super().__init__(params, defaults)

    def _update(self, p: np.ndarray, g: np.ndarray, state: dict, group: dict) -> None:
        d_p = self._grad(p, g, group)
        momentum = group["momentum"]
        tmp = self._tmp(p)
        if momentum != 0:
            buf_t = state.get("momentum_buffer")
            if buf_t is None:
                buf = np.array(d_p, copy=True)
                state["momentum_buffer"] = Tensor._wrap(buf)
            else:
                buf = buf_t._data
                buf *= momentum
                damp = 1 - group["dampening"]
                if damp == 1:
                    buf += d_p
                else:
                    np.multiply(d_p, damp, out=tmp)
                    buf += tmp
            if group["nesterov"]:
                np.multiply(buf, momentum, out=tmp)
                tmp += d_p
                d_p = tmp
            else:
                d_p = buf
        np.multiply(d_p, -group["lr"], out=tmp)
        p += tmp
