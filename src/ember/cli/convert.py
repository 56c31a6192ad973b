"""`ember convert SRC DST`: pt/pth/bin -> safetensors, safetensors <-> GGUF, GGUF -> HF folder."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ember.errors import EmberError, UnsupportedError

GGUF_META_KEY = "gguf.metadata"  # safetensors metadata entry carrying GGUF metadata as JSON


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument("src", help="input: .pt/.pth/.bin, .safetensors or .gguf")
    p.add_argument(
        "dst", help="output: .safetensors, .gguf, or a folder (GGUF -> Hugging Face layout)"
    )
    p.add_argument(
        "--quantize", metavar="QTYPE", help="with a .gguf output: q8_0, q4_0, q4_1, q4_k, q6_k"
    )
    p.add_argument(
        "--dtype",
        default=None,
        help="float dtype for float outputs (default: keep; GGUF -> float32)",
    )


def flatten_state(obj, prefix: str = "") -> dict[str, np.ndarray]:
    """Nested dicts/lists of arrays from a checkpoint -> {'a.b.0': array}."""
    out: dict[str, np.ndarray] = {}
    if isinstance(obj, np.ndarray):
        out[prefix.rstrip(".")] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten_state(v, f"{prefix}{k}."))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flatten_state(v, f"{prefix}{i}."))
    return out


def _cast(arrays: dict, dtype: str | None) -> dict:
    if not dtype:
        return arrays
    from ember.dtypes import get_dtype

    dt = get_dtype(dtype).np
    return {
        k: v.astype(dt) if v.dtype.kind == "f" or v.dtype.name == "bfloat16" else v
        for k, v in arrays.items()
    }


def torch_to_safetensors(src: Path, dst: Path, dtype: str | None = None) -> int:
    """A torch checkpoint (no torch needed) -> safetensors; returns the tensor count."""
    from ember.io import save_safetensors
    from ember.io.torch_pickle import load_torch

    arrays = _cast(flatten_state(load_torch(src)), dtype)
    if not arrays:
        raise EmberError(f"{src}: no tensors found in the checkpoint")
    save_safetensors(
        {k: np.ascontiguousarray(v) for k, v in arrays.items()}, dst, metadata={"format": "pt"}
    )
    return len(arrays)


def gguf_to_safetensors(src: Path, dst: Path, dtype: str | None = None) -> int:
    """GGUF -> safetensors, dequantized, same tensor names, GGUF metadata kept as JSON."""
    from ember.cli._progress import progress
    from ember.io import open_gguf, save_safetensors
    from ember.quant import dequantize

    f = open_gguf(src)
    arrays = {}
    for name, info in progress(f.tensors.items(), len(f.tensors), "dequantize", "tensor"):
        arrays[name] = (
            dequantize(info.data, info.qtype, info.shape)
            if info.is_quantized
            else np.array(info.data)
        )
    meta = {
        GGUF_META_KEY: json.dumps(
            {"metadata": f.metadata, "types": f.metadata_types}, default=_jsonable
        )
    }
    save_safetensors(_cast(arrays, dtype), dst, metadata=meta)
    return len(arrays)


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(type(x).__name__)


def safetensors_to_gguf(src: Path, dst: Path, quantize: str | None = None) -> int:
    """safetensors -> GGUF; 2-D float tensors whose rows fit the block size get quantized."""
    from ember.cli._progress import progress
    from ember.io import open_safetensors, save_gguf
    from ember.quant import QUANTIZE_TYPES, block_format, quantize_array

    f = open_safetensors(src)
    meta, types = {}, {}
    if GGUF_META_KEY in (f.metadata or {}):
        blob = json.loads(f.metadata[GGUF_META_KEY])
        meta, types = blob["metadata"], blob["types"]
    meta.setdefault("general.architecture", "unknown")
    qt = quantize.upper() if quantize else None
    if qt and qt not in QUANTIZE_TYPES:
        raise UnsupportedError(
            f"--quantize {quantize}: supported are {', '.join(sorted(QUANTIZE_TYPES))}"
        )
    tensors = {}
    for name in progress(f.keys(), len(f.keys()), "convert", "tensor"):
        a = np.asarray(f.get(name))
        if (
            qt
            and a.ndim == 2
            and a.dtype.kind == "f"
            and a.shape[1] % block_format(qt).block_size == 0
        ):
            tensors[name] = (quantize_array(a.astype(np.float32), qt), qt, a.shape)
        else:
            tensors[name] = np.ascontiguousarray(
                a.astype(np.float32) if a.dtype.name == "bfloat16" else a
            )
    save_gguf(dst, meta, tensors, metadata_types=types)
    return len(tensors)


def gguf_to_hf(src: Path, dst: Path, dtype: str | None = None) -> int:
    """GGUF (llama family) -> a Hugging Face folder: config.json + model.safetensors (HF names)."""
    from ember.io import open_gguf, save_safetensors
    from ember.models.auto import config_from_gguf, gguf_to_hf_name
    from ember.quant import dequantize

    f = open_gguf(src)
    cfg = config_from_gguf(f.metadata, set(f.tensors))
    arrays = {}
    for name, info in f.tensors.items():
        arrays[gguf_to_hf_name(name)] = (
            dequantize(info.data, info.qtype, info.shape)
            if info.is_quantized
            else np.array(info.data)
        )
    dst.mkdir(parents=True, exist_ok=True)
    save_safetensors(_cast(arrays, dtype), dst / "model.safetensors", metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return len(arrays)


def run(args) -> int:
    """Pick the conversion from the file suffixes."""
    src, dst = Path(args.src), Path(args.dst)
    if not src.is_file():
        raise EmberError(f"{src}: no such file")
    s, d = src.suffix.lower(), dst.suffix.lower()
    if s in (".pt", ".pth", ".bin", ".ckpt") and d == ".safetensors":
        n = torch_to_safetensors(src, dst, args.dtype)
    elif s == ".safetensors" and d == ".gguf":
        n = safetensors_to_gguf(src, dst, args.quantize)
    elif s == ".gguf" and d == ".safetensors":
        n = gguf_to_safetensors(src, dst, args.dtype)
    elif s == ".gguf" and d == "":
        n = gguf_to_hf(src, dst, args.dtype)
    else:
        raise UnsupportedError(
            f"cannot convert {s or 'folder'} -> {d or 'folder'}; supported: pt/pth/bin -> safetensors, "
            "safetensors -> gguf (--quantize), gguf -> safetensors, gguf -> folder (Hugging Face layout)"
        )
    print(f"wrote {dst} ({n} tensors)")
    return 0
