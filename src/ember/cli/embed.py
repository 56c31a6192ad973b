"""`ember embed "text" ...`: sentence embeddings (bundled all-MiniLM-L6-v2 by default).

ember embed "A cat sits on the mat." "A dog runs."       # one vector per line
ember embed --summary "first" "second"                    # shapes, norms, cosine matrix
cat lines.txt | ember embed - --output vectors.npy        # one text per input line
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ember.cli._args import existing_dir, int_at_least, writable_file
from ember.cli._progress import add_progress_flag, bar
from ember.cli._text import check_utf8, echo, read_stdin, to_json
from ember.errors import EmberError


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument(
        "texts", nargs="+", metavar="TEXT", help="texts to embed; '-' reads one per line from stdin"
    )
    p.add_argument(
        "--model", help="sentence-transformers or BERT folder (default: bundled all-MiniLM-L6-v2)"
    )
    p.add_argument(
        "--batch-size",
        type=int_at_least(1),
        default=32,
        help="texts per forward pass (default 32)",
    )
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
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (model, dimension, texts, embeddings)",
    )
    p.add_argument(
        "--threads", type=int_at_least(1), help="threads for BLAS and kernels (default: all cores)"
    )
    add_progress_flag(p)


def read_texts(args_texts: list[str]) -> list[str]:
    """The texts: arguments as given, '-' replaced by the non-empty lines of stdin."""
    if args_texts.count("-") > 1:
        raise EmberError("'-' (stdin) can be given once")
    out = []
    for i, t in enumerate(args_texts, 1):
        if t == "-":
            lines = (line.removesuffix("\r") for line in read_stdin().split("\n"))
            out += [line for line in lines if line.strip()]
        elif not t.strip():
            raise EmberError(f"TEXT {i} is empty")
        else:
            out.append(check_utf8(t, f"TEXT {i}"))
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


def document(texts: list[str], emb: np.ndarray, model_path: str, normalized: bool) -> dict:
    """The JSON form: model, dimension, normalized, texts and embeddings."""
    return {
        "model": model_path,
        "dimension": int(emb.shape[1]),
        "normalized": normalized,
        "texts": texts,
        "embeddings": emb.tolist(),
    }


def check_output(path: str) -> Path:
    """The --output path, checked before any work: a .npy or .json file in an existing folder."""
    p = writable_file(path, "--output")
    if p.suffix not in (".npy", ".json"):
        raise EmberError(f"--output {path!r}: use a .npy or .json file name")
    return p


def write(path: str, texts: list[str], emb: np.ndarray, model_path: str, normalized: bool) -> None:
    """Save as .npy (the matrix) or .json (texts, vectors and the model)."""
    p = check_output(path)
    if p.suffix == ".npy":
        np.save(p, emb)
    else:
        p.write_text(to_json(document(texts, emb, model_path, normalized)))


def encode(model, texts: list[str], args) -> np.ndarray:
    """The embeddings, batch by batch, with a progress bar when there are several batches."""
    n, bs = len(texts), args.batch_size
    chunks = range(0, n, bs)
    shown = args.progress if args.progress is not None else (None if len(chunks) > 1 else False)
    progress = bar(n, "embed", "text", shown)
    parts = []
    try:
        for s in chunks:
            part = texts[s : s + bs]
            parts.append(model.encode(part, batch_size=bs, normalize_embeddings=args.normalize))
            progress.update(len(part))
    finally:
        progress.close()
    return np.concatenate(parts)


def run(args) -> int:
    """Embed the texts and print or save the vectors."""
    import ember
    from ember.models.sentence import SentenceTransformer

    texts = read_texts(args.texts)
    if not texts:
        raise EmberError("no texts to embed (stdin was empty)")
    if args.output:
        check_output(args.output)
    if args.model is not None:
        existing_dir(args.model, "--model")
    if args.threads:
        ember.set_num_threads(args.threads)
    model = SentenceTransformer(args.model)
    emb = encode(model, texts, args)
    normalized = bool(model.normalize if args.normalize is None else args.normalize)
    path = str(model.path)
    if args.output:
        write(args.output, texts, emb, path, normalized)
        echo(f"wrote {emb.shape[0]} x {emb.shape[1]} embeddings to {args.output}", err=True)
    if args.json:
        echo(to_json(document(texts, emb, path, normalized)))
    elif args.summary:
        for line in summary(texts, emb, path).splitlines():
            echo(line)
    elif not args.output:
        for v in emb:
            echo(" ".join(f"{x:.6g}" for x in v))
    return 0
