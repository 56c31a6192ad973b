"""Argument types that check their values as they are parsed, and path checks.

A bad value becomes argparse's own error ("argument --top-p: must be in (0, 1], got 1.5"),
which `ember.cli.main` prints as one line before any model is loaded.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

from ember.errors import EmberError


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= low."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}")
        return v

    parse.__name__ = f"integer >= {low}"
    return parse


def finite_float(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> Callable[[str], float]:
    """An argparse type: a finite float in the interval given (open or closed at each end)."""
    lo = "(" if low_open else "["
    hi = ")" if high_open else "]"
    if low is not None and high is not None:
        want = f"in {lo}{low:g}, {high:g}{hi}"
    elif low is not None:
        want = f"{'>' if low_open else '>='} {low:g}"
    elif high is not None:
        want = f"{'<' if high_open else '<='} {high:g}"
    else:
        want = "a finite number"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        ok = math.isfinite(v)
        if ok and low is not None:
            ok = v > low if low_open else v >= low
        if ok and high is not None:
            ok = v < high if high_open else v <= high
        if not ok:
            raise argparse.ArgumentTypeError(f"must be {want}, got {text}")
        return v

    parse.__name__ = want
    return parse


def non_empty(what: str) -> Callable[[str], str]:
    """An argparse type: any string but the empty one."""

    def parse(text: str) -> str:
        if text == "":
            raise argparse.ArgumentTypeError(f"{what} must not be empty")
        return text

    parse.__name__ = what
    return parse


def _label(path: str | Path, flag: str) -> str:
    return f"{flag} {str(path)!r}" if flag else repr(str(path))


def existing_file(path: str | Path, flag: str = "") -> Path:
    """`path` as a Path, or an EmberError (naming `flag`) when it is missing or a folder."""
    p = Path(path).expanduser()
    if not p.exists():
        raise EmberError(f"{_label(path, flag)}: no such file")
    if p.is_dir():
        raise EmberError(f"{_label(path, flag)} is a folder; expected a file")
    return p


def existing_dir(path: str | Path, flag: str = "") -> Path:
    """`path` as a Path, or an EmberError (naming `flag`) when it is missing or a file."""
    p = Path(path).expanduser()
    if not p.exists():
        raise EmberError(f"{_label(path, flag)}: no such folder")
    if not p.is_dir():
        raise EmberError(f"{_label(path, flag)} is a file; expected a folder")
    return p


def writable_file(path: str | Path, flag: str = "") -> Path:
    """`path` as a Path to write, or an EmberError when it is a folder or its folder is missing."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise EmberError(f"{_label(path, flag)} is a folder; expected a file name")
    if not p.parent.is_dir():
        raise EmberError(f"{_label(path, flag)}: folder {str(p.parent)!r} does not exist")
    return p
