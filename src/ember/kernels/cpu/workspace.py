"""Named scratch arrays kept from one call to the next, so that their memory stays mapped.

A large fresh numpy array is new memory from the OS (glibc maps big blocks and returns them when
they are freed): the first write to each 4 KB page faults. On the development VM that is about
1.3 us per page, which was 45 ms of a 225 ms Whisper encoder pass (140 MB of intermediates:
GEMM outputs, packed weights, packed keys and values). Inference paths that run the same shapes
again and again take their intermediates from a Workspace instead.

    ws = workspace.local()                     # this thread's workspace
    h = ws("h", (tokens, d_model))             # uninitialised; the same array next time

An array from a workspace is only valid until the next request of the same name: results
returned to a caller must be fresh arrays.
"""

from __future__ import annotations

import threading

import numpy as np

_local = threading.local()


class Workspace:
    """Float32 (or other) buffers by name, reused while the shape and dtype stay the same."""

    def __init__(self, max_buffers: int = 64) -> None:
        self.max_buffers = max_buffers
        self._bufs: dict = {}

    def __call__(self, name: str, shape: tuple, dtype=np.float32) -> np.ndarray:
        """An uninitialised array for name (the one given last time if shape and dtype match)."""
        shape = tuple(int(s) for s in shape)
        dt = np.dtype(dtype)
        buf = self._bufs.get(name)
        if buf is None or buf.shape != shape or buf.dtype != dt:
            if len(self._bufs) >= self.max_buffers:
                self._bufs.clear()  # many names: something allocates in a loop; start over
            buf = self._bufs[name] = np.empty(shape, dt)
        return buf

    def nbytes(self) -> int:
        """Bytes held."""
        return sum(b.nbytes for b in self._bufs.values())

    def clear(self) -> None:
        """Drop every buffer (the memory goes back to the allocator)."""
        self._bufs.clear()


def local() -> Workspace:
    """The calling thread's workspace (kernels' internal scratch and inference paths)."""
    ws = getattr(_local, "ws", None)
    if ws is None:
        ws = _local.ws = Workspace()
    return ws
