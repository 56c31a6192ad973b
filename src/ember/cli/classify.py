"""`ember classify IMAGE...`: top-5 ImageNet labels with probabilities (EfficientNet-Lite0)."""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files (anything Pillow reads)")
    p.add_argument(
        "--model",
        default="efficientnet_lite0",
        help="efficientnet_lite0 (default, bundled weights), resnet18/34/50/101/152, "
        "mobilenet_v2 (torchvision checkpoints) or vit_b_16 (a Hugging Face folder)",
    )
    p.add_argument("--weights", help="checkpoint file or folder (required except for the default)")
    p.add_argument("--top", type=int, default=5, help="how many classes to show (default 5)")
    p.add_argument("--json", action="store_true", help="print one JSON object per image")
    p.add_argument("--threads", type=int, help="CPU threads (default: all cores)")


def run(args: argparse.Namespace) -> int:
    """Classify each image and print its top classes."""
    import ember
    from ember.models.vision.pipeline import ImageClassifier

    if args.threads:
        ember.set_num_threads(args.threads)
    clf = ImageClassifier.load(args.model, args.weights)
    status = 0
    for path in args.images:
        try:
            (top,) = clf([path], top=args.top)
        except (OSError, ember.errors.EmberError) as e:
            print(f"ember classify: {path}: {e}", file=sys.stderr)
            status = 1
            continue
        if args.json:
            rows = [{"index": i, "label": lab, "probability": round(p, 6)} for i, lab, p in top]
            print(json.dumps({"image": path, "model": args.model, "top": rows}))
            continue
        print(path)
        for i, label, p in top:
            print(f"  {p:7.2%}  {label} ({i})")
    return status
