"""`ember detect IMAGE... --model yolov8n.safetensors`: YOLOv8 boxes, printed and drawn."""

from __future__ import annotations

import argparse
from pathlib import Path

from ember.cli._args import existing_file, finite_float, int_at_least, writable_file
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
        help="YOLOv8 weights: a .safetensors or a .pt/.pth state_dict (ember ships none)",
    )
    p.add_argument(
        "-o",
        "--output",
        help="write the image with its boxes drawn here (several images: a folder, "
        "each saved as NAME_detect.png)",
    )
    unit = finite_float(0.0, 1.0)
    p.add_argument("--conf", type=unit, default=0.25, help="score threshold (default 0.25)")
    p.add_argument("--iou", type=unit, default=0.7, help="NMS IoU threshold (default 0.7)")
    p.add_argument(
        "--size", type=int_at_least(32), default=640, help="letterbox size, a multiple of 32"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per image")
    p.add_argument("--threads", type=int_at_least(1), help="CPU threads (default: all cores)")


def _outputs(args: argparse.Namespace, names: list[str]) -> list[Path | None]:
    """Where each image's drawing goes (None: not drawn); checked before the model loads."""
    if args.output is None:
        return [None] * len(names)
    out = Path(args.output).expanduser()
    if len(names) == 1 and not out.is_dir():
        return [writable_file(out, "-o")]
    if out.exists() and not out.is_dir():
        raise EmberError(f"-o {args.output!r}: several images need a folder, not a file")
    out.mkdir(parents=True, exist_ok=True)
    stems = [("stdin" if n == "-" else Path(n).stem) for n in names]
    return [out / f"{s}_detect.png" for s in stems]


def run(args: argparse.Namespace) -> int:
    """Detect objects in each image, print the boxes and draw them when -o is given."""
    import ember
    from ember.cli.classify import _sources
    from ember.models.vision.detection import YOLODetector, draw_detections

    if args.model is None:
        raise EmberError("--model is required (ember ships no YOLOv8 weights): e.g. "
                         "--model yolov8n.safetensors")  # fmt: skip
    if args.size % 32:
        raise EmberError(f"--size must be a multiple of 32, got {args.size}")
    sources = _sources(args.images)
    weights = existing_file(args.model, "--model")
    outputs = _outputs(args, [n for n, _ in sources])
    if args.threads:
        ember.set_num_threads(args.threads)
    det = YOLODetector.load(weights, size=args.size)
    status = 0
    for (name, src), out in zip(sources, outputs):
        try:
            (found,) = det([src], conf=args.conf, iou=args.iou)
            if out is not None:
                draw_detections(src, found).save(out)
        except (OSError, EmberError) as e:  # report this image, go on with the others
            msg = describe_error(e)
            echo(f"ember detect: error: {msg if name in msg else f'{name}: {msg}'}", err=True)
            status = 1
            continue
        if args.json:
            rows = [{"label": d.label, "class": d.class_id, "score": round(d.score, 6),
                     "box": [round(v, 2) for v in d.box]} for d in found]  # fmt: skip
            echo(to_json({"image": name, "detections": rows}))
            continue
        echo(f"{name}: {len(found)} object{'s' if len(found) != 1 else ''}")
        for d in found:
            x1, y1, x2, y2 = d.box
            echo(f"  {d.label:<14} {d.score:.3f}  {x1:7.1f} {y1:7.1f} {x2:7.1f} {y2:7.1f}")
        if out is not None:
            echo(f"  drawn: {out}")
    return status
