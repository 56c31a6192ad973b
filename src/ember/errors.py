"""ember's exception hierarchy: every user mistake raises one of these."""

from __future__ import annotations


class EmberError(Exception):
    """Base class of every error ember raises on purpose."""


class ShapeError(EmberError, ValueError):
    """Shapes do not fit the operation (names the op and both shapes)."""


class DTypeError(EmberError, TypeError):
    """A dtype the operation does not accept, or a lossy cast it refuses."""


class DeviceError(EmberError, RuntimeError):
    """Tensors on different devices, or a device that is not available."""


class FormatError(EmberError, ValueError):
    """A file is truncated, corrupt, hostile or of an unknown format."""


class UnsupportedError(EmberError, NotImplementedError):
    """A feature ember does not implement (yet); the message says which."""


class AutogradError(EmberError, RuntimeError):
    """Misuse of autograd: in-place on a leaf that requires grad, backward twice, ..."""
