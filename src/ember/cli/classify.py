"""`ember classify IMAGE...`: top-5 ImageNet labels with probabilities (EfficientNet-Lite0)."""

from __future__ import annotations

import argparse
import sys

from ember.cli._args import existing_file, int_at_least
from ember.cli._text import describe_error, echo, to_json
from ember.errors import EmberError


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument(
        "images",
        nargs="+",
        metavar="IMAGE",
        help="image files (anything Pillow reads); '-' reads one image from stdin",
    )
    p.add_argument(
        "--model",
        default="efficientnet_lite0",
        help="efficientnet_lite0 (default, bundled weights), resnet18/34/50/101/152, "
        "mobilenet_v2 (torchvision checkpoints) or vit_b_16 (a Hugging Face folder)",
    )
    p.add_argument("--weights", help="checkpoint file or folder (required except for the default)")
    p.add_argument(
        "--top", type=int_at_least(1), default=5, help="how many classes to show (default 5)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per image")
    p.add_argument("--threads", type=int_at_least(1), help="CPU threads (default: all cores)")


def _sources(images: list[str]) -> list[tuple[str, object]]:
    """(name shown, what load_image takes) per IMAGE; files are checked before any model loads."""
    if images.count("-") > 1:
        raise EmberError("'-' (stdin) can be given once")
    out: list[tuple[str, object]] = []
    for name in images:
        if name == "-":
            data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else b""
            if not data:
                raise EmberError("no image on stdin")
            out.append(("-", data))
        else:
            out.append((name, str(existing_file(name))))
    return out


def run(args: argparse.Namespace) -> int:
    """Classify each image and print its top classes."""
    import ember
    from ember.models.vision.pipeline import ImageClassifier

    sources = _sources(args.images)
    if args.weights is not None:
        from pathlib import Path

        if not Path(args.weights).exists():
            raise EmberError(f"--weights {args.weights!r}: no such file or folder")
    if args.threads:
        ember.set_num_threads(args.threads)
    clf = ImageClassifier.load(args.model, args.weights)
    status = 0
    for name, src in sources:
        try:
            (top,) = clf([src], top=args.top)
        except (OSError, EmberError) as e:  # report this image, go on with the others
            msg = describe_error(e)
            echo(f"ember classify: error: {msg if name in msg else f'{name}: {msg}'}", err=True)
            status = 1
            continue
        if args.json:
            rows = [{"index": i, "label": lab, "probability": round(p, 6)} for i, lab, p in top]
            echo(to_json({"image": name, "model": args.model, "top": rows}))
            continue
        echo(name)
        for i, label, p in top:
            echo(f"  {p:7.2%}  {label} ({i})")
    return status
