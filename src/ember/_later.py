"""A module named now and imported at first use: how the Tensor class reaches the ops above it.

The ops import ``ember.tensor`` (they build Tensors), so ``ember.tensor`` and its method mixins
cannot import the ops when they load. Each of those modules names the op modules it calls with
``later()``: a stand-in that, on its first attribute access, imports the module and puts it in
its own place in the caller's globals. From then on a method costs what ``module.fn(...)``
costs: one global and one attribute lookup.
"""

from __future__ import annotations

import importlib
from typing import Any


class _Later:
    __slots__ = ("_namespace", "_name", "_module")

    def __init__(self, namespace: dict, name: str, module: str) -> None:
        self._namespace, self._name, self._module = namespace, name, module

    def __getattr__(self, attr: str) -> Any:
        mod = importlib.import_module(self._module)
        self._namespace[self._name] = mod
        return getattr(mod, attr)

    def __repr__(self) -> str:
        return f"<{self._module}, imported at first use>"


def later(namespace: dict, name: str, module: str) -> Any:
    """A stand-in for ``module`` bound to ``namespace[name]``, replaced by the module at first use."""
    return _Later(namespace, name, module)
