"""`ember inspect FILE`: format, metadata, tensor table, dtypes and sizes."""

from __future__ import annotations

import argparse
from pathlib import Path

from ember.errors import EmberError


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument("file", help=".safetensors, .gguf, or a torch .pt/.pth/.bin checkpoint")
    p.add_argument("--limit", type=int, default=40, help="tensors to list (0 = all)")
    p.add_argument(
        "--metadata-values", type=int, default=8, help="list items shown per metadata value"
    )


def _short(v, n: int) -> str:
    if isinstance(v, (list, tuple)):
        head = ", ".join(repr(x) for x in v[:n])
        return f"[{head}{', ...' if len(v) > n else ''}] ({len(v)} items)"
    s = repr(v)
    return s if len(s) < 100 else s[:97] + "..."


def table(path: Path) -> tuple[str, dict, list[tuple[str, str, tuple, int]]]:
    """(format, metadata, [(name, dtype, shape, nbytes)]) of a model file."""
    suffix = path.suffix.lower()
    if suffix == ".gguf":
        from ember.io import open_gguf

        f = open_gguf(path)
        rows = [(n, t.qtype, t.shape, t.nbytes) for n, t in f.tensors.items()]
        return f"GGUF v{f.version} (alignment {f.alignment})", f.metadata, rows
    if suffix == ".safetensors":
        from ember.io import open_safetensors

        f = open_safetensors(path)
        rows = []
        for n in f.keys():
            a = f.get(n)
            rows.append((n, str(a.dtype), tuple(a.shape), a.nbytes))
        return "safetensors", dict(f.metadata or {}), rows
    if suffix in (".pt", ".pth", ".bin", ".ckpt"):
        from ember.cli.convert import flatten_state
        from ember.io.torch_pickle import load_torch

        arrays = flatten_state(load_torch(path))
        rows = [(n, str(a.dtype), tuple(a.shape), a.nbytes) for n, a in arrays.items()]
        return "PyTorch checkpoint", {}, rows
    raise EmberError(
        f"{path}: unknown model file type {suffix!r} (expected .gguf, .safetensors, .pt/.pth/.bin)"
    )


def run(args) -> int:
    """Print the report."""
    path = Path(args.file)
    if not path.is_file():
        raise EmberError(f"{path}: no such file")
    fmt, meta, rows = table(path)
    total = sum(r[3] for r in rows)
    print(f"file:     {path}")
    print(f"format:   {fmt}")
    print(
        f"size:     {path.stat().st_size / 2**20:.1f} MiB, {len(rows)} tensors, {total / 2**20:.1f} MiB of data"
    )
    if meta:
        print("metadata:")
        for k, v in meta.items():
            print(f"  {k} = {_short(v, args.metadata_values)}")
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r[1]] = kinds.get(r[1], 0) + 1
    print("dtypes:   " + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items())))
    print(f"{'name':48s} {'dtype':9s} {'shape':22s} {'bytes':>12s}")
    shown = rows if args.limit == 0 else rows[: args.limit]
    for n, dt, shape, nb in shown:
        print(f"{n:48s} {dt:9s} {str(tuple(shape)):22s} {nb:12,d}")
    if len(shown) < len(rows):
        print(f"... {len(rows) - len(shown)} more (--limit 0 lists all)")
    return 0
