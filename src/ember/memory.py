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

``allocate`` turns a factory's failed allocation (``ember.empty(2**40, 2**40)``, or one past the
machine's memory) into an ``AllocationError`` that names the shape, dtype and byte size.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ember import config
from ember.errors import EmberError

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


# --------------------------------------------------------------------------- impossible sizes

MAX_ARRAY_BYTES = 2**63 - 1  # numpy's cap on an array's byte size (zero dimensions counted as 1)


class AllocationError(EmberError, MemoryError):
    """A tensor too large to allocate or to describe at all; the message names its size."""


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} YiB"


def allocation_error(op: str, shape: tuple, dtype: Any, cause: BaseException | None = None):
    """The AllocationError for a tensor of shape and dtype that cannot exist or be allocated."""
    dt = np.dtype(dtype)
    n = dt.itemsize
    for d in shape:
        n *= d
    if n == 0:
        why = f"yet numpy cannot describe it (zero dimensions counted as 1, over {MAX_ARRAY_BYTES})"
    elif cause is not None and not isinstance(cause, MemoryError):
        why = f"more than any array can hold ({MAX_ARRAY_BYTES} bytes)"
    else:
        why = "more memory than could be allocated"
    return AllocationError(
        f"{op}: a tensor of shape {list(shape)} and dtype {dt.name} needs {n} bytes "
        f"({_human(n)}), {why}"
    )


def too_large(shape: tuple, itemsize: int) -> bool:
    """Whether numpy refuses this shape outright (its byte size overflows a signed 64-bit int)."""
    n = max(itemsize, 1)
    for d in shape:
        n *= d or 1
    return n > MAX_ARRAY_BYTES


def allocate(make: Callable[[], Any], op: str, shape: tuple, dtype: Any) -> Any:
    """make() (a numpy allocation of shape x dtype); AllocationError naming the size if it fails."""
    try:
        return make()
    except MemoryError as e:
        raise allocation_error(op, shape, dtype, e) from None
    except ValueError as e:  # "array is too big", "iterator is too large", or another mistake
        if too_large(tuple(shape), np.dtype(dtype).itemsize):
            raise allocation_error(op, shape, dtype, e) from None
        raise


def _file_map(a: np.ndarray):
    """(the read-only mmap an array views, its address), or None."""
    import mmap

    base = a
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    if not isinstance(base, mmap.mmap) or not hasattr(base, "madvise") or a.nbytes == 0:
        return None
    try:
        with memoryview(base) as view:
            if not view.readonly:
                return None
        return base, np.frombuffer(base, np.uint8, 1).ctypes.data
    except (ValueError, TypeError):  # closed, or empty
        return None


def file_backed(a: np.ndarray) -> bool:
    """Whether an array is a view of a read-only memory-mapped file (its pages can be dropped
    and read again, see ``release_file_pages``)."""
    return _file_map(a) is not None


def release_file_pages(a: np.ndarray) -> int:
    """Drop this process's resident pages of an array that is a view of a read-only memory map
    (``MADV_DONTNEED``): its resident set shrinks, the file stays mapped, and a later read of
    the array faults its pages back in from the page cache. Returns the bytes released (0 for
    any other array: anonymous memory would lose its contents)."""
    import mmap

    mapped = _file_map(a)
    if mapped is None:
        return 0
    base, start = mapped
    page = mmap.PAGESIZE
    lo = a.ctypes.data - start
    first = -(-lo // page) * page
    last = (lo + a.nbytes) // page * page
    if last <= first:
        return 0
    try:
        base.madvise(mmap.MADV_DONTNEED, first, last - first)
    except (OSError, ValueError):
        return 0
    return last - first
