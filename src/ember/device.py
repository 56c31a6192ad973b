"""Devices: 'cpu' (numpy), 'meta' (shapes and dtypes only) and 'cuda' (not installed)."""

from __future__ import annotations

from ember.errors import DeviceError

_TYPES = ("cpu", "meta", "cuda")


class Device:
    """A device such as ember.device('cpu'); compares equal to its string form."""

    __slots__ = ("type", "index")

    def __init__(self, spec: str | Device = "cpu", index: int | None = None) -> None:
        if isinstance(spec, Device):
            spec, index = spec.type, spec.index
        if not isinstance(spec, str):
            raise DeviceError(f"expected a device string like 'cpu', got {spec!r}")
        typ, _, idx = spec.partition(":")
        if typ not in _TYPES:
            raise DeviceError(f"unknown device {spec!r}; expected one of {', '.join(_TYPES)}")
        if idx:
            if not idx.isdigit():
                raise DeviceError(f"bad device index in {spec!r}")
            index = int(idx)
        self.type = typ
        self.index = index

    def __repr__(self) -> str:
        return f"device(type='{self.type}'" + (
            f", index={self.index})" if self.index is not None else ")"
        )

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            try:
                other = Device(other)
            except DeviceError:
                return False
        return isinstance(other, Device) and (self.type, self.index or 0) == (
            other.type,
            other.index or 0,
        )

    def __hash__(self) -> int:
        return hash((self.type, self.index or 0))

    def __enter__(self) -> Device:
        """Make this the default device of factories inside a ``with`` block (torch.device style)."""
        _default_stack.append(as_device(self))
        return self

    def __exit__(self, *exc) -> None:
        _default_stack.pop()


CPU = Device("cpu")
META = Device("meta")
_default_stack: list = [CPU]


def as_device(spec) -> Device:
    """Resolve a device spec to CPU or META; 'cuda' raises DeviceError (no CUDA backend)."""
    if spec is None:
        return _default_stack[-1]
    if spec is CPU:
        return CPU
    if spec is META:
        return META
    d = Device(str(spec) if not isinstance(spec, (str, Device)) else spec)
    if d.type == "cuda":
        raise DeviceError(
            "no CUDA backend is installed: ember runs on 'cpu' here "
            "(ember.cuda_if_available() picks the best device)"
        )
    return CPU if d.type == "cpu" else META


def cuda_is_available() -> bool:
    """Whether a CUDA backend is installed (never, in this build)."""
    return False


def cuda_if_available() -> Device:
    """The CUDA device when a CUDA backend is usable, else the CPU."""
    return CPU
