"""Optimizer base class: param groups, zero_grad, and torch-shaped state_dict / load_state_dict.

Subclasses implement ``_update(p, g, state, group)`` on numpy arrays: ``p`` is the parameter's
array (updated in place), ``g`` its gradient (never written), ``state`` the per-parameter dict.
State tensors are allocated once and updated with in-place ufuncs (``out=``), so a step does
not reallocate them.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ember.autograd import no_grad
from ember.errors import EmberError
from ember.tensor import Tensor


class _Required:
    """Marker for an option that has no default (torch.optim.optimizer.required)."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _Required()


def _as_array(value: Any) -> Any:
    return value._data if isinstance(value, Tensor) else value


class Optimizer:
    """Base class of all optimizers (torch.optim.Optimizer)."""

    def __init__(self, params: Iterable, defaults: dict[str, Any]) -> None:
        self.defaults = dict(defaults)
        self.state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        if isinstance(params, Tensor):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Tensors or "
                f"dicts, but got {type(params).__name__}"
            )
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)
        self._scratch: dict[int, np.ndarray] = {}

    # ------------------------------------------------------------------ groups
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters with its own options (missing ones take the defaults)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, got {type(param_group).__name__}")
        group = dict(param_group)
        params = group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections")
        params = list(params)
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, got {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        group["params"] = params
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise ValueError(
                    f"parameter group didn't specify a value of required option {name}"
                )
            group.setdefault(name, default)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if len({id(p) for p in params}) != len(params):
            raise ValueError("optimizer contains a parameter group with duplicate parameters")
        if any(id(p) in seen for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for k in sorted(g):
                if k != "params":
                    lines.append(f"    {k}: {g[k]}")
        lines.append(")")
        return "\n".join(lines)

    # ------------------------------------------------------------------ gradients
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's gradient: drop it (default) or fill it with zeros."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    g = p.grad._data
                    if g.flags.writeable:
                        g.fill(0)
                    else:
                        p.grad = Tensor._wrap(np.zeros(g.shape, g.dtype), p.grad._device)

    # ------------------------------------------------------------------ stepping
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that has a gradient; returns closure() if given."""
        loss = None
        if closure is not None:
            from ember.autograd import enable_grad

            with enable_grad():
                loss = closure()
        with no_grad():
            for group in self.param_groups:
                self._prepare_group(group)
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    g = p.grad._data
                    arr = p._data
                    if not arr.flags.writeable:  # e.g. a memory-mapped checkpoint view
                        arr = p._data = np.array(arr)
                    if g.shape != arr.shape:
                        raise EmberError(
                            f"{type(self).__name__}: gradient of shape {g.shape} for a parameter "
                            f"of shape {arr.shape}"
                        )
                    state = self.state.get(p)
                    if state is None:
                        state = {}
                        self._update(arr, g, state, group)
                        if state:
                            self.state[p] = state
                    else:
                        self._update(arr, g, state, group)
        return loss

    def _prepare_group(self, group: dict[str, Any]) -> None:
        """Hook run once per group per step (validation of options)."""

    def _update(self, p: np.ndarray, g: np.ndarray, state: dict, group: dict) -> None:
        raise NotImplementedError

    def _tmp(self, p: np.ndarray, slot: int = 0) -> np.ndarray:
        """A scratch array shaped like p, reused across steps (not part of the state)."""
        key = (id(p), slot)
        buf = self._scratch.get(key)
        if buf is None or buf.shape != p.shape or buf.dtype != p.dtype:
            buf = self._scratch[key] = np.empty_like(p)
        return buf

    def _grad(
        self, p: np.ndarray, g: np.ndarray, group: dict, wd: float | None = None
    ) -> np.ndarray:
        """The gradient after `maximize` (negation) and L2 weight decay, in a scratch buffer."""
        if wd is None:
            wd = group.get("weight_decay", 0)
        maximize = group.get("maximize", False)
        if not wd and not maximize:
            return g if g.dtype == p.dtype else g.astype(p.dtype)
        out = self._tmp(p, 1)
        if not wd:
            return np.negative(g, out=out)
        np.multiply(p, wd, out=out)  # torch: grad.add(param, alpha=weight_decay)
        if maximize:
            out -= g
        else:
            out += g
        return out

    @staticmethod
    def _zeros(p: np.ndarray) -> Tensor:
        return Tensor._wrap(np.zeros(p.shape, p.dtype))

    # ------------------------------------------------------------------ state dict
    def state_dict(self) -> dict[str, Any]:
        """{'state': {param_index: {...}}, 'param_groups': [{options..., 'params': [indices]}]}."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            ids = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            packed["params"] = ids
            groups.append(packed)
        state = {index[id(p)]: s for p, s in self.state.items() if id(p) in index and s}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state_dict from this optimizer type (tensors are copied and cast)."""
        saved_groups = copy.deepcopy(state_dict["param_groups"])
        groups = self.param_groups
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(groups, saved_groups)):
            raise ValueError(
                "loaded state dict contains a parameter group that doesn't match the size of "
                "optimizer's group"
            )
        id_map = {
            int(i): p
            for s, g in zip(saved_groups, groups)
            for i, p in zip(s["params"], g["params"])
        }
        new_state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        for k, v in state_dict["state"].items():
            p = id_map.get(int(k))
            if p is None:
                continue
            new_state[p] = {key: self._cast_state(p, key, val) for key, val in v.items()}
        self.state = new_state
        new_groups = []
        for s, g in zip(saved_groups, groups):
            s["params"] = g["params"]
            if "betas" in s and isinstance(s["betas"], list):
                s["betas"] = tuple(s["betas"])
            new_groups.append(s)
        self.param_groups = new_groups
        self._scratch.clear()

    @staticmethod
    def _cast_state(p: Tensor, key: str, value: Any) -> Any:
        arr = _as_array(value)
        if isinstance(arr, np.ndarray):
            if key == "step":
                return int(arr.reshape(()).item()) if arr.size == 1 else arr.copy()
            dt = p._data.dtype if p._data.dtype.kind == "f" else arr.dtype
            out = np.array(arr, dtype=dt, copy=True)
            if out.shape != p._data.shape and out.size == p._data.size:
                out = out.reshape(p._data.shape)
            return Tensor._wrap(out)
        if key == "step" and isinstance(value, float) and value.is_integer():
            return int(value)
        return copy.deepcopy(value)
