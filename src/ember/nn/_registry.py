"""The dict behind Module._parameters/_buffers/_modules: every write is mirrored into __dict__."""

from __future__ import annotations


class _Registry(dict):
    """A name -> value dict that mirrors every write into its module's ``__dict__``."""

    __slots__ = ("_mirror",)

    def __init__(self, mirror: dict, items=()) -> None:
        super().__init__()
        self._mirror = mirror
        for k, v in items:
            self[k] = v

    def __setitem__(self, key, value) -> None:
        dict.__setitem__(self, key, value)
        self._mirror[key] = value

    def __delitem__(self, key) -> None:
        dict.__delitem__(self, key)
        self._mirror.pop(key, None)

    def pop(self, key, *default):
        """Remove key (and its mirror) and return its value."""
        if key in self:
            self._mirror.pop(key, None)
        return dict.pop(self, key, *default)

    def popitem(self):
        """Remove the last item (and its mirror)."""
        k, v = dict.popitem(self)
        self._mirror.pop(k, None)
        return k, v

    def setdefault(self, key, default=None):
        """Insert key with default if absent; return its value."""
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args, **kwargs) -> None:
        """Insert many items, mirroring each."""
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def clear(self) -> None:
        """Remove every item and its mirror."""
        for k in list(self):
            self._mirror.pop(k, None)
        dict.clear(self)

    def __reduce__(self):
        return (dict, (dict(self),))
