"""How freed activation memory goes back to the system (glibc's malloc, Linux).

A forward pass allocates and frees arrays of a few MB at every op (a linear layer's output, an
activation, a layer norm). glibc serves those from its heap, but returns the heap's free top to
the system whenever it exceeds a trim threshold (a few MB by default), so the next pass pays a
page fault and a zero fill for every 4 KB it touches again: MiniLM's 32-sentence batch took
8,700 page faults per pass (34 MB), a decode step of an LLM a few hundred. ``keep_freed_memory``
raises glibc's thresholds once, at import, so freed arrays of up to 32 MB stay in the heap for
the next pass (the process keeps its peak working set; arrays above 32 MB still go straight to
and from the system). It is what a caching allocator does in torch or a reused compute buffer in
llama.cpp, by two ``mallopt`` calls.

``EMBER_MALLOC=system`` leaves malloc as it is (see ember.config). Elsewhere than glibc this does
nothing.
"""

from __future__ import annotations

import ctypes
import sys

from ember import config

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # the largest glibc accepts on 64-bit: bigger arrays are mmapped
TRIM_THRESHOLD = 256 << 20  # free heap top kept for reuse before it goes back to the system

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Keep freed arrays of up to 32 MB in glibc's heap for reuse; True where it took effect."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if config.MALLOC != "keep" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this Python runs on
    except (OSError, AttributeError):  # musl and others: no mallopt, nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    _applied = ok
    return ok
