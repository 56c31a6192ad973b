"""`ember inspect FILE`: format, metadata, tensor table, dtypes and sizes.

Names and metadata come from the file and may hold escape sequences: they are printed through
`ember.cli._text.echo`, which shows control characters as visible escapes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ember.cli._args import existing_file, int_at_least
from ember.cli._text import echo, to_json
from ember.errors import EmberError


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument("file", help=".safetensors, .gguf, or a torch .pt/.pth/.bin checkpoint")
    p.add_argument(
        "--limit", type=int_at_least(0), default=40, help="tensors to list (0 = all; default 40)"
    )
    p.add_argument(
        "--metadata-values",
        type=int_at_least(0),
        default=8,
        metavar="N",
        help="items shown per list-valued metadata entry (0 = all; default 8)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (format, metadata, tensors) within the same limits",
    )


def _short(v, n: int) -> str:
    if isinstance(v, (list, tuple)):
        head = ", ".join(repr(x) for x in (v if n == 0 else v[:n]))
        more = ", ..." if n and len(v) > n else ""
        return f"[{head}{more}] ({len(v)} items)"
    s = repr(v)
    return s if len(s) < 100 else s[:97] + "..."


def _json_value(v, n: int):
    if isinstance(v, (list, tuple)) and n and len(v) > n:
        return {"length": len(v), "head": list(v[:n])}
    return list(v) if isinstance(v, tuple) else v


def table(path: Path) -> tuple[str, dict, list[tuple[str, str, tuple, int]]]:
    """(format, metadata, [(name, dtype, shape, nbytes)]) of a model file."""
    suffix = path.suffix.lower()
    if suffix == ".gguf":
        from ember.io import open_gguf

        f = open_gguf(path)
        rows = [(n, str(t.qtype), tuple(t.shape), t.nbytes) for n, t in f.tensors.items()]
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
    path = existing_file(args.file)
    fmt, meta, rows = table(path)
    total = sum(r[3] for r in rows)
    shown = rows if args.limit == 0 else rows[: args.limit]
    if args.json:
        doc = {
            "file": str(path),
            "format": fmt,
            "file_bytes": path.stat().st_size,
            "tensor_count": len(rows),
            "tensor_bytes": total,
            "metadata": {k: _json_value(v, args.metadata_values) for k, v in meta.items()},
            "tensors": [
                {"name": n, "dtype": dt, "shape": list(shape), "bytes": nb}
                for n, dt, shape, nb in shown
            ],
        }
        echo(to_json(doc))
        return 0
    echo(f"file:     {path}")
    echo(f"format:   {fmt}")
    echo(
        f"size:     {path.stat().st_size / 2**20:.1f} MiB, {len(rows)} tensors, "
        f"{total / 2**20:.1f} MiB of data"
    )
    if meta:
        echo("metadata:")
        for k, v in meta.items():
            echo(f"  {k} = {_short(v, args.metadata_values)}")
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r[1]] = kinds.get(r[1], 0) + 1
    echo("dtypes:   " + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items())))
    echo(f"{'name':48s} {'dtype':9s} {'shape':22s} {'bytes':>12s}")
    for n, dt, shape, nb in shown:
        echo(f"{n:48s} {dt:9s} {str(tuple(shape)):22s} {nb:12,d}")
    if len(shown) < len(rows):
        echo(f"... {len(rows) - len(shown)} more (--limit 0 lists all)")
    return 0
