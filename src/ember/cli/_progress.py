"""A progress bar for long CLI jobs: tqdm when installed and stderr is a terminal, else quiet."""

from __future__ import annotations

import sys


def progress(iterable, total: int | None = None, desc: str = "", unit: str = "it"):
    """Wrap an iterable with a progress bar when one can be shown."""
    if sys.stderr.isatty():
        try:
            from tqdm import tqdm

            return tqdm(iterable, total=total, desc=desc, unit=unit, leave=False)
        except ImportError:
            pass
    return iterable
