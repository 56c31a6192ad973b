"""Helpers shared by the readers and writers: mapping files, error messages, atomic writes."""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

from ember.errors import FormatError

# numpy refuses arrays whose element count does not fit in a signed 64-bit index.
MAX_ELEMENTS = 2**62


def fail(path: str | os.PathLike, message: str, offset: int | None = None) -> FormatError:
    """Build a FormatError that names the file and, when known, the byte offset."""
    where = f" (at byte {offset})" if offset is not None else ""
    return FormatError(f"{os.fspath(path)}: {message}{where}")


def map_file(path: str | os.PathLike, min_size: int, what: str) -> tuple[mmap.mmap, int]:
    """Map a whole file read-only; FormatError if it is shorter than `min_size` bytes."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < min_size:
            raise fail(
                path, f"file is {size} bytes long; a {what} file has at least {min_size} bytes"
            )
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), size


def checked_numel(shape: tuple[int, ...], path: str | os.PathLike, what: str) -> int:
    """Element count of `shape` in exact integers; FormatError when numpy cannot index it."""
    n = nonzero = 1
    for d in shape:
        n *= d
        nonzero *= d or 1
    if nonzero >= MAX_ELEMENTS:  # numpy refuses such shapes even when a dimension is 0
        raise fail(path, f"{what}: shape {list(shape)} is too large for any array")
    return n


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it over `path` only if the block succeeds."""
    final = Path(path)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
