"""ImageNet-1k class names, shipped as package data (imagenet_labels.tsv: index, synset, label)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

_FILE = Path(__file__).with_name("imagenet_labels.tsv")


@lru_cache(maxsize=1)
def _rows() -> tuple[tuple[str, str], ...]:
    rows = []
    for line in _FILE.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        idx, synset, label = line.split("\t", 2)
        if int(idx) != len(rows):
            raise ValueError(f"{_FILE}: row {idx} out of order")
        rows.append((synset, label))
    return tuple(rows)


def imagenet_labels(synsets: bool = False) -> list[str]:
    """The 1000 ImageNet-1k class names in index order (or their WordNet synset ids)."""
    return [s if synsets else label for s, label in _rows()]
