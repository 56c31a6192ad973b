"""Progress bars for long CLI jobs: tqdm on stderr, shown on a terminal or when asked for."""

from __future__ import annotations

import argparse
import sys


def add_progress_flag(p: argparse.ArgumentParser) -> None:
    """--progress / --no-progress (default: a bar only when stderr is a terminal)."""
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar on stderr (default: only when stderr is a terminal)",
    )


def _wanted(enabled: bool | None) -> bool:
    return sys.stderr.isatty() if enabled is None else enabled


class _NoBar:
    """What `bar` returns when no bar is shown: the same calls, doing nothing."""

    def update(self, n: int = 1) -> None:
        """Nothing."""

    def close(self) -> None:
        """Nothing."""


def bar(total: int, desc: str = "", unit: str = "it", enabled: bool | None = None):
    """A bar advanced by .update(n) and ended by .close(); a silent stand-in when none is shown."""
    if _wanted(enabled):
        try:
            from tqdm import tqdm
        except ImportError:
            if enabled:
                from ember.cli._text import echo

                echo("ember: no progress bar: tqdm is not installed", err=True)
        else:
            return tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr)
    return _NoBar()


def progress(
    iterable,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    enabled: bool | None = None,
):
    """Wrap an iterable with a progress bar when one can be shown."""
    if _wanted(enabled):
        try:
            from tqdm import tqdm

            return tqdm(iterable, total=total, desc=desc, unit=unit, leave=False, file=sys.stderr)
        except ImportError:
            pass
    return iterable
