"""`ember segment IMAGE --point X,Y -o mask.png --model FOLDER`: a SAM mask from clicks or a box."""

from __future__ import annotations

import argparse
import math

from ember.cli._args import existing_dir, existing_file, int_at_least, writable_file
from ember.cli._text import echo, to_json
from ember.errors import EmberError


def _numbers(count: int, what: str):
    """An argparse type: `count` finite comma-separated numbers."""

    def parse(text: str) -> tuple[float, ...]:
        """The numbers, or argparse's error."""
        parts = text.split(",")
        try:
            vals = tuple(float(v) for v in parts)
        except ValueError:
            vals = ()
        if len(parts) != count or len(vals) != count or not all(map(math.isfinite, vals)):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return vals

    parse.__name__ = what
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument(
        "image", metavar="IMAGE", help="an image file (anything Pillow reads); '-' reads stdin"
    )
    p.add_argument(
        "--model",
        help="a transformers SamModel folder (config.json + model.safetensors) or Meta's "
        "sam_vit_*.pth (ember ships none)",
    )
    point = _numbers(2, "X,Y in image pixels")
    p.add_argument("--point", action="append", type=point, default=[], metavar="X,Y",
                   help="a point on the object (repeatable)")  # fmt: skip
    p.add_argument("--neg", action="append", type=point, default=[], metavar="X,Y",
                   help="a background point, not on the object (repeatable)")  # fmt: skip
    p.add_argument("--box", type=_numbers(4, "x1,y1,x2,y2 in image pixels"), metavar="X1,Y1,X2,Y2",
                   help="a box around the object")  # fmt: skip
    p.add_argument("-o", "--output", help="write the best mask here as a PNG (white inside)")
    p.add_argument("--overlay", help="also write the image with the mask tinted on it")
    p.add_argument("--single", action="store_true",
                   help="ask for one mask instead of three and keep it (SAM's multimask off)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--threads", type=int_at_least(1), help="CPU threads (default: all cores)")


def _bbox(mask) -> list[int] | None:
    """x1, y1, x2, y2 (inclusive pixels) of a mask, None when it is empty."""
    import numpy as np

    ys, xs = np.nonzero(mask)
    return None if not len(xs) else [int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max())]


def run(args: argparse.Namespace) -> int:
    """Segment the object the prompts point at and write its mask."""
    import numpy as np

    import ember
    from ember.cli.classify import _sources
    from ember.models.vision.segmentation import SamPredictor, check_box, check_points
    from ember.vision.image import load_image

    if args.model is None:
        raise EmberError(
            "--model is required (ember ships no SAM weights): a transformers SamModel folder "
            "(config.json + model.safetensors, e.g. facebook/sam-vit-base saved with "
            "save_pretrained) or Meta's sam_vit_b_01ec64.pth"
        )
    if not args.point and not args.box:
        raise EmberError("give at least one --point X,Y or a --box x1,y1,x2,y2")
    ((name, src),) = _sources([args.image])
    out = writable_file(args.output, "-o") if args.output else None
    over = writable_file(args.overlay, "--overlay") if args.overlay else None
    model = args.model
    model = existing_dir(model, "--model") if not model.endswith((".pth", ".pt")) else (
        existing_file(model, "--model"))  # fmt: skip
    image = load_image(src)
    size = (image.height, image.width)
    points = [*args.point, *args.neg] or None
    labels = [1] * len(args.point) + [0] * len(args.neg) if points else None
    try:  # prompts checked against the image before the model loads
        if points:
            check_points(points, labels, size)
        if args.box:
            check_box(args.box, size)
    except EmberError as e:
        raise EmberError(str(e).removeprefix("SAM: ")) from None
    if args.threads:
        ember.set_num_threads(args.threads)
    predictor = SamPredictor.load(model)
    predictor.set_image(image)
    masks, scores = predictor.predict(points, labels, args.box, multimask_output=not args.single)
    best = int(np.argmax(scores))
    mask = masks[best]
    if out is not None:
        from ember.models.vision.segmentation import mask_image

        mask_image(mask).save(out, format="PNG")
    if over is not None:
        from ember.models.vision.segmentation import overlay

        overlay(image, mask).save(over)
    area = int(mask.sum())
    box = _bbox(mask)
    if args.json:
        echo(to_json({
            "image": name, "width": size[1], "height": size[0], "mask": str(out) if out else None,
            "overlay": str(over) if over else None, "best": best, "score": round(float(scores[best]), 6),
            "scores": [round(float(s), 6) for s in scores], "area": area, "box": box,
        }))  # fmt: skip
        return 0
    share = 100.0 * area / (size[0] * size[1])
    where = f", box {' '.join(map(str, box))}" if box else ""
    echo(f"{name}: mask {best + 1} of {len(scores)}, score {scores[best]:.3f}, "
         f"{area} pixels ({share:.1f}%){where}")  # fmt: skip
    for path in (out, over):
        if path is not None:
            echo(f"  wrote {path}")
    return 0
