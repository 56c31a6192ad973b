"""Model files at the numpy level: safetensors, GGUF and PyTorch checkpoints (no torch needed)."""

from ember.io.gguf import GGUFFile, GGUFTensorInfo, open_gguf, save_gguf
from ember.io.safetensors import (
    SafetensorsFile,
    SafetensorsTensorInfo,
    ShardedSafetensors,
    load_safetensors,
    load_safetensors_dir,
    open_safetensors,
    open_safetensors_index,
    save_safetensors,
)
from ember.io.torch_pickle import load_torch

__all__ = [
    "GGUFFile",
    "GGUFTensorInfo",
    "SafetensorsFile",
    "SafetensorsTensorInfo",
    "ShardedSafetensors",
    "load_safetensors",
    "load_safetensors_dir",
    "load_torch",
    "open_gguf",
    "open_safetensors",
    "open_safetensors_index",
    "save_gguf",
    "save_safetensors",
]
