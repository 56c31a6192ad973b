"""Adagrad: per-coordinate learning rates from the sum of squared gradients."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ember.optim.optimizer import Optimizer
from ember.tensor import Tensor


class Adagrad(Optimizer):
    """torch.optim.Adagrad (state is created at construction, as in torch)."""

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        *,
        maximize: bool = False,
    ) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if lr_decay < 0.0:
            raise ValueError(f"Invalid lr_decay value: {lr_decay}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if initial_accumulator_value < 0.0:
            raise ValueError(
                f"Invalid initial_accumulator_value value: {initial_accumulator_value}"
            )
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        defaults = dict(
            lr=lr,
            lr_decay=lr_decay,
            eps=eps,
            weight_decay=weight_decay,
            initial_accumulator_value=initial_accumulator_value,
            maximize=maximize,
        )
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p] = self._init_state(p._data, group)

    @staticmethod
    def _init_state(p: np.ndarray, group: dict) -> dict:
        value = group["initial_accumulator_value"]
        return {"step": 0, "sum": Tensor._wrap(np.full(p.shape, value, p.dtype))}

    def _update(self, p: np.ndarray, g: np.ndarray, state: dict, group: dict) -> None:
        if not state:
            state.update(self._init_state(p, group))
        state["step"] += 1
        grad = self._grad(p, g, group)
        clr = group["lr"] / (1 + (state["step"] - 1) * group["lr_decay"])
        acc = state["sum"]._data
        tmp = self._tmp(p)
        np.multiply(grad, grad, out=tmp)
        acc += tmp
        np.sqrt(acc, out=tmp)
        tmp += group["eps"]
        np.divide(grad, tmp, out=tmp)
        tmp *= -clr
        p += tmp
