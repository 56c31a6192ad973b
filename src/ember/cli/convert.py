"""`ember convert SRC DST`: between torch checkpoints, safetensors, GGUF and Hugging Face folders."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ember.cli._text import echo
from ember.errors import EmberError, FormatError, UnsupportedError

GGUF_META_KEY = "gguf.metadata"  # safetensors metadata entry carrying GGUF metadata as JSON
_TORCH = (".pt", ".pth", ".bin", ".ckpt")
_FLOAT_DTYPES = ("float32", "float16", "bfloat16")
# the quantize types, spelled out for --help (ember.quant.QUANTIZE_TYPES, checked by a test)
QUANTIZE_HELP = "f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q6_k"

EPILOG = (
    """\
conversions (picked from SRC and DST):
  .pt/.pth/.bin/.ckpt  -> .safetensors   torch checkpoint, read without torch
  .gguf                -> .safetensors   dequantized, GGUF names, GGUF metadata kept
  .gguf                -> FOLDER         Hugging Face folder: config.json, model.safetensors,
                                         tokenizer.json, tokenizer_config.json,
                                         generation_config.json (llama, mistral, qwen2, qwen3)
  FOLDER | .safetensors -> .gguf         llama.cpp's names, metadata and vocabulary (a
                                         safetensors file needs config.json and tokenizer.json
                                         beside it, unless it came from a GGUF)
  .gguf                -> .gguf          re-encoded (--quantize or --dtype), metadata kept

--quantize types: """
    + QUANTIZE_HELP
    + """
  1-D tensors (norms, biases) stay F32 and matrices whose rows do not split into whole blocks
  stay float, as in llama.cpp; the command lists them.
--dtype types: float32, float16, bfloat16"""
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    p.add_argument("src", help="input: .pt/.pth/.bin/.ckpt, .safetensors, .gguf or a folder")
    p.add_argument("dst", help="output: .safetensors, .gguf, or a folder (Hugging Face layout)")
    p.add_argument("--quantize", metavar="QTYPE", help=f"with a .gguf output: {QUANTIZE_HELP}")
    p.add_argument(
        "--dtype",
        default=None,
        help="float type of the float outputs: float32, float16, bfloat16 (default: keep; "
        "GGUF -> float32)",
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


def _kind(path: Path, role: str) -> str:
    """'torch', 'safetensors', 'gguf' or 'folder' for SRC/DST; EmberError when it cannot be."""
    suffix = path.suffix.lower()
    if role == "src":
        if not path.exists():
            raise EmberError(f"{path}: no such file or folder")
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise FormatError(
                    f"{path}: a folder without config.json (expected a Hugging Face model folder)"
                )
            return "folder"
        if not path.is_file():
            raise EmberError(f"{path}: not a regular file")
    kinds = {".gguf": "gguf", ".safetensors": "safetensors", **dict.fromkeys(_TORCH, "torch")}
    if suffix in kinds:
        if role == "dst" and path.is_dir():
            raise EmberError(f"{path}: is a folder, but a {suffix} file is to be written there")
        return kinds[suffix]
    if role == "dst" and (path.is_dir() or not path.exists()) and not suffix:
        return "folder"
    if role == "dst" and path.exists() and not path.is_dir():
        raise EmberError(f"{path}: is a file, but a folder output is a folder")
    raise UnsupportedError(
        f"{path}: unknown {'input' if role == 'src' else 'output'} type {suffix or '(none)'}; "
        "expected .pt/.pth/.bin/.ckpt, .safetensors, .gguf or a folder"
    )


def run(args) -> int:
    """Check the arguments, pick the conversion from SRC and DST, report what was written."""
    src, dst = Path(args.src), Path(args.dst)
    s, d = _kind(src, "src"), _kind(dst, "dst")
    if d != "folder" and not dst.parent.is_dir():
        raise EmberError(f"{dst.parent}: no such folder to write {dst.name} in")
    if src.resolve() == dst.resolve():
        raise EmberError(f"{src}: the output would overwrite the input")
    if args.dtype is not None:
        from ember.dtypes import get_dtype

        if get_dtype(args.dtype).name not in _FLOAT_DTYPES:
            raise UnsupportedError(
                f"--dtype {args.dtype}: expected one of {', '.join(_FLOAT_DTYPES)}"
            )
    if args.quantize is not None and d != "gguf":
        raise UnsupportedError(f"--quantize writes GGUF blocks; {dst} is not a .gguf output")
    report = None
    if s == "torch" and d == "safetensors":
        n = torch_to_safetensors(src, dst, args.dtype)
    elif s in ("safetensors", "folder") and d == "gguf":
        from ember.convert import hf_to_gguf

        report = hf_to_gguf(src, dst, args.quantize, args.dtype)
        n = len(report.types)
    elif s == "gguf" and d == "gguf":
        from ember.convert import requantize_gguf

        report = requantize_gguf(src, dst, args.quantize, args.dtype)
        n = len(report.types)
    elif s == "gguf" and d == "safetensors":
        n = gguf_to_safetensors(src, dst, args.dtype)
    elif s == "gguf" and d == "folder":
        from ember.convert import gguf_to_hf

        n = gguf_to_hf(src, dst, args.dtype)
    else:
        raise UnsupportedError(
            f"cannot convert {s} -> {d}; supported: torch checkpoint -> .safetensors, "
            ".gguf -> .safetensors, .gguf -> folder, .gguf -> .gguf, folder or .safetensors -> "
            ".gguf "
            "(see ember convert --help)"
        )
    echo(f"wrote {dst} ({n} tensors)")
    for line in report.lines() if report is not None else ():
        echo(line)
    return 0
