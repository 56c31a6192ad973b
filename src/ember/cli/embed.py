"""`ember embed "text" ...`: sentence embeddings (bundled all-MiniLM-L6-v2 by default).

ember embed "A cat sits on the mat." "A dog runs."       # one vector per line
ember embed --summary "first" "second"                    # shapes, norms, cosine matrix
cat lines.txt | ember embed - --output vectors.npy        # one text per input line
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from ember.errors import EmberError


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument(
        "texts", nargs="+", metavar="TEXT", help="texts to embed; '-' reads one per line from stdin"
    )
    p.add_argument(
        "--model", help="sentence-transformers or BERT folder (default: bundled all-MiniLM-L6-v2)"
    )
    p.add_argument("--batch-size", type=int, default=32, help="texts per forward pass (default 32)")
    p.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="unit-length vectors (default: as the model's pipeline says)",
    )
    p.add_argument(
        "--output", "-o", help="write the vectors to a .npy or .json file instead of printing them"
    )
    p.add_argument(
        "--summary",
        action="store_true",
        help="print shapes, norms and cosine similarities, not vectors",
    )
    p.add_argument("--threads", type=int, help="threads for BLAS and kernels (default: all cores)")


def read_texts(args_texts: list[str], stdin=None) -> list[str]:
    """The texts: arguments as given, '-' replaced by the non-empty lines of stdin."""
    out = []
    for t in args_texts:
        if t == "-":
            stream = stdin if stdin is not None else sys.stdin
            out += [line.rstrip("\r\n") for line in stream if line.strip()]
        else:
            out.append(t)
    return out


def _preview(text: str, n: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def summary(texts: list[str], emb: np.ndarray, model_path: str) -> str:
    """Shape, per-text norm and first values, and the cosine matrix for up to 8 texts."""
    lines = [f"model: {model_path}", f"embeddings: {emb.shape[0]} x {emb.shape[1]} float32"]
    for i, (t, v) in enumerate(zip(texts, emb)):
        head = " ".join(f"{x:+.4f}" for x in v[:4])
        lines.append(f"[{i}] norm {np.linalg.norm(v):.4f}  [{head} ...]  {_preview(t)!r}")
    if 1 < len(texts) <= 8:
        from ember.models.sentence import SentenceTransformer

        sim = SentenceTransformer.similarity(emb, emb)
        lines.append("cosine similarity:")
        lines.append("      " + " ".join(f"[{j}]".rjust(6) for j in range(len(texts))))
        for i, row in enumerate(sim):
            lines.append(f"[{i}]".ljust(6) + " ".join(f"{x:6.3f}" for x in row))
    return "\n".join(lines)


def write(path: str, texts: list[str], emb: np.ndarray, model_path: str, normalized: bool) -> None:
    """Save as .npy (the matrix) or .json (texts, vectors and the model)."""
    p = Path(path)
    if p.suffix == ".npy":
        np.save(p, emb)
    elif p.suffix == ".json":
        doc = {
            "model": model_path,
            "dimension": int(emb.shape[1]),
            "normalized": normalized,
            "texts": texts,
            "embeddings": emb.tolist(),
        }
        p.write_text(json.dumps(doc))
    else:
        raise EmberError(f"--output {path!r}: use a .npy or .json file name")


def run(args) -> int:
    """Embed the texts and print or save the vectors."""
    import ember
    from ember.models.sentence import SentenceTransformer

    if args.threads:
        ember.set_num_threads(args.threads)
    texts = read_texts(args.texts)
    if not texts:
        raise EmberError("no texts to embed (stdin was empty)")
    if args.batch_size < 1:
        raise EmberError(f"--batch-size must be >= 1, got {args.batch_size}")
    model = SentenceTransformer(args.model)
    emb = model.encode(texts, batch_size=args.batch_size, normalize_embeddings=args.normalize)
    normalized = model.normalize if args.normalize is None else args.normalize
    if args.output:
        write(args.output, texts, emb, str(model.path), bool(normalized))
        print(f"wrote {emb.shape[0]} x {emb.shape[1]} embeddings to {args.output}", file=sys.stderr)
    if args.summary:
        print(summary(texts, emb, str(model.path)))
    elif not args.output:
        for v in emb:
            print(" ".join(f"{x:.6g}" for x in v))
    return 0
