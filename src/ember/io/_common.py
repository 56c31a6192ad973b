"""Helpers shared by the readers and writers: mapping files, error messages, atomic writes."""

from __future__ import annotations

import contextlib
import functools
import json
import mmap
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from ember.errors import FormatError

# numpy refuses arrays whose element count does not fit in a signed 64-bit index.
MAX_ELEMENTS = 2**62
# ... and arrays whose byte size (zero dimensions counted as 1) does not fit in one either.
MAX_ARRAY_BYTES = 2**63 - 1


@functools.cache
def np_dtype(code: str) -> np.dtype:
    """A numpy dtype from its code ('<f4'), or 'ml_dtypes.X' (ml_dtypes imported only then)."""
    if code.startswith("ml_dtypes."):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, code.removeprefix("ml_dtypes.")))
    return np.dtype(code)


class LazyDTypes(Mapping):
    """A name -> numpy dtype table whose ml_dtypes entries are resolved when first looked up."""

    def __init__(self, codes: dict[str, str]) -> None:
        self.codes = codes

    def __getitem__(self, name: str) -> np.dtype:
        return np_dtype(self.codes[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self.codes)

    def __len__(self) -> int:
        return len(self.codes)

    def __contains__(self, name: object) -> bool:
        return name in self.codes

    def name_of(self, dt: np.dtype) -> str | None:
        """The table's name for a numpy dtype, or None."""
        for name, code in self.codes.items():
            # an array of an ml_dtypes type means ml_dtypes is imported already
            if (not code.startswith("ml_dtypes.") or "ml_dtypes" in sys.modules) and np_dtype(
                code
            ) == dt:
                return name
        return None


def read_json_object(path: str | os.PathLike, missing: dict | None = None) -> dict:
    """A JSON object from a file; ``missing`` (a copy) when the file does not exist, if given.
    A missing file without it, broken JSON or another JSON value: FormatError naming the file."""
    path = Path(path)
    if not path.is_file():
        if missing is not None:
            return dict(missing)
        raise FormatError(f"{path}: no such file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise FormatError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


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


def checked_numel(
    shape: tuple[int, ...], path: str | os.PathLike, what: str, itemsize: int = 1
) -> int:
    """Element count of `shape` in exact integers; FormatError when numpy cannot hold it.

    numpy refuses a shape whose element count, or whose byte size at `itemsize` bytes an item,
    overflows a signed 64-bit integer, even when a dimension is 0 (it counts zeros as ones).
    """
    n = nonzero = 1
    for d in shape:
        n *= d
        nonzero *= d or 1
    if nonzero >= MAX_ELEMENTS or nonzero * max(itemsize, 1) > MAX_ARRAY_BYTES:
        raise fail(
            path,
            f"{what}: shape {list(shape)} of {itemsize}-byte items is too large for any array "
            f"(limit: {MAX_ARRAY_BYTES} bytes, zero dimensions counted as 1)",
        )
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
