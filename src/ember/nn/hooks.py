"""Hook handles and the global forward hooks that apply to every Module."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable


class RemovableHandle:
    """Returned by register_*_hook: ``.remove()`` unregisters the hook (also a context manager)."""

    _next_id = 0

    def __init__(self, *dicts: dict) -> None:
        self.id = RemovableHandle._next_id
        RemovableHandle._next_id += 1
        self._dicts = dicts

    def remove(self) -> None:
        """Unregister the hook; calling it twice is harmless."""
        for d in self._dicts:
            d.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


_global_forward_pre_hooks: dict = OrderedDict()
_global_forward_hooks: dict = OrderedDict()


def register_module_forward_pre_hook(hook: Callable) -> RemovableHandle:
    """Run hook(module, args) before every module's forward (torch's global hook)."""
    h = RemovableHandle(_global_forward_pre_hooks)
    _global_forward_pre_hooks[h.id] = hook
    return h


def register_module_forward_hook(hook: Callable) -> RemovableHandle:
    """Run hook(module, args, output) after every module's forward (torch's global hook)."""
    h = RemovableHandle(_global_forward_hooks)
    _global_forward_hooks[h.id] = hook
    return h
